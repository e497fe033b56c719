"""Gradient-echo simulators (FLASH with shaped and adiabatic pulses, multi-echo
GRE and T2', DESPOT1, water-fat, double angle, slice profiles) against
isochromat ensembles, the Bloch equation stepped dwell by dwell, and closed
forms written here."""
import numpy as np
import pytest

from blochsim import Pulse, Readout, Simulator, Spoil
from blochsim.sequence import Sequence
from blochsim.simulators import (DESPOT1Simulator, DoubleAngleSimulator, FLASHSimulator, FSESimulator,
                                 MultiEchoGRESimulator, SPGRSimulator, WaterFatSimulator)
from protocol_oracles import _jacobian_matches_differences, _flash_isochromats, _bloch_dwell, TES, NoB1


@pytest.mark.parametrize("inc,inversion", [(117.0, False), (50.0, True), (0.0, False)])
def test_flash_against_an_isochromat_ensemble(inc, inversion):
    flips = np.linspace(5.0, 30.0, 40)
    t = dict(T1=900.0, T2=70.0, B1=0.9, B0=12.0, M0=1.2)
    sim = FLASHSimulator(flip=flips, TR=9.0, TE=4.0, rf_spoiling=inc, inversion="ideal" if inversion else None,
                         TI=20.0)
    s = sim.simulate(**t)
    ref = _flash_isochromats(flips, 9.0, 4.0, 40, inc, 900.0, 70.0, 0.9, 12.0, 1.2, inversion, 20.0)
    np.testing.assert_allclose(s, ref, atol=3e-6 * 1.2)


def test_flash_jacobian_and_refusals():
    sim = FLASHSimulator(flip=12.0, TR=8.0, TE=3.0, n=30)
    t = dict(T1=np.array([800.0, 1500.0]), T2=np.array([60.0, 90.0]))
    s, J = sim.jacobian(("T1", "T2"), **t)
    for v in range(2):
        for i, k in enumerate(("T1", "T2")):
            x = {"T1": t["T1"][v], "T2": t["T2"][v]}
            h = 1e-3 * x[k]
            up = _flash_isochromats(12.0, 8.0, 3.0, 30, 117.0, **{**x, k: x[k] + h}, N=128)
            dn = _flash_isochromats(12.0, 8.0, 3.0, 30, 117.0, **{**x, k: x[k] - h}, N=128)
            np.testing.assert_allclose(J[v, i], (up - dn) / (2 * h), rtol=1e-3, atol=1e-8)
    with pytest.raises(ValueError, match="needs n"):
        FLASHSimulator(flip=12.0, TR=8.0)
    with pytest.raises(ValueError, match="TE = 9 ms must be at most TR = 8 ms"):
        FLASHSimulator(flip=12.0, TR=8.0, TE=9.0, n=3)
    with pytest.raises(ValueError, match="inversion must be None, 'ideal', 'adiabatic' or a SampledPulse"):
        FLASHSimulator(flip=12.0, TR=8.0, n=3, inversion="hyperbolic")


def _shaped_flash_isochromats(shape, dwell_us, flip, TR, TE, n, inc, T1, T2, B1=1.0, B0=0.0, inversion=None,
                              TI=0.0, N=128):
    """FLASH with a shaped excitation (its area giving the flip) and an
    optional shaped inversion ((complex rad/ms per sample, dwell µs)) followed by a
    spoiler, by an isochromat ensemble stepped dwell by dwell with the
    Bloch equation's exponential; TE, TR and TI from the pulse centres."""
    theta = 2 * np.pi * np.arange(N) / N
    m = np.zeros((3, N))
    m[2] = 1.0
    dwell = dwell_us * 1e-3
    half = 0.5 * len(shape) * dwell

    def free(m, t):
        return _bloch_dwell(m, 0.0, t, T1, T2, B0)

    if inversion is not None:
        samples, inv_dwell = inversion[0], inversion[1] * 1e-3
        for b in samples:
            m = _bloch_dwell(m, B1 * b, inv_dwell, T1, T2, B0)
        m[:2] = 0.0
        m = free(m, TI - half - 0.5 * len(samples) * inv_dwell)
    rate = np.asarray(shape) / abs(np.sum(shape)) / dwell  # rad/ms per rad of flip
    out = []
    for k in range(n):
        phi = np.radians(inc * k * (k + 1) / 2)
        for r in rate:
            m = _bloch_dwell(m, B1 * np.radians(flip[k]) * r * np.exp(1j * phi), dwell, T1, T2, B0)
        m = free(m, TE - half)
        out.append(np.mean(m[0] + 1j * m[1]) * np.exp(-1j * (phi - np.pi / 2)))
        fp = (m[0] + 1j * m[1]) * np.exp(1j * theta)
        m = free(np.stack([fp.real, fp.imag, m[2]]), TR - TE - half)
    return np.array(out)


