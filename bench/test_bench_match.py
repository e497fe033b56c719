"""Dictionary matching on the host, side by side in one run (bench/NOTES.md).

- the fused kernel (match.hpp) on 1e5 noisy MRF signals against 1e5 atoms
  of the reference dictionary projected at rank 12, beside faiss-cpu's exact
  ``IndexFlatIP`` on the equivalent real problem (vectors of dimension 24:
  real and imaginary parts), the same threads, and beside the chunked NumPy
  brute force a user would write;
- the full 500-sample match (2e4 × 2e4) beside the host's sgemm rate,
  measured in the same run at the same arithmetic.

Run: ``pip install ".[bench]"`` then ``pytest bench/test_bench_match.py
--benchmark-only``.  Each benchmark records its GFLOP/s (8 real flops per
complex multiply-add, the arithmetic of the phase-insensitive score) in
``extra_info``.
"""
import numpy as np
import pytest

from blochsim._engine import dispatch as _dispatch
from blochsim.cli import reference_flips
from blochsim.estimators.dictionary._atoms import _basis, _best, _gram, _unit_rows
from blochsim.simulators import MRFSimulator

N = 100_000
RANK = 12


@pytest.fixture(scope="module")
def projected():
    """(signals, unit atoms), both (1e5, 12) complex64: the reference
    train's dictionary on its (T1, T2) grid and noisy signals of random
    tissues, projected on the dictionary's 12 leading singular vectors."""
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, TI=20.0, states=32)
    s1 = int(np.ceil(np.sqrt(N)))
    T1, T2 = np.meshgrid(np.geomspace(200, 3000, s1), np.geomspace(10, 300, s1))
    atoms = sim.simulate(T1=T1.reshape(-1)[:N], T2=T2.reshape(-1)[:N])
    unit, _ = _unit_rows(atoms.astype(np.complex64))
    basis = _basis(_gram(unit), rank=RANK)
    rng = np.random.default_rng(0)
    s = sim.simulate(T1=rng.uniform(250, 2800, N), T2=rng.uniform(12, 280, N))
    s = s + 0.005 * (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape))
    return np.ascontiguousarray(s.astype(np.complex64) @ basis), np.ascontiguousarray(unit @ basis)


def _record(benchmark, n, N_, r):
    benchmark.extra_info["pairs"] = n * N_
    benchmark.extra_info["gflops_median"] = 8 * n * N_ * r / benchmark.stats.stats.median / 1e9


def test_match_kernel_1e5_by_1e5_rank12(benchmark, projected):
    q, atoms = projected
    threads = _dispatch.default_threads()
    idx = benchmark.pedantic(_best, args=(q, atoms, 1, threads), rounds=3, warmup_rounds=0)[0]
    _record(benchmark, N, N, RANK)
    benchmark.extra_info["threads"] = threads
    benchmark.extra_info["best"] = idx[:4, 0].tolist()


def test_faiss_flat_ip_1e5_by_1e5_dim24(benchmark, projected):
    """faiss's exact inner-product search, real vectors of dimension 2r.
    Its arithmetic is half the complex score's (2r real products a pair
    against 4r), so its GFLOP/s here are counted at its own 4·r·pairs."""
    faiss = pytest.importorskip("faiss")
    q, atoms = projected
    threads = _dispatch.default_threads()
    faiss.omp_set_num_threads(threads)
    index = faiss.IndexFlatIP(2 * RANK)
    index.add(np.ascontiguousarray(atoms.view(np.float32)))
    x = np.ascontiguousarray(q.view(np.float32))
    benchmark.pedantic(index.search, args=(x, 1), rounds=3, warmup_rounds=0)
    benchmark.extra_info["pairs"] = N * N
    benchmark.extra_info["gflops_median"] = 4 * N * N * RANK / benchmark.stats.stats.median / 1e9
    benchmark.extra_info["threads"] = threads


def test_numpy_brute_force_1e5_by_1e5_rank12(benchmark, projected):
    """The chunked NumPy a user would write: abs(S @ D.conj().T).argmax(1)."""
    q, atoms = projected
    dc = np.ascontiguousarray(atoms.conj().T)

    def brute():
        return np.concatenate([np.abs(q[a:a + 4096] @ dc).argmax(1) for a in range(0, len(q), 4096)])

    benchmark.pedantic(brute, rounds=1, warmup_rounds=0)
    _record(benchmark, N, N, RANK)


def test_match_kernel_full_500(benchmark):
    """2e4 signals × 2e4 atoms of 500 complex samples (full atoms)."""
    rng = np.random.default_rng(1)
    n, r = 20_000, 500
    q = (rng.standard_normal((n, r)) + 1j * rng.standard_normal((n, r))).astype(np.complex64)
    atoms = _unit_rows((rng.standard_normal((n, r)) + 1j * rng.standard_normal((n, r))).astype(np.complex64))[0]
    benchmark.pedantic(_best, args=(q, atoms, 1, _dispatch.default_threads()), rounds=2, warmup_rounds=0)
    _record(benchmark, n, n, r)


def test_sgemm_rate(benchmark):
    """The host's sgemm (NumPy's BLAS) at the full match's arithmetic:
    (2e4 × 1000) @ (1000 × 2e4) real is 8e11 flops, as the 2e4 × 2e4 × 500
    complex match."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((20_000, 1000), dtype=np.float32)
    b = rng.standard_normal((1000, 20_000), dtype=np.float32)
    benchmark.pedantic(np.matmul, args=(a, b), rounds=2, warmup_rounds=1)
    benchmark.extra_info["gflops_median"] = 2 * 20_000 * 20_000 * 1000 / benchmark.stats.stats.median / 1e9
