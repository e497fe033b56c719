"""The CUDA backend on a GPU: parity with the host on the oracle cases,
wide states, streaming, CuPy/PyTorch/blochsim device arrays, streams and
refusals.  Skipped without a usable device (marker ``gpu``)."""
import numpy as np
import pytest

import blochsim
from blochsim import Delay, Dephase, Excitation, Pulse, Readout, Sequence, Simulator
from blochsim.simulators import FSESimulator, MRFSimulator

pytestmark = pytest.mark.gpu

RTOL = 1e-5
FLIPS = np.concatenate([np.linspace(5, 60, 250), np.linspace(60, 2, 250)])


def rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def device_cases():
    """The oracle cases of the host emulation test, run here on the GPU."""
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location(
        "device_templates", pathlib.Path(__file__).with_name("test_device_templates.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CASES


CASES = device_cases()


@pytest.mark.parametrize("name,make,extra", CASES, ids=[c[0] for c in CASES])
def test_parity_with_host_streamed(name, make, extra):
    sim = make()
    kw = {"T1": np.array([300.0, 900.0, 2000.0]), "T2": np.array([30.0, 80.0, 150.0]), **extra}
    if "T1" not in sim.tissue_properties:
        kw.pop("T1")
    ref = sim.simulate(**kw)
    sim.device = "cuda"
    out = sim.simulate(**kw)
    assert isinstance(out, np.ndarray) and out.dtype == np.complex64
    assert rel(out, ref) <= RTOL


@pytest.mark.parametrize("states", [32, 200, 2048, 5000, 9000])
def test_wide_states(states):
    # 2048: warp teams give way to block teams; 9000 > 512 * 16: the tail kernel
    n = 300
    sim = FSESimulator(ESP=2.0, flip=np.full(n, 150.0), states=states)
    T2 = np.array([100.0, 300.0])
    ref = sim.simulate(T1=1000.0, T2=T2)
    sim.device = "cuda"
    assert rel(sim.simulate(T1=1000.0, T2=T2), ref) <= RTOL
    if states == 2048:
        perfect = FSESimulator(ESP=2.0, flip=np.full(1024, 180.0), device="cuda").simulate(T2=500.0)
        assert rel(np.abs(perfect), np.exp(-np.arange(1, 1025) * 2.0 / 500.0)) <= RTOL


class TailProbe(Simulator):
    """An excitation, `steps` small pulses each followed by one shift up, then
    a rewinder of `steps` orders and a readout: the F+ state carried up to
    order `steps` (past what a block team holds in registers) comes back to
    order 0, so the readout sees what the tail kernel kept in memory."""

    tissue_properties = ("T1", "T2", "B0")

    def __init__(self, steps, **kw):
        self.steps = steps
        super().__init__(**kw)

    def repetition(self, p):
        ops = [Excitation(90.0, 90.0)] + [Pulse(1.0, 0.0), Dephase(), Delay(0.5)] * self.steps
        return Sequence(ops + [Readout(), Dephase(-self.steps), Readout()])


@pytest.mark.parametrize("states,steps,B0", [(8300, 8260, None), (4200, 4150, 9.0)],
                         ids=["real, 8300", "complex, 4200"])
def test_tail_past_the_register_team(states, steps, B0):
    sim = TailProbe(steps, states=states)
    kw = {"T1": np.array([1000.0, 3000.0]), "T2": np.array([2000.0, 8000.0])}
    if B0 is not None:
        kw["B0"] = B0
    ref = sim.simulate(**kw)
    assert np.min(np.abs(ref[:, 1])) > 0.05  # the echo from order `steps` is there
    sim.device = "cuda"
    assert rel(sim.simulate(**kw), ref) <= RTOL


@pytest.mark.parametrize("states", [20, 33, 65, 97, 200, 513, 1025, 1500])
@pytest.mark.parametrize("quadratic", [False, True], ids=["real", "complex"])
def test_team_shapes_on_a_fingerprinting_train(states, quadratic):
    # 500 pulses with one shift each: the fast runs, truncated at K < 500 and
    # played by teams of every kind the launcher picks for K (one thread,
    # warp teams of 2, 3, 4, 7 lanes with spare lanes, blocks of several teams)
    phases = 0.5 * np.arange(500) ** 2 if quadratic else 0.0
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=states, phases=phases)
    tissue = {"T1": np.array([300.0, 900.0, 2000.0, 1200.0, 700.0]),
              "T2": np.array([30.0, 80.0, 150.0, 40.0, 300.0])}
    # uniform pulses (from the rows) and per-problem B1 (per-lane pulses)
    for extra in ({}, {"B1": np.array([1.0, 0.9, 1.1, 0.8, 1.05])}):
        sim.device = "cpu"
        ref = sim.simulate(**tissue, **extra)
        sim.device = "cuda"
        assert rel(sim.simulate(**tissue, **extra), ref) <= RTOL


class SparseReadouts(Simulator):
    """29 pulses with one shift each, read out after all but every third, at
    receiver phases 0 and 180 degrees: 19 samples (not a multiple of the
    warp's stage of 8), with runs of events with and without a readout."""

    tissue_properties = ("T1", "T2")

    def repetition(self, p):
        ops = [Excitation(90.0, 0.0)]
        for i in range(29):
            ops += [Pulse(20.0 + 5.0 * (i % 7), 0.0)]
            if i % 3 != 1:
                ops += [Readout(180.0 * (i % 2))]
            ops += [Dephase(), Delay(4.0 + (i % 4))]
        return Sequence(ops)


@pytest.mark.parametrize("states", [20, 32, 45])
def test_staged_samples_of_the_warp_kernel(states):
    # 70 problems: two full warps and one of 6 (lanes past the last problem
    # write nothing); one thread per problem at K <= 32, teams of two at 45
    rng = np.random.default_rng(11)
    kw = {"T1": rng.uniform(200.0, 3000.0, 70), "T2": rng.uniform(10.0, 300.0, 70)}
    sim = SparseReadouts(states=states)
    ref = sim.simulate(**kw)
    assert ref.shape == (70, 19)
    sim.device = "cuda"
    assert rel(sim.simulate(**kw), ref) <= RTOL


@pytest.mark.parametrize("states", [200, 1500])
def test_complex_wide_states(states):
    # 200: a warp team of 25 lanes; 1500: a block team
    sim = FSESimulator(ESP=3.0, flip=np.full(400, 140.0), states=states)
    kw = {"T1": 900.0, "T2": np.array([60.0, 120.0]), "B0": np.array([5.0, -12.0])}
    ref = sim.simulate(**kw)
    sim.device = "cuda"
    assert rel(sim.simulate(**kw), ref) <= RTOL


def test_streaming_under_a_small_budget_equals_one_run():
    rng = np.random.default_rng(3)
    T1 = rng.uniform(200, 3000, 5000)
    T2 = rng.uniform(10, 300, 5000)
    big = MRFSimulator(flip=FLIPS, TR=10.0, states=32, device="cuda")
    whole = big.simulate(T1=T1, T2=T2)
    small = MRFSimulator(flip=FLIPS, TR=10.0, states=32, device="cuda", budget_bytes=1_000_000)
    np.testing.assert_array_equal(small.simulate(T1=T1, T2=T2), whole)
    host = MRFSimulator(flip=FLIPS, TR=10.0, states=32).simulate(T1=T1, T2=T2)
    assert rel(whole, host) <= RTOL


def test_every_operation_streams_numpy_under_a_small_budget():
    """NumPy inputs with device="cuda": jacobian, vjp and jacobian_vjp run
    in chunks under budget_bytes (here about 40 chunks), each equal to one
    run of the whole and to the host."""
    from blochsim.optim import CRLBCost

    rng = np.random.default_rng(5)
    tissue = {"T1": rng.uniform(300, 2500, (40, 50)), "T2": rng.uniform(20, 200, (40, 50)), "M0": 1.0}
    flips = FLIPS[:100]
    host = MRFSimulator(flip=flips, TR=10.0, states=24)
    card = MRFSimulator(flip=flips, TR=10.0, states=24, device="cuda")
    small = MRFSimulator(flip=flips, TR=10.0, states=24, device="cuda", budget_bytes=50 * 100 * 8 * 3)
    s_h, J_h = host.jacobian(("T1", "T2"), **tissue)
    s_w, J_w = card.jacobian(("T1", "T2"), **tissue)
    s_c, J_c = small.jacobian(("T1", "T2"), **tissue)
    np.testing.assert_array_equal(s_c, s_w)
    np.testing.assert_array_equal(J_c, J_w)
    assert rel(J_c, J_h) <= RTOL and J_c.shape == (40, 50, 2, 100)
    w = np.exp(1j * np.arange(s_h.size) / 9.0).reshape(s_h.shape).astype(np.complex64)
    g_h = host.vjp(("flip", "T2"), **tissue)[1](w)
    for sim in (card, small):
        s, pb = sim.vjp(("flip", "T2"), **tissue)
        assert isinstance(s, np.ndarray) and rel(s, s_h) <= RTOL
        g = pb(w)
        for k in ("flip", "T2"):
            assert g[k].shape == g_h[k].shape and rel(g[k], g_h[k]) <= RTOL, k
    cost = CRLBCost(("M0", "T2"), noise_variance=1e-4, weights={"T2": 1.0})
    s2, J2, pb2 = host.jacobian_vjp(("M0", "T2"), "flip", **tissue)
    _, W = cost(J2)
    g2 = pb2(W, 2 * s2)
    for sim in (card, small):
        s, J, pb = sim.jacobian_vjp(("M0", "T2"), "flip", **tissue)
        assert isinstance(J, np.ndarray) and rel(J, J2) <= RTOL
        assert rel(pb(W, 2 * s2)["flip"], g2["flip"]) <= RTOL


def test_cupy_inputs_and_outputs():
    cp = pytest.importorskip("cupy")
    T1 = np.linspace(300, 2500, 1000)
    T2 = np.linspace(20, 200, 1000)
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=32)
    ref = sim.simulate(T1=T1, T2=T2)
    out = sim.simulate(T1=cp.asarray(T1), T2=cp.asarray(T2, dtype=cp.float32))
    assert isinstance(out, cp.ndarray) and out.dtype == cp.complex64 and out.shape == (1000, 500)
    assert rel(cp.asnumpy(out), ref) <= RTOL
    # mixed: a host T2 moves to the device; broadcasting over a device (n, 1) array
    out2 = sim.simulate(T1=cp.asarray(T1[:10, None]), T2=T2[:7])
    ref2 = sim.simulate(T1=T1[:10, None], T2=T2[:7])
    assert out2.shape == (10, 7, 500) and rel(cp.asnumpy(out2), ref2) <= RTOL
    # out= on the device
    buf = cp.empty((1000, 500), cp.complex64)
    r = sim.simulate(T1=cp.asarray(T1), T2=cp.asarray(T2), out=buf)
    assert r is buf and rel(cp.asnumpy(buf), ref) <= RTOL
    # the Jacobian's out= on the device, and NumPy outputs through device='cuda'
    s_ref, J_ref = sim.jacobian(("T1", "T2"), T1=T1[:64], T2=T2[:64])
    sb, Jb = cp.empty((64, 500), cp.complex64), cp.empty((64, 2, 500), cp.complex64)
    rs, rJ = sim.jacobian(("T1", "T2"), T1=cp.asarray(T1[:64]), T2=cp.asarray(T2[:64]), out=(sb, Jb))
    assert rs is sb and rJ is Jb
    assert rel(cp.asnumpy(sb), s_ref) <= RTOL and rel(cp.asnumpy(Jb), J_ref) <= RTOL
    hs, hJ = np.empty((64, 500), np.complex64), np.empty((64, 500), np.complex64)
    on = MRFSimulator(flip=FLIPS, TR=10.0, states=32, device="cuda")
    rs, rJ = on.jacobian("T2", T1=T1[:64], T2=T2[:64], out=(hs, hJ))
    assert rs is hs and rJ is hJ and rel(hJ, J_ref[:, 1]) <= RTOL
    with pytest.raises(TypeError, match=r"out\[1\] must be a device array"):
        sim.jacobian(("T1", "T2"), T1=cp.asarray(T1[:64]), T2=cp.asarray(T2[:64]), out=(sb, J_ref))


