"""Host benchmarks of the reference workload (SPEC §9).

Run: ``pytest bench/ --benchmark-only`` (add ``--benchmark-json=FILE`` to
keep the numbers).  Each benchmark records atoms/s in ``extra_info``.

Per host level (``BLOCHSIM_HOST_ISA`` forces one for the whole process)::

    for l in x86-64 x86-64-v3 x86-64-v4; do
        BLOCHSIM_HOST_ISA=$l pytest bench/test_bench_host.py -k per_core --benchmark-only
    done
"""
import time

import numpy as np
import pytest

from blochsim.cli import reference_flips, reference_tissues
from blochsim.simulators import MRFSimulator

SIZES = [1_000, 10_000, 100_000]


def _run(benchmark, n, phases, threads=None):
    T1, T2 = reference_tissues(n)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, phases=phases, states=32, threads=threads)
    sim.simulate(T1=T1[:16], T2=T2[:16])  # pack once outside the timing
    rounds = 3 if n >= 100_000 else 10
    out = benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2}, rounds=rounds, warmup_rounds=1)
    assert out.shape == (n, 500)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median
    return out


@pytest.mark.parametrize("n", SIZES)
def test_mrf_forward_real_path(benchmark, n):
    """Phase-0 train: the real-subspace kernel."""
    _run(benchmark, n, 0.0)


@pytest.mark.parametrize("n", SIZES)
def test_mrf_forward_complex_path(benchmark, n):
    """Every RF phase different (quadratic phase): the complex kernel."""
    k = np.arange(500)
    _run(benchmark, n, 0.5 * 117.0 * k * (k + 1))


def test_mrf_forward_per_core(benchmark):
    """The reference workload (1e5 atoms, real path) on one thread, at the
    host level this process runs (``extra_info["isa"]``, ``["lanes"]``)."""
    import blochsim

    cpu = blochsim.backends()["cpu"]
    benchmark.extra_info["isa"] = cpu["isa"]
    benchmark.extra_info["lanes"] = cpu["lanes"]
    _run(benchmark, 100_000, 0.0, threads=1)


@pytest.mark.parametrize("threads", [1, 2])
def test_mrf_forward_threads_10k(benchmark, threads):
    """10,000 atoms at a fixed thread count (the issue's 2-core target)."""
    _run(benchmark, 10_000, 0.0, threads=threads)


def _run_jacobian(benchmark, n, threads=None):
    T1, T2 = reference_tissues(n)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, threads=threads)
    sim.jacobian(("T1", "T2"), T1=T1[:16], T2=T2[:16])
    rounds = 3 if n >= 100_000 else 5
    s, J = benchmark.pedantic(sim.jacobian, args=(("T1", "T2"),), kwargs={"T1": T1, "T2": T2},
                              rounds=rounds, warmup_rounds=1)
    assert J.shape == (n, 2, 500)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


@pytest.mark.parametrize("n", [1_000, 10_000])
def test_mrf_jacobian_T1_T2(benchmark, n):
    """Signal and its (T1, T2) Jacobian in one pass (real path)."""
    _run_jacobian(benchmark, n)


@pytest.mark.parametrize("n", [1_000, 10_000])
def test_mrf_flip_train_gradient(benchmark, n):
    """The pullback of L = sum |s|^2 to the 500 flips (adjoint sweep with
    checkpointing), given the signal from vjp."""
    T1, T2 = reference_tissues(n)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    s, pullback = sim.vjp("flip", T1=T1, T2=T2)
    cot = 2 * s
    g = benchmark.pedantic(pullback, args=(cot,), rounds=3, warmup_rounds=1)
    assert g["flip"].shape == (500,)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


# Pools (SPEC §3): the reference workload with a semisolid (MT) pool, and
# with one exchanging pool, against the single-pool forward above.
POOLS = {
    "mt": {"bound_fraction": 0.1, "bound_exchange": 20.0},
    "poolB": {"poolB_fraction": 0.2, "poolB_exchange": 10.0, "poolB_T2": 20.0, "poolB_shift": 50.0},
}


@pytest.mark.parametrize("pool", sorted(POOLS))
@pytest.mark.parametrize("n", [1_000, 10_000])
def test_mrf_forward_pools(benchmark, n, pool):
    """Forward with one pool added (single precision, SIMD lanes)."""
    T1, T2 = reference_tissues(n)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    sim.simulate(T1=T1[:16], T2=T2[:16], **POOLS[pool])
    rounds = 5
    out = benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, **POOLS[pool]}, rounds=rounds,
                             warmup_rounds=1)
    assert out.shape == (n, 500)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_mrf_jacobian_pools_1k(benchmark, pool):
    """(T1, T2) Jacobian with one pool added (double precision per problem)."""
    T1, T2 = reference_tissues(1_000)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    s, J = benchmark.pedantic(sim.jacobian, args=(("T1", "T2"),), kwargs={"T1": T1, "T2": T2, **POOLS[pool]},
                              rounds=3, warmup_rounds=1)
    assert J.shape == (1_000, 2, 500)
    benchmark.extra_info["atoms"] = 1_000
    benchmark.extra_info["atoms_per_s_median"] = 1_000 / benchmark.stats.stats.median


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_mrf_vjp_pools_1k(benchmark, pool):
    """Pullback to (flip, TR, T1, T2) with one pool added (the pooled adjoint,
    double precision per problem), given the signal from vjp."""
    T1, T2 = reference_tissues(1_000)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    s, pullback = sim.vjp(("flip", "TR", "T1", "T2"), T1=T1, T2=T2, **POOLS[pool])
    g = benchmark.pedantic(pullback, args=(np.ones_like(s),), rounds=3, warmup_rounds=1)
    assert g["flip"].shape == (500,)
    benchmark.extra_info["atoms"] = 1_000
    benchmark.extra_info["atoms_per_s_median"] = 1_000 / benchmark.stats.stats.median