def _hs_rad_per_ms(duration_ms=10.24, peak_uT=13.5, mu=5.0, beta=800.0, dwell_us=10.0):
    """The hyperbolic-secant pulse of Silver, Joseph and Hoult (1985):
    B1 sech(beta t), phase -mu ln cosh(beta t), as gamma B1 in rad/ms."""
    n = int(round(duration_ms * 1e3 / dwell_us))
    t = (np.arange(n) + 0.5 - n / 2) * dwell_us * 1e-6
    gamma = 2 * np.pi * 42.57747892e6
    return gamma * peak_uT * 1e-6 * 1e-3 / np.cosh(beta * t) * np.exp(-1j * mu * np.log(np.cosh(beta * t)))


SINC = np.sinc(np.linspace(-2.0, 2.0, 48)) * np.hanning(48)


@pytest.mark.parametrize("B0", [0.0, 150.0])
def test_flash_shaped_pulse_against_the_bloch_equation_per_dwell(B0):
    flips = np.linspace(8.0, 40.0, 25)
    t = dict(T1=900.0, T2=70.0, B1=0.9, B0=B0)
    sim = FLASHSimulator(flip=flips, TR=9.0, TE=4.0, pulse=(SINC, 40.0))
    ref = _shaped_flash_isochromats(SINC, 40.0, flips, 9.0, 4.0, 25, 117.0, **t)
    np.testing.assert_allclose(sim.simulate(**t), ref, atol=2e-5)
    # the shaped pulse is not the hard pulse once off resonance within its band
    hard = FLASHSimulator(flip=flips, TR=9.0, TE=4.0).simulate(**t)
    assert (np.max(np.abs(hard - ref)) > 1e-3) == (B0 != 0.0)


@pytest.mark.parametrize("B1,B0", [(1.0, 0.0), (0.7, 200.0), (1.4, -300.0)])
def test_flash_adiabatic_inversion_against_the_bloch_equation_per_dwell(B1, B0):
    flips = np.full(12, 10.0)
    t = dict(T1=1200.0, T2=60.0, B1=B1, B0=B0)
    sim = FLASHSimulator(flip=flips, TR=8.0, TE=3.0, pulse=(SINC, 20.0), inversion="adiabatic", TI=40.0)
    ref = _shaped_flash_isochromats(SINC, 20.0, flips, 8.0, 3.0, 12, 117.0, **t, inversion=(_hs_rad_per_ms(), 10.0),
                                    TI=40.0)
    s = sim.simulate(**t)
    np.testing.assert_allclose(s, ref, atol=2e-5)


def test_hyperbolic_secant_inverts_across_b1_and_b0():
    """Adiabatic: Mz after the pulse (read by a 90° pulse) stays near -1
    for B1 from 0.8 to 1.5 and offsets inside the +-1.3 kHz sweep, where
    a hard 180° pulse loses a third of it."""
    from blochsim.sequence import hyperbolic_secant

    class Probe(Simulator):
        protocol = {"hs": True}
        tissue_properties = ("T1", "T2", "B1", "B0")

        def repetition(self, p):
            inv = hyperbolic_secant() if p["hs"] else Pulse(180.0)
            return Sequence([inv, Spoil(), Pulse(90.0), Readout()])

    B1, B0 = np.meshgrid([0.8, 1.0, 1.2, 1.5], [-300.0, 0.0, 150.0, 300.0])
    t = dict(T1=1e6, T2=1e6, B1=B1.ravel(), B0=B0.ravel())
    read = np.sin(np.pi / 2 * t["B1"])  # the 90° probe scales with B1 too
    mz = -Probe().simulate(**t)[:, 0].imag / read
    assert np.all(mz < -0.97), mz.max()
    assert np.max(-Probe(hs=False).simulate(**t)[:, 0].imag / read) > -0.1


