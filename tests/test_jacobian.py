"""Forward-mode tissue Jacobians (SPEC §4) against outside references:
analytic derivatives of closed forms, and central finite differences of a
float64 EPG written here from Weigel's equations (J Magn Reson Imaging
2015, 41:266)."""
import numpy as np
import pytest

from blochsim import Delay, Dephase, Excitation, Inversion, Pulse, Readout, Refocusing, Sequence, Simulator
from blochsim.simulators import FSESimulator, MRFSimulator


def _physics_oracle():
    """The Weigel EPG of test_epg_physics.py (tests are not a package)."""
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location(
        "epg_physics", pathlib.Path(__file__).with_name("test_epg_physics.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_W = _physics_oracle()
rf, shift = _W.weigel_T, _W.weigel_shift

FLIPS = np.concatenate([np.linspace(5, 60, 30), np.linspace(60, 2, 30)])


def rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# ---------------------------------------------------------------------------
# float64 oracle: an inversion-prepared train (pulse, free precession over
# TE, readout at receiver phase -90 deg, one shift, free precession over
# TR - TE), states as a (3, K) complex array with rows F+, F-, Z.

def relax(om, tau, T1, T2, B0):
    E1, E2 = np.exp(-tau / T1), np.exp(-tau / T2)
    q = E2 * np.exp(-2j * np.pi * B0 * tau)
    om = om * np.array([[q], [np.conj(q)], [E1]])
    om[2, 0] += 1 - E1
    return om


TE, TR = 2.0, 10.0


def oracle(T1, T2, M0=1.0, B1=1.0, B0=0.0, B1phase=0.0, inv_efficiency=1.0, phases=None, K=32):
    """Samples of the train in float64; times in ms, B0 in Hz, phases in degrees."""
    ph = np.zeros(len(FLIPS)) if phases is None else np.radians(phases)
    om = np.zeros((3, K), complex)
    om[2, 0] = -inv_efficiency
    out = []
    for a, p in zip(np.radians(FLIPS), ph):
        om = relax(rf(a * B1, p + np.radians(B1phase)) @ om, TE * 1e-3, T1 * 1e-3, T2 * 1e-3, B0)
        out.append(1j * M0 * om[0, 0])
        om = relax(shift(om), (TR - TE) * 1e-3, T1 * 1e-3, T2 * 1e-3, B0)
    return np.array(out)


def central(f, kw, name, h):
    up, dn = dict(kw), dict(kw)
    up[name] = kw[name] + h
    dn[name] = kw[name] - h
    return (f(**up) - f(**dn)) / (2 * h)


class Train(Simulator):
    """The oracle's train, with every property it models."""

    protocol = {"phases": None}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "B1phase", "inv_efficiency")

    def repetition(self, p):
        ph = np.zeros(len(FLIPS)) if p["phases"] is None else p["phases"]
        ops = [Inversion()]
        for f, q in zip(FLIPS, ph):
            ops += [Pulse(float(f), float(q)), Delay(TE), Readout(-90.0), Dephase(), Delay(TR - TE)]
        return Sequence(ops)


STEPS = {"T1": 0.5, "T2": 0.05, "M0": 1e-4, "B1": 1e-5, "B0": 1e-3, "B1phase": 1e-3, "inv_efficiency": 1e-5}


def test_real_path_jacobian_against_finite_differences_of_the_oracle():
    kw = {"T1": 850.0, "T2": 60.0, "M0": 0.8, "B1": 0.9, "inv_efficiency": 0.95}
    names = ("T1", "T2", "M0", "B1", "inv_efficiency")
    s, J = Train(states=32).jacobian(names, **kw)
    assert s.shape == (60,) and J.shape == (5, 60) and J.dtype == np.complex64
    assert rel(s, oracle(**kw)) < 1e-5
    for j, name in enumerate(names):
        assert rel(J[j], central(oracle, kw, name, STEPS[name])) < 1e-4, name


def test_complex_path_jacobian_with_off_resonance_and_phases():
    phases = 0.5 * 117.0 * np.arange(60) * (np.arange(60) + 1) % 360.0
    kw = {"T1": 1200.0, "T2": 90.0, "B1": 1.05, "B0": 7.0, "B1phase": 4.0}
    names = ("T2", "T1", "B0", "B1", "B1phase")
    s, J = Train(states=32, phases=phases).jacobian(names, **kw)
    assert rel(s, oracle(**kw, phases=phases)) < 1e-5
    for j, name in enumerate(names):
        ref = central(lambda **k: oracle(**k, phases=phases), kw, name, STEPS[name])
        assert rel(J[j], ref) < 1e-4, name


def test_perfect_cpmg_against_the_analytic_derivative():
    # 180-degree refocusing: echo n is M0 e^{-n ESP / T2} (times a phase), so
    # d/dT2 = n ESP / T2^2 s and d/dM0 = s / M0; T1 has no effect
    ESP, T2, M0 = 6.0, np.array([40.0, 95.0]), 1.3
    sim = FSESimulator(ESP=ESP, flip=np.full(20, 180.0))
    s, J = sim.jacobian(("T2", "M0", "T1"), T1=900.0, T2=T2, M0=M0)
    n = np.arange(1, 21)
    TE = n * ESP
    assert rel(np.abs(s), M0 * np.exp(-TE[None] / T2[:, None])) < 1e-5
    assert rel(J[:, 0], s * TE[None] / T2[:, None] ** 2) < 1e-5
    assert rel(J[:, 1], s / M0) < 1e-5
    assert np.max(np.abs(J[:, 2])) < 1e-9


def test_inversion_recovery_against_the_analytic_derivative():
    # s = 1 - (1 + eta) e^{-TI/T1}: d/dT1 = -(1 + eta) TI/T1^2 e^{-TI/T1},
    # d/deta = -e^{-TI/T1}
    TI, T1, eta = 400.0, np.array([300.0, 700.0, 2000.0]), 0.93

    class IR(Simulator):
        tissue_properties = ("T1", "inv_efficiency")

        def repetition(self, p):
            return Readout(-90.0) @ Pulse(90.0) @ Delay(TI) @ Inversion()

    s, J = IR().jacobian(["T1", "inv_efficiency"], T1=T1, inv_efficiency=eta)
    e = np.exp(-TI / T1)
    assert rel(s[:, 0].real, 1 - (1 + eta) * e) < 1e-5
    assert rel(J[:, 0, 0].real, -(1 + eta) * TI / T1 ** 2 * e) < 1e-5
    assert rel(J[:, 1, 0].real, -e) < 1e-5


def test_diffusion_against_stejskal_tanner():
    # echo = e^{-2 tau/T2} e^{-b D}: d/dD = -b echo (b in ms/um^2 for D in um^2/ms)
    tau, T2 = 20.0, 80.0
    crusher, voxel = 4 * np.pi, 1e-3
    dk = crusher / voxel
    D = np.array([0.5, 1.0, 3.0])

    class DW(Simulator):
        tissue_properties = ("T2", "D")

        def repetition(self, p):
            return (Readout() @ Dephase() @ Delay(tau) @ Refocusing(180.0) @ Delay(tau) @ Dephase()
                    @ Excitation(90.0, 90.0))

    s, J = DW(crusher_dephasing_rad=crusher, voxel_size_m=voxel).jacobian("D", T2=T2, D=D)
    b = dk ** 2 * 2 * tau * 1e-3 * 1e-9  # per (um^2/ms)
    assert rel(J[:, 0], -b * s[:, 0]) < 1e-5


def test_flow_against_finite_differences():
    # a velocity v moves the phase of order k by k dk v tau and washes out
    # v tau / voxel of the voxel per interval; the reference is central
    # differences of blochsim's float32 forward (rounding ~1e-4 of J here)
    class Flow(Simulator):
        tissue_properties = ("T1", "T2", "v")

        def repetition(self, p):
            ops = [Excitation(90.0, 90.0)]
            for _ in range(12):
                ops += [Dephase(), Delay(4.0), Refocusing(150.0), Dephase(), Delay(4.0), Readout()]
            return Sequence(ops)

    sim = Flow(crusher_dephasing_rad=2 * np.pi, voxel_size_m=2e-3)
    kw = {"T1": 1000.0, "T2": 100.0, "v": np.array([0.01, 0.05])}
    s, J = sim.jacobian("v", **kw)
    h = 2e-4
    fd = central(lambda **k: sim.simulate(**k).astype(np.complex128), kw, "v", h)
    assert rel(J, fd) < 2e-3


def test_every_direction_at_once_matches_each_alone():
    kw = {"T1": np.array([600.0, 1500.0]), "T2": np.array([45.0, 130.0]), "M0": 1.1, "B1": 0.95, "B0": 3.0,
          "B1phase": 2.0, "inv_efficiency": 0.97}
    names = tuple(kw)
    sim = Train(states=32)
    s, J = sim.jacobian(names, **kw)  # 7 directions: passes of four duals and two
    assert J.shape == (2, 7, 60)
    for j, name in enumerate(names):
        s1, J1 = sim.jacobian(name, **kw)
        np.testing.assert_array_equal(s1, s)
        assert rel(J1, J[:, j]) < 1e-6, name
    s2, J2 = sim.jacobian(("B0", "T2", "T1"), **kw)  # 3 directions: duals of 4
    assert rel(J2[:, 1], J[:, 1]) < 1e-6 and rel(J2[:, 0], J[:, 4]) < 1e-6


def test_shapes_and_thread_count():
    T1 = np.linspace(400.0, 2000.0, 35).reshape(5, 7)
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=32, threads=1)
    s, J = sim.jacobian(("T1", "T2"), T1=T1, T2=80.0)
    assert s.shape == (5, 7, 60) and J.shape == (5, 7, 2, 60)
    s1, J1 = sim.jacobian("T2", T1=T1, T2=80.0)
    assert J1.shape == (5, 7, 60)
    np.testing.assert_array_equal(J1, J[..., 1, :])
    many = MRFSimulator(flip=FLIPS, TR=10.0, states=32, threads=2)
    s2, J2 = many.jacobian(("T1", "T2"), T1=T1, T2=80.0)
    np.testing.assert_array_equal(J2, J)
    np.testing.assert_array_equal(s2, s)