def test_cupy_non_default_stream():
    cp = pytest.importorskip("cupy")
    T1 = cp.linspace(300, 2500, 4096)
    T2 = cp.linspace(20, 200, 4096)
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=32)
    ref = sim.simulate(T1=cp.asnumpy(T1), T2=cp.asnumpy(T2))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        a = T1 * 1.0  # produced on `stream`
        b = T2 * 1.0
        out = sim.simulate(T1=a, T2=b)
        got = cp.asnumpy(out)
    assert rel(got, ref) <= RTOL


def test_torch_inputs_and_outputs():
    torch = pytest.importorskip("torch")
    T1 = np.linspace(300, 2500, 777)
    T2 = np.linspace(20, 200, 777)
    sim = FSESimulator(ESP=5.0, flip=np.full(32, 150.0))
    ref = sim.simulate(T1=T1, T2=T2)
    out = sim.simulate(T1=torch.tensor(T1, device="cuda"), T2=torch.tensor(T2, device="cuda", dtype=torch.float32))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.complex64 and out.is_cuda
    assert rel(out.cpu().numpy(), ref) <= RTOL


def test_blochsim_device_array_and_dlpack():
    T1 = blochsim.DeviceArray.from_numpy(np.linspace(300, 2500, 100).astype(np.float32))
    T2 = blochsim.DeviceArray.from_numpy(np.linspace(20, 200, 100).astype(np.float32))
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=32)
    out = sim.simulate(T1=T1, T2=T2)
    assert isinstance(out, blochsim.DeviceArray) and out.shape == (100, 500)
    ref = sim.simulate(T1=T1.get(), T2=T2.get())
    assert rel(out.get(), ref) <= RTOL
    torch = pytest.importorskip("torch")
    t = torch.from_dlpack(out)
    assert t.is_cuda and t.dtype == torch.complex64
    assert rel(t.cpu().numpy(), ref) <= RTOL