def test_flash_shaped_pulse_jacobian_and_flip_gradient():
    flips = np.linspace(10.0, 30.0, 12)
    sim = FLASHSimulator(flip=flips, TR=8.0, TE=3.0, pulse=(SINC, 20.0), inversion="adiabatic", TI=40.0)
    t = dict(T1=np.array([800.0, 1500.0]), T2=np.array([60.0, 90.0]), B1=np.array([0.9, 1.1]),
             B0=np.array([-30.0, 40.0]))
    names = ("T1", "B1", "B0")
    s, J = sim.jacobian(names, **t)
    _jacobian_matches_differences(sim, t, names, J, step=1e-2, rtol=2e-3, atol=5e-5)
    x = dict(T1=1000.0, T2=70.0, B1=0.95)
    s, pullback = sim.vjp("flip", **x)
    g = pullback(2 * s)["flip"]
    for i in (0, 5, 11):
        h = np.zeros_like(flips)
        h[i] = 0.05  # float32 signals: a step well above their round-off
        up = np.sum(np.abs(sim.simulate(**x, flip=flips + h).astype(complex)) ** 2)
        dn = np.sum(np.abs(sim.simulate(**x, flip=flips - h).astype(complex)) ** 2)
        np.testing.assert_allclose(g[i], (up - dn) / 0.1, rtol=1e-2)


def test_flash_shaped_pulse_refusals():
    with pytest.raises(ValueError, match="pulse must be a"):
        FLASHSimulator(flip=10.0, TR=8.0, n=3, pulse=SINC)
    with pytest.raises(ValueError, match="lasts 1.92 ms"):
        FLASHSimulator(flip=10.0, TR=8.0, TE=0.5, n=3, pulse=(SINC, 40.0))
    with pytest.raises(ValueError, match="zero area"):
        FLASHSimulator(flip=10.0, TR=8.0, TE=3.0, n=3, pulse=(np.array([1.0, -1.0]), 40.0))
    with pytest.raises(ValueError, match="dwell"):
        FLASHSimulator(flip=10.0, TR=8.0, TE=3.0, n=3, pulse=(SINC, 0.0))
    with pytest.raises(ValueError, match="TI = 3 ms is shorter"):
        FLASHSimulator(flip=10.0, TR=8.0, TE=3.0, n=3, inversion="adiabatic", TI=3.0)
    from blochsim import hyperbolic_secant
    with pytest.raises(ValueError, match="mu"):
        hyperbolic_secant(mu=-1.0)
    with pytest.raises(ValueError, match="shorter than one dwell"):
        hyperbolic_secant(duration=0.001)


def test_megre_t2prime_is_the_lorentzian_average_and_the_spgr_closed_form():
    """Ideally spoiled: the played echoes averaged over a Lorentzian spread
    of B0 (HWHM 1/(2 pi T2'), quadrature in the test) equal the echoes with
    T2prime, and the SPGR closed form with 1/T2* = 1/T2 + 1/T2'."""
    sim = MultiEchoGRESimulator(flip=25.0, TR=30.0, TE=TES, rf_spoiling=None)
    T2, T2p, B0 = 50.0, 30.0, 7.0
    theta = (np.arange(20000) + 0.5) / 20000 * np.pi - np.pi / 2
    offsets = np.tan(theta) / (2 * np.pi * T2p * 1e-3)  # Lorentzian quantiles, Hz
    spread = sim.simulate(T1=900.0, T2=T2, B0=B0 + offsets, M0=1.3).astype(complex).mean(axis=0)
    s = sim.simulate(T1=900.0, T2=T2, B0=B0, M0=1.3, T2prime=T2p)
    np.testing.assert_allclose(s, spread, atol=2e-4)
    closed = SPGRSimulator(flip=25.0, TR=30.0, TE=TES).simulate(T1=900.0, T2star=1 / (1 / T2 + 1 / T2p), B0=B0,
                                                                M0=1.3)
    np.testing.assert_allclose(s, closed, atol=2e-6)
    # and the Ernst signal written out: sin a (1 - E1)/(1 - cos a E1) e^{-TE/T2*} e^{-2 pi i B0 TE}
    a, E1 = np.radians(25.0), np.exp(-30.0 / 900.0)
    ernst = 1.3 * np.sin(a) * (1 - E1) / (1 - np.cos(a) * E1)
    np.testing.assert_allclose(s, ernst * np.exp(-TES * (1 / T2 + 1 / T2p) - 2j * np.pi * B0 * TES * 1e-3), atol=2e-6)


