"""EPG engine against outside oracles: closed forms, a float64 EPG written
here from Weigel's equations (J Magn Reson Imaging 2015, 41:266), and
isochromat sums."""
import numpy as np
import pytest

import blochsim
from blochsim import Delay, Dephase, Excitation, Inversion, Pulse, Readout, Refocusing, Sequence, Simulator, Spoil
from blochsim.simulators import FSESimulator, MRFSimulator

RTOL = 1e-5


def rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


# ---------------------------------------------------------------------------
# oracle: a float64 EPG from Weigel 2015 (Eqs. 15, 18, 20), states as a
# (3, K) complex array with rows F+, F-, Z.

def weigel_T(alpha, phi):
    c2, s2, s = np.cos(alpha / 2) ** 2, np.sin(alpha / 2) ** 2, np.sin(alpha)
    e = np.exp(1j * phi)
    return np.array([
        [c2, e ** 2 * s2, -1j * e * s],
        [np.conj(e) ** 2 * s2, c2, 1j * np.conj(e) * s],
        [-0.5j * np.conj(e) * s, 0.5j * e * s, np.cos(alpha)],
    ])


def weigel_relax(om, tau, T1, T2, D=0.0, dk=0.0):
    E1, E2 = np.exp(-tau / T1), np.exp(-tau / T2)
    k = np.arange(om.shape[1])
    att = np.exp(-D * (k * dk) ** 2 * tau)
    om = om * np.array([[E2], [E2], [E1]]) * att
    om[2, 0] += 1 - E1
    return om


def weigel_shift(om):
    om = om.copy()
    om[0, 1:] = om[0, :-1].copy()
    om[1, :-1] = om[1, 1:].copy()
    om[1, -1] = 0
    om[0, 0] = np.conj(om[1, 0])
    return om


def weigel_cpmg(flips_deg, esp_s, T1_s, T2_s, K, exc_phase=np.pi / 2, D=0.0, dk=0.0):
    om = np.zeros((3, K), complex)
    om[2, 0] = 1
    om = weigel_T(np.pi / 2, exc_phase) @ om
    out = []
    for a in np.radians(flips_deg):
        om = weigel_relax(om, esp_s / 2, T1_s, T2_s, D, dk)
        om = weigel_shift(om)
        om = weigel_T(a, 0.0) @ om
        om = weigel_shift(om)
        om = weigel_relax(om, esp_s / 2, T1_s, T2_s, D, dk)
        out.append(om[0, 0])
    return np.array(out)


# ---------------------------------------------------------------------------
# oracle: isochromats (Bloch rotations), M = (Mx, My, Mz), F+ = Mx + i My

def rot_pulse(alpha, phi):
    ca, sa = np.cos(alpha), np.sin(alpha)
    Rx = np.array([[1, 0, 0], [0, ca, -sa], [0, sa, ca]])
    return rot_z(phi) @ Rx @ rot_z(-phi)


def rot_z(theta):
    c, s = np.cos(theta), np.sin(theta)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def test_90_pulse_gives_minus_i():
    class One(Simulator):
        def repetition(self, p):
            return Readout() @ Pulse(90.0)

    s = One().simulate()
    assert s.shape == (1,)
    np.testing.assert_allclose(s, [-1j], atol=1e-7)


def test_perfect_cpmg_decays_with_T2():
    n, esp = 32, 7.5
    T2 = np.array([20.0, 60.0, 150.0])
    s = FSESimulator(ESP=esp).simulate(flip=np.full(n, 180.0), T1=1000.0, T2=T2)
    expect = np.exp(-np.arange(1, n + 1)[None, :] * esp / T2[:, None])
    assert rel(np.abs(s), expect) < RTOL
    # CPMG: the echoes are real and positive (excitation at 90°)
    assert np.max(np.abs(s.imag)) < 1e-6


@pytest.mark.parametrize("flip", [120.0, 150.0, 165.0])
def test_imperfect_cpmg_against_weigel_epg(flip):
    n, esp = 40, 10.0
    T1, T2 = 900.0, 70.0
    s = FSESimulator(ESP=esp).simulate(flip=np.full(n, flip), T1=T1, T2=T2)
    ref = weigel_cpmg(np.full(n, flip), esp * 1e-3, T1 * 1e-3, T2 * 1e-3, K=2 * n + 1)
    assert rel(s, ref) < RTOL