def test_a_bare_cuda_array_interface():
    # what Numba's device arrays expose: the interface alone (version 3,
    # with a stream), from a library blochsim cannot name
    cp = pytest.importorskip("cupy")
    T2 = cp.linspace(20, 200, 50, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)

    class Bare:
        __cuda_array_interface__ = {"shape": (50,), "typestr": "<f4", "data": (T2.data.ptr, False),
                                    "version": 3, "strides": None, "stream": stream.ptr}

    sim = FSESimulator(ESP=5.0, flip=np.full(16, 150.0))
    out = sim.simulate(T1=900.0, T2=Bare())
    assert isinstance(out, blochsim.DeviceArray) and out.shape == (50, 16)
    assert rel(out.get(), sim.simulate(T1=900.0, T2=cp.asnumpy(T2))) <= RTOL


def test_deterministic_on_the_device():
    cp = pytest.importorskip("cupy")
    T1 = cp.linspace(300, 2500, 3000)
    T2 = cp.linspace(20, 200, 3000)
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=32, phases=np.arange(500) * 7.0)
    a = cp.asnumpy(sim.simulate(T1=T1, T2=T2))
    b = cp.asnumpy(sim.simulate(T1=T1, T2=T2))
    np.testing.assert_array_equal(a, b)


def test_device_refusals():
    cp = pytest.importorskip("cupy")
    sim = FSESimulator(ESP=5.0, flip=np.full(8, 180.0))
    with pytest.raises(ValueError, match=r"T2 must be a C-contiguous device array"):
        sim.simulate(T2=cp.linspace(20, 200, 20)[::2])
    with pytest.raises(TypeError, match=r"T2 must be a float32 or float64 device array"):
        sim.simulate(T2=cp.arange(10))
    bad = cp.linspace(20, 200, 10)
    bad[3] = cp.nan
    with pytest.raises(ValueError, match=r"T2 must be finite, got nan at index \(3,\)"):
        sim.simulate(T2=bad)
    neg = cp.linspace(20, 200, 10)
    neg[7] = -1.0
    with pytest.raises(ValueError, match=r"T2 must be > 0 ms, got -1.0 at index \(7,\)"):
        sim.simulate(T2=neg)
    with pytest.raises(ValueError, match=r"do not broadcast"):
        sim.simulate(T1=cp.ones(3) * 900, T2=cp.ones(4) * 80)
    with pytest.raises(ValueError, match=r"out must be a C-contiguous complex64 device array of shape"):
        sim.simulate(T2=cp.ones(4) * 80, out=cp.empty((4, 7), cp.complex64))
    with pytest.raises(ValueError, match=r"device='cpu' was asked for, but T2 is a device array"):
        FSESimulator(ESP=5.0, flip=np.full(8, 180.0), device="cpu").simulate(T2=cp.ones(4))
    with pytest.raises(MemoryError, match=r"needs [\d.]+ [KMGT]iB of device memory \(.*\) and [\d.]+ [KMGT]iB is "
                                         r"available: simulate at most [\d,]+ voxels a call"):
        MRFSimulator(flip=FLIPS, TR=10.0, states=32).simulate(T1=cp.ones(1), T2=cp.ones(1),
                                                            M0=_huge_device_array(cp))


def _huge_device_array(cp):
    """A device array that claims 10^11 elements (never read: the memory check refuses first)."""

    class Huge:
        __cuda_array_interface__ = {"shape": (100_000_000_000,), "typestr": "<f4",
                                    "data": (int(cp.ones(1, cp.float32).data.ptr), False), "version": 3,
                                    "strides": None}

    return Huge()


def test_cuda_error_is_a_python_exception():
    from blochsim import _core

    with pytest.raises(blochsim.CudaError, match=r"^cuda\w+"):
        _core.DeviceBuffer(1 << 62)
    # the failed allocation is not reported again by the next launch
    sim = FSESimulator(ESP=5.0, flip=np.full(8, 150.0), device="cuda")
    ref = FSESimulator(ESP=5.0, flip=np.full(8, 150.0)).simulate(T2=np.array([60.0, 90.0]))
    assert rel(sim.simulate(T2=np.array([60.0, 90.0])), ref) <= RTOL


def test_ctrl_c_between_device_chunks():
    """A real SIGINT sent to a process in a long device call streamed from
    NumPy in many chunks: KeyboardInterrupt within 2 s, and the device gives
    the same result afterwards."""
    from interrupts import assert_ctrl_c_stops

    assert_ctrl_c_stops("""
        import time
        import numpy as np
        from blochsim import Delay, Dephase, Excitation, Pulse, Readout, Sequence, Simulator

        class Long(Simulator):  # 4000 events, one sample: a long call of small outputs
            tissue_properties = ("T1", "T2")

            def repetition(self, p):
                return Sequence([Excitation(90.0, 90.0)] + [Pulse(30.0, 0.0), Dephase(), Delay(5.0)] * 4000
                                + [Readout()])

        sim = Long(states=256, device="cuda", budget_bytes=16_000_000)
        small = sim.simulate(T1=np.full(64, 1000.0), T2=80.0)
        t0 = time.monotonic()
        sim.simulate(T1=np.full(20_000, 1000.0), T2=80.0)
        rate = 20_000 / (time.monotonic() - t0)
        n = int(min(max(10 * rate, 100_000), 30_000_000))  # about ten seconds of chunks
        T1 = np.full(n, 1000.0)
        print("ready", n, flush=True)
        t0 = time.monotonic()
        try:
            sim.simulate(T1=T1, T2=80.0)
            print("finished after %.3f" % (time.monotonic() - t0), flush=True)
        except KeyboardInterrupt:
            print("interrupted after %.3f" % (time.monotonic() - t0), flush=True)
        print("again", bool(np.array_equal(sim.simulate(T1=np.full(64, 1000.0), T2=80.0), small)), flush=True)
    """, wait=1.5)


@pytest.mark.parametrize("states,names,extra", [
    (32, ("T1", "T2"), {}),
    (200, ("T2", "B1", "M0"), {}),
    (64, ("T1", "B0", "T2"), {"B0": np.array([3.0, -5.0, 0.0, 8.0, 1.0])}),
    (48, ("T1", "T2", "B1", "M0"), {}),
    (24, ("T1", "B0", "T2", "B1"), {"B0": np.array([3.0, -5.0, 0.0, 8.0, 1.0])}),
], ids=["real, 2 directions", "real, 200 states, 2 directions and M0", "complex, 3 directions",
        "real, 3 directions and M0", "complex, 4 directions"])
