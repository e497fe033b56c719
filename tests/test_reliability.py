"""Reliability: memory refused before allocation, empty inputs giving empty
results, Ctrl-C stopping a long call, and concurrent calls (threads, fork)
giving the bitwise results of serial ones."""
import multiprocessing
import os
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import pytest

import blochsim
from blochsim import Delay, Dephase, Excitation, Readout, Sequence, Simulator, _core, simulators as S
from blochsim._engine import memory as _memory
from blochsim.estimators import PERK, DictionaryMatcher, LookupTable, NonlinearLeastSquares
from interrupts import assert_ctrl_c_stops

TENSOR = dict(Dxx=1.5, Dyy=1.0, Dzz=0.5, Dxy=0.1, Dxz=0.0, Dyz=0.0)
MP2 = dict(TI=[700.0, 2500.0], flip=[4.0, 5.0], TR=5000.0, TR_gre=7.0, n_readouts=160)

# every shipped simulator: (class, protocol, tissue of one voxel)
SHIPPED = [
    (S.FSESimulator, dict(ESP=5.0, flip=np.full(4, 150.0)), dict(T1=1000.0, T2=80.0)),
    (S.HyperechoSimulator, dict(flip=[30.0, 70.0, 110.0], phases=[0.0, 40.0, 10.0], ESP=5.0), dict(T1=1000.0, T2=80.0)),
    (S.MultiEchoSESimulator, dict(n_echoes=4, ESP=10.0), dict(T1=1000.0, T2=80.0)),
    (S.MRFSimulator, dict(flip=np.full(8, 20.0), TR=10.0, states=8), dict(T1=1000.0, T2=80.0)),
    (S.TrueFISPSimulator, dict(flip=40.0, TR=5.0, nshots=10), dict(T1=1000.0, T2=80.0)),
    (S.IRbSSFPSimulator, dict(flip=45.0, TR=5.0, nshots=20, TI=15.0), dict(T1=1000.0, T2=80.0)),
    (S.DESSSimulator, dict(flip=30.0, TR=18.0, TE=4.0, repetitions=20), dict(T1=1000.0, T2=80.0)),
    (S.fmSSFPSimulator, dict(flip=30.0, TR=5.0, n=20, sweep=10.0), dict(T1=1000.0, T2=80.0)),
    (S.HSFPSimulator, dict(flip=np.full(20, 30.0), TR=4.5, TI=12.0, inversion=True), dict(T1=1000.0, T2=80.0)),
    (S.MOLLISimulator, dict(TI=[110.0, 190.0], RR=900.0, flip=35.0, TR=2.6, n_readouts=12), dict(T1=1000.0, T2=80.0)),
    (S.StimulatedEchoSimulator, dict(TE=10.0, TM=20.0), dict(T1=1000.0, T2=80.0)),
    (S.FLASHSimulator, dict(flip=10.0, TR=8.0, TE=3.0, n=5), dict(T1=1000.0, T2=80.0)),
    (S.MultiEchoGRESimulator, dict(flip=20.0, TR=30.0, TE=[5.0, 10.0], n=5), dict(T1=1000.0, T2=80.0)),
    (S.CESTSimulator, dict(offsets=[1.0, 2.0]), dict(T1=1000.0, T2=80.0)),
    (S.MTSimulator, dict(flip=10.0, TR=30.0, n_tr=5, exc_duration=1.0), dict(T1=1000.0, T2=80.0, bound_fraction=0.1)),
    (S.SPGRSimulator, dict(flip=10.0, TR=10.0), dict(T1=1000.0, T2star=40.0)),
    (S.DoubleAngleSimulator, dict(flip=60.0), dict(T1=1000.0, B1=1.0)),
    (S.DESPOT1Simulator, dict(flip=[5.0, 10.0], TR=5.0), dict(T1=1000.0)),
    (S.DESPOT2Simulator, dict(flip=[5.0, 10.0], TR=5.0), dict(T1=1000.0, T2=80.0)),
    (S.bSSFPSimulator, dict(flip=30.0, TR=5.0), dict(T1=1000.0, T2=80.0)),
    (S.InversionRecoverySimulator, dict(TI=[100.0, 400.0]), dict(T1=1000.0)),
    (S.SpinEchoSimulator, dict(TE=[10.0, 40.0], TR=5000.0), dict(T1=1000.0, T2=80.0)),
    (S.DiffusionSimulator, dict(b=[0.0, 800.0], TE=70.0, TR=3000.0), dict(T1=1000.0, T2=80.0, D=1.0)),
    (S.DiffusionTensorSimulator, dict(b=[0.0, 1000.0], directions=[[0.0, 0.0, 1.0]] * 2, TE=80.0),
     dict(T1=1000.0, T2=80.0, **TENSOR)),
    (S.WaterFatSimulator, dict(TE=[1.0, 2.0]), dict(fat_fraction=0.2, T2star=30.0)),
    (S.ASLSimulator, dict(times=[300.0, 1000.0]), dict(CBF=60.0, ATT=800.0, T1=1600.0)),
    (S.LookLockerSimulator, dict(flip=6.0, spacing=80.0, n=12, TI=30.0, TR=2500.0), dict(T1=1000.0)),
    (S.MPnRAGESimulator, dict(TI=[700.0], flip=[5.0], TR=3000.0, TR_gre=7.0, n_readouts=100), dict(T1=1000.0)),
    (S.MPRAGESimulator, dict(TI=900.0, flip=8.0, TR=2300.0, TR_gre=7.0, n_readouts=176), dict(T1=1000.0)),
    (S.MP2RAGESimulator, MP2, dict(T1=1000.0)),
]
IDS = [c.__name__ for c, _, _ in SHIPPED]


