"""blochsim on Dask (blochsim.distributed): lazy simulate, jacobian and vjp
of Dask arrays, DictionaryMatcher and PERK fitted on a LocalCluster of two
worker processes, equal to the in-process NumPy results (bitwise where the
module promises it), a worker killed mid-run, a dictionary larger than the
workers' memory, Zarr stores written, resumed and reopened, and the command
line on a cluster."""
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
pytest.importorskip("zarr")

from blochsim.estimators import PERK, DictionaryMatcher  # noqa: E402
from blochsim.simulators import FSESimulator, MRFSimulator, SPGRSimulator  # noqa: E402

FLIPS = np.concatenate([np.linspace(5, 60, 60), np.linspace(60, 2, 60)])
GRIDS = dict(T1=np.geomspace(300, 3000, 40), T2=np.geomspace(20, 300, 30), B1=np.linspace(0.8, 1.2, 5))


def _mrf(**kw):
    return MRFSimulator(flip=FLIPS, TR=10.0, states=16, **kw)


@pytest.fixture(scope="module")
def client():
    """Two worker processes on the loopback interface, one thread each."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0", memory_limit="2GiB") as cluster:
        with distributed.Client(cluster) as c:
            yield c


def _tissue(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(300, 2500, n), rng.uniform(20, 250, n), rng.uniform(0.8, 1.2, n)


def _noisy(s, sigma, seed):
    rng = np.random.default_rng(seed)
    return s + sigma * (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape))


# --------------------------------------------------------------------------
# import, pickling


def test_import_blochsim_never_imports_dask():
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import blochsim
        from blochsim.simulators import MRFSimulator
        from blochsim.estimators import DictionaryMatcher, PERK
        MRFSimulator(flip=np.full(10, 20.0), TR=10.0).simulate(T1=1000.0, T2=80.0)
        print(sorted(m for m in sys.modules if m == "dask" or m.startswith(("dask.", "distributed", "zarr"))))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_simulators_pickle_to_their_protocol():
    sim = _mrf(TI=20.0)
    s = sim.simulate(T1=1000.0, T2=80.0)
    assert "_stream_cache" in sim.__dict__
    blob = pickle.dumps(sim)
    back = pickle.loads(blob)
    assert "_stream_cache" not in back.__dict__  # caches are rebuilt, not shipped
    assert back is not sim and back._given.keys() == sim._given.keys()
    np.testing.assert_array_equal(back.simulate(T1=1000.0, T2=80.0), s)
    # one instance per process and protocol: a worker's tasks share its caches
    assert pickle.loads(blob) is back
    assert pickle.loads(pickle.dumps(_mrf(TI=30.0))) is not back
    # copies stay independent
    import copy
    c = copy.copy(sim)
    c.device = "cpu"
    assert c is not sim and sim.device is None
    d = copy.deepcopy(sim)
    assert d is not sim and d._given["flip"] is not sim._given["flip"]
    # an option pickle cannot hold (a lambda): cloudpickle, as Dask uses, still can
    import cloudpickle
    odd = _mrf()
    odd.note = lambda x: x
    back = cloudpickle.loads(cloudpickle.dumps(odd))
    assert back.note(3) == 3 and dask.base.tokenize(odd)


def test_a_worker_builds_a_simulator_once(client):
    sim = _mrf()

    def which(s, i):
        import os
        return os.getpid(), id(s)

    seen = client.gather(client.map(which, [sim] * 16, range(16), pure=False))
    per_worker = {}
    for pid, ident in seen:
        per_worker.setdefault(pid, set()).add(ident)
    assert all(len(ids) == 1 for ids in per_worker.values()), per_worker


def test_a_task_takes_its_workers_share_of_the_cpus():
    """A worker of two task threads: each task's host calls use half its
    CPUs (BLOCHSIM_NUM_THREADS = 2 here), decided when the call runs."""
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                                  dashboard_address=":0", env={"BLOCHSIM_NUM_THREADS": "2"}) as cluster:
        with distributed.Client(cluster) as c:
            def threads(s):
                from blochsim._engine import dispatch as _dispatch
                return s.threads, _dispatch.route(s.device, s.threads, {}).threads

            assert c.submit(threads, _mrf()).result() == (None, 1)
            assert c.submit(threads, _mrf(threads=2)).result() == (2, 2)  # asked for: kept


def test_device_auto_runs_on_the_host_without_a_gpu():
    import blochsim
    if blochsim.backends()["cuda"]["available"]:
        pytest.skip("this machine has a usable GPU")
    T1, T2, _ = _tissue(50)
    np.testing.assert_array_equal(_mrf(device="auto").simulate(T1=T1, T2=T2), _mrf().simulate(T1=T1, T2=T2))


# --------------------------------------------------------------------------
# lazy simulate, jacobian, vjp


def test_simulate_and_jacobian_of_dask_arrays_equal_numpy(client):
    sim = _mrf()
    T1, T2, B1 = _tissue(3000)
    lazy = sim.simulate(T1=da.from_array(T1, chunks=700), T2=T2, B1=B1)
    assert isinstance(lazy, da.Array) and lazy.shape == (3000, 120) and lazy.chunks[0] == (700,) * 4 + (200,)
    ref = sim.simulate(T1=T1, T2=T2, B1=B1)
    np.testing.assert_array_equal(lazy.compute(), ref)  # on the cluster
    with dask.config.set(scheduler="threads"):
        np.testing.assert_array_equal(lazy.compute(scheduler="threads"), ref)
    s, J = sim.jacobian(("T1", "T2", "B1"), T1=da.from_array(T1, chunks=1000), T2=T2, B1=B1)
    rs, rJ = sim.jacobian(("T1", "T2", "B1"), T1=T1, T2=T2, B1=B1)
    assert J.shape == rJ.shape
    s, J = dask.compute(s, J)
    np.testing.assert_array_equal(s, rs)
    np.testing.assert_array_equal(J, rJ)
    # one name: J shaped like the signal
    _, J1 = sim.jacobian("T2", T1=da.from_array(T1, chunks=1000), T2=T2)
    np.testing.assert_array_equal(J1.compute(), sim.jacobian("T2", T1=T1, T2=T2)[1])


def test_images_keep_their_chunks_and_closed_forms_their_precision(client):
    sim = _mrf()
    T1 = np.geomspace(300, 3000, 600).reshape(20, 30)
    lazy = sim.simulate(T1=da.from_array(T1, chunks=(5, 15)), T2=np.geomspace(20, 300, 30))
    assert lazy.chunks == ((5,) * 4, (15, 15), (120,))
    np.testing.assert_array_equal(lazy.compute(), sim.simulate(T1=T1, T2=np.geomspace(20, 300, 30)))
    spgr = SPGRSimulator(flip=[3.0, 15.0], TR=10.0)
    for dtype, ctype in ((np.float64, np.complex128), (np.float32, np.complex64)):
        x = T1.astype(dtype)
        got = spgr.simulate(T1=da.from_array(x, chunks=(10, 10)))
        assert got.dtype == ctype
        np.testing.assert_array_equal(got.compute(), spgr.simulate(T1=x))


def test_vjp_of_dask_arrays(client):
    sim = FSESimulator(ESP=8.0, flip=np.linspace(120, 170, 12))
    rng = np.random.default_rng(4)
    T2 = rng.uniform(30, 200, 2000)
    T1 = np.full((40, 1), 1000.0) * rng.uniform(0.8, 1.2, (1, 50))  # 40 x 50 voxels
    T2 = T2.reshape(40, 50)
    s, pullback = sim.vjp(("flip", "ESP", "T2", "T1", "M0"), T1=T1[:, :1], T2=da.from_array(T2, chunks=(10, 25)),
                          M0=1.0)
    rs, rpull = sim.vjp(("flip", "ESP", "T2", "T1", "M0"), T1=T1[:, :1], T2=T2, M0=1.0)
    np.testing.assert_array_equal(s.compute(), rs)
    g = pullback(2 * s)
    assert all(isinstance(v, da.Array) for v in g.values())
    g = dask.compute(g)[0]
    ref = rpull(2 * rs)
    for k in ref:
        assert g[k].shape == np.shape(ref[k]), k
        # the tissue array chunk by chunk: bitwise; sums over voxels: the
        # same values summed in another order
        if k == "T2":
            np.testing.assert_array_equal(g[k], ref[k])
        else:
            np.testing.assert_allclose(g[k], ref[k], rtol=1e-12)
    # the same graph on threads, on one thread and on the cluster: bitwise
    on_threads = dask.compute(pullback(2 * s), scheduler="threads")[0]
    serial = dask.compute(pullback(2 * s), scheduler="sync")[0]
    for k in g:
        np.testing.assert_array_equal(on_threads[k], g[k])
        np.testing.assert_array_equal(serial[k], g[k])


def test_lazy_refusals():
    sim = _mrf()
    T1 = da.from_array(np.full(10, 1000.0), chunks=5)
    with pytest.raises(TypeError, match=r"out= is not taken with Dask inputs"):
        sim.simulate(np.empty((10, 120), np.complex64), T1=T1, T2=80.0)
    with pytest.raises(TypeError, match=r"TR is a Dask array, but only tissue values may be"):
        sim.simulate(T1=T1, T2=80.0, TR=da.from_array(np.array(10.0)))
    with pytest.raises(ValueError, match=r"tissue shapes .* do not broadcast"):
        sim.simulate(T1=T1, T2=np.full(3, 80.0))
    s, pullback = sim.vjp("T2", T1=T1, T2=80.0)
    with pytest.raises(ValueError, match=r"the cotangent has shape \(10, 7\); the signal has \(10, 120\)"):
        pullback(np.ones((10, 7)))
    with pytest.raises(ValueError, match=r"T1 is a Dask array of unknown chunk sizes"):
        sim.simulate(T1=T1[T1 > 500], T2=80.0)
    with pytest.raises(TypeError, match=r"jacobian_vjp takes NumPy or device arrays, not Dask arrays"):
        sim.jacobian_vjp("T2", "flip", T1=T1, T2=80.0)
    # values are checked chunk by chunk when computed
    bad = da.from_array(np.array([1000.0, -1.0, 900.0, 800.0]), chunks=2)
    with pytest.raises(ValueError, match=r"T1 must be > 0 ms, got -1.0"):
        sim.simulate(T1=bad, T2=80.0).compute(scheduler="sync")


# --------------------------------------------------------------------------
# dictionaries


def _signals(n=1500, seed=1):
    T1, T2, B1 = _tissue(n, seed)
    return _noisy(1.3 * _mrf().simulate(T1=T1, T2=T2, B1=B1), 0.01, seed), B1


@pytest.mark.parametrize("rank", [None, 8, "auto"])
def test_dictionary_on_the_cluster_equals_in_process(client, rank):
    sig, _ = _signals()
    local = DictionaryMatcher(_mrf(), rank=rank, chunk=1024)
    remote = DictionaryMatcher(_mrf(), rank=rank, chunk=1024)
    local.auto_bytes = remote.auto_bytes = 1 << 20  # "auto" compresses this 6000-atom dictionary
    local.fit(**GRIDS)
    remote.fit(dask=True, **GRIDS)
    assert isinstance(remote._atoms, da.Array) and remote.compressed_rank == local.compressed_rank
    # the atoms' parameters: lazy, from the grids, equal to the in-process table
    assert isinstance(remote.params["T1"], da.Array)
    for k in GRIDS:
        np.testing.assert_array_equal(remote.params[k].compute(), local.params[k])
    if rank is not None:
        assert remote.compressed_rank is not None
    a, b = local.map(sig), remote.map(sig)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    top = remote.match(sig[:50], k=3)
    np.testing.assert_array_equal(top["index"], local.match(sig[:50], k=3)["index"])
    # Dask signals: Dask maps shaped like the voxels
    lazy = remote.map(da.from_array(sig.reshape(30, 50, -1), chunks=(10, 50, -1)))
    assert isinstance(lazy["T1"], da.Array) and lazy["T1"].shape == (30, 50)
    np.testing.assert_array_equal(lazy["T1"].compute().reshape(-1), a["T1"])
    # a dictionary fitted in this process, against Dask signals
    np.testing.assert_array_equal(local.map(da.from_array(sig, chunks=(400, -1)))["index"].compute(), a["index"])


def test_dictionary_streamed_larger_than_the_workers_memory():
    """1.4 GB of full atoms (350,000 x 500, complex64) never stored: the
    match simulates them chunk by chunk on two workers of 600 MiB each and
    finds every noise-free signal's own atom."""
    sim = MRFSimulator(flip=np.concatenate([np.linspace(5, 60, 250), np.linspace(60, 2, 250)]), TR=10.0, states=16)
    grids = dict(T1=np.geomspace(200, 3000, 100), T2=np.geomspace(10, 300, 100), B1=np.linspace(0.8, 1.2, 35))
    n = 100 * 100 * 35
    assert n * 500 * 8 > 2 * 600 * 2**20
    pick = np.random.default_rng(3).choice(n, 64, replace=False)
    i1, i2, i3 = np.unravel_index(pick, (100, 100, 35))
    signals = 0.8 * sim.simulate(T1=grids["T1"][i1], T2=grids["T2"][i2], B1=grids["B1"][i3])
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0", memory_limit="600MiB") as cluster:
        with distributed.Client(cluster):
            dm = DictionaryMatcher(sim, rank=None, chunk=8192).fit(dask=True, store=None, **grids)
            maps = dm.map(signals)
    np.testing.assert_array_equal(maps["index"], pick)
    np.testing.assert_allclose(np.abs(maps["M0"]), 0.8, rtol=1e-5)


