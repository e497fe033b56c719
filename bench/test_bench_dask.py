"""Dask benchmarks (blochsim.distributed): the reference dictionary of 1e6
atoms and the maps of 1e6 voxels, in this process and on local clusters of
1 and 2 worker processes, in one run; and the scheduler's overhead per task.

Run: ``pytest bench/test_bench_dask.py --benchmark-only`` (needs
``blochsim[distributed]``).  Each cluster's workers share this machine's
CPUs (BLOCHSIM_NUM_THREADS = CPUs / workers, one task a worker).
"""
import numpy as np
import pytest

from blochsim._engine import dispatch as _dispatch
from blochsim.cli import reference_flips
from blochsim.estimators import DictionaryMatcher
from blochsim.simulators import MRFSimulator

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

WHERE = ["process", "1 worker", "2 workers"]


def _sim():
    return MRFSimulator(flip=reference_flips(500), TR=10.0, TI=20.0, states=32)


class _Cluster:
    """A local cluster of n workers (n = 0: none, the process itself)."""

    def __init__(self, where):
        self.n = 0 if where == "process" else int(where.split()[0])

    def __enter__(self):
        if self.n:
            share = max(1, _dispatch.default_threads() // self.n)
            self.cluster = distributed.LocalCluster(n_workers=self.n, threads_per_worker=1, processes=True,
                                                    host="127.0.0.1", dashboard_address=":0",
                                                    env=_dispatch.thread_env(share))
            self.client = distributed.Client(self.cluster)
            self.client.run(lambda: __import__("blochsim.simulators"))  # imports outside the timing
        return self

    def __exit__(self, *exc):
        if self.n:
            self.client.close()
            self.cluster.close()


@pytest.mark.parametrize("where", WHERE)
def test_dask_dictionary_1e6_atoms(benchmark, where):
    """The reference workload's (T1, T2) grid, 1000 x 1000 atoms x 500 TRs,
    compressed (rank="auto": the subspace from 4096 sampled atoms, then
    every atom simulated and projected, 4096 atoms a task) and kept: in
    memory here, persisted on the workers there."""
    grids = dict(T1=np.geomspace(200, 3000, 1000), T2=np.geomspace(10, 300, 1000))
    with _Cluster(where) as c:
        def fit():
            dm = DictionaryMatcher(_sim())
            if c.n:
                dm.fit(dask=True, **grids)
                distributed.wait(dm._atoms)
            else:
                dm.fit(**grids)
            return dm

        dm = benchmark.pedantic(fit, rounds=1, warmup_rounds=0)
    benchmark.extra_info["atoms"] = 1_000_000
    benchmark.extra_info["rank"] = dm.compressed_rank
    benchmark.extra_info["tasks"] = -(-1_000_000 // dm.chunk)
    benchmark.extra_info["atoms_per_s_median"] = 1e6 / benchmark.stats.stats.median


@pytest.mark.parametrize("where", WHERE)
def test_dask_maps_1e6_voxels(benchmark, where):
    """Maps of 1e6 voxels from their tissue: the signals simulated (500
    TRs) and matched against 1e4 atoms kept at rank 12, no re-ranking; in
    this process, or as one Dask graph of 65,536-voxel chunks."""
    rng = np.random.default_rng(0)
    n = 1_000_000
    T1, T2 = rng.uniform(250, 2800, n), rng.uniform(12, 280, n)
    grids = dict(T1=np.geomspace(200, 3000, 100), T2=np.geomspace(10, 300, 100))
    dm = DictionaryMatcher(_sim(), rank=12, refine=0).fit(**grids)
    with _Cluster(where) as c:
        def maps():
            if c.n:
                s = _sim().simulate(T1=da.from_array(T1, chunks=65536), T2=T2)
                return dict(zip(("T1", "T2"), dask.compute(*(lambda m: (m["T1"], m["T2"]))(dm.map(s)))))
            return dm.map(_sim().simulate(T1=T1, T2=T2))

        m = benchmark.pedantic(maps, rounds=1, warmup_rounds=0)
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["T1_median_rel_error"] = float(np.median(np.abs(m["T1"] - T1) / T1))
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


def test_dask_overhead_per_task(benchmark):
    """2000 tasks that do nothing, on 2 workers: the scheduler's cost per
    task (the floor under a chunk's work)."""
    with _Cluster("2 workers"):
        x = da.zeros(2000, chunks=1)

        def run():
            return (x + 1).sum().compute()

        benchmark.pedantic(run, rounds=3, warmup_rounds=1)
        tasks = len((x + 1).sum().__dask_graph__())
    benchmark.extra_info["tasks"] = tasks
    benchmark.extra_info["s_per_task"] = benchmark.stats.stats.median / tasks
    benchmark.extra_info["atoms_per_s_median"] = 0.0