def test_megre_rf_spoiled_against_the_isochromat_ensemble():
    sim = MultiEchoGRESimulator(flip=15.0, TR=30.0, TE=TES, n=60)
    t = dict(T1=900.0, T2=70.0, B1=0.9, B0=12.0)
    s = sim.simulate(**t)
    for j, te in enumerate(TES):
        ref = _flash_isochromats(np.full(60, 15.0), 30.0, te, 60, 117.0, **t)
        np.testing.assert_allclose(s[j], ref[-1], atol=3e-6)


def test_t2prime_jacobian_and_pullback_against_differences():
    sim = MultiEchoGRESimulator(flip=20.0, TR=30.0, TE=TES, n=40)
    t = dict(T1=np.array([800.0, 1400.0]), T2=np.array([60.0, 90.0]), T2prime=np.array([25.0, 60.0]),
             B0=np.array([-5.0, 20.0]))
    names = ("T2prime", "T1", "B0")
    s, J = sim.jacobian(names, **t)
    _jacobian_matches_differences(sim, t, names, J, step=1e-4, rtol=2e-3, atol=1e-6)
    s1, J1 = sim.jacobian("T2prime", **t)
    np.testing.assert_allclose(J1, J[:, 0], rtol=1e-6)
    # a loss of the echoes pulled back to the echo times, the flip and T2prime
    s, pullback = sim.vjp(("TE", "flip", "T2prime"), **t)
    g = pullback(2 * s)

    def loss(**kw):
        return np.sum(np.abs(sim.simulate(**{**t, **kw}).astype(complex)) ** 2)

    for j in range(len(TES)):
        h = np.zeros(len(TES))
        h[j] = 1e-2
        fd = (loss(TE=TES + h) - loss(TE=TES - h)) / 2e-2
        np.testing.assert_allclose(g["TE"][j], fd, rtol=5e-3)
    np.testing.assert_allclose(g["flip"], (loss(flip=20.05) - loss(flip=19.95)) / 0.1, rtol=5e-3)
    dT = t["T2prime"] * 1e-3
    for v in range(2):
        e = np.eye(2)[v] * dT
        fd = (loss(T2prime=t["T2prime"] + e) - loss(T2prime=t["T2prime"] - e)) / (2 * dT[v])
        np.testing.assert_allclose(g["T2prime"][v], fd, rtol=5e-3)


def test_t2prime_refusals():
    sim = MultiEchoGRESimulator(flip=20.0, TR=30.0, TE=TES)
    with pytest.raises(ValueError, match="T2prime must be > 0 ms"):
        sim.simulate(T1=800.0, T2=60.0, T2prime=0.0)
    with pytest.raises(ValueError, match="do not broadcast to one voxel shape: T1"):
        sim.simulate(T1=np.ones(3) * 800.0, T2=60.0, T2prime=np.ones(2) * 30.0)
    with pytest.raises(ValueError, match="jacobian_vjp does not take T2prime"):
        sim.jacobian_vjp("T1", "flip", T1=800.0, T2=60.0, T2prime=30.0)
    with pytest.raises(TypeError, match="T2prime"):
        FSESimulator(ESP=5.0, flip=np.full(4, 180.0)).simulate(T1=800.0, T2=60.0, T2prime=30.0)
    with pytest.raises(ValueError, match="TE must increase"):
        MultiEchoGRESimulator(flip=20.0, TR=30.0, TE=[5.0, 3.0])
    with pytest.raises(ValueError, match="dephasing of a Readout must be >= 0 ms"):
        Readout(dephasing=-1.0)