class _Failing(MRFSimulator):
    """Counts its calls; the one numbered ``fail_at`` raises, as a worker
    dying mid-fit would."""

    calls, fail_at = 0, None

    def simulate(self, out=None, **values):
        _Failing.calls += 1
        if _Failing.calls == _Failing.fail_at:
            raise RuntimeError("a worker died")
        return super().simulate(out=out, **values)


def test_zarr_dictionary_written_resumed_and_reopened(tmp_path):
    grids = dict(T1=np.array([300.0, 500.0, 700.0, 900.0, 1100.0, 1500.0, 2000.0, 3000.0]),
                 T2=np.geomspace(20, 300, 512))
    path = tmp_path / "dictionary.zarr"
    _Failing.calls, _Failing.fail_at = 0, 5  # the probe atom, three chunks, then the failure
    sim = _Failing(flip=FLIPS, TR=10.0, states=16)
    with dask.config.set(scheduler="sync"):
        with pytest.raises(RuntimeError, match="a worker died"):
            DictionaryMatcher(sim, rank=None, chunk=512).fit(dask=True, store=path, **grids)
        with pytest.raises(ValueError, match=r"is incomplete \(a fit that stopped\)"):
            DictionaryMatcher.load(path, simulator=sim)
        import zarr
        done = zarr.open_group(str(path), mode="r")["done"][...]
        assert done.sum() == 3  # the chunks written before the failure
        _Failing.calls, _Failing.fail_at = 0, None
        resumed = DictionaryMatcher(sim, rank=None, chunk=512).fit(dask=True, store=path, **grids)
        # one probe atom, then only the missing chunks
        assert _Failing.calls == 1 + len(done) - done.sum()
        _Failing.calls = 0
        again = DictionaryMatcher(sim, rank=None, chunk=512).fit(dask=True, store=path, **grids)
        assert _Failing.calls == 1  # a complete store is opened, not simulated
        reopened = DictionaryMatcher.load(path, simulator=sim)
        fresh = DictionaryMatcher(sim, rank=None, chunk=512).fit(**grids)
        sig = _noisy(sim.simulate(T1=np.array([600.0, 1200.0]), T2=np.array([50.0, 90.0])), 0.001, 0)
        ref = fresh.map(sig)
        for dm in (resumed, again, reopened):
            got = dm.map(sig)
            for k in ref:
                np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
        with pytest.raises(ValueError, match=r"holds another dictionary"):
            DictionaryMatcher(sim, rank=5, chunk=512).fit(dask=True, store=path, **grids)
        with pytest.raises(ValueError, match=r"was made by another simulator or protocol"):
            DictionaryMatcher.load(path, simulator=_Failing(flip=FLIPS, TR=12.0, states=16))
        # where and on how many threads it runs is not part of the dictionary
        DictionaryMatcher(_Failing(flip=FLIPS, TR=10.0, states=16, threads=1), rank=None,
                          chunk=512).fit(dask=True, store=path, **grids)