def test_device_jacobian_against_the_host(states, names, extra):
    # M0 from the unscaled signal, the other directions two to a team, one launch
    cp = pytest.importorskip("cupy")
    tissue = {"T1": np.array([300.0, 900.0, 2000.0, 1200.0, 700.0]),
              "T2": np.array([30.0, 80.0, 150.0, 40.0, 300.0]),
              "B1": np.array([1.0, 0.9, 1.1, 0.8, 1.05]), "M0": 0.9, **extra}
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=states) if not extra else None
    if sim is None:
        class Off(Simulator):
            tissue_properties = ("T1", "T2", "B1", "M0", "B0")

            def repetition(self, p):
                ops = []
                for f in FLIPS[:200]:
                    ops += [Pulse(float(f), 0.0), Delay(2.0), Readout(-90.0), Dephase(), Delay(8.0)]
                return Sequence(ops)

        sim = Off(states=states)
    s_ref, J_ref = sim.jacobian(names, **tissue)
    dev = {k: cp.asarray(v) if np.ndim(v) else v for k, v in tissue.items()}
    s, J = sim.jacobian(names, **dev)
    assert isinstance(J, cp.ndarray) and J.shape == J_ref.shape
    assert rel(cp.asnumpy(s), s_ref) <= RTOL
    assert rel(cp.asnumpy(J), J_ref) <= RTOL
    # NumPy in and out through the device
    sim.device = "cuda"
    s2, J2 = sim.jacobian(names, **tissue)
    assert isinstance(J2, np.ndarray) and rel(J2, J_ref) <= RTOL


@pytest.mark.parametrize("states,trs,b0", [(300, 500, False), (300, 500, True), (2100, 2200, False),
                                           (1100, 1200, True)],
                         ids=["real, a block team", "complex, a block team", "real, a tail past 2048 orders",
                              "complex, a tail past 1024 orders"])
def test_device_jacobian_past_a_warp_team(states, trs, b0):
    """More orders than a warp team holds: block teams, then the tail in
    device memory; against the host backend."""
    cp = pytest.importorskip("cupy")
    flips = np.resize(FLIPS, trs)

    class Train(Simulator):
        tissue_properties = ("T1", "T2", "B1", "M0", "B0")

        def repetition(self, p):
            ops = []
            for f in flips:
                ops += [Pulse(float(f), 0.0), Delay(2.0), Readout(-90.0), Dephase(), Delay(8.0)]
            return Sequence(ops)

    sim = Train(states=states)
    tissue = {"T1": np.array([300.0, 900.0, 2000.0]), "T2": np.array([30.0, 80.0, 150.0]),
              "B1": np.array([1.0, 0.9, 1.1]), "M0": 0.9, **({"B0": np.array([3.0, -5.0, 8.0])} if b0 else {})}
    names = ("T1", "T2", "B1", "M0") + (("B0",) if b0 else ())
    s_ref, J_ref = sim.jacobian(names, **tissue)
    s, J = sim.jacobian(names, **{k: cp.asarray(v) if np.ndim(v) else v for k, v in tissue.items()})
    assert rel(cp.asnumpy(s), s_ref) <= RTOL
    assert rel(cp.asnumpy(J), J_ref) <= RTOL


@pytest.mark.parametrize("states,names,extra", [
    (32, ("flip", "TR", "T1", "T2"), {}),
    (200, ("flip", "TI", "B1", "M0", "T2"), {}),
    # B0 puts the train on the complex path; the signal of a train dephased
    # by one whole shift every TR does not depend on it, so it is not in wrt
    (64, ("flip", "phases", "T1", "T2"), {"B0": np.array([3.0, -5.0, 0.0, 8.0, 1.0])}),
], ids=["real, flips and TR", "200 states, 3 tissue", "complex, phases"])
def test_device_pullback_against_the_host(states, names, extra):
    cp = pytest.importorskip("cupy")
    tissue = {"T1": np.array([300.0, 900.0, 2000.0, 1200.0, 700.0]),
              "T2": np.array([30.0, 80.0, 150.0, 40.0, 300.0]),
              "B1": np.array([1.0, 0.9, 1.1, 0.8, 1.05]), "M0": 0.9, **extra}
    phases = 0.5 * 117.0 * np.arange(200) * (np.arange(200) + 1) % 360.0 if extra else 0.0
    flips = FLIPS[:200]

    class Train(MRFSimulator):
        tissue_properties = ("T1", "T2", "M0", "B1", "B0", "inv_efficiency")

    sim = Train(flip=flips, TR=10.0, TI=20.0, phases=phases, states=states)
    s_ref, pb_ref = sim.vjp(names, **tissue)
    w = np.exp(1j * np.arange(s_ref.size) / 7.0).reshape(s_ref.shape).astype(np.complex64)
    g_ref = pb_ref(w)
    dev = {k: cp.asarray(v) if np.ndim(v) else v for k, v in tissue.items()}
    s, pb = sim.vjp(names, **dev)
    assert isinstance(s, cp.ndarray) and rel(cp.asnumpy(s), s_ref) <= RTOL
    for cot in (cp.asarray(w), w):
        g = pb(cot)
        for k in names:
            # a property passed as a CuPy array gets a CuPy gradient; the
            # protocol's and the scalars' are NumPy
            assert isinstance(g[k], cp.ndarray if k in dev and np.ndim(dev[k]) else (np.ndarray, np.generic)), k
            gk = cp.asnumpy(g[k]) if isinstance(g[k], cp.ndarray) else g[k]
            assert gk.dtype == np.float64 and np.shape(gk) == np.shape(g_ref[k])
            assert rel(gk, g_ref[k]) <= RTOL, k
    # NumPy in and out through the device, the same on every run
    sim.device = "cuda"
    s2, pb2 = sim.vjp(names, **tissue)
    assert isinstance(s2, np.ndarray)
    g1, g2 = pb2(w), pb2(w)
    for k in names:
        np.testing.assert_array_equal(g1[k], g2[k])
        assert rel(g1[k], g_ref[k]) <= RTOL, k


def test_device_pullback_through_2000_events_of_1e5_voxels():
    # SPEC §4: a gradient through a 2000-event train of 1e5 voxels fits on
    # the device; its first 64 voxels' share equals the host's
    cp = pytest.importorskip("cupy")
    n_tr = 2000  # one event per TR (its interval, pulse, readout, shift)
    flips = 10.0 + 50.0 * np.abs(np.sin(np.arange(n_tr) / 60.0))
    sim = MRFSimulator(flip=flips, TR=6.0, TI=10.0, states=32)
    assert sim.stream()[0].n_events >= 2000
    T1 = cp.asarray(np.geomspace(200.0, 3000.0, 100_000))
    T2 = cp.asarray(np.geomspace(10.0, 300.0, 100_000))
    s, pb = sim.vjp(("flip", "T2"), T1=T1, T2=T2)
    g = pb(2 * s)
    assert g["flip"].shape == (n_tr,) and g["T2"].shape == (100_000,) and np.all(np.isfinite(g["flip"]))
    assert isinstance(g["T2"], cp.ndarray)  # the device property's gradient stays on the card
    sub = {"T1": cp.asnumpy(T1[:64]), "T2": cp.asnumpy(T2[:64])}
    s_h, pb_h = sim.vjp("T2", **sub)
    assert rel(cp.asnumpy(g["T2"][:64]), pb_h(2 * s_h)["T2"]) <= RTOL