def test_megre_flow_washout_against_the_inflow_recursion():
    """Ideally spoiled echoes with through-plane flow: over each interval
    tau a share w = |v| tau / voxel of the spins is replaced by fresh
    equilibrium magnetisation (SPEC §2), so Z -> (1 - w) (E1 Z + 1 - E1) + w;
    the steady state is the fixed point of pulse, TE and TR - TE, and the
    echo is sin(a) Z (1 - w_TE) e^{-TE/T2}."""
    TR, TE, a, voxel = 20.0, 5.0, np.radians(30.0), 5e-3
    v = np.array([0.0, 0.02, 0.1, 0.3])  # m/s
    T1, T2 = 1200.0, 80.0
    sim = MultiEchoGRESimulator(flip=30.0, TR=TR, TE=[TE], rf_spoiling=None, n=1, repetitions="auto",
                                crusher_dephasing_rad=2 * np.pi, voxel_size_m=voxel)
    s = sim.simulate(T1=T1, T2=T2, v=v)

    def interval(tau):
        """Z -> A Z + B over tau with washout and recovery."""
        w = np.minimum(np.abs(v) * tau * 1e-3 / voxel, 1.0)
        E1 = np.exp(-tau / T1)
        return (1 - w) * E1, (1 - w) * (1 - E1) + w

    A1, B1 = interval(TE)
    A2, B2 = interval(TR - TE)
    A, B = A2 * A1 * np.cos(a), A2 * B1 + B2  # pulse, TE, (spoil), TR - TE
    z = B / (1 - A)
    w_te = np.minimum(v * TE * 1e-3 / voxel, 1.0)
    np.testing.assert_allclose(s[:, 0].real, np.sin(a) * z * (1 - w_te) * np.exp(-TE / T2), rtol=1e-5)
    assert s[-1, 0].real > 2 * s[0, 0].real  # inflow brightens the vessel
    with pytest.raises(ValueError, match="geometry|crusher_dephasing_rad|voxel_size_m"):
        MultiEchoGRESimulator(flip=30.0, TR=TR, TE=[TE], rf_spoiling=None).simulate(T1=T1, T2=T2, v=0.1)


VFA = np.array([3.0, 6.0, 10.0, 15.0, 20.0])


def test_despot1_against_ernst_and_the_played_spoiled_echo_and_its_fit():
    T1, M0, B1 = np.array([500.0, 1100.0, 2500.0]), np.array([0.8, 1.0, 1.3]), np.array([0.85, 1.0, 1.2])
    sim = DESPOT1Simulator(flip=VFA, TR=6.0)
    s = sim.simulate(T1=T1, M0=M0, B1=B1)
    a = np.radians(VFA) * B1[:, None]
    E1 = np.exp(-6.0 / T1)[:, None]
    np.testing.assert_allclose(s.real, M0[:, None] * np.sin(a) * (1 - E1) / (1 - np.cos(a) * E1), rtol=1e-12)
    for j in (0, 3):
        played = MultiEchoGRESimulator(flip=VFA[j], TR=6.0, TE=[0.0], rf_spoiling=None, n=1,
                                       repetitions="auto").simulate(
            T1=T1, T2=60.0, M0=M0, B1=B1)
        np.testing.assert_allclose(played[:, 0], s[:, j], rtol=2e-5)
    fit = sim.fit(s, B1=B1)
    np.testing.assert_allclose(fit["T1"], T1, rtol=1e-9)
    np.testing.assert_allclose(fit["M0"], M0, rtol=1e-9)
    # ignoring B1 scales T1 by about B1^2 at small flips (the known DESPOT1 B1 sensitivity)
    assert abs(sim.fit(s)["T1"][0] / T1[0] - 0.85 ** 2) < 0.01
    _, J = sim.jacobian(("T1", "B1"), T1=T1, M0=M0, B1=B1)
    _jacobian_matches_differences(sim, dict(T1=T1, M0=M0, B1=B1), ("T1", "B1"), J)


GAMMA_BAR = 42.57747892e6  # Hz/T


def test_water_fat_single_peak_in_and_opposed_phase():
    """One fat peak at -3.4 ppm: opposed phase at TE = 1/(2|df|) gives
    |1 - 2f|, in phase at 1/|df| gives 1."""
    for B in (1.5, 3.0):
        df = 3.4e-6 * GAMMA_BAR * B
        TE = np.array([0.5, 1.0]) / df * 1e3
        s = WaterFatSimulator(TE=TE, field_strength=B, fat_spectrum="single").simulate(
            fat_fraction=np.array([0.1, 0.35, 0.8]))
        np.testing.assert_allclose(abs(s[:, 0]), abs(1 - 2 * np.array([0.1, 0.35, 0.8])), atol=1e-12)
        np.testing.assert_allclose(abs(s[:, 1]), 1.0, atol=1e-12)