def test_zarr_dictionary_of_a_shipped_simulator_reopens_without_it(client, tmp_path):
    path = tmp_path / "mrf.zarr"
    dm = DictionaryMatcher(_mrf(TI=20.0), chunk=1024)
    dm.auto_bytes = 1 << 20
    dm.fit(dask=True, store=path, **GRIDS)
    back = DictionaryMatcher.load(path)
    assert type(back.simulator) is MRFSimulator and back.compressed_rank == dm.compressed_rank
    sig, _ = _signals(200)
    sig = _noisy(1.3 * _mrf(TI=20.0).simulate(T1=np.full(200, 800.0), T2=np.full(200, 70.0)), 0.01, 0)
    a, b = dm.map(sig), back.map(sig)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_dictionary_refusals(tmp_path):
    dm = DictionaryMatcher(_mrf())
    with pytest.raises(ValueError, match=r"store='x.zarr' needs dask=True"):
        dm.fit(store="x.zarr", **GRIDS)
    with pytest.raises(ValueError, match=r"groups is not available with dask=True"):
        DictionaryMatcher(_mrf(), groups=4).fit(dask=True, **GRIDS)
    with pytest.raises(ValueError, match=r"a given dictionary is fitted in this process"):
        dm.fit((np.ones((3, 120), np.complex64), {"T1": np.ones(3)}), dask=True)
    with pytest.raises(TypeError, match=r"store must be 'memory', a path or None, got 3"):
        dm.fit(dask=True, store=3, **GRIDS)
    (tmp_path / "other").mkdir()
    import zarr
    zarr.open_group(str(tmp_path / "other"), mode="w")
    with pytest.raises(ValueError, match=r"exists and is not a blochsim dictionary store"):
        dm.fit(dask=True, store=tmp_path / "other", **GRIDS)
    with dask.config.set(scheduler="sync"):
        lazy = DictionaryMatcher(_mrf()).fit(dask=True, T1=np.geomspace(300, 3000, 5), T2=np.geomspace(20, 300, 5))
        with pytest.raises(ValueError, match=r"saved by fit\(..., dask=True, store=path\)"):
            lazy.save(tmp_path / "d.npz")
        with pytest.raises(ValueError, match=r"signals have 7 contrasts"):
            lazy.map(da.ones((4, 7), chunks=2))
        with pytest.raises(ValueError, match=r"signals are not finite at voxel"):
            lazy.map(np.full((2, 120), np.nan))


