"""Device benchmarks of the reference workload (SPEC §9), CuPy-resident
inputs and outputs (the kernel and its launch; no host transfer), plus the
streamed path from NumPy.  Skipped without a GPU.

Run: ``pytest bench/test_bench_device.py --benchmark-only``.
"""
import numpy as np
import pytest

import blochsim
from blochsim.cli import reference_flips, reference_tissues
from blochsim.simulators import MRFSimulator

pytestmark = pytest.mark.skipif(not blochsim.backends()["cuda"]["available"], reason="no usable CUDA device")

SIZES = [10_000, 100_000, 1_000_000]


def _resident(benchmark, n, phases):
    cp = pytest.importorskip("cupy")
    T1, T2 = reference_tissues(n)
    T1, T2 = cp.asarray(T1, cp.float32), cp.asarray(T2, cp.float32)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, phases=phases, states=32)
    out = cp.empty((n, 500), cp.complex64)
    sim.simulate(T1=T1, T2=T2, out=out)  # warm-up: packing, module load
    benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, "out": out}, rounds=5, warmup_rounds=1)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


@pytest.mark.parametrize("n", SIZES)
def test_device_mrf_forward_real_path(benchmark, n):
    _resident(benchmark, n, 0.0)


@pytest.mark.parametrize("n", SIZES)
def test_device_mrf_forward_complex_path(benchmark, n):
    k = np.arange(500)
    _resident(benchmark, n, 0.5 * 117.0 * k * (k + 1))


@pytest.mark.parametrize("states", [32, 33, 64, 65, 128, 512, 1024])
def test_device_mrf_forward_states(benchmark, states):
    """The real path at 1e5 atoms over the state counts where the launcher
    changes team shape (one thread, warp teams, block teams)."""
    cp = pytest.importorskip("cupy")
    n = 100_000
    T1, T2 = reference_tissues(n)
    T1, T2 = cp.asarray(T1, cp.float32), cp.asarray(T2, cp.float32)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=states)
    out = cp.empty((n, 500), cp.complex64)
    sim.simulate(T1=T1, T2=T2, out=out)
    benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, "out": out}, rounds=5, warmup_rounds=1)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_device_mrf_bssfp_b0(benchmark, n):
    """kind="bssfp" with a B0 map (the complex path; no shifts, so one
    order is played whatever ``states`` says)."""
    cp = pytest.importorskip("cupy")
    T1, T2 = reference_tissues(n)
    tissue = {"T1": cp.asarray(T1, cp.float32), "T2": cp.asarray(T2, cp.float32),
              "B0": cp.asarray(np.linspace(-50.0, 50.0, n), cp.float32)}
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, kind="bssfp")
    out = cp.empty((n, 500), cp.complex64)
    sim.simulate(**tissue, out=out)
    benchmark.pedantic(sim.simulate, kwargs={**tissue, "out": out}, rounds=5, warmup_rounds=1)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


def test_device_mrf_one_voxel(benchmark):
    """One voxel, one call, CuPy in and out: the per-call latency."""
    cp = pytest.importorskip("cupy")
    T1, T2 = cp.asarray([1000.0], cp.float32), cp.asarray([80.0], cp.float32)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    out = cp.empty((1, 500), cp.complex64)
    sim.simulate(T1=T1, T2=T2, out=out)
    benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, "out": out}, rounds=200, warmup_rounds=5)
    benchmark.extra_info["atoms"] = 1
    benchmark.extra_info["atoms_per_s_median"] = 1 / benchmark.stats.stats.median


def test_device_mrf_streamed_from_numpy_1e6(benchmark):
    n = 1_000_000
    T1, T2 = reference_tissues(n)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, device="cuda")
    out = np.empty((n, 500), np.complex64)
    out.fill(0)
    sim.simulate(T1=T1[:1000], T2=T2[:1000])
    benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, "out": out}, rounds=3, warmup_rounds=1)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_device_mrf_jacobian_T1_T2(benchmark, n):
    """Signal and its (T1, T2) Jacobian in one pass, CuPy in and out."""
    cp = pytest.importorskip("cupy")
    T1, T2 = reference_tissues(n)
    T1, T2 = cp.asarray(T1, cp.float32), cp.asarray(T2, cp.float32)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    sim.jacobian(("T1", "T2"), T1=T1[:1000], T2=T2[:1000])
    benchmark.pedantic(sim.jacobian, args=(("T1", "T2"),), kwargs={"T1": T1, "T2": T2}, rounds=5,
                       warmup_rounds=1)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