def test_variable_flip_train_with_B1_against_weigel_epg():
    n, esp = 24, 8.0
    flips = np.linspace(60, 180, n)
    B1 = np.array([0.7, 1.0, 1.2])
    s = FSESimulator(ESP=esp).simulate(flip=flips, T1=1200.0, T2=90.0, B1=B1)
    for i, b in enumerate(B1):
        ref = weigel_cpmg(flips * b, esp * 1e-3, 1.2, 0.09, K=2 * n + 1)
        # the excitation is scaled by B1 too
        ref_exc = _weigel_cpmg_scaled_exc(flips * b, b, esp * 1e-3, 1.2, 0.09, 2 * n + 1)
        assert rel(s[i], ref_exc) < RTOL
        if b == 1.0:
            assert rel(s[i], ref) < RTOL


def _weigel_cpmg_scaled_exc(flips_deg, b1, esp_s, T1, T2, K):
    om = np.zeros((3, K), complex)
    om[2, 0] = 1
    om = weigel_T(b1 * np.pi / 2, np.pi / 2) @ om
    out = []
    for a in np.radians(flips_deg):
        om = weigel_shift(weigel_relax(om, esp_s / 2, T1, T2))
        om = weigel_relax(weigel_shift(weigel_T(a, 0.0) @ om), esp_s / 2, T1, T2)
        out.append(om[0, 0])
    return np.array(out)


def test_crushed_spin_echo_against_isochromat_sum():
    # 90°x, crusher, refocusing (flip 130°, phase 30°), crusher, echo; no relaxation.
    alpha, phi = np.radians(130.0), np.radians(30.0)
    n_iso = 64
    x = np.arange(n_iso) / n_iso
    M = np.tile([0.0, 0.0, 1.0], (n_iso, 1))
    M = M @ rot_pulse(np.pi / 2, 0.0).T
    M = np.stack([rot_z(-2 * np.pi * xi) @ m for xi, m in zip(x, M)])
    M = M @ rot_pulse(alpha, phi).T
    M = np.stack([rot_z(-2 * np.pi * xi) @ m for xi, m in zip(x, M)])
    echo = np.mean(M[:, 0] + 1j * M[:, 1])

    class SE(Simulator):
        def repetition(self, p):
            return Readout() @ Dephase() @ Pulse(130.0, 30.0) @ Dephase() @ Pulse(90.0)

    s = SE().simulate()
    assert abs(s[0] - echo) < 1e-6
    # the crushed echo has magnitude sin^2(alpha/2)
    assert abs(abs(echo) - np.sin(alpha / 2) ** 2) < 1e-9


def test_ideally_spoiled_train_reaches_ernst():
    flip, TR, T1 = 15.0, 12.0, 800.0
    n = 400

    class Spoiled(Simulator):
        protocol = {"n": n}

        def repetition(self, p):
            return (Delay(TR) @ Spoil() @ Readout(-90.0) @ Pulse(flip)) ** p["n"]

    s = Spoiled().simulate(T1=T1, T2=50.0)
    a, E1 = np.radians(flip), np.exp(-TR / T1)
    ernst = np.sin(a) * (1 - E1) / (1 - np.cos(a) * E1)
    assert abs(s[-1] - ernst) < 1e-5 * ernst
    # transient: Mz_n follows the recursion Mz <- E1 cos(a) Mz + 1 - E1
    mz, ref = 1.0, []
    for _ in range(n):
        ref.append(np.sin(a) * mz)
        mz = E1 * np.cos(a) * mz + 1 - E1
    assert rel(s.real, ref) < RTOL


def test_inversion_recovery_played():
    TI = np.array([0.0, 50.0, 300.0, 900.0, 2500.0])
    T1, eta = 700.0, np.array([1.0, 0.93])

    class IR(Simulator):
        protocol = {"TI": 0.0}

        def repetition(self, p):
            return Readout(-90.0) @ Pulse(90.0) @ Delay(p["TI"]) @ Inversion()

    sim = IR()
    s = np.stack([sim.simulate(TI=ti, T1=T1, inv_efficiency=eta)[..., 0] for ti in TI], -1)
    ref = 1 - (1 + eta[:, None]) * np.exp(-TI[None, :] / T1)
    assert rel(s.real, ref) < RTOL
    assert np.max(np.abs(s.imag)) < 1e-6