def test_the_catalogue_covers_every_shipped_simulator():
    shipped = {getattr(S, n) for n in S.__all__ if n.endswith("Simulator")}
    assert shipped == {c for c, _, _ in SHIPPED}


# --------------------------------------------------------------------------
# Empty and degenerate inputs


def _empty(tissue, shape=(0,)):
    """The tissue with its first property an empty array of `shape`."""
    first = next(iter(tissue))
    return {**tissue, first: np.full(shape, tissue[first])}


@pytest.mark.parametrize("cls, proto, tissue", SHIPPED, ids=IDS)
def test_zero_voxels_give_empty_results(cls, proto, tissue):
    """simulate, jacobian and vjp of zero voxels (shapes (0,) and (3, 0)):
    empty results shaped as NumPy broadcasting would give, and a pullback of
    zero gradients."""
    sim = cls(**proto)
    samples = sim.simulate(**tissue).shape[-1]
    for shape in [(0,), (3, 0)]:
        t = _empty(tissue, shape)
        s = sim.simulate(**t)
        assert s.shape == shape + (samples,) and s.dtype in (np.complex64, np.complex128, np.float64)
        name = next(iter(tissue))
        s, J = sim.jacobian(name, **t)
        assert s.shape == shape + (samples,) and J.shape == shape + (samples,)
        s, J = sim.jacobian((name,), **t)
        assert J.shape == shape + (1, samples)
        s, pullback = sim.vjp((name,), **t)
        g = pullback(np.zeros(s.shape, np.complex64))
        assert g[name].shape == shape


@pytest.mark.parametrize("cls, proto, tissue", [c for c in SHIPPED if issubclass(c[0], blochsim.Simulator)],
                         ids=[c.__name__ for c, _, _ in SHIPPED if issubclass(c, blochsim.Simulator)])
def test_zero_voxels_protocol_pullback_is_zero(cls, proto, tissue):
    """A protocol gradient over zero voxels is a sum over nothing: zeros of
    the protocol parameter's shape."""
    sim = cls(**proto)
    name = next(k for k, v in proto.items() if np.asarray(v).dtype.kind == "f")
    s, pullback = sim.vjp((name,), **_empty(tissue))
    g = pullback(np.zeros(s.shape, np.complex64))
    np.testing.assert_array_equal(g[name], np.zeros(np.shape(proto[name])))


def test_zero_readouts_and_empty_trains():
    """A sequence with no readout gives (voxels, 0); a train of no pulses
    behaves as its limit (no samples)."""
    from blochsim.sequence import Delay, Excitation

    class NoReadout(blochsim.Simulator):
        def repetition(self, p):
            return Excitation(90.0) @ Delay(10.0)

    s = NoReadout().simulate(T1=np.full(4, 1000.0), T2=80.0)
    assert s.shape == (4, 0)
    s, J = NoReadout().jacobian(("T1", "T2"), T1=np.full(4, 1000.0), T2=80.0)
    assert s.shape == (4, 0) and J.shape == (4, 2, 0)
    for cls, proto in [(S.MRFSimulator, dict(flip=[], TR=10.0)), (S.FSESimulator, dict(flip=[], ESP=5.0)),
                       (S.SpinEchoSimulator, dict(TE=[], TR=5000.0)),
                       (S.InversionRecoverySimulator, dict(TI=[]))]:
        out = cls(**proto).simulate(T1=np.full(3, 1000.0), T2=80.0) if cls is not S.InversionRecoverySimulator \
            else cls(**proto).simulate(T1=np.full(3, 1000.0))
        assert out.shape == (3, 0), cls.__name__