def test_jacobian_refusals():
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=32)
    with pytest.raises(ValueError, match=r"jacobian with respect to 'B1' needs B1 passed"):
        sim.jacobian("B1", T1=900.0, T2=80.0)
    with pytest.raises(TypeError, match=r"T2 must be a float array to differentiate, got dtype int64"):
        sim.jacobian("T2", T1=900.0, T2=np.array([80, 90]))
    with pytest.raises(TypeError, match=r"cannot differentiate with respect to 'T2prime'"):
        sim.jacobian("T2prime", T1=900.0, T2=80.0)
    with pytest.raises(TypeError, match=r"cannot differentiate with respect to 'flip'.*vjp"):
        sim.jacobian("flip", T1=900.0, T2=80.0)
    with pytest.raises(ValueError, match=r"diff names a property twice: \['T1', 'T1'\]"):
        sim.jacobian(("T1", "T1"), T1=900.0, T2=80.0)
    with pytest.raises(ValueError, match=r"at least one property"):
        sim.jacobian((), T1=900.0, T2=80.0)
    with pytest.raises(TypeError, match=r"diff names properties by str, got 3"):
        sim.jacobian(("T1", 3), T1=900.0, T2=80.0)
    with pytest.raises(ValueError, match=r"T1 must be > 0 ms"):
        sim.jacobian("T1", T1=-1.0, T2=80.0)
    with pytest.raises(ValueError, match=r"jacobian computes first derivatives \(order=1\), got order=2"):
        sim.jacobian("T1", order=2, T1=900.0, T2=80.0)
    from blochsim.simulators import SPGRSimulator, spgr_sim

    with pytest.raises(ValueError, match=r"got order=2"):
        SPGRSimulator(flip=10.0, TR=8.0).jacobian("T1", order=2, T1=900.0)
    with pytest.raises(ValueError, match=r"got order=0"):
        spgr_sim(flip=10.0, TR=8.0, T1=900.0, diff="T1", order=0)