# --------------------------------------------------------------------------
# PERK


def test_perk_on_the_cluster_is_bitwise_the_in_process_fit(client):
    sim = _mrf()
    ranges = dict(T1=(300.0, 2500.0), T2=(20.0, 250.0), M0=(0.5, 1.5), B1=(0.8, 1.2))
    kw = dict(noise_std=0.005, samples=6000, known="B1", uncertainty=True, **ranges)
    local = PERK(sim, n_features=300).fit(**kw)
    for chunk in (1024, 4096, 8192):  # any grouping of the training blocks, in process or on two workers
        for lazy in (False, True):
            other = PERK(sim, n_features=300).fit(chunk=chunk, dask=lazy, **kw)
            for k in local._model:
                np.testing.assert_array_equal(other._model[k], local._model[k], err_msg=f"{k}, {chunk}, {lazy}")
    sig, B1 = _signals(900)
    a = local.map(sig, known={"B1": B1}, uncertainty=True)
    b = local.map(da.from_array(sig.reshape(30, 30, -1), chunks=(10, 30, -1)), known={"B1": B1.reshape(30, 30)},
                  uncertainty=True)
    assert isinstance(b["T1"], da.Array)
    for k in a:
        np.testing.assert_array_equal(b[k].compute().reshape(-1), a[k])
    with pytest.raises(TypeError, match=r"PERK.vjp takes NumPy arrays, not Dask arrays"):
        local.vjp(da.from_array(sig, chunks=(300, -1)), known={"B1": B1})