def test_stimulated_and_spin_echo_amplitudes():
    from blochsim.simulators import StimulatedEchoSimulator

    a = np.array([70.0, 110.0, 95.0])
    TE, TM, T1, T2 = 20.0, 150.0, 900.0, 60.0
    s = StimulatedEchoSimulator(flip=a, TE=TE, TM=TM).simulate(T1=T1, T2=T2)
    r = np.radians(a)
    se = np.sin(r[0]) * np.sin(r[1] / 2) ** 2 * np.exp(-TE / T2)
    ste = 0.5 * np.sin(r[0]) * np.sin(r[1]) * np.sin(r[2]) * np.exp(-TE / T2) * np.exp(-TM / T1)
    assert abs(abs(s[0]) - se) < 1e-5 * se
    assert abs(abs(s[1]) - ste) < 1e-5 * ste
    # B1 scales every flip
    s2 = StimulatedEchoSimulator(flip=a, TE=TE, TM=TM).simulate(T1=T1, T2=T2, B1=0.8)
    r = np.radians(a * 0.8)
    ste = 0.5 * np.sin(r[0]) * np.sin(r[1]) * np.sin(r[2]) * np.exp(-TE / T2) * np.exp(-TM / T1)
    assert abs(abs(s2[1]) - ste) < 1e-5 * ste


def test_diffusion_attenuation_narrow_pulse_stejskal_tanner():
    # The magnetisation sits at order 1 for tau before and tau after a 180°:
    # echo = e^{-2 tau/T2} e^{-b D}, b = dk^2 (2 tau) (narrow-pulse Stejskal-Tanner).
    tau, T2 = 20.0, 80.0
    crusher, voxel = 4 * np.pi, 1e-3
    dk = crusher / voxel
    D = np.array([0.0, 0.5, 1.0, 3.0])  # um^2/ms

    class DW(Simulator):
        tissue_properties = ("T2", "D")

        def repetition(self, p):
            return (Readout() @ Dephase() @ Delay(tau) @ Refocusing(180.0) @ Delay(tau) @ Dephase()
                    @ Excitation(90.0, 90.0))

    s = DW(crusher_dephasing_rad=crusher, voxel_size_m=voxel).simulate(T2=T2, D=D)
    b = dk ** 2 * 2 * tau * 1e-3  # s/m^2
    ref = np.exp(-2 * tau / T2) * np.exp(-b * D * 1e-9)
    assert rel(np.abs(s[:, 0]), ref) < RTOL


def test_diffusion_in_imperfect_cpmg_against_weigel_epg():
    n, esp, flip = 20, 10.0, 140.0
    crusher, voxel = 8 * np.pi, 0.5e-3
    D = 2.0
    s = FSESimulator(ESP=esp, crusher_dephasing_rad=crusher, voxel_size_m=voxel).simulate(
        flip=np.full(n, flip), T1=1000.0, T2=100.0, D=D)
    ref = weigel_cpmg(np.full(n, flip), esp * 1e-3, 1.0, 0.1, K=2 * n + 1, D=D * 1e-9, dk=crusher / voxel)
    assert rel(s, ref) < RTOL
    s0 = FSESimulator(ESP=esp).simulate(flip=np.full(n, flip), T1=1000.0, T2=100.0)
    assert np.all(np.abs(s) <= np.abs(s0) + 1e-6)
    assert np.abs(s[-1]) < np.abs(s0[-1])


@pytest.mark.parametrize("flip", [180.0, 130.0])
def test_refocused_train_magnitude_is_off_resonance_invariant(flip):
    n = 30
    B0 = np.array([0.0, 7.0, 23.0, -41.0, 113.0])
    s = FSESimulator(ESP=6.0).simulate(flip=np.full(n, flip), T1=1000.0, T2=80.0, B0=B0)
    ref = weigel_cpmg(np.full(n, flip), 6e-3, 1.0, 0.08, K=2 * n + 1)
    for i in range(len(B0)):
        assert rel(np.abs(s[i]), np.abs(ref)) < RTOL


def test_flow_phase_and_washout():
    # F+ sits at order 1 for tau, then is refocused: phase -dk v tau, and a
    # fraction |v| tau / voxel is replaced by fresh (longitudinal) spins.
    tau, crusher, voxel = 5.0, 2 * np.pi, 2e-3
    dk = crusher / voxel
    v = np.array([0.0, 0.01, -0.05, 0.2])

    class Flow(Simulator):
        tissue_properties = ("v",)

        def repetition(self, p):
            return Readout() @ Dephase(-1) @ Delay(tau) @ Dephase() @ Excitation(90.0, 90.0)

    s = Flow(crusher_dephasing_rad=crusher, voxel_size_m=voxel).simulate(v=v)
    w = np.minimum(np.abs(v) * tau * 1e-3 / voxel, 1.0)
    ref = (1 - w) * np.exp(-1j * dk * v * tau * 1e-3)
    assert rel(s[:, 0], ref) < RTOL