@pytest.mark.parametrize("states", [512, 2048])
def test_device_mrf_jacobian_states(benchmark, states):
    """(T1, T2) past a warp team's 256 orders at 1e4 atoms: block teams
    (512), then the tail in device memory (2048 + 1: its default states
    on a 2048-TR train)."""
    cp = pytest.importorskip("cupy")
    n = 10_000
    T1, T2 = reference_tissues(n)
    T1, T2 = cp.asarray(T1, cp.float32), cp.asarray(T2, cp.float32)
    flips = np.resize(reference_flips(500), states)
    sim = MRFSimulator(flip=flips, TR=10.0, states=states + 1 if states == 2048 else states)
    sim.jacobian(("T1", "T2"), T1=T1[:100], T2=T2[:100])
    benchmark.pedantic(sim.jacobian, args=(("T1", "T2"),), kwargs={"T1": T1, "T2": T2}, rounds=3,
                       warmup_rounds=1)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_device_mrf_jacobian_four_directions(benchmark, n):
    """(T1, T2, B1, inv_efficiency): one launch, two teams of two directions a voxel."""
    cp = pytest.importorskip("cupy")
    T1, T2 = reference_tissues(n)
    tissue = {"T1": cp.asarray(T1, cp.float32), "T2": cp.asarray(T2, cp.float32),
              "B1": cp.full(n, 0.95, cp.float32), "inv_efficiency": cp.full(n, 0.97, cp.float32)}
    names = ("T1", "T2", "B1", "inv_efficiency")
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    sim.jacobian(names, **{k: v[:1000] for k, v in tissue.items()})
    benchmark.pedantic(sim.jacobian, args=(names,), kwargs=tissue, rounds=3, warmup_rounds=1)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_device_mrf_flip_train_gradient(benchmark, n):
    """The pullback of L = sum |s|^2 to the 500 flips on the device, CuPy
    cotangent."""
    cp = pytest.importorskip("cupy")
    T1, T2 = reference_tissues(n)
    T1, T2 = cp.asarray(T1, cp.float32), cp.asarray(T2, cp.float32)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    s, pullback = sim.vjp("flip", T1=T1, T2=T2)
    cot = 2 * s
    pullback(cot)
    benchmark.pedantic(pullback, args=(cot,), rounds=3, warmup_rounds=1)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


POOLS = {
    "mt": {"bound_fraction": 0.1, "bound_exchange": 20.0},
    "poolB": {"poolB_fraction": 0.2, "poolB_exchange": 10.0, "poolB_T2": 20.0, "poolB_shift": 50.0},
}
# the forward also with an exchanging pool on resonance (real planes)
FORWARD_POOLS = {**POOLS, "poolB_noshift": {"poolB_fraction": 0.2, "poolB_exchange": 10.0, "poolB_T2": 20.0}}


@pytest.mark.parametrize("pool", sorted(FORWARD_POOLS))
@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_device_mrf_forward_pools_from_numpy(benchmark, n, pool):
    """Forward with one pool added, NumPy in and out through the device
    (device='cuda'), against test_device_mrf_streamed_from_numpy_1e6."""
    T1, T2 = reference_tissues(n)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, device="cuda")
    sim.simulate(T1=T1[:1024], T2=T2[:1024], **FORWARD_POOLS[pool])
    out = benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, **FORWARD_POOLS[pool]}, rounds=3,
                             warmup_rounds=1)
    assert out.shape == (n, 500)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


@pytest.mark.parametrize("pool", sorted(FORWARD_POOLS))
@pytest.mark.parametrize("n", SIZES)
def test_device_mrf_forward_pools_resident(benchmark, n, pool):
    """Forward with one pool added, CuPy in and out (the pooled kernels on
    resident arrays), against test_device_mrf_forward_real_path and
    test_device_mrf_forward_complex_path."""
    cp = pytest.importorskip("cupy")
    T1, T2 = reference_tissues(n)
    T1, T2 = cp.asarray(T1, cp.float32), cp.asarray(T2, cp.float32)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    out = cp.empty((n, 500), cp.complex64)
    sim.simulate(T1=T1, T2=T2, out=out, **FORWARD_POOLS[pool])
    benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, "out": out, **FORWARD_POOLS[pool]}, rounds=5,
                       warmup_rounds=1)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_device_mrf_vjp_pools_1e4(benchmark, pool):
    """Pullback to (flip, TR, T1, T2) with one pool added on the device (the
    pooled adjoint, one thread a problem in double precision), NumPy in and
    out."""
    T1, T2 = reference_tissues(10_000)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, device="cuda")
    s, pullback = sim.vjp(("flip", "TR", "T1", "T2"), T1=T1, T2=T2, **POOLS[pool])
    g = benchmark.pedantic(pullback, args=(np.ones_like(s),), rounds=3, warmup_rounds=1)
    assert g["flip"].shape == (500,)
    benchmark.extra_info["atoms"] = 10_000
    benchmark.extra_info["atoms_per_s_median"] = 10_000 / benchmark.stats.stats.median