def test_device_second_order_against_the_host():
    cp = pytest.importorskip("cupy")
    from blochsim.optim import CRLBCost

    fse = FSESimulator(ESP=8.0, flip=np.linspace(180.0, 100.0, 12), states=32)
    tissue = {"T1": np.array([900.0, 1200.0, 700.0]), "T2": np.array([50.0, 90.0, 120.0]), "M0": 1.0}
    names = ("M0", "T2")
    s_h, J_h, pb_h = fse.jacobian_vjp(names, ("flip", "ESP"), **tissue)
    cost = CRLBCost(names, noise_variance=1e-4, weights={"T2": 1.0})
    _, W = cost(J_h)
    w = (2 * s_h).astype(np.complex64)
    g_h = pb_h(W, w)
    s_d, J_d, pb_d = fse.jacobian_vjp(names, ("flip", "ESP"), **{k: cp.asarray(v) for k, v in tissue.items()})
    assert isinstance(J_d, cp.ndarray) and rel(cp.asnumpy(J_d), J_h) <= RTOL
    for Wc, wc in ((cp.asarray(W.astype(np.complex64)), cp.asarray(w)), (W, w)):
        g = pb_d(Wc, wc)
        for k in ("flip", "ESP"):
            assert rel(g[k], g_h[k]) <= RTOL, k


# --------------------------------------------------------------------------
# Pools on the device (NumPy in and out, device='cuda')

def _pool_cases():
    from blochsim.simulators import CESTSimulator, MTSimulator

    pooled = dict(T1=np.array([600.0, 1000.0, 1800.0]), T2=np.array([40.0, 70.0, 120.0]), B1=np.array([0.9, 1.0, 1.1]))
    offres = {**pooled, "B0": np.array([-8.0, 0.0, 15.0])}
    mrf = MRFSimulator(flip=FLIPS, TR=10.0, states=32)
    return [
        ("mrf-bound", mrf, {**pooled, "bound_fraction": 0.12, "bound_exchange": 25.0}),
        ("mrf-poolB", mrf, {**pooled, "poolB_fraction": 0.2, "poolB_exchange": 15.0, "poolB_T2": 15.0,
                            "poolB_shift": 60.0}),
        ("mrf-4pools-bound", MRFSimulator(flip=FLIPS[:100], TR=8.0, states=16),
         {**pooled, "bound_fraction": 0.1, "bound_exchange": 20.0, "poolB_fraction": 0.1, "poolB_exchange": 30.0,
          "poolC_fraction": 0.05, "poolC_shift": -200.0, "poolD_fraction": 0.05, "poolD_T2": 8.0,
          "poolE_fraction": 0.02, "poolE_exchange": 200.0}),
        ("fse-bound", FSESimulator(ESP=10.0, flip=np.full(12, 150.0), states=40),
         {**offres, "bound_fraction": 0.15, "bound_exchange": 40.0}),
        ("cest", CESTSimulator(offsets=np.linspace(-5, 5, 21), n_pulses=3, pulse_duration=50.0, pulse_delay=5.0),
         {**offres, "poolB_fraction": 0.01, "poolB_exchange": 500.0, "poolB_shift": 447.0, "bound_fraction": 0.1,
          "bound_exchange": 25.0}),
        ("mt-saturating", MTSimulator(flip=10.0, TR=30.0, n_tr=50, exc_duration=1.0), {**offres, "bound_fraction": 0.15, "bound_exchange": 30.0}),
    ] + _network_cases(pooled, offres)


def _network_cases(pooled, offres):
    """Exchange networks beyond the star (tests/test_networks.py): the
    four-pool white matter with dipolar order on the MRF train, a dual-offset
    saturation train (of a network, and of the star off resonance), and
    MTSimulator's frequency-alternating ihMT pulse."""
    from blochsim.presets import white_matter_four_pool
    from blochsim.simulators import MTSimulator
    from test_networks import NETWORKS, NetworkTrain

    five = {k: v for k, v in NETWORKS["five-pool"][0].items() if k not in ("T1", "T2", "B0")}
    return [
        ("mrf-four-pool-ihmt", MRFSimulator(flip=FLIPS[:120], TR=10.0, states=24),
         {**white_matter_four_pool(), **pooled}),
        ("network-five-pool-dual", NetworkTrain(dual=True, states=8), {**five, **offres}),
        ("star-dual-offres", NetworkTrain(dual=True, offset=700.0, sat_flip=600.0, alternate=False, states=8),
         {**pooled, "B0": np.array([-150.0, 0.0, 150.0]), "bound_fraction": 0.12, "bound_exchange": 30.0}),
        ("mt-dual-ihmt", MTSimulator(flip=10.0, TR=30.0, n_tr=30, mt_offset=6000.0, mt_mode="dual"),
         {**white_matter_four_pool(), **offres}),
    ]


@pytest.mark.parametrize("name,sim,tissue", _pool_cases(), ids=[c[0] for c in _pool_cases()])
def test_pools_parity_with_host(name, sim, tissue):
    ref = sim.simulate(**tissue)
    sim.device = "cuda"
    out = sim.simulate(**tissue)
    sim.device = None
    assert isinstance(out, np.ndarray) and out.dtype == np.complex64 and out.shape == ref.shape
    assert rel(out, ref) <= RTOL


class _RectTrain(Simulator):
    """Exact off-resonance pulses between hard pulses, shifts both ways and
    a spoiler: the register team's exact-pulse and shift paths."""

    def repetition(self, p):
        from blochsim import RectPulse, Spoil
        return Sequence([RectPulse(300.0, 4.0, phase=20.0, offset=600.0), Readout(), Excitation(60.0, 30.0),
                         Dephase(), Delay(4.0), Readout(), Pulse(120.0, 90.0, duration=1.0, offset=900.0),
                         Dephase(-2), Delay(3.0), Readout(), Spoil(), Delay(2.0), Excitation(40.0), Dephase(3),
                         Readout()])


def _team_cases():
    pooled = dict(T1=np.array([600.0, 1000.0, 1800.0]), T2=np.array([40.0, 70.0, 120.0]), B1=np.array([0.9, 1.0, 1.1]))
    both = {**pooled, "bound_fraction": 0.1, "bound_exchange": 20.0, "poolB_fraction": 0.15, "poolB_exchange": 30.0,
            "poolB_T2": 12.0, "poolB_shift": 40.0}
    k = np.arange(len(FLIPS))
    phases = (0.5 * 117.0 * k * (k + 1)) % 360.0
    return [
        ("mrf-poolB-real", MRFSimulator(flip=FLIPS, TR=10.0, TI=20.0, states=32),
         {**pooled, "poolB_fraction": 0.2, "poolB_exchange": 15.0, "poolB_T2": 15.0}),
        ("mrf-bound-complex-K13", MRFSimulator(flip=FLIPS, TR=10.0, phases=phases, states=13),
         {**pooled, "bound_fraction": 0.12, "bound_exchange": 25.0}),
        ("mrf-both-K50", MRFSimulator(flip=FLIPS, TR=10.0, states=50), both),
        ("rect-both", _RectTrain(states=20, repetitions=6), {**both, "B0": np.array([-8.0, 0.0, 15.0])}),
        ("rect-bound", _RectTrain(states=8, repetitions=6), {**pooled, "bound_fraction": 0.1,
                                                             "bound_exchange": 20.0}),
        ("mrf-bound-K300-team", MRFSimulator(flip=FLIPS[:60], TR=10.0, states=300),
         {**pooled, "bound_fraction": 0.12, "bound_exchange": 25.0}),
        ("mrf-bound-complex-K300-general", MRFSimulator(flip=FLIPS[:60], TR=10.0, phases=phases[:60], states=300),
         {**pooled, "bound_fraction": 0.12, "bound_exchange": 25.0}),
    ]