# --------------------------------------------------------------------------
# a worker lost


def test_a_worker_killed_mid_run_gives_the_same_result():
    # 100 playings of a 100-TR train, the last recorded: seconds of work, small outputs
    sim = MRFSimulator(flip=np.linspace(5, 60, 100), TR=10.0, states=32, repetitions=100)
    T1, T2, _ = _tissue(120_000, 7)
    ref = sim.simulate(T1=T1, T2=T2)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster:
        with distributed.Client(cluster) as c:
            lazy = sim.simulate(T1=da.from_array(T1, chunks=4000), T2=T2)
            future = c.compute(lazy)
            pids = c.run(os.getpid)
            deadline = time.monotonic() + 60
            while not any(c.processing().values()) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            assert not future.done()
            os.kill(next(iter(pids.values())), signal.SIGKILL)
            got = future.result(timeout=300)
            assert set(c.run(os.getpid).values()) != set(pids.values())  # the nanny started another
    np.testing.assert_array_equal(got, ref)


# --------------------------------------------------------------------------
# the command line


def test_the_main_job_on_a_local_cluster_equals_the_job_in_process(tmp_path):
    args = ["--size", "24", "--trs", "100", "--maps", "", "--quiet"]
    run = [sys.executable, "-m", "blochsim"]
    local = subprocess.run(run + args, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    remote = subprocess.run(run + args + ["--workers", "2"], capture_output=True, text=True, cwd=tmp_path,
                            timeout=600)
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    assert "Dask cluster at tcp://" in remote.stdout and "2 workers" in remote.stdout

    def table(out):
        return [line for line in out.splitlines() if "%" in line]

    assert table(remote.stdout) == table(local.stdout) and len(table(local.stdout)) == 10
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster:
        at = subprocess.run(run + args + ["--scheduler", cluster.scheduler_address], capture_output=True,
                            text=True, cwd=tmp_path, timeout=600)
    assert at.returncode == 0, at.stderr
    assert table(at.stdout) == table(local.stdout)
    gone = subprocess.run(run + args + ["--scheduler", "tcp://127.0.0.1:9"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert gone.returncode == 2 and "no Dask scheduler answered at tcp://127.0.0.1:9" in gone.stderr
    bad = subprocess.run(run + ["--workers", "0"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "--workers must be >= 1, got 0" in bad.stderr
    both = subprocess.run(run + ["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], capture_output=True,
                          text=True, cwd=tmp_path)
    assert both.returncode == 2 and "give --scheduler or --workers, not both" in both.stderr


@pytest.mark.gpu
def test_a_worker_runs_its_chunks_on_its_gpu():
    """device="auto": a worker with a usable GPU plays its chunks there (the
    route its simulator takes), equal to the host within single precision."""
    sim = _mrf(device="auto")
    T1, T2, _ = _tissue(20_000, 5)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster:
        with distributed.Client(cluster) as c:
            def route():
                from blochsim._engine import dispatch as _dispatch
                return _dispatch.route("auto", None, {}).device

            assert list(c.run(route).values()) == ["cuda"]
            got = sim.simulate(T1=da.from_array(T1, chunks=5000), T2=T2).compute()
            # a dictionary's atoms projected on the worker's card: the same match as the host's
            remote = DictionaryMatcher(sim, rank=8, chunk=1024).fit(dask=True, **GRIDS)
            sig, _ = _signals()
            on_card = remote.map(sig)
    ref = _mrf().simulate(T1=T1, T2=T2)
    assert np.max(np.abs(got - ref)) <= 1e-5 * np.max(np.abs(ref))
    local = DictionaryMatcher(_mrf(), rank=8, chunk=1024).fit(**GRIDS)
    assert np.mean(local.map(sig)["index"] == on_card["index"]) > 0.99