def test_water_fat_six_peak_spectrum_with_decay_and_field():
    """The Hamilton et al. 2011 liver spectrum, written out here."""
    ppm = [-3.80, -3.40, -2.60, -1.94, -0.39, 0.60]
    amp = np.array([0.087, 0.693, 0.128, 0.004, 0.039, 0.048])
    amp = amp / amp.sum()
    TE = np.linspace(1.0, 12.0, 8)
    t = dict(fat_fraction=0.22, T2star=25.0, B0=-35.0, M0=1.4)
    s = WaterFatSimulator(TE=TE, field_strength=3.0).simulate(**t)
    te = TE * 1e-3
    fat = sum(a * np.exp(-2j * np.pi * p_ * 1e-6 * GAMMA_BAR * 3.0 * te) for p_, a in zip(ppm, amp))
    ref = 1.4 * (0.78 + 0.22 * fat) * np.exp(-TE / 25.0) * np.exp(2j * np.pi * 35.0 * te)
    np.testing.assert_allclose(s, ref, rtol=1e-12)
    names = ("fat_fraction", "T2star", "B0", "M0")
    _, J = WaterFatSimulator(TE=TE).jacobian(names, **t)
    for i, k in enumerate(names):
        h = 1e-6 * max(abs(t[k]), 1.0)
        fd = (WaterFatSimulator(TE=TE).simulate(**{**t, k: t[k] + h})
              - WaterFatSimulator(TE=TE).simulate(**{**t, k: t[k] - h})) / (2 * h)
        np.testing.assert_allclose(J[i], fd, rtol=1e-6, atol=1e-10)


def test_water_fat_refusals():
    with pytest.raises(ValueError, match="fat_spectrum must be"):
        WaterFatSimulator(TE=[1.0], fat_spectrum="olive")
    with pytest.raises(ValueError, match="2 shifts and 1 amplitudes"):
        WaterFatSimulator(TE=[1.0], fat_spectrum=([-3.4, -2.6], [1.0]))
    with pytest.raises(TypeError, match="needs tissue property 'fat_fraction'"):
        WaterFatSimulator(TE=[1.0]).simulate(M0=1.0)


def test_double_angle_recovers_b1_and_its_bias_with_short_tr():
    B1 = np.array([0.6, 0.85, 1.0, 1.2])
    da = DoubleAngleSimulator(flip=60.0)
    np.testing.assert_allclose(da.b1(da.simulate(B1=B1, M0=2.0), 60.0), B1, rtol=1e-12)
    # with TR: the Ernst signals written out; the map is biased by T1
    short = DoubleAngleSimulator(flip=60.0, TR=500.0)
    s = short.simulate(B1=B1, T1=1000.0)
    E1 = np.exp(-0.5)
    for i, m in enumerate((1.0, 2.0)):
        a = np.radians(60.0 * m) * B1
        np.testing.assert_allclose(s[:, i], np.sin(a) * (1 - E1) / (1 - np.cos(a) * E1), rtol=1e-12)
    assert np.all(np.abs(short.b1(s, 60.0) - B1) > 1e-3)


def test_double_angle_jacobian_and_refusals():
    sim = DoubleAngleSimulator(flip=50.0, TR=2000.0, TE=3.0)
    t = dict(T1=np.array([700.0, 1500.0]), T2star=30.0, B1=0.9, M0=1.1)
    names = ("T1", "T2star", "B1", "M0")
    _, J = sim.jacobian(names, **t)
    _jacobian_matches_differences(sim, t, names, J)
    with pytest.raises(TypeError, match="needs tissue property 'T1' with a TR"):
        sim.simulate(B1=1.0)
    with pytest.raises(ValueError, match="flip"):
        DoubleAngleSimulator(flip=0.0)


PROFILE = (np.array([0.15, 0.45, 0.8, 1.0, 0.8, 0.45, 0.15]), np.array([1.0, 2.0, 3.0, 3.0, 3.0, 2.0, 1.0]))


def test_slice_profile_averages_the_flips_across_the_slice():
    """FLASH with a slice profile against the isochromat ensemble averaged
    over the profile's effective flips, written out here."""
    flips = np.linspace(5.0, 30.0, 30)
    t = dict(T1=np.array([900.0, 1400.0]), T2=np.array([70.0, 50.0]), B1=np.array([0.9, 1.05]))
    sim = FLASHSimulator(flip=flips, TR=9.0, TE=4.0, slice_profile=PROFILE)
    s = sim.simulate(**t)
    scales, w = PROFILE[0], PROFILE[1] / PROFILE[1].sum()
    for v in range(2):
        ref = sum(wk * _flash_isochromats(flips, 9.0, 4.0, 30, 117.0, t["T1"][v], t["T2"][v], B1=t["B1"][v] * sk,
                                          N=256) for sk, wk in zip(scales, w))
        np.testing.assert_allclose(s[v], ref, atol=3e-6)