@pytest.mark.parametrize("name,sim,tissue", _team_cases(), ids=[c[0] for c in _team_cases()])
def test_pooled_register_team_parity_with_host(name, sim, tissue):
    """The device's pooled register team (and, past its orders, the general
    kernel) against the host backend: real and complex planes, truncated
    teams, exact pulses, shifts both ways."""
    ref = sim.simulate(**tissue)
    sim.device = "cuda"
    out = sim.simulate(**tissue)
    sim.device = None
    assert rel(out, ref) <= RTOL


def test_pools_on_device_at_the_reference_size():
    # enough problems for several blocks; lanes past the end write nothing
    n = 4099
    T1 = np.geomspace(200, 3000, n)
    T2 = np.geomspace(10, 300, n)
    mrf = MRFSimulator(flip=FLIPS, TR=10.0, states=32)
    ref = mrf.simulate(T1=T1, T2=T2, bound_fraction=0.1, bound_exchange=20.0)
    out = MRFSimulator(flip=FLIPS, TR=10.0, states=32, device="cuda").simulate(T1=T1, T2=T2, bound_fraction=0.1,
                                                                               bound_exchange=20.0)
    assert rel(out, ref) <= RTOL


def test_pools_take_device_arrays(monkeypatch):
    """CuPy in, CuPy out (simulate, jacobian and vjp on the device, the
    planes never leaving it; out= on the device arrays) against the NumPy
    host results."""
    cp = pytest.importorskip("cupy")
    from blochsim import _core

    mrf = MRFSimulator(flip=FLIPS[:60], TR=10.0, states=16)
    T1 = np.array([700.0, 1100.0, 1600.0])
    t = dict(T2=80.0, bound_fraction=np.array([0.05, 0.1, 0.15]), bound_exchange=20.0)
    # the NumPy results first: they take the host-array entries, which the
    # device arrays must not
    ref = mrf.simulate(T1=T1, **t)
    s0, J0 = mrf.jacobian(("T1", "bound_fraction"), T1=T1, **t)
    g0 = mrf.vjp(("flip", "T1"), T1=T1, **t)[1](np.ones(ref.shape, np.complex64))
    for entry in ("pooled", "pooled_adjoint"):  # the host-array entries
        monkeypatch.setattr(_core, entry, lambda *a, _e=entry, **k: pytest.fail(f"{_e}: through the host"))
    out = mrf.simulate(T1=cp.asarray(T1), **t)
    assert isinstance(out, cp.ndarray) and out.dtype == cp.complex64
    assert rel(cp.asnumpy(out), ref) <= RTOL
    buf = cp.empty(ref.shape, dtype=cp.complex64)
    assert mrf.simulate(T1=cp.asarray(T1), out=buf, **t) is buf
    assert rel(cp.asnumpy(buf), ref) <= RTOL
    s1, J1 = mrf.jacobian(("T1", "bound_fraction"), T1=cp.asarray(T1), **t)
    assert isinstance(J1, cp.ndarray) and J1.shape == J0.shape
    assert rel(cp.asnumpy(J1), J0) <= RTOL
    _, J1one = mrf.jacobian("T1", T1=cp.asarray(T1), **t)
    assert J1one.shape == J0[..., 0, :].shape and rel(cp.asnumpy(J1one), J0[..., 0, :]) <= RTOL
    sb, Jb = cp.empty(ref.shape, cp.complex64), cp.empty(J0.shape, cp.complex64)
    r = mrf.jacobian(("T1", "bound_fraction"), T1=cp.asarray(T1), out=(sb, Jb), **t)
    assert r[0] is sb and r[1] is Jb
    assert rel(cp.asnumpy(Jb), J0) <= RTOL
    s1, pullback = mrf.vjp(("flip", "T1"), T1=cp.asarray(T1), **t)
    assert isinstance(s1, cp.ndarray)
    g1 = pullback(cp.ones(ref.shape, dtype=cp.complex64))
    assert isinstance(g1["T1"], cp.ndarray) and isinstance(g1["flip"], np.ndarray)
    for k in g0:
        assert rel(cp.asnumpy(g1[k]) if k == "T1" else g1[k], g0[k]) <= RTOL, k
    with pytest.raises(TypeError, match="out must be a device array when tissue properties are device arrays"):
        mrf.simulate(T1=cp.asarray(T1), out=np.empty(ref.shape, np.complex64), **t)
    with pytest.raises(ValueError, match="device='cpu' was asked for, but T1 is a device array"):
        MRFSimulator(flip=FLIPS[:10], TR=10.0, device="cpu").simulate(T1=cp.asarray(T1), T2=80.0,
                                                                      bound_fraction=0.1)


def test_pools_at_2048_states_on_device():
    """No limit from orders × pools: 2048 states with an exchanging and a
    semisolid pool, against the host."""
    from blochsim.simulators import FSESimulator

    fse = FSESimulator(ESP=8.0, flip=np.full(40, 160.0), states=2048)
    t = dict(T1=np.array([900.0, 1300.0]), T2=np.array([60.0, 90.0]), bound_fraction=0.1, bound_exchange=20.0,
             poolB_fraction=0.1, poolB_exchange=15.0)
    ref = fse.simulate(**t)
    fse.device = "cuda"
    assert rel(fse.simulate(**t), ref) <= RTOL


_JACOBIAN_CASES = [c for c in _pool_cases() if c[0] not in ("mt-saturating", "mt-dual-ihmt")]


@pytest.mark.parametrize("name,sim,tissue", _JACOBIAN_CASES, ids=[c[0] for c in _JACOBIAN_CASES])
def test_pools_jacobian_parity_with_host(name, sim, tissue):
    names = [k for k in ("T1", "T2", "B1", "bound_fraction", "bound_exchange", "poolB_exchange", "poolB_shift",
                         "exchange_B_bound", "bound_T1D", "bound2_fraction", "exchange_bound_bound2") if k in tissue]
    s0, J0 = sim.jacobian(names, **tissue)
    sim.device = "cuda"
    s1, J1 = sim.jacobian(names, **tissue)
    sim.device = None
    assert J1.shape == J0.shape
    assert rel(s1, s0) <= RTOL
    for i in range(len(names)):
        # (a column that is 0, as bound_T1D's without saturating pulses, is 0 on both)
        assert np.max(np.abs(J1[..., i, :] - J0[..., i, :])) <= RTOL * np.max(np.abs(J0[..., i, :])) + 1e-12, names[i]