# ---------------------------------------------------------------------------
# closed forms: analytic derivatives against central differences in float64

CLOSED = [
    ("SPGRSimulator", {"flip": [5.0, 15.0, 40.0], "TR": 8.0, "TE": 3.0},
     {"T1": [900.0, 1400.0], "T2star": [30.0, 50.0], "M0": [1.0, 0.7], "B0": [4.0, -6.0]}),
    ("bSSFPSimulator", {"flip": [30.0, 60.0], "TR": 5.0},
     {"T1": [900.0, 1400.0], "T2": [60.0, 90.0], "M0": [1.0, 0.7], "B0": [4.0, -16.0]}),
    ("InversionRecoverySimulator", {"TI": [50.0, 400.0, 1500.0], "TR": 3000.0},
     {"T1": [900.0, 1400.0], "M0": [1.0, 0.7], "inv_efficiency": [0.9, 1.0]}),
    ("SpinEchoSimulator", {"TE": [10.0, 80.0], "TR": 2000.0},
     {"T1": [900.0, 1400.0], "T2": [60.0, 90.0], "M0": [1.0, 0.7]}),
]


@pytest.mark.parametrize("cls,protocol,tissue", CLOSED, ids=[c[0] for c in CLOSED])
def test_closed_form_jacobians_against_finite_differences(cls, protocol, tissue):
    import blochsim.simulators as sims

    sim = getattr(sims, cls)(**protocol)
    kw = {k: np.array(v) for k, v in tissue.items()}
    names = tuple(kw)
    s, J = sim.jacobian(names, **kw)
    assert J.dtype == np.complex128 and J.shape == s.shape[:-1] + (len(names), s.shape[-1])
    np.testing.assert_allclose(s, sim.simulate(**kw), rtol=1e-14)  # M0 applied last: rounding only
    for j, name in enumerate(names):
        h = 1e-6 * max(1.0, float(np.max(np.abs(kw[name]))))
        assert rel(J[..., j, :], central(sim.simulate, kw, name, h)) < 1e-6, name