def test_estimators_on_zero_voxels():
    """Estimators map zero signals to empty maps."""
    sim = S.InversionRecoverySimulator(TI=[100.0, 400.0, 1200.0])
    grid = dict(T1=np.geomspace(200.0, 3000.0, 50))
    for est in [DictionaryMatcher(sim).fit(**grid), LookupTable(sim, feature=lambda s: np.abs(s[..., 0])).fit(**grid),
                NonlinearLeastSquares(sim).fit(T1=(50.0, 5000.0))]:
        maps = est.map(np.zeros((0, 3), np.complex64))
        assert all(np.shape(v) == (0,) for v in maps.values()), type(est).__name__
    perk = PERK(sim, n_features=50).fit(samples=200, T1=(200.0, 3000.0))
    assert perk.map(np.zeros((0, 3), np.complex64))["T1"].shape == (0,)
    assert perk.map(np.zeros((2, 0, 3), np.complex64))["T1"].shape == (2, 0)
    # a simulator with no samples identifies nothing: fitting it is refused
    silent = S.InversionRecoverySimulator(TI=[])
    for name, fit in [("DictionaryMatcher", lambda: DictionaryMatcher(silent).fit(**grid)),
                      ("LookupTable", lambda: LookupTable(silent, feature=lambda s: np.abs(s).sum(-1)).fit(**grid)),
                      ("NonlinearLeastSquares", lambda: NonlinearLeastSquares(silent).fit(T1=(50.0, 5000.0))),
                      ("PERK", lambda: PERK(silent, n_features=10).fit(samples=20, T1=(200.0, 3000.0)))]:
        with pytest.raises(ValueError, match=f"{name}.fit: the simulator gives no samples"):
            fit()


# --------------------------------------------------------------------------
# Memory, before anything is allocated


# a neutral working folder for the child interpreters, so that they import the installed package
# (from the repository root, `python -c` would import the source folder instead)
CHILD_CWD = tempfile.gettempdir()