_POOL_PROTOCOL = {"mrf-bound": ("flip", "TR"), "mrf-poolB": ("flip", "TR"), "mrf-4pools-bound": ("flip",),
                  "fse-bound": ("flip", "ESP"), "cest": ("B1sat", "pulse_duration", "offsets"),
                  "mt-saturating": ("flip", "TR", "mt_flip", "mt_offset", "exc_duration"),
                  "mrf-four-pool-ihmt": ("flip", "TR"), "network-five-pool-dual": ("sat_flip", "offset", "TR"),
                  "star-dual-offres": ("sat_flip", "offset"),
                  "mt-dual-ihmt": ("flip", "mt_flip")}


@pytest.mark.parametrize("name,sim,tissue", _pool_cases(), ids=[c[0] for c in _pool_cases()])
def test_pools_vjp_parity_with_host(name, sim, tissue):
    names = _POOL_PROTOCOL[name] + tuple(
        k for k in ("T1", "T2", "B1", "B0", "bound_fraction", "bound_exchange", "poolB_exchange", "poolB_shift",
                    "exchange_B_bound", "bound_T1D", "bound2_T1D") if k in tissue)
    s0, pb0 = sim.vjp(names, **tissue)
    rng = np.random.default_rng(11)
    w = (rng.standard_normal(s0.shape) + 1j * rng.standard_normal(s0.shape)).astype(np.complex64)
    g0 = pb0(w)
    sim.device = "cuda"
    s1, pb1 = sim.vjp(names, **tissue)
    g1 = pb1(w)
    sim.device = None
    assert rel(s1, s0) <= RTOL
    for k in names:
        assert np.shape(g1[k]) == np.shape(g0[k]), k
        # (a gradient that is 0 by symmetry, as B0's in a CPMG train, is round-off on both)
        assert np.max(np.abs(g1[k] - g0[k])) <= RTOL * np.max(np.abs(g0[k])) + 1e-9, k


class _KeyedTrain(Simulator):
    """A spin-echo train whose crushers (x and z, unequal from echo to echo)
    only the moment-keyed EPG holds: _Moment operators, as the Pulseq reader
    writes them."""

    protocol = {"echoes": 12}

    def repetition(self, p):
        from blochsim.sequence.operators import _Moment

        ops = [Pulse(90.0, 90.0)]
        for e in range(p["echoes"]):
            m = (300.0 * (1 + 0.291 * (e % 4)), 0.0, 400.0 * (1 + 0.137 * (e % 5)))
            ops += [Delay(4.0), _Moment(m, 1.0), Delay(1.0), Pulse(120.0), Delay(1.0), _Moment(m, 1.0), Delay(4.0),
                    Readout()]
        return Sequence(ops)


def test_moment_keyed_epg_on_the_card_equals_the_host():
    """The moment-keyed EPG on the card: NumPy inputs with device="cuda" and
    device arrays in, against the host's, with B1, B0 and D per voxel."""
    n = 3000
    rng = np.random.default_rng(3)
    tissue = dict(T1=rng.uniform(300, 3000, n), T2=rng.uniform(20, 300, n), B1=rng.uniform(0.8, 1.2, n),
                  B0=rng.uniform(-20, 20, n), D=rng.uniform(0, 3, n))
    host = _KeyedTrain().simulate(**tissue)
    card = _KeyedTrain(device="cuda").simulate(**tissue)
    assert isinstance(card, np.ndarray) and card.shape == host.shape == (n, 12)
    assert rel(card, host) < 2e-5
    # in chunks of about 200 voxels under a small budget (each chunk's
    # program made for its own tissue ranges)
    chunked = _KeyedTrain(device="cuda", budget_bytes=200 * (12 * 8 + 5 * 4)).simulate(**tissue)
    assert rel(chunked, card) < 1e-6
    dev = {k: blochsim.DeviceArray.from_numpy(v.astype(np.float32)) for k, v in tissue.items()}
    resident = _KeyedTrain().simulate(**dev)
    assert rel(resident.get(), host) < 2e-5
    # with pools the keyed EPG plays on the host: device arrays in, a device array out
    pools = dict(poolB_fraction=0.1, poolB_exchange=25.0, poolB_T1=700.0, poolB_T2=30.0, poolB_shift=20.0)
    small = {k: v[:200] for k, v in tissue.items() if k != "D"}
    host = _KeyedTrain().simulate(**small, **pools)
    dev = {k: blochsim.DeviceArray.from_numpy(v.astype(np.float32)) for k, v in small.items()}
    pooled = _KeyedTrain().simulate(**dev, **pools)
    assert isinstance(pooled, blochsim.DeviceArray) and rel(pooled.get(), host) < 1e-6
    # its Jacobian and vjp play on the host: device arrays in, device arrays out
    small = {k: v[:200] for k, v in tissue.items()}
    dev = {k: blochsim.DeviceArray.from_numpy(v.astype(np.float32)) for k, v in small.items()}
    s0, J0 = _KeyedTrain().jacobian(("T2", "B1"), **small)
    s1, J1 = _KeyedTrain().jacobian(("T2", "B1"), **dev)
    assert isinstance(J1, blochsim.DeviceArray) and rel(s1.get(), s0) < 1e-5 and rel(J1.get(), J0) < 1e-4
    s2, pb = _KeyedTrain(device="cuda").vjp(["T2"], **small)
    assert isinstance(s2, np.ndarray) and rel(s2, s0) < 1e-5
    np.testing.assert_allclose(pb(2 * s2)["T2"], np.sum((np.conj(2 * s2) * J0[:, 0]).real, axis=-1), rtol=1e-4,
                               atol=1e-9)
    # device arrays in: the signal and the tissue gradient in their library
    s3, pb3 = _KeyedTrain().vjp(["T2"], **dev)
    g3 = pb3(2 * s3.get())["T2"]
    assert isinstance(s3, blochsim.DeviceArray) and isinstance(g3, blochsim.DeviceArray)
    np.testing.assert_allclose(g3.get(), np.sum((np.conj(2 * s2) * J0[:, 0]).real, axis=-1), rtol=1e-3, atol=1e-9)


def test_temporal_basis_on_device_arrays():
    """project / expand compute in the signals' library (CuPy, PyTorch)."""
    cp = pytest.importorskip("cupy")
    from blochsim.subspace import TemporalBasis

    sim = MRFSimulator(flip=FLIPS[:80], TR=10.0, states=16)
    atoms = sim.simulate(T1=np.geomspace(300, 3000, 40), T2=np.geomspace(20, 300, 40))
    b = TemporalBasis.learn(atoms, rank=4)
    c = b.project(cp.asarray(atoms))
    assert isinstance(c, cp.ndarray) and c.dtype == cp.complex64
    assert rel(cp.asnumpy(c), b.project(atoms)) <= 1e-5
    back = b.expand(c)
    assert isinstance(back, cp.ndarray) and rel(cp.asnumpy(back), b.expand(b.project(atoms))) <= 1e-5
    torch = pytest.importorskip("torch")
    t = torch.as_tensor(atoms, device="cuda")
    ct = b.project(t)
    assert isinstance(ct, torch.Tensor) and ct.is_cuda and rel(ct.cpu().numpy(), b.project(atoms)) <= 1e-5