# Estimators (SPEC §5-6): PERK's fused map and dictionary matching at the
# issue's shapes (500 complex contrasts, 1000 features), fewer voxels.
def _perk_model(d, F, p, seed=0):
    rng = np.random.default_rng(seed)
    return ((rng.standard_normal((F, d)) / np.sqrt(d)).astype(np.float32),
            rng.uniform(0, 2 * np.pi, F).astype(np.float32),
            (rng.standard_normal((p, F)) / F).astype(np.float32), np.zeros(p, np.float32))


@pytest.mark.parametrize("pullback", [False, True])
def test_perk_map_100k(benchmark, pullback):
    """Fused features + regression (and its pullback) of 1e5 voxels, d =
    1000 inputs (500 complex contrasts), F = 1000 features, 2 estimates."""
    from blochsim import _core
    from blochsim._engine import dispatch as _dispatch
    n, d, F, p = 100_000, 1000, 1000, 2
    om, ph, W, off = _perk_model(d, F, p)
    x = np.random.default_rng(1).standard_normal((n, d)).astype(np.float32)
    out = np.empty((n, p), np.float32)
    kw = {"threads": _dispatch.default_threads()}
    if pullback:
        kw.update(g=np.ones((n, p), np.float32), xbar=np.empty_like(x))
    benchmark.pedantic(_core.perk, args=(om, ph, W, off, x, out), kwargs=kw, rounds=3, warmup_rounds=1)
    benchmark.extra_info["voxels_per_s_median"] = n / benchmark.stats.stats.median
    benchmark.extra_info["gflops_median"] = (2 if pullback else 1) * 2 * n * d * F / benchmark.stats.stats.median / 1e9


def test_dictionary_match_10k(benchmark):
    """Best atom of 1e4 signals among 1e4 atoms × 500 contrasts."""
    from blochsim.estimators import DictionaryMatcher
    T1, T2 = reference_tissues(10_000)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    atoms = sim.simulate(T1=T1, T2=T2)
    dm = DictionaryMatcher(sim).fit(dictionary=(atoms, {"T1": T1, "T2": T2}))
    m = benchmark.pedantic(dm.map, args=(atoms * 1.5,), rounds=3, warmup_rounds=1)
    assert np.all(m["index"] == np.arange(10_000))
    pairs = 10_000 * 10_000
    benchmark.extra_info["pairs_per_s_median"] = pairs / benchmark.stats.stats.median
    benchmark.extra_info["gflops_median"] = 8 * pairs * 500 / benchmark.stats.stats.median / 1e9


@pytest.mark.parametrize("mode", ["compressed", "full"])
def test_dictionary_match_1e5_by_1e5(benchmark, mode):
    """Best atom of 1e5 noisy signals among 1e5 atoms × 500 contrasts (the
    reference workload's (T1, T2) grid), the dictionary kept compressed
    (rank="auto": a subspace of all but 1e-6 of the energy, candidates
    re-ranked exactly) or full (rank=None).  One round: the full match is
    1e10 inner products of 500 contrasts."""
    from blochsim.estimators import DictionaryMatcher
    n = 100_000
    s1 = int(np.ceil(np.sqrt(n)))
    grids = dict(T1=np.geomspace(200, 3000, s1), T2=np.geomspace(10, 300, s1))
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, TI=20.0, states=32)
    dm = DictionaryMatcher(sim, rank="auto" if mode == "compressed" else None)
    t0 = time.perf_counter()
    dm.fit(**grids)
    t_fit = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    T1, T2 = rng.uniform(250, 2800, n), rng.uniform(12, 280, n)
    s = sim.simulate(T1=T1, T2=T2)
    s = s + 0.005 * (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape))
    m = benchmark.pedantic(dm.map, args=(s,), rounds=1, warmup_rounds=0)
    benchmark.extra_info["atoms"] = s1 * s1
    benchmark.extra_info["rank"] = dm.compressed_rank
    benchmark.extra_info["fit_s"] = t_fit
    benchmark.extra_info["stored_MiB"] = dm._atoms.nbytes / 2 ** 20
    benchmark.extra_info["T1_median_rel_error"] = float(np.median(np.abs(m["T1"] - T1) / T1))
    benchmark.extra_info["T2_median_rel_error"] = float(np.median(np.abs(m["T2"] - T2) / T2))
    benchmark.extra_info["voxels_per_s"] = n / benchmark.stats.stats.median
