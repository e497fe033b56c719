"""Reverse mode (SPEC §4): pullbacks against central finite differences of a
float64 EPG written here from Weigel's equations (J Magn Reson Imaging 2015,
41:266), which plays the operators a simulator builds; against analytic
derivatives; and against the forward-mode Jacobian through the transpose
identity <w, J v> = <J^T w, v>."""
import numpy as np
import pytest

from blochsim import Delay, Dephase, Excitation, Inversion, Pulse, Readout, Refocusing, Sequence, Simulator, Spoil
from blochsim.simulators import FSESimulator, MRFSimulator, StimulatedEchoSimulator, TrueFISPSimulator


def _physics_oracle():
    """The Weigel rotation and shift of test_epg_physics.py."""
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location(
        "epg_physics", pathlib.Path(__file__).with_name("test_epg_physics.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_W = _physics_oracle()


def play(ops, T1, T2, M0=1.0, B1=1.0, B0=0.0, B1phase=0.0, inv_efficiency=1.0, K=64):
    """Samples of a list of operators in float64 (one voxel; ms, degrees, Hz)."""
    om = np.zeros((3, K), complex)
    om[2, 0] = 1.0
    out = []
    for op in ops:
        if isinstance(op, Pulse):
            om = _W.weigel_T(np.radians(float(op.flip)) * B1, np.radians(float(op.phase) + B1phase)) @ om
        elif isinstance(op, Delay):
            tau = float(op.duration) * 1e-3
            E1, E2 = np.exp(-tau / (T1 * 1e-3)), np.exp(-tau / (T2 * 1e-3))
            q = E2 * np.exp(-2j * np.pi * B0 * tau)
            om = om * np.array([[q], [np.conj(q)], [E1]])
            om[2, 0] += 1 - E1
        elif isinstance(op, Dephase):
            for _ in range(op.orders):
                om = _W.weigel_shift(om)
        elif isinstance(op, Inversion):
            om = om * np.array([[1.0], [1.0], [-inv_efficiency]])
        elif isinstance(op, Spoil):
            om[:2] = 0
        elif isinstance(op, Readout):
            out.append(M0 * om[0, 0] * np.exp(-1j * np.radians(float(op.phase))))
        else:
            raise TypeError(op)
    return np.array(out)


def oracle_signal(sim, tissue, raw=None, **proto):
    """The float64 oracle's samples of sim's sequence for each voxel (raw:
    protocol values set after the simulator's checks)."""
    p = {**sim._protocol_values(proto), **(raw or {})}
    prep = sim.preparation(p)
    ops = (prep.ops() if prep is not None else []) + sim.repetition(p).ops()
    shape = np.broadcast_shapes(*(np.shape(v) for v in tissue.values()))
    flat = {k: np.broadcast_to(np.asarray(v, float), shape).reshape(-1) for k, v in tissue.items()}
    n = int(np.prod(shape))
    return np.stack([play(ops, **{k: v[i] for k, v in flat.items()}) for i in range(n)]).reshape(shape + (-1,))


def loss(w, s):
    return float(np.sum(np.real(np.conj(w) * s)))


def rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


class Train(Simulator):
    """Inversion, TI, then per TR: pulse, TE, readout, one shift, TR - TE."""

    protocol = {"flip": None, "phases": None, "TE": 2.0, "TR": None, "TI": 30.0, "rx": -90.0}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "B1phase", "inv_efficiency")

    def check_protocol(self, p):
        for k in ("flip", "phases", "TR"):
            p[k] = np.asarray(p[k], dtype=float)
        for k in ("TE", "TI", "rx"):
            p[k] = float(p[k])
        return p

    def repetition(self, p):
        ops = [Inversion(), Delay(p["TI"])]
        for f, ph, tr in zip(p["flip"], p["phases"], p["TR"]):
            ops += [Pulse(f, ph), Delay(p["TE"]), Readout(p["rx"]), Dephase(), Delay(tr - p["TE"])]
        return Sequence(ops)


N_TR = 24
RNG = np.random.default_rng(7)
FLIP = np.concatenate([np.linspace(10, 70, N_TR // 2), np.linspace(70, 5, N_TR // 2)])
TRS = 9.0 + 2.0 * RNG.random(N_TR)
QUAD = 0.5 * 117.0 * np.arange(N_TR) * (np.arange(N_TR) + 1) % 360.0


def central_protocol(sim, tissue, w, name, value, h):
    """Central differences of the oracle's loss with respect to every entry
    of protocol parameter `name` (value as given)."""
    value = np.asarray(value, float)
    g = np.zeros(value.shape)
    for i in np.ndindex(value.shape):
        up, dn = value.copy(), value.copy()
        up[i] += h
        dn[i] -= h
        g[i] = (loss(w, oracle_signal(sim, tissue, **{name: up})) -
                loss(w, oracle_signal(sim, tissue, **{name: dn}))) / (2 * h)
    return g


def central_tissue(sim, tissue, w, name, h):
    """Central differences of the oracle's loss per voxel of tissue property `name`."""
    v = np.asarray(tissue[name], float)
    g = np.zeros(v.shape)
    for i in np.ndindex(v.shape):
        up, dn = v.copy(), v.copy()
        up[i] += h
        dn[i] -= h
        g[i] = (loss(w, oracle_signal(sim, {**tissue, name: up})) -
                loss(w, oracle_signal(sim, {**tissue, name: dn}))) / (2 * h)
    return g


@pytest.mark.parametrize("complex_path", [False, True])
def test_protocol_and_tissue_gradients_against_the_oracle(complex_path):
    phases = QUAD if complex_path else np.zeros(N_TR)
    sim = Train(flip=FLIP, phases=phases, TR=TRS, states=32)
    tissue = {"T1": np.array([700.0, 1400.0]), "T2": np.array([50.0, 110.0]), "B1": np.array([0.9, 1.05])}
    if complex_path:
        tissue["B0"] = np.array([4.0, -9.0])
    names = ("flip", "phases", "TR", "TE", "TI", "rx") + tuple(tissue)
    s, pullback = sim.vjp(names, **tissue)
    assert s.shape == (2, N_TR) and s.dtype == np.complex64
    assert rel(s, oracle_signal(sim, tissue)) < 1e-5
    w = RNG.standard_normal(s.shape) + 1j * RNG.standard_normal(s.shape)
    g = pullback(w)
    assert set(g) == set(names)
    steps = {"flip": 1e-4, "phases": 1e-4, "TR": 1e-4, "TE": 1e-4, "TI": 1e-4, "rx": 1e-4}
    for name, h in steps.items():
        ref = central_protocol(sim, tissue, w, name, sim._protocol_values({})[name], h)
        assert g[name].shape == np.shape(ref) and g[name].dtype == np.float64
        assert rel(g[name], ref) < 1e-4, name
    for name, h in {"T1": 1e-3, "T2": 1e-4, "B1": 1e-6, "B0": 1e-5}.items():
        if name in tissue:
            assert g[name].shape == (2,)
            assert rel(g[name], central_tissue(sim, tissue, w, name, h)) < 1e-4, name


def test_fse_flip_train_and_echo_spacing_against_the_oracle():
    flips = np.linspace(180.0, 100.0, 12)
    sim = FSESimulator(ESP=7.0, flip=flips, states=32)
    tissue = {"T1": 900.0, "T2": np.array([45.0, 80.0]), "B1": 0.95}
    s, pullback = sim.vjp(("flip", "ESP", "exc_flip", "exc_phase", "phases", "T2", "T1"), **tissue)
    g = pullback(2 * s)  # L = sum |s|^2

    def L(**proto):
        return float(np.sum(np.abs(oracle_signal(sim, tissue, **proto)) ** 2))

    h = 1e-4
    fd = np.array([(L(flip=flips + h * e) - L(flip=flips - h * e)) / (2 * h) for e in np.eye(12)])
    assert rel(g["flip"], fd) < 1e-4
    assert g["ESP"].shape == () and g["exc_flip"].shape == () and g["phases"].shape == ()
    assert abs(g["ESP"] - (L(ESP=7.0 + h) - L(ESP=7.0 - h)) / (2 * h)) < 1e-4 * abs(g["ESP"])
    assert abs(g["exc_flip"] - (L(exc_flip=90.0 + h) - L(exc_flip=90.0 - h)) / (2 * h)) < 1e-3
    # sum |s|^2 is even in a common refocusing phase about the CPMG condition
    assert abs(g["phases"]) < 1e-5 * np.max(np.abs(g["flip"]))
    assert g["T1"].shape == () and g["T2"].shape == (2,)


def test_perfect_cpmg_against_the_analytic_gradient():
    # echo n of a perfect CPMG train is e^{-n ESP/T2}: L = sum |s|^2 has
    # dL/dESP = sum -2 n/T2 e^{-2 n ESP/T2}, dL/dT2 = sum 2 n ESP/T2^2 e^{-2 n ESP/T2}
    ESP, T2, n = 6.0, np.array([40.0, 95.0]), np.arange(1, 21)
    s, pullback = FSESimulator(ESP=ESP, flip=np.full(20, 180.0)).vjp(("ESP", "T2"), T1=900.0, T2=T2)
    g = pullback(2 * s)
    e = np.exp(-2 * n[None] * ESP / T2[:, None])
    assert rel(g["ESP"], np.sum(-2 * n[None] / T2[:, None] * e)) < 1e-5
    assert rel(g["T2"], np.sum(2 * n[None] * ESP / T2[:, None] ** 2 * e, axis=1)) < 1e-5


def test_transpose_identity_with_the_forward_jacobian():
    # <w, J v> = <J^T w, v>: the pullback's tissue gradient is Re(sum conj(w) J)
    names = ("T1", "T2", "M0", "B1", "B0", "B1phase", "inv_efficiency")
    tissue = {"T1": np.array([600.0, 1500.0, 900.0]), "T2": np.array([45.0, 130.0, 70.0]), "M0": 1.2,
              "B1": np.array([0.95, 1.0, 1.1]), "B0": 3.0, "B1phase": 2.0, "inv_efficiency": 0.97}
    sim = Train(flip=FLIP, phases=QUAD, TR=TRS, states=32)
    s, J = sim.jacobian(names, **tissue)
    s2, pullback = sim.vjp(names, **tissue)
    np.testing.assert_allclose(s2, s, rtol=0, atol=1e-5 * np.max(np.abs(s)))
    w = RNG.standard_normal(s.shape) + 1j * RNG.standard_normal(s.shape)
    g = pullback(w)
    for j, name in enumerate(names):
        per_voxel = np.sum(np.real(np.conj(w) * J[:, j].astype(np.complex128)), axis=-1)
        ref = per_voxel if np.ndim(tissue[name]) else per_voxel.sum()
        assert np.shape(g[name]) == np.shape(tissue[name])
        assert rel(g[name], ref) < 1e-4, name


def test_directional_derivative_of_the_whole_flip_train():
    # <pullback(w), v> against d/dh L(flip + h v) of the oracle
    sim = Train(flip=FLIP, phases=np.zeros(N_TR), TR=TRS, states=32)
    tissue = {"T1": 1000.0, "T2": 80.0}
    s, pullback = sim.vjp("flip", **tissue)
    w = RNG.standard_normal(s.shape) + 1j * RNG.standard_normal(s.shape)
    v = RNG.standard_normal(N_TR)
    h = 1e-4
    fd = (loss(w, oracle_signal(sim, tissue, flip=FLIP + h * v)) -
          loss(w, oracle_signal(sim, tissue, flip=FLIP - h * v))) / (2 * h)
    assert abs(np.dot(pullback(w)["flip"], v) - fd) < 1e-4 * abs(fd)


def test_diffusion_against_stejskal_tanner():
    # echo = e^{-2 tau/T2} e^{-b D}: dL/dD = -b Re(conj(w) s) per voxel
    tau, T2, crusher, voxel = 20.0, 80.0, 4 * np.pi, 1e-3

    class DW(Simulator):
        tissue_properties = ("T2", "D")

        def repetition(self, p):
            return (Readout() @ Dephase() @ Delay(tau) @ Refocusing(180.0) @ Delay(tau) @ Dephase()
                    @ Excitation(90.0, 90.0))

    D = np.array([0.5, 1.0, 3.0])
    s, pullback = DW(crusher_dephasing_rad=crusher, voxel_size_m=voxel).vjp("D", T2=T2, D=D)
    w = np.full(s.shape, 1.0 + 0.5j)
    b = (crusher / voxel) ** 2 * 2 * tau * 1e-3 * 1e-9
    assert rel(pullback(w)["D"], -b * np.real(np.conj(w) * s)[:, 0]) < 1e-5


def test_flow_by_the_transpose_identity():
    class Flow(Simulator):
        protocol = {"flip": 150.0}
        tissue_properties = ("T1", "T2", "v")

        def repetition(self, p):
            ops = [Excitation(90.0, 90.0)]
            for _ in range(12):
                ops += [Dephase(), Delay(4.0), Refocusing(p["flip"]), Dephase(), Delay(4.0), Readout()]
            return Sequence(ops)

    sim = Flow(crusher_dephasing_rad=2 * np.pi, voxel_size_m=2e-3)
    kw = {"T1": 1000.0, "T2": 100.0, "v": np.array([0.01, 0.05])}
    s, J = sim.jacobian(("v", "T2"), **kw)
    _, pullback = sim.vjp(("v", "T2", "flip"), **kw)
    w = RNG.standard_normal(s.shape) + 1j * RNG.standard_normal(s.shape)
    g = pullback(w)
    assert rel(g["v"], np.sum(np.real(np.conj(w) * J[:, 0]), axis=-1)) < 1e-4
    assert rel(g["T2"], np.sum(np.real(np.conj(w) * J[:, 1]))) < 1e-4
    assert np.isfinite(g["flip"])


def test_a_zero_duration_still_has_a_gradient():
    # TI = 0: the inversion's delay is empty, but d/dTI is not zero
    flips = np.linspace(10.0, 60.0, 10)
    sim = MRFSimulator(flip=flips, TR=10.0, TI=0.0)
    tissue = {"T1": 800.0, "T2": 60.0}
    s, pullback = sim.vjp(("TI", "TR"), **tissue)
    g = pullback(2 * s)

    def L(**raw):
        return float(np.sum(np.abs(oracle_signal(sim, tissue, raw=raw)) ** 2))

    h = 1e-3  # one-sided, second order
    assert g["TI"] != 0 and rel(g["TI"], (-3 * L(TI=0.0) + 4 * L(TI=h) - L(TI=2 * h)) / (2 * h)) < 1e-4
    tr = np.full(10, 10.0)
    assert g["TR"].shape == () and rel(g["TR"], (L(TR=tr + h) - L(TR=tr - h)) / (2 * h)) < 1e-4


def test_shipped_simulators_against_the_oracle():
    tissue = {"T1": 1100.0, "T2": 70.0}
    w = None
    for sim, names in [(TrueFISPSimulator(flip=40.0, TR=5.0, nshots=30), ("flip", "TR", "TE")),
                       (StimulatedEchoSimulator(flip=[80.0, 100.0, 70.0], TE=20.0, TM=60.0), ("flip", "TE", "TM"))]:
        s, pullback = sim.vjp(names, **tissue)
        w = np.exp(1j * np.arange(s.size)).reshape(s.shape)
        g = pullback(w)
        for name in names:
            ref = central_protocol(sim, tissue, w, name, sim._protocol_values({})[name], 1e-4)
            assert rel(g[name], ref) < 1e-4, (type(sim).__name__, name)


def test_checkpointing_over_a_long_train():
    # 2000 TRs (C = 45 events per segment): the gradient of the first flip
    # reaches back through every segment
    n = 2000
    flips = 10.0 + 50.0 * np.abs(np.sin(np.arange(n) / 60.0))
    sim = MRFSimulator(flip=flips, TR=6.0, states=16)
    tissue = {"T1": 1000.0, "T2": 100.0}
    s, pullback = sim.vjp("flip", **tissue)
    g = pullback(2 * s)["flip"]
    p = sim._protocol_values({})
    ops = sim.repetition(p).ops()
    h = 1e-4
    for i in (0, 1000, n - 1):
        up, dn = flips.copy(), flips.copy()
        up[i] += h
        dn[i] -= h
        Lu = np.sum(np.abs(play(sim.repetition({**p, "flip": up}).ops(), **tissue, K=16)) ** 2)
        Ld = np.sum(np.abs(play(sim.repetition({**p, "flip": dn}).ops(), **tissue, K=16)) ** 2)
        assert abs(g[i] - (Lu - Ld) / (2 * h)) < 1e-4 * np.max(np.abs(g)), i
    assert len(ops) == 2 + 4 * n


def test_the_same_gradient_at_every_thread_count():
    T1 = np.linspace(300.0, 2000.0, 70)
    results = []
    for threads in (1, 2, 3):
        sim = Train(flip=FLIP, phases=QUAD, TR=TRS, threads=threads)
        s, pullback = sim.vjp(("flip", "TR", "T1"), T1=T1, T2=60.0, B0=2.0)
        results.append(pullback(2 * s))
    for r in results[1:]:
        for k in r:
            np.testing.assert_array_equal(r[k], results[0][k])


# ---------------------------------------------------------------------------
# Refusals

def _fse():
    return FSESimulator(ESP=5.0, flip=np.full(8, 160.0))


def test_refuses_bad_wrt():
    fse = _fse()
    with pytest.raises(ValueError, match="at least one"):
        fse.vjp((), T1=1000.0, T2=80.0)
    with pytest.raises(TypeError, match="'bogus'"):
        fse.vjp("bogus", T1=1000.0, T2=80.0)
    with pytest.raises(TypeError, match="'states'.*engine"):
        fse.vjp("states", T1=1000.0, T2=80.0)
    with pytest.raises(TypeError, match="'nshots'.*not a float"):
        TrueFISPSimulator(flip=30.0, TR=5.0, nshots=10).vjp("nshots", T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match="twice"):
        fse.vjp(("flip", "flip"), T1=1000.0, T2=80.0)
    with pytest.raises(TypeError, match="by str"):
        fse.vjp((1,), T1=1000.0, T2=80.0)


def test_refuses_tissue_not_passed_or_not_float():
    fse = _fse()
    with pytest.raises(ValueError, match="vjp with respect to 'B1' needs B1"):
        fse.vjp("B1", T1=1000.0, T2=80.0)
    with pytest.raises(TypeError, match="T2 must be a float array"):
        fse.vjp("T2", T1=1000.0, T2=np.array([80, 90]))


def test_refuses_a_bad_cotangent():
    s, pullback = _fse().vjp("flip", T1=1000.0, T2=np.array([80.0, 90.0]))
    with pytest.raises(ValueError, match=r"cotangent must have the signal's shape \(2, 8\), got \(8,\)"):
        pullback(np.ones(8))
    with pytest.raises(ValueError, match="cotangent must be finite"):
        pullback(np.full(s.shape, np.nan))
    with pytest.raises(TypeError, match="cotangent must be a float or complex array"):
        pullback(np.ones(s.shape, dtype=np.int64))


# ---------------------------------------------------------------------------
# Second order: the pullback of a cost of the Jacobian (forward over reverse)

def oracle_jacobian(sim, tissue, names, raw=None, steps=None):
    """d signal / d property of the float64 oracle by central differences."""
    steps = steps or {"T1": 1e-2, "T2": 1e-3, "M0": 1e-5, "B1": 1e-6}
    cols = []
    for k in names:
        up, dn = dict(tissue), dict(tissue)
        up[k] = np.asarray(tissue[k], float) + steps[k]
        dn[k] = np.asarray(tissue[k], float) - steps[k]
        cols.append((oracle_signal(sim, up, raw) - oracle_signal(sim, dn, raw)) / (2 * steps[k]))
    return np.stack(cols, axis=-2)


def test_second_order_against_nested_differences_of_the_oracle():
    # <W, J(p)> for fixed W: its gradient in the flips and TR, against
    # central differences in the protocol of the oracle's Jacobian
    sim = Train(flip=FLIP, phases=np.zeros(N_TR), TR=TRS, states=32)
    tissue = {"T1": np.array([700.0, 1400.0]), "T2": np.array([50.0, 110.0]), "M0": 1.0, "B1": 0.95}
    names = ("T1", "T2", "M0", "B1")
    s, J, pullback = sim.jacobian_vjp(names, ("flip", "TR", "TE"), **tissue)
    assert J.shape == (2, 4, N_TR) and rel(J, oracle_jacobian(sim, tissue, names)) < 1e-4
    W = RNG.standard_normal(J.shape) + 1j * RNG.standard_normal(J.shape)
    g = pullback(W)
    p = sim._protocol_values({})

    def h(**raw):
        return float(np.sum(np.real(np.conj(W) * oracle_jacobian(sim, tissue, names, raw))))

    d = 1e-3
    for i in (0, 7, N_TR - 1):
        e = np.zeros(N_TR)
        e[i] = d
        assert abs(g["flip"][i] - (h(flip=p["flip"] + e) - h(flip=p["flip"] - e)) / (2 * d)) \
            < 1e-3 * np.max(np.abs(g["flip"])), i
        assert abs(g["TR"][i] - (h(TR=p["TR"] + e) - h(TR=p["TR"] - e)) / (2 * d)) \
            < 1e-3 * np.max(np.abs(g["TR"])), i
    assert rel(g["TE"], (h(TE=p["TE"] + d) - h(TE=p["TE"] - d)) / (2 * d)) < 1e-3


def test_second_order_against_differences_of_the_first_order_gradient():
    # d/dT2 of the flip gradient of <w, s> is the second-order pullback of
    # w placed on the T2 column
    fse = FSESimulator(ESP=8.0, flip=np.linspace(180.0, 100.0, 10))
    T2 = np.array([50.0, 90.0])
    _, J, pullback = fse.jacobian_vjp(("T2",), ("flip", "ESP"), T1=1000.0, T2=T2)
    w = RNG.standard_normal(J.shape[::2]) + 1j * RNG.standard_normal(J.shape[::2])
    g = pullback(w[:, None, :])
    h = 0.5

    def first(t2):
        s, pb = fse.vjp(("flip", "ESP"), T1=1000.0, T2=t2)
        return pb(w)

    up, dn = first(T2 + h), first(T2 - h)
    for k in ("flip", "ESP"):
        assert rel(g[k], (up[k] - dn[k]) / (2 * h)) < 2e-3, k


def test_crlb_cost_and_its_gradient():
    from blochsim.optim import CRLBCost, crlb

    flips = np.linspace(180.0, 100.0, 10)
    tissue = {"T1": 1000.0, "T2": np.array([50.0, 90.0]), "M0": 1.0}
    names = ("M0", "T2")
    cost = CRLBCost(names, noise_variance=1e-4, weights={"T2": 1.0})
    fse = FSESimulator(ESP=8.0, flip=flips)
    s, J, pullback = fse.jacobian_vjp(names, "flip", **tissue)
    value, W = cost(J)
    assert abs(value - np.sum(crlb(J, 1e-4)[:, 1])) < 1e-9 * value
    g = pullback(W)["flip"]

    def C(f):
        return cost(oracle_jacobian(FSESimulator(ESP=8.0, flip=f), tissue, names))[0]

    d = 1e-3
    fd = np.array([(C(flips + d * e) - C(flips - d * e)) / (2 * d) for e in np.eye(10)])
    assert rel(g, fd) < 1e-3


def test_second_order_refusals():
    fse = _fse()
    with pytest.raises(TypeError, match="'T1' is a tissue property"):
        fse.jacobian_vjp("T2", ("flip", "T1"), T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match="jacobian with respect to 'B1' needs B1"):
        fse.jacobian_vjp("B1", "flip", T1=1000.0, T2=80.0)
    _, J, pullback = fse.jacobian_vjp(("M0", "T2"), "flip", T1=1000.0, T2=np.array([80.0, 90.0]), M0=1.0)
    with pytest.raises(ValueError, match=r"cotangent must have the Jacobian's shape \(2, 2, 8\)"):
        pullback(np.ones((2, 8)))


def test_rf_waveform_samples_against_the_oracle():
    # a shaped excitation (complex samples, uT) then a spin echo: the
    # gradient with respect to each sample is dL/dRe + i dL/dIm
    t = np.linspace(-1, 1, 9)
    wave = (4.0 * np.sinc(2 * t) * np.exp(0.4j * t)).astype(np.complex128)

    class Shaped(Simulator):
        protocol = {"waveform": wave, "dwell": 40.0, "scale": 1.0}
        tissue_properties = ("T1", "T2", "B0")

        def repetition(self, p):
            exc = SampledPulse(p["waveform"], dwell=p["dwell"])
            return Sequence([exc, Delay(5.0), Dephase(), Refocusing(170.0), Dephase(), Delay(5.0), Readout(),
                             Dephase(), Refocusing(p["scale"] * 150.0), Dephase(), Delay(10.0), Readout()])

    from blochsim import SampledPulse

    sim = Shaped(states=16)
    tissue = {"T1": 900.0, "T2": 70.0, "B0": np.array([0.0, 40.0])}
    s, pullback = sim.vjp(("waveform", "scale"), **tissue)
    w = RNG.standard_normal(s.shape) + 1j * RNG.standard_normal(s.shape)
    g = pullback(w)
    assert g["waveform"].shape == (9,) and g["waveform"].dtype == np.complex128
    h = 1e-5
    fd = np.zeros(9, complex)
    for i in range(9):
        for part in (1.0, 1j):
            up, dn = wave.copy(), wave.copy()
            up[i] += h * part
            dn[i] -= h * part
            d = (loss(w, oracle_signal(sim, tissue, waveform=up)) -
                 loss(w, oracle_signal(sim, tissue, waveform=dn))) / (2 * h)
            fd[i] += d * part
    assert rel(g["waveform"], fd) < 1e-4
    ref = (loss(w, oracle_signal(sim, tissue, scale=1.0 + h)) - loss(w, oracle_signal(sim, tissue, scale=1.0 - h))) / (2 * h)
    assert rel(g["scale"], ref) < 1e-4


# ---------------------------------------------------------------------------
# Closed forms: analytic pullbacks against float64 central differences

from blochsim.simulators import (InversionRecoverySimulator, SPGRSimulator, SpinEchoSimulator,  # noqa: E402
                                 bSSFPSimulator)

CLOSED = [
    (SPGRSimulator(flip=np.array([4.0, 12.0, 30.0]), TR=8.0, TE=np.array([2.0, 3.0, 5.0])),
     {"T1": np.array([800.0, 1300.0]), "T2star": 40.0, "M0": 1.2, "B0": 6.0}, ("flip", "TR", "TE", "T1", "M0")),
    (bSSFPSimulator(flip=np.array([20.0, 45.0, 70.0]), TR=5.0, phase_inc=np.array([180.0, 150.0, 90.0])),
     {"T1": 1000.0, "T2": np.array([60.0, 90.0]), "B0": np.array([3.0, -7.0])},
     ("flip", "TR", "phase_inc", "T2", "B0")),
    (bSSFPSimulator(flip=30.0, TR=6.0, TE=2.0), {"T1": 900.0, "T2": 70.0}, ("TR", "TE")),
    (InversionRecoverySimulator(TI=np.array([100.0, 400.0, 1200.0]), TR=3000.0),
     {"T1": np.array([600.0, 1500.0]), "inv_efficiency": 0.95}, ("TI", "TR", "T1", "inv_efficiency")),
    (SpinEchoSimulator(TE=np.array([10.0, 40.0, 90.0]), TR=2000.0),
     {"T1": 1100.0, "T2": np.array([50.0, 80.0])}, ("TE", "TR", "T2")),
]


@pytest.mark.parametrize("sim,tissue,names", CLOSED, ids=["SPGR", "bSSFP", "bSSFP TE", "IR", "SE"])
def test_closed_form_pullbacks_against_finite_differences(sim, tissue, names):
    s, pullback = sim.vjp(names, **tissue)
    assert s.dtype == np.complex128
    w = np.exp(1j * np.arange(s.size)).reshape(s.shape) * (1 + np.arange(s.size).reshape(s.shape) % 3)
    g = pullback(w)
    p = sim._protocol_values({})

    def central(k, v, play):
        # relative steps of 1e-6: the closed forms are float64
        ref = np.zeros(v.shape)
        for i in np.ndindex(v.shape):
            up, dn = v.copy(), v.copy()
            step = 1e-6 * max(1.0, abs(v[i]))
            up[i] += step
            dn[i] -= step
            ref[i] = (loss(w, play(up)) - loss(w, play(dn))) / (2 * step)
        return ref

    for k in names:
        if k in tissue:
            v = np.asarray(tissue[k], float)
            ref = central(k, v, lambda x: sim.simulate(**{**tissue, k: x}))
        else:
            v = np.asarray(p[k], float)
            ref = central(k, v, lambda x: sim.simulate(**tissue, **{k: x}))
        assert np.shape(g[k]) == v.shape, k
        assert rel(g[k], ref) < 1e-6, k


def test_closed_form_vjp_refusals():
    spgr = SPGRSimulator(flip=10.0, TR=8.0)
    with pytest.raises(TypeError, match="cannot differentiate with respect to 'T2'"):
        spgr.vjp("T2", T1=900.0)
    with pytest.raises(ValueError, match="vjp with respect to 'B0' needs B0"):
        spgr.vjp("B0", T1=900.0)
    with pytest.raises(TypeError, match="cannot differentiate with respect to 'TR'"):
        InversionRecoverySimulator(TI=np.array([100.0])).vjp("TR", T1=900.0)


def test_repetitions_sum_the_gradient_of_every_playing():
    # three trains 300 ms apart, the last recorded: TR only acts through the
    # recovery between trains
    fse = FSESimulator(ESP=10.0, flip=np.full(6, 150.0), TR=300.0, repetitions=3, states=32)
    tissue = {"T1": 700.0, "T2": 80.0}
    s, pullback = fse.vjp(("TR", "flip", "ESP"), **tissue)
    g = pullback(2 * s)

    def L(**proto):
        p = fse._protocol_values(proto)
        samples = play(fse.repetition(p).ops() * 3, **tissue, K=32)[-6:]
        return float(np.sum(np.abs(samples) ** 2))

    h = 1e-3
    assert rel(g["TR"], (L(TR=300.0 + h) - L(TR=300.0 - h)) / (2 * h)) < 1e-4
    assert rel(g["ESP"], (L(ESP=10.0 + h) - L(ESP=10.0 - h)) / (2 * h)) < 1e-4
    f = np.full(6, 150.0)
    fd = np.array([(L(flip=f + h * e) - L(flip=f - h * e)) / (2 * h) for e in np.eye(6)])
    assert rel(g["flip"], fd) < 1e-4


def test_device_tissue_gradients_go_back_to_their_library(monkeypatch):
    """The pullback's gradient of a tissue property passed as a device array
    goes back to that array's library (float64); the protocol's and host
    properties' stay NumPy (the device path itself: tests/test_gpu.py)."""
    from blochsim._arrays import device as D

    moved = []
    monkeypatch.setattr(D, "to_library", lambda a, library: moved.append((library, a.dtype)) or (library, a))
    grads = {"flip": np.ones(3), "T1": np.array([1.0, 2.0], np.float32), "T2": np.array(3.0)}
    out = D.gradients_in_libraries(grads, {"T1": "cupy", "B1": "torch"})
    assert out["T1"][0] == "cupy" and out["T1"][1].dtype == np.float64
    np.testing.assert_array_equal(out["T1"][1], [1.0, 2.0])
    assert isinstance(out["flip"], np.ndarray) and isinstance(out["T2"], np.ndarray)
    assert moved == [("cupy", np.float64)] and "B1" not in out
