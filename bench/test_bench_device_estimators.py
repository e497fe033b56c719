"""Matching and PERK on the GPU, beside the CuPy brute force a user would
write, in one run (bench/NOTES.md).  Skipped without a usable device and
CuPy.

- the fused matching kernel (cuda/match.cuh) on device-resident projected
  signals and atoms: 1e6 × 1e6 and 1e5 × 1e5 at rank 12, 1e5 × 1e5 full
  (500 samples); the chunked ``abs(S @ D.conj().T).argmax(1)`` of CuPy on
  the same arrays;
- DictionaryMatcher(device="cuda").map of 1e6 device signals against its
  1e6-atom dictionary (projection, kernel, exact re-ranking of the
  candidates simulated again on the card);
- PERK.map of 1e6 device signals of 500 contrasts, 2000 features.

Run: ``pytest bench/test_bench_device_estimators.py --benchmark-only``.
"""
import numpy as np
import pytest

from blochsim._engine import dispatch as _dispatch

cupy = pytest.importorskip("cupy")
if not _dispatch.cuda_status()[0]:
    pytest.skip("no usable CUDA device", allow_module_level=True)

from blochsim import _core  # noqa: E402
from blochsim._arrays.device import DeviceArray  # noqa: E402
from blochsim.cli import reference_flips  # noqa: E402
from blochsim.estimators import PERK, DictionaryMatcher  # noqa: E402
from blochsim.simulators import MRFSimulator  # noqa: E402

N = 1_000_000


def _sync(x=None):
    cupy.cuda.runtime.deviceSynchronize()
    return x


@pytest.fixture(scope="module")
def sim():
    return MRFSimulator(flip=reference_flips(500), TR=10.0, TI=20.0, states=32, device="cuda")


@pytest.fixture(scope="module")
def dictionary(sim):
    """The reference train's 1e6-atom dictionary on the card at rank 12."""
    s1 = 1000
    return DictionaryMatcher(sim, rank=12, chunk=100_000).fit(T1=np.geomspace(200, 3000, s1),
                                                               T2=np.geomspace(10, 300, s1))


@pytest.fixture(scope="module")
def signals(sim):
    """1e6 noisy signals of random tissues, CuPy complex64 (1e6, 500)."""
    rng = np.random.default_rng(0)
    s = sim.simulate(T1=cupy.asarray(rng.uniform(250, 2800, N)), T2=cupy.asarray(rng.uniform(12, 280, N)))
    noise = cupy.random.default_rng(1).standard_normal(s.shape, dtype=cupy.float32)
    s += 0.005 * noise
    return _sync(s)


@pytest.fixture(scope="module")
def projected(dictionary, signals):
    q = cupy.asarray(signals @ cupy.asarray(dictionary._basis.astype(np.complex64)))
    atoms = cupy.asarray(dictionary._atoms)
    return _sync(q), atoms


def _kernel(q, atoms, k=1):
    n, r = q.shape
    idx = cupy.empty((n, k), cupy.int64)
    power = cupy.empty((n, k), cupy.float32)
    dot = cupy.empty((n, k), cupy.complex128)
    _core.match_device(q.data.ptr, atoms.data.ptr, n, len(atoms), r, k, idx.data.ptr, power.data.ptr,
                       dot.data.ptr, 0)
    return _sync(idx)