def test_function_forms_take_diff():
    from blochsim.simulators import SPGRSimulator, fse_sim, spgr_sim

    s, J = spgr_sim(flip=10.0, TR=8.0, T1=np.array([900.0, 1200.0]), diff="T1")
    s2, J2 = SPGRSimulator(flip=10.0, TR=8.0).jacobian("T1", T1=np.array([900.0, 1200.0]))
    np.testing.assert_array_equal(J, J2)
    s, J = fse_sim(ESP=5.0, flip=np.full(8, 180.0), T2=70.0, diff=("T2",))
    assert J.shape == (1, 8)
    n = np.arange(1, 9)
    assert rel(J[0], s * n * 5.0 / 70.0 ** 2) < 1e-5


# ---------------------------------------------------------------------------
# the device's Jacobian kernel, instantiated on the host (teams of four
# lanes, 8 orders each on the real path, 4 on the complex path)

@pytest.mark.parametrize("states,names,extra", [
    (32, ("T1", "T2"), {}),
    (30, ("T2", "B1", "M0"), {}),
    (16, ("T1", "B0", "T2"), {"B0": np.array([3.0, -5.0])}),
    (24, ("T1", "M0", "T2", "B1", "inv_efficiency"), {"inv_efficiency": 0.95}),
    (13, ("B0", "T2", "B1phase", "T1", "M0", "B1"), {"B0": np.array([3.0, -5.0]), "B1phase": 2.0}),
], ids=["real, 2 directions", "real, truncated, 2 directions and M0", "complex, 3 directions",
        "real, 4 directions and M0", "complex, truncated, 5 directions and M0"])
def test_device_jacobian_templates_on_the_host(states, names, extra):
    # M0 from the unscaled signal, the other directions two to a team
    kw = {"T1": np.array([700.0, 1600.0]), "T2": np.array([50.0, 140.0]), "B1": np.array([0.9, 1.05]),
          "M0": 0.8, **extra}
    sim = Train(states=states)
    s_ref, J_ref = sim.jacobian(names, **kw)
    sim._host_variant = 4
    s, J = sim.jacobian(names, **kw)
    assert rel(s, s_ref) < 1e-6
    assert rel(J, J_ref) < 1e-5
    sim._host_variant = 0


TAIL_FLIPS = np.concatenate([np.linspace(5, 60, 40), np.linspace(60, 2, 40)])