def test_real_and_complex_paths_agree():
    flips = np.concatenate([np.linspace(5, 60, 50), np.linspace(60, 2, 50)])
    T1, T2 = np.array([300.0, 900.0, 2500.0]), np.array([20.0, 70.0, 200.0])
    sim = MRFSimulator(flip=flips, TR=10.0, states=32)
    real = sim.simulate(T1=T1, T2=T2)
    s_cplx = _mrf_complex(flips, T1, T2)
    assert rel(real, s_cplx) < RTOL
    # alternating phases stay on the real path (0 / 180) and equal the complex result
    alt = MRFSimulator(flip=flips, TR=10.0, states=32, phases=180.0 * (np.arange(100) % 2))
    ref_alt = _mrf_complex(flips, T1, T2, phases=180.0 * (np.arange(100) % 2))
    assert rel(alt.simulate(T1=T1, T2=T2), ref_alt) < RTOL


def _mrf_complex(flips, T1, T2, phases=None):
    """The MRF train on the complex path: a zero B0 array switches it on."""

    class MRFc(Simulator):
        tissue_properties = ("T1", "T2", "B0")

        def repetition(self, p):
            ph = np.zeros(len(flips)) if phases is None else phases
            ops = [Inversion()]
            for f, q in zip(flips, ph):
                ops += [Pulse(f, q), Readout(-90.0), Dephase(), Delay(10.0)]
            return Sequence(ops)

    return MRFc(states=32).simulate(T1=T1, T2=T2, B0=np.zeros_like(T1))


def test_mrf_against_weigel_epg():
    flips = np.concatenate([np.linspace(5, 60, 40), np.linspace(60, 2, 40)])
    T1, T2, K = 850.0, 60.0, 32
    s = MRFSimulator(flip=flips, TR=10.0, TI=20.0, states=K).simulate(T1=T1, T2=T2)
    om = np.zeros((3, K), complex)
    om[2, 0] = 1
    om[2] *= -1
    om = weigel_relax(om, 0.02, T1 * 1e-3, T2 * 1e-3)
    ref = []
    for a in np.radians(flips):
        om = weigel_T(a, 0.0) @ om
        ref.append(1j * om[0, 0])
        om = weigel_relax(weigel_shift(om), 0.01, T1 * 1e-3, T2 * 1e-3)
    assert rel(s, np.array(ref)) < RTOL
    assert np.max(np.abs(s.imag)) < 1e-6


@pytest.mark.parametrize("K", [1, 2, 3, 7, 40])
def test_runs_of_pulses_across_voxels_against_weigel_epg(K):
    """The host plays runs of simple events (pulse, readout, one shift) a
    few at a time in one sweep over the orders: against the float64 EPG at
    every truncation, an odd number of events, voxels of their own T1, T2
    and B1 (the pulses per lane) and a spoiler that breaks the runs."""
    rng = np.random.default_rng(3)
    flips = rng.uniform(5.0, 70.0, 37)
    T1, T2, B1 = rng.uniform(300, 2000, 19), rng.uniform(20, 200, 19), rng.uniform(0.6, 1.3, 19)

    class Broken(Simulator):
        protocol = {"flip": None}

        def repetition(self, p):
            ops = [Inversion(), Delay(20.0)]
            for i, f in enumerate(p["flip"]):
                ops += [Pulse(f), Readout(-90.0), Spoil() if i == 20 else Dephase(), Delay(10.0)]
            return Sequence(ops)

    for sim in (MRFSimulator(flip=flips, TR=10.0, TI=20.0, states=K), Broken(flip=flips, states=K)):
        s = sim.simulate(T1=T1, T2=T2, B1=B1)
        for v in range(T1.size):
            om = np.zeros((3, K), complex)
            om[2, 0] = -1
            om = weigel_relax(om, 0.02, T1[v] * 1e-3, T2[v] * 1e-3)
            ref = []
            for i, a in enumerate(np.radians(flips) * B1[v]):
                om = weigel_T(a, 0.0) @ om
                ref.append(1j * om[0, 0])
                if isinstance(sim, Broken) and i == 20:
                    om[:2] = 0
                else:
                    om = weigel_shift(om)
                om = weigel_relax(om, 0.01, T1[v] * 1e-3, T2[v] * 1e-3)
            assert rel(s[v], np.array(ref)) < RTOL, (type(sim).__name__, v)