def _run(code, timeout=120):
    """Run code in a fresh interpreter: (returncode, stdout + stderr)."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=timeout, cwd=CHILD_CWD)
    return r.returncode, r.stdout + r.stderr


def test_a_huge_state_count_is_refused_not_a_crash():
    # (a train reaches 1 + its shifts: one shift of 10^9 orders needs them all)
    code, out = _run("""
        from blochsim import Delay, Dephase, Excitation, Readout, Sequence, Simulator

        class Wide(Simulator):
            tissue_properties = ("T1", "T2")

            def repetition(self, p):
                return Sequence([Excitation(90.0), Dephase(10**9), Delay(1.0), Readout()])

        try:
            Wide(states=10**9).simulate(T1=1000.0, T2=80.0)
        except MemoryError as e:
            print("MemoryError:", e)
    """)
    assert code == 0, out
    assert "MemoryError: Wide.simulate needs" in out and "states=1000000000" in out
    assert "lower states" in out


def test_the_kernels_refuse_a_workspace_that_does_not_fit(monkeypatch):
    """Past the Python check (switched off here), the C++ entry refuses the
    workspace itself with a status that becomes MemoryError, before
    allocating it."""
    monkeypatch.setattr(_memory, "check_host", lambda *a, **k: None)

    class Wide(Simulator):
        """One shift of 10^9 orders: a train that reaches every state."""
        tissue_properties = ("T1", "T2")

        def repetition(self, p):
            return Sequence([Excitation(90.0), Dephase(10**9), Delay(1.0), Readout()])

    sim = Wide(states=10**9)
    for call in (lambda: sim.simulate(T1=1000.0, T2=80.0), lambda: sim.jacobian("T1", T1=1000.0, T2=80.0)):
        with pytest.raises(MemoryError, match="workspace does not fit"):
            call()


def test_a_broadcast_past_memory_is_refused_with_a_chunk_size():
    sim = S.MRFSimulator(flip=np.full(10, 20.0), TR=10.0)
    with pytest.raises(MemoryError, match=r"MRFSimulator.simulate needs .* of host memory \(100,000,000,000 voxels"
                                          r".*simulate at most [\d,]+ voxels a call"):
        sim.simulate(T1=np.ones((100000, 1)) * 1000.0, T2=np.ones((1, 1000000)) * 80.0)


def test_memory_refusals_name_the_call_and_a_chunk_that_fits(monkeypatch):
    """With 4 MiB available, each entry refuses what does not fit and says
    how many voxels would; a call of that many runs."""
    monkeypatch.setattr(_memory, "available", lambda: 4.0 * 2**20)
    monkeypatch.setattr(_memory, "_UNCHECKED", 0.0)
    sim = S.MRFSimulator(flip=np.full(100, 20.0), TR=10.0, states=8)
    T1 = np.full(20000, 1000.0)
    calls = {
        "simulate": lambda t: sim.simulate(T1=t, T2=80.0),
        "jacobian": lambda t: sim.jacobian(("T1", "T2"), T1=t, T2=80.0),
        "vjp": lambda t: sim.vjp(("flip",), T1=t, T2=80.0),
        "jacobian_vjp": lambda t: sim.jacobian_vjp("T2", ("flip",), T1=t, T2=80.0),
    }
    for what, call in calls.items():
        with pytest.raises(MemoryError, match=f"MRFSimulator.{what} needs") as e:
            call(T1)
        most = int(str(e.value).split("at most ")[1].split(" voxels")[0].replace(",", ""))
        assert 0 < most < T1.size
        call(T1[:most])
    pooled = S.MTSimulator(flip=10.0, TR=30.0, n_tr=20, exc_duration=1.0)
    many = np.full(1_000_000, 1000.0)
    with pytest.raises(MemoryError, match="MTSimulator.simulate needs"):
        pooled.simulate(T1=many, T2=80.0, bound_fraction=0.1)
    with pytest.raises(MemoryError, match="MTSimulator.jacobian needs"):
        pooled.jacobian("T1", T1=many, T2=80.0, bound_fraction=0.1)
    with pytest.raises(MemoryError, match="MTSimulator.vjp needs"):
        pooled.vjp(("flip",), T1=many, T2=80.0, bound_fraction=0.1)


def test_memory_message_units():
    assert _memory.size(512) == "512 B"
    assert _memory.size(3 * 2**30) == "3.0 GiB"
    assert _memory.available() > 0


# --------------------------------------------------------------------------
# Ctrl-C


def test_ctrl_c_stops_a_long_host_call_and_the_pool_still_works():
    """A real SIGINT sent to a process in a 4-million-atom host call: it
    raises KeyboardInterrupt within 2 s, and a call afterwards gives the
    serial result."""
    assert_ctrl_c_stops("""
        import sys, time
        import numpy as np
        from blochsim.simulators import MRFSimulator
        flips = np.concatenate([np.linspace(5, 60, 250), np.linspace(60, 2, 250)])
        sim = MRFSimulator(flip=flips, TR=10.0, states=32, threads=2)
        small = sim.simulate(T1=np.full(64, 1000.0), T2=80.0)
        T1 = np.full(4_000_000, 1000.0)
        print("ready", flush=True)
        t0 = time.monotonic()
        try:
            sim.simulate(T1=T1, T2=80.0)
            print("finished", flush=True)
        except KeyboardInterrupt:
            print("interrupted after %.3f" % (time.monotonic() - t0), flush=True)
        print("again", bool(np.array_equal(sim.simulate(T1=np.full(64, 1000.0), T2=80.0), small)), flush=True)
    """, wait=1.0, timeout=60)


def test_an_interrupt_from_a_handler_is_the_handlers_exception():
    """A SIGINT handler that raises another exception: the call stops with
    that exception (what the handler raised, not a generic one)."""
    code, out = _run("""
        import os, signal, threading
        import numpy as np
        from blochsim.simulators import MRFSimulator
        class Stop(Exception):
            pass
        def handler(sig, frame):
            raise Stop("asked to stop")
        signal.signal(signal.SIGINT, handler)
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        sim = MRFSimulator(flip=np.full(500, 20.0), TR=10.0, states=32, threads=2)
        try:
            sim.simulate(T1=np.full(4_000_000, 1000.0), T2=80.0)
        except Stop as e:
            print("stopped:", e)
    """)
    assert code == 0 and "stopped: asked to stop" in out, out


# --------------------------------------------------------------------------
# Concurrency


def _in_threads(work, count, repeat=3):
    """work(k) called `repeat` times on each of `count` threads started
    together: the results in the order they came, or the first error."""
    got, errors = [], []

    def run(k):
        try:
            for _ in range(repeat):
                got.append(work(k))
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return got


def _serial_results():
    sim = S.MRFSimulator(flip=np.linspace(5.0, 60.0, 60), TR=10.0, states=16, threads=2)
    T1 = np.geomspace(200.0, 3000.0, 300)
    return sim, T1, sim.simulate(T1=T1, T2=80.0), sim.jacobian(("T1", "T2"), T1=T1, T2=80.0)[1]


def test_calls_from_many_threads_are_bitwise_the_serial_ones():
    """Eight Python threads sharing one simulator (its packing caches
    included, fresh at the start) and the host pool: every result equals
    the serial one bit for bit."""
    _, T1, want_s, want_j = _serial_results()
    sim = S.MRFSimulator(flip=np.linspace(5.0, 60.0, 60), TR=10.0, states=16, threads=2)

    def work(k):
        if k % 2:
            return "s", sim.simulate(T1=T1, T2=80.0)
        return "j", sim.jacobian(("T1", "T2"), T1=T1, T2=80.0)[1]

    got = _in_threads(work, 8)
    assert len(got) == 24
    for kind, value in got:
        np.testing.assert_array_equal(value, want_s if kind == "s" else want_j)


def _child_simulate(queue):
    sim, T1, want_s, _ = _serial_results()
    queue.put(bool(np.array_equal(sim.simulate(T1=T1, T2=80.0), want_s)))


@pytest.mark.skipif(sys.platform != "linux", reason="fork is the default start method on Linux")
def test_the_host_pool_works_after_fork():
    """A parent that has run threaded calls forks; the children's threaded
    calls give the serial results."""
    _serial_results()  # the parent's threads have run
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child_simulate, args=(queue,)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == [True, True] and all(p.exitcode == 0 for p in procs)


def test_the_cxx_entries_hold_no_process_wide_state():
    """The interrupt poll is per thread: installing none elsewhere leaves a
    call on this thread unaffected (a smoke test of the thread-local hook)."""
    sim = S.MRFSimulator(flip=np.full(10, 20.0), TR=10.0, states=8, threads=2)
    a = sim.simulate(T1=np.full(100, 1000.0), T2=80.0)
    t = threading.Thread(target=lambda: sim.simulate(T1=np.full(100, 1000.0), T2=80.0))
    t.start()
    t.join()
    np.testing.assert_array_equal(sim.simulate(T1=np.full(100, 1000.0), T2=80.0), a)
    assert os.getpid() > 0


def test_estimators_shared_between_threads_are_bitwise_serial():
    """A fitted DictionaryMatcher and PERK mapped from four threads at once
    give the serial maps bit for bit."""
    sim = S.MRFSimulator(flip=np.linspace(5.0, 60.0, 40), TR=10.0, states=16, threads=2)
    grid = dict(T1=np.geomspace(300.0, 3000.0, 30), T2=np.geomspace(20.0, 300.0, 20))
    matcher = DictionaryMatcher(sim).fit(**grid)
    perk = PERK(sim, n_features=100).fit(samples=500, T1=(300.0, 3000.0), T2=(20.0, 300.0))
    signals = sim.simulate(T1=np.geomspace(400.0, 2500.0, 64), T2=np.geomspace(30.0, 250.0, 64))
    want = {"dict": matcher.map(signals), "perk": perk.map(signals)}

    def work(k):
        kind = "dict" if k % 2 else "perk"
        return kind, (matcher if kind == "dict" else perk).map(signals)

    for kind, maps in _in_threads(work, 4):
        for k, v in want[kind].items():
            np.testing.assert_array_equal(maps[k], v)


def test_device_memory_refusal_names_a_chunk(monkeypatch):
    """The device check (host-side logic, the free memory reported by the
    driver replaced): a call past the free memory is refused with a chunk
    size; one within it passes."""
    monkeypatch.setattr(_core, "memory_info", lambda: (10 * 2**20, 80 * 2**30))
    with pytest.raises(MemoryError, match=r"FSESimulator.simulate needs 20.0 MiB of device memory \(1,048,576 voxels "
                                          r"x 20 B\) and 10.0 MiB is available: simulate at most 524,288 voxels a "
                                          r"call .*, or pass NumPy arrays with device='cuda'"):
        _memory.check_device("FSESimulator.simulate", 2**20, 20 * 2**20)
    _memory.check_device("FSESimulator.simulate", 2**20, 5 * 2**20)


def test_a_zero_stride_broadcast_past_memory_is_refused_before_any_voxel_is_allocated():
    """Tissue given as broadcast views of 1e11 voxels (a few bytes each in
    memory): every method is refused by blochsim's memory check, which runs
    before any per-voxel array is made (not by NumPy failing to allocate)."""
    big = (100000, 1000000)
    T1 = np.broadcast_to(np.float64(1000.0), big)
    T2 = np.broadcast_to(np.linspace(50.0, 90.0, 1000000), big)
    sim = S.MRFSimulator(flip=np.full(10, 20.0), TR=10.0)
    calls = {"simulate": lambda: sim.simulate(T1=T1, T2=T2),
             "jacobian": lambda: sim.jacobian(("T1", "T2"), T1=T1, T2=T2),
             "vjp": lambda: sim.vjp("T2", T1=T1, T2=T2),
             "pooled simulate": lambda: sim.simulate(T1=T1, T2=T2, bound_fraction=0.1, bound_exchange=5.0),
             "pooled vjp": lambda: sim.vjp("T2", T1=T1, T2=T2, bound_fraction=0.1, bound_exchange=5.0)}
    for what, call in calls.items():
        with pytest.raises(MemoryError, match=r"needs .* of host memory \(100,000,000,000 voxels") as e:
            call()
        assert "MRFSimulator." in str(e.value), what
    # a bad value inside the view is still found and named
    with pytest.raises(ValueError, match=r"T2 must be > 0 ms, got -1\.0 at index \(0, 3\)"):
        bad = np.linspace(50.0, 90.0, 1000000)
        bad[3] = -1.0
        sim.simulate(T1=T1, T2=np.broadcast_to(bad, big))


def test_results_reuse_the_memory_of_dropped_ones():
    """A new result of a megabyte or more comes from the memory a dropped
    result of the same size gave back (its pages already mapped), never
    from memory an array still uses; the values are the kernels' either way."""
    _core.release_kept_results()
    assert _core.kept_result_bytes() == 0
    sim = S.MRFSimulator(flip=np.linspace(5.0, 60.0, 500), TR=10.0, states=16)
    T1 = np.linspace(300.0, 2000.0, 400)
    ref = np.empty((400, 500), np.complex64)
    sim.simulate(T1=T1, T2=80.0, out=ref)
    a = sim.simulate(T1=T1, T2=80.0)
    assert a.flags["C_CONTIGUOUS"] and a.flags["WRITEABLE"] and a.dtype == np.complex64
    np.testing.assert_array_equal(a, ref)
    address = a.ctypes.data
    del a
    b = sim.simulate(T1=T1, T2=80.0)
    assert b.ctypes.data == address
    np.testing.assert_array_equal(b, ref)
    # a view keeps the memory: the next result takes other memory
    view = b[::2]
    del b
    c = sim.simulate(T1=T1, T2=80.0)
    assert c.ctypes.data != address
    np.testing.assert_array_equal(view, ref[::2])
    np.testing.assert_array_equal(c, ref)
    # the Jacobian's outputs too; below a megabyte NumPy allocates
    s, J = sim.jacobian(("T1", "T2"), T1=T1, T2=80.0)
    assert J.shape == (400, 2, 500) and np.isfinite(J).all()
    small = sim.simulate(T1=T1[:10], T2=80.0)
    assert small.flags["OWNDATA"]
    del s, J
    assert 0 < _core.kept_result_bytes() <= 1 << 30


def test_kept_result_memory_is_freed_before_a_call_is_refused(monkeypatch):
    """A call that fits only without the memory kept from dropped results
    frees it and runs."""
    sim = S.MRFSimulator(flip=np.linspace(5.0, 60.0, 500), TR=10.0, states=16)
    T1 = np.linspace(300.0, 2000.0, 400)
    sim.simulate(T1=T1, T2=80.0)  # the result is dropped at once
    assert _core.kept_result_bytes() > 0
    real = _core.available_memory
    monkeypatch.setattr(_core, "available_memory", lambda: real() if _core.kept_result_bytes() == 0 else 2**20)
    # 80 MB of output: past the size calls skip the check at (_UNCHECKED)
    out = sim.simulate(T1=np.linspace(300.0, 2000.0, 20000), T2=80.0)
    assert out.shape == (20000, 500) and _core.kept_result_bytes() == 0