@pytest.mark.parametrize("make,names,extra", [
    (lambda: MRFSimulator(flip=TAIL_FLIPS, TR=10.0, states=75), ("T1", "T2", "M0"), {"M0": 0.8}),
    (lambda: MRFSimulator(flip=TAIL_FLIPS, TR=10.0, states=81), ("T2", "B1", "T1"),
     {"B1": np.array([0.9, 1.1])}),
    (lambda: FSESimulator(ESP=5.0, flip=np.full(40, 130.0), states=70), ("T1", "B0", "T2"),
     {"B0": np.array([0.0, 17.0])}),
    (lambda: FSESimulator(ESP=5.0, flip=np.full(40, 130.0), states=90, crusher_dephasing_rad=8 * np.pi,
                          voxel_size_m=1e-3), ("T2", "D"), {"D": np.array([1.0, 3.0])}),
], ids=["real, 75 states", "real, 81 states, B1", "complex, 70 states", "diffusion, 90 states"])
def test_device_tail_jacobian_templates_on_the_host(make, names, extra):
    """The device's tail Jacobian (a team whose orders past its registers
    live in memory, on duals): more states than four members hold."""
    kw = {"T1": np.array([700.0, 1600.0]), "T2": np.array([50.0, 140.0]), **extra}
    sim = make()
    s_ref, J_ref = sim.jacobian(names, **kw)
    sim._host_variant = 4
    with pytest.raises(ValueError, match="states exceed what the register team holds"):
        sim.jacobian(names, **kw)
    sim._host_variant = 5
    s, J = sim.jacobian(names, **kw)
    sim._host_variant = 0
    assert rel(s, s_ref) < 1e-6
    assert rel(J, J_ref) < 1e-5


class LongRecovery(Simulator):
    """Inversion, a recovery long enough that e^{-TI/T2} underflows to 0
    even in float64, a 90-degree pulse and a readout after TE."""

    protocol = {"TI": 3000.0, "TE": 5.0}
    tissue_properties = ("T1", "T2", "M0")

    def repetition(self, p):
        return Sequence([Inversion(), Delay(p["TI"]), Pulse(90.0, 0.0), Delay(p["TE"]), Readout()])


def test_relaxation_factor_underflowing_to_zero_carries_no_nan():
    # s = -i (1 - 2 e^{-TI/T1}) e^{-TE/T2}; the TI interval's e^{-TI/T2} is
    # 0, so its log-derivative is taken as 0 (its derivative is 0 too)
    T1, T2, TI, TE = 900.0, 5.0, 3000.0, 5.0
    s, J = LongRecovery(states=4).jacobian(("T1", "T2"), T1=T1, T2=T2)
    E1, E2 = np.exp(-TI / T1), np.exp(-TE / T2)
    ref = -1j * (1 - 2 * E1) * E2
    assert np.all(np.isfinite(J))
    assert rel(s, [ref]) < 1e-6
    assert rel(J[0], [-1j * (-2 * E1 * TI / T1 ** 2) * E2]) < 1e-5
    assert rel(J[1], [ref * TE / T2 ** 2]) < 1e-5


def test_M0_derivative_is_the_unscaled_signal_even_at_zero():
    # M0 only scales the readouts: d s / d M0 = s(M0 = 1), also where M0 = 0
    M0 = np.array([0.0, 0.5, 2.0])
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=32)
    s, J = sim.jacobian(("T2", "M0"), T1=900.0, T2=80.0, M0=M0)
    unit, J1 = sim.jacobian("T2", T1=900.0, T2=80.0)
    np.testing.assert_allclose(J[:, 1], np.broadcast_to(unit, (3, 60)), rtol=1e-6)
    np.testing.assert_allclose(s, M0[:, None] * unit, rtol=1e-6)
    np.testing.assert_allclose(J[:, 0], M0[:, None] * J1, rtol=1e-6, atol=1e-12)


def test_closed_form_M0_derivative_at_zero():
    from blochsim.simulators import SPGRSimulator

    sim = SPGRSimulator(flip=[5.0, 20.0], TR=8.0)
    M0 = np.array([0.0, 1.5])
    s, J = sim.jacobian(("M0", "T1"), T1=900.0, M0=M0)
    unit, J1 = sim.jacobian("T1", T1=900.0)
    np.testing.assert_allclose(J[:, 0], np.broadcast_to(unit, (2, 2)), rtol=1e-12)
    np.testing.assert_allclose(J[:, 1], M0[:, None] * J1, rtol=1e-12)
    assert np.all(np.isfinite(J))