def test_2048_states_run_and_truncation_is_exact_for_perfect_cpmg():
    n = 1024  # 2048 shifts: the default K is 2049
    s = FSESimulator(ESP=2.0).simulate(flip=np.full(n, 180.0), T2=500.0)
    assert s.shape == (n,)
    assert rel(np.abs(s), np.exp(-np.arange(1, n + 1) * 2.0 / 500.0)) < RTOL
    s2 = FSESimulator(ESP=2.0, states=2048).simulate(flip=np.full(n, 150.0), T2=500.0, T1=1000.0)
    ref = weigel_cpmg(np.full(n, 150.0), 2e-3, 1.0, 0.5, K=2048)
    assert rel(s2, ref) < 1e-4  # 1024 echoes of float32 accumulation


def test_states_truncation_matches_truncated_oracle():
    n = 30
    s = FSESimulator(ESP=10.0, states=5).simulate(flip=np.full(n, 120.0), T1=1000.0, T2=100.0)
    ref = weigel_cpmg(np.full(n, 120.0), 0.01, 1.0, 0.1, K=5)
    assert rel(s, ref) < RTOL


def test_result_does_not_depend_on_thread_count():
    flips = np.linspace(10, 70, 120)
    rng = np.random.default_rng(1)
    T1 = rng.uniform(200, 3000, 203)  # not a multiple of the block size
    T2 = rng.uniform(10, 300, 203)
    outs = [MRFSimulator(flip=flips, TR=8.0, states=40, threads=t).simulate(T1=T1, T2=T2)
            for t in (1, 2, 3, 7)]
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])
    # a voxel alone equals the same voxel in a block
    one = MRFSimulator(flip=flips, TR=8.0, states=40).simulate(T1=T1[17], T2=T2[17])
    assert np.array_equal(one, outs[0][17])


def test_spoil_and_negative_shift():
    # a spoiled FID is zero; shifting back with Dephase(-1) refocuses
    class S(Simulator):
        def repetition(self, p):
            return Sequence([Pulse(90.0), Dephase(), Readout(), Dephase(-1), Readout(), Spoil(), Readout()])

    s = S().simulate()
    np.testing.assert_allclose(s, [0, -1j, 0], atol=1e-7)


def test_echo_after_long_excursions_both_ways():
    # 150 shifts up, 150 back, then 60 below order 0 and back, at 200 states:
    # the host's sliding planes recentre their windows several times each
    # way, and the FID comes back as -i e^{-t/T2} each time it refocuses
    class Excursion(Simulator):
        tissue_properties = ("T1", "T2")

        def repetition(self, p):
            ops = [Pulse(90.0), Readout()]
            ops += [Dephase(), Delay(1.0)] * 150 + [Readout()]
            ops += [Dephase(-1), Delay(1.0)] * 150 + [Readout()]
            ops += [Dephase(-1)] * 60 + [Readout()] + [Dephase()] * 60 + [Readout()]
            return Sequence(ops)

    T2 = np.array([80.0, 200.0])
    s = Excursion(states=200).simulate(T1=1000.0, T2=T2)
    e = np.exp(-300.0 / T2)
    want = np.stack([np.full(2, -1j), np.zeros(2), -1j * e, np.zeros(2), -1j * e], axis=-1)
    np.testing.assert_allclose(s, want, rtol=1e-5, atol=1e-7)


def test_sampled_pulse_rectangle_equals_hard_pulse():
    # 1 ms rectangle of B1 giving 90°: B1 = (pi/2) / (gamma * 1 ms)
    gamma = 2 * np.pi * 42.57747892e6
    b1_uT = (np.pi / 2) / (gamma * 1e-3) * 1e6
    wave = np.full(100, b1_uT)

    class Shaped(Simulator):
        def repetition(self, p):
            return Readout() @ blochsim.SampledPulse(wave, dwell=10.0)

    s = Shaped().simulate()
    np.testing.assert_allclose(s, [-1j], atol=1e-5)