def test_model_operator_on_device_arrays():
    """ModelOperator with CuPy free variables: forward, jvp, vjp and the
    Jacobian run on the card and come back as CuPy arrays equal to the
    NumPy operator's."""
    cp = pytest.importorskip("cupy")
    from blochsim import ModelOperator

    sim = MRFSimulator(flip=FLIPS[:100], TR=10.0, states=16)
    A = ModelOperator(sim, ("T1", "T2"), bounds={"T1": (100.0, 4000.0), "T2": (5.0, None)}, scale={"T2": 50.0},
                      amplitude=True, known={"B1": np.array([0.9, 1.0, 1.1])})
    x = A.to_free({"T1": np.array([500.0, 900.0, 1500.0]), "T2": np.array([40.0, 80.0, 120.0]),
                   "amplitude": np.array([1.0, 0.5j, 2.0])})
    rng = np.random.default_rng(1)
    dx = rng.standard_normal(x.shape)
    v = (rng.standard_normal((3, 100)) + 1j * rng.standard_normal((3, 100))).astype(np.complex64)
    xd, dxd, vd = cp.asarray(x), cp.asarray(dx), cp.asarray(v)
    # (the device adjoint runs in single precision, the host's pooled one in double)
    for got, want, tol in ((A.forward(xd), A.forward(x), RTOL), (A.jvp(xd, dxd), A.jvp(x, dx), RTOL),
                           (A.vjp(xd, vd), A.vjp(x, v), 1e-4), (A.jacobian(xd)[1], A.jacobian(x)[1], RTOL)):
        assert isinstance(got, cp.ndarray)
        assert rel(cp.asnumpy(got), want) <= tol


def test_static_ptx_on_device_arrays():
    """A multi-channel B1 of CuPy arrays: the signal, the Jacobian along the
    channel maps and the pullback to the maps and shim weights on the card,
    as the NumPy path gives them."""
    cp = pytest.importorskip("cupy")
    sim = MRFSimulator(flip=FLIPS[:60], TR=10.0, phases=0.5 * 117.0 * np.arange(60) * np.arange(1, 61) % 360.0)
    maps = np.array([[0.7 + 0.2j, 0.5 - 0.3j, 0.1 + 0.6j], [0.3 - 0.4j, 0.6 + 0.1j, 0.55]])
    shim = np.array([0.9 * np.exp(0.4j), 1.1 * np.exp(-1.2j)])
    T2 = np.array([40.0, 80.0, 120.0])
    ref = sim.simulate(T1=900.0, T2=T2, B1=maps, shim=shim)
    got = sim.simulate(T1=900.0, T2=cp.asarray(T2), B1=cp.asarray(maps), shim=shim)
    assert isinstance(got, cp.ndarray) and rel(cp.asnumpy(got), ref) <= RTOL
    s0, J0 = sim.jacobian(("T2", "B1"), T1=900.0, T2=T2, B1=maps, shim=shim)
    s1, J1 = sim.jacobian(("T2", "B1"), T1=900.0, T2=cp.asarray(T2), B1=cp.asarray(maps), shim=shim)
    assert isinstance(J1, cp.ndarray) and J1.shape == (3, 5, 60) and rel(cp.asnumpy(J1), J0) <= RTOL
    w = np.exp(1j * np.arange(ref.size) / 5.0).reshape(ref.shape)
    g0 = sim.vjp(("B1", "shim", "T2"), T1=900.0, T2=T2, B1=maps, shim=shim)[1](w)
    s2, pull = sim.vjp(("B1", "shim", "T2"), T1=900.0, T2=cp.asarray(T2), B1=cp.asarray(maps), shim=shim)
    g1 = pull(cp.asarray(w))
    assert isinstance(g1["B1"], cp.ndarray) and isinstance(g1["shim"], np.ndarray)
    assert rel(cp.asnumpy(g1["B1"]), g0["B1"]) <= 1e-4 and rel(g1["shim"], g0["shim"]) <= 1e-4
    assert rel(cp.asnumpy(g1["T2"]), g0["T2"]) <= 1e-4


def test_dynamic_ptx_on_the_device():
    """Per-pulse transmit settings on the card: a shim per pulse with CuPy
    maps and a kT-points train (a waveform per channel) with NumPy inputs
    and device='cuda': signal, Jacobian along the maps and the pullback to
    maps and shim weights as the host plays them, in the inputs' library."""
    cp = pytest.importorskip("cupy")
    import test_ptx_dynamic as D

    sim = D._sim()
    ref = sim.simulate(T1=D.T1, T2=D.T2, B1=D.MAPS, shim=D.SHIMS)
    got = sim.simulate(T1=D.T1, T2=cp.asarray(np.full(4, D.T2)), B1=cp.asarray(D.MAPS), shim=D.SHIMS)
    assert isinstance(got, cp.ndarray) and rel(cp.asnumpy(got), ref) <= RTOL
    s0, J0 = sim.jacobian(("T2", "B1"), T1=D.T1, T2=D.T2, B1=D.MAPS, shim=D.SHIMS)
    s1, J1 = sim.jacobian(("T2", "B1"), T1=D.T1, T2=D.T2, B1=cp.asarray(D.MAPS), shim=D.SHIMS)
    assert isinstance(J1, cp.ndarray) and rel(cp.asnumpy(J1), J0) <= 1e-5
    w = np.exp(1j * np.arange(ref.size) / 5.0).reshape(ref.shape)
    g0 = sim.vjp(("B1", "shim"), T1=D.T1, T2=D.T2, B1=D.MAPS, shim=D.SHIMS)[1](w)
    g1 = sim.vjp(("B1", "shim"), T1=D.T1, T2=D.T2, B1=cp.asarray(D.MAPS), shim=D.SHIMS)[1](cp.asarray(w))
    assert isinstance(g1["B1"], cp.ndarray) and isinstance(g1["shim"], np.ndarray)
    assert rel(cp.asnumpy(g1["B1"]), g0["B1"]) <= 1e-4 and rel(g1["shim"], g0["shim"]) <= 1e-4
    kt = D._KTPoints(states=4)
    host = kt.simulate(T1=D.KT_T1, T2=D.KT_T2, B0=D.KT_B0, B1=D.KT_MAPS)
    on_card = D._KTPoints(states=4, device="cuda")
    dev = on_card.simulate(T1=D.KT_T1, T2=D.KT_T2, B0=D.KT_B0, B1=D.KT_MAPS)
    assert isinstance(dev, np.ndarray) and np.max(np.abs(dev - D._kt_oracle())) <= 2e-5
    assert rel(dev, host) <= RTOL
    # the adjoint on the card: the waveform's pullback (its gaps by the quarter turn) and the maps'
    tissue = dict(T1=D.KT_T1, T2=D.KT_T2, B0=D.KT_B0, B1=D.KT_MAPS)
    g0 = kt.vjp(("waveform", "B1", "T2"), **tissue)[1](2 * host)
    g1 = on_card.vjp(("waveform", "B1", "T2"), **tissue)[1](2 * host)
    for k in ("waveform", "B1", "T2"):
        assert rel(np.asarray(g1[k]), np.asarray(g0[k])) <= 1e-4, k