def test_slice_profile_jacobian_and_pullback_against_differences():
    flips = np.linspace(5.0, 30.0, 12)
    sim = FLASHSimulator(flip=flips, TR=9.0, TE=4.0, slice_profile=PROFILE)
    t = dict(T1=np.array([900.0, 1400.0]), T2=60.0, B1=0.95)
    names = ("T1", "B1")
    s, J = sim.jacobian(names, **t)
    _jacobian_matches_differences(sim, t, names, J, step=1e-3, rtol=2e-3, atol=2e-6)
    s2, pullback = sim.vjp(("flip", "B1", "T1"), **t)
    np.testing.assert_allclose(s2, s, atol=1e-6)
    g = pullback(2 * s2)  # L = sum |s|^2: dL/dk = sum Re(conj(2 s) J_k)
    dl = {k: np.sum(np.real(np.conj(2 * s) * J[:, i]), axis=-1) for i, k in enumerate(names)}
    np.testing.assert_allclose(g["T1"], dl["T1"], rtol=1e-4)  # per voxel, as T1 was passed
    np.testing.assert_allclose(g["B1"], dl["B1"].sum(), rtol=1e-4)  # a scalar B1: summed over voxels
    h = 0.1  # degrees: a step the single-precision signal resolves at every host level
    up, dn = flips.copy(), flips.copy()
    up[3] += h
    dn[3] -= h
    loss = lambda f: float(np.sum(np.abs(sim.simulate(flip=f, **t)) ** 2))
    np.testing.assert_allclose(g["flip"][3], (loss(up) - loss(dn)) / (2 * h), rtol=2e-3)


def test_slice_profile_of_a_pulse_against_rabi_and_the_small_tip_fourier_transform():
    from blochsim import slice_profile
    # a 1 ms rectangle, 60°: the Rabi formula Mz = (dw^2 + w1^2 cos(w T)) / w^2, w^2 = w1^2 + dw^2
    T, flip = 1e-3, np.radians(60.0)
    offsets = np.linspace(-3000.0, 3000.0, 41)
    scales, weights = slice_profile(np.ones(100), 10.0, 60.0, offsets=offsets)
    w1, dw = flip / T, 2 * np.pi * offsets
    w = np.sqrt(w1 ** 2 + dw ** 2)
    mz = (dw ** 2 + w1 ** 2 * np.cos(w * T)) / w ** 2
    np.testing.assert_allclose(scales, np.arccos(mz) / flip, atol=1e-9)
    np.testing.assert_allclose(weights, np.full(41, 1 / 41))
    # small tip (1°): the profile is the pulse's Fourier transform
    shape = np.sinc(np.linspace(-4, 4, 400)) * np.hamming(400)
    scales, _ = slice_profile(shape, 5.0, 1.0, offsets=offsets)
    t = (np.arange(400) + 0.5) * 5e-6
    ft = np.abs(np.exp(-2j * np.pi * offsets[:, None] * t) @ shape) / abs(shape.sum())
    np.testing.assert_allclose(scales, ft, atol=2e-4)
    # the default positions span 1.5 FWHM of that profile: the edges sit well below half the flip
    scales, weights = slice_profile(shape, 5.0, 30.0)
    assert scales.shape == (64,) and scales[0] < 0.1 and abs(np.max(scales) - 1.0) < 0.02
    with pytest.raises(ValueError, match="zero area"):
        slice_profile(np.array([1.0, -1.0]), 5.0, 30.0)
    with pytest.raises(ValueError, match="extent must be > 0"):
        slice_profile(shape, 5.0, 30.0, extent=0.0)


def test_slice_profile_refusals():
    with pytest.raises(ValueError, match="2 scales and 3 weights"):
        FLASHSimulator(flip=10.0, TR=5.0, n=3, slice_profile=([1.0, 0.5], [1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="pair"):
        FLASHSimulator(flip=10.0, TR=5.0, n=3, slice_profile=1.0)
    with pytest.raises(TypeError, match="does not model"):
        NoB1(slice_profile=PROFILE)
    with pytest.raises(ValueError, match="jacobian_vjp does not take a slice_profile"):
        FLASHSimulator(flip=10.0, TR=5.0, n=3, slice_profile=PROFILE).jacobian_vjp("T1", "flip", T1=800.0,
                                                                                    T2=50.0)