def _brute(q, atoms):
    dc = atoms.conj().T
    step = max(1, (1 << 28) // len(atoms))  # 2 GiB of complex64 scores a chunk
    out = cupy.concatenate([cupy.abs(q[a:a + step] @ dc).argmax(1) for a in range(0, len(q), step)])
    return _sync(out)


def _against_float64(q, atoms, picked):
    """The kernel's best atoms of signals q against a complex128 brute force:
    (fraction that are its best atom, the largest relative shortfall of
    their exact power from the best one)."""
    qd = q.astype(cupy.complex128)
    rows = cupy.arange(len(q))
    best, arg = cupy.full(len(q), -1.0), cupy.zeros(len(q), cupy.int64)
    for a in range(0, len(atoms), 100_000):
        p = cupy.abs(qd @ atoms[a:a + 100_000].astype(cupy.complex128).conj().T) ** 2
        j = p.argmax(1)
        v = p[rows, j]
        arg = cupy.where(v > best, j + a, arg)
        best = cupy.maximum(v, best)
    mine = cupy.abs((qd * atoms[picked].astype(cupy.complex128).conj()).sum(1)) ** 2
    return float((arg == picked).mean()), float(((best - mine) / best).max())


def _record(benchmark, n, m, r):
    benchmark.extra_info["pairs"] = n * m
    benchmark.extra_info["tflops_median"] = 8 * n * m * r / benchmark.stats.stats.median / 1e12


@pytest.mark.parametrize("n", [100_000, N])
def test_device_match_kernel_rank12(benchmark, projected, n):
    q, atoms = projected
    idx = benchmark.pedantic(_kernel, args=(q[:n], atoms[:n]), rounds=3, warmup_rounds=1)
    _record(benchmark, n, n, 12)
    same, shortfall = _against_float64(q[:1000], atoms[:n], idx[:1000, 0])
    benchmark.extra_info["first_1000_same_as_float64"] = same
    benchmark.extra_info["first_1000_worst_power_shortfall"] = shortfall


@pytest.mark.parametrize("n", [100_000, N])
def test_device_cupy_brute_force_rank12(benchmark, projected, n):
    q, atoms = projected
    benchmark.pedantic(_brute, args=(q[:n], atoms[:n]), rounds=1, warmup_rounds=1 if n < N else 0)
    _record(benchmark, n, n, 12)


@pytest.fixture(scope="module")
def full(sim, signals):
    """1e5 unit atoms of 500 samples and 1e5 signals, CuPy complex64."""
    rng = np.random.default_rng(3)
    atoms = sim.simulate(T1=cupy.asarray(rng.uniform(200, 3000, 100_000)),
                         T2=cupy.asarray(rng.uniform(10, 300, 100_000)))
    atoms /= cupy.linalg.norm(atoms, axis=1, keepdims=True)
    return _sync(signals[:100_000].copy()), atoms


def test_device_match_kernel_full(benchmark, full):
    q, atoms = full
    idx = benchmark.pedantic(_kernel, args=(q, atoms), rounds=3, warmup_rounds=1)
    _record(benchmark, len(q), len(atoms), 500)
    same, shortfall = _against_float64(q[:1000], atoms, idx[:1000, 0])
    benchmark.extra_info["first_1000_same_as_float64"] = same
    benchmark.extra_info["first_1000_worst_power_shortfall"] = shortfall


def test_device_cupy_brute_force_full(benchmark, full):
    q, atoms = full
    benchmark.pedantic(_brute, args=(q, atoms), rounds=2, warmup_rounds=1)
    _record(benchmark, len(q), len(atoms), 500)


def test_device_dictionary_map_1e6(benchmark, dictionary, signals):
    maps = benchmark.pedantic(dictionary.map, args=(signals,), rounds=2, warmup_rounds=1)
    assert isinstance(maps["T1"], cupy.ndarray) and maps["T1"].shape == (N,)
    benchmark.extra_info["voxels_per_s_median"] = N / benchmark.stats.stats.median


def test_device_perk_map_1e6(benchmark, sim, signals):
    perk = PERK(sim, n_features=2000).fit(noise_std=0.005, samples=20_000, T1=(250.0, 2800.0),
                                          T2=(12.0, 280.0), M0=(0.5, 1.5))
    maps = benchmark.pedantic(perk.map, args=(signals,), rounds=3, warmup_rounds=1)
    assert isinstance(maps["T1"], cupy.ndarray)
    benchmark.extra_info["inputs"] = perk.inputs
    benchmark.extra_info["voxels_per_s_median"] = N / benchmark.stats.stats.median
