"""The sequence library's protocols against oracles written here: closed
forms derived in the test, the longitudinal recursion stepped pulse by
pulse, and the same protocol played through the EPG engine."""
import numpy as np
import pytest

from blochsim import Delay, Dephase, Excitation, Inversion, Pulse, Readout, Refocusing, Simulator, Spoil
from blochsim.sequence import Sequence
from blochsim.simulators import (DESPOT1Simulator, DESPOT2Simulator, TrueFISPSimulator, DiffusionTensorSimulator, FSESimulator, MultiEchoGRESimulator, MultiEchoSESimulator, SPGRSimulator, ASLSimulator, HSFPSimulator, MOLLISimulator, DESSSimulator, DoubleAngleSimulator, HyperechoSimulator, WaterFatSimulator, fmSSFPSimulator, DiffusionSimulator, FLASHSimulator, IRbSSFPSimulator, bSSFPSimulator, LookLockerSimulator, MP2RAGESimulator, MPnRAGESimulator, MPRAGESimulator, ll_sim,
                                 mp2rage_sim)

MP2 = dict(TI=[700.0, 2500.0], flip=[4.0, 5.0], TR=5000.0, TR_gre=7.0, n_readouts=160)


def _pulse(a_rad, phase_rad):
    """The rotation of a hard pulse of flip a about (cos phase, sin phase,
    0), by Rodrigues' formula (SPEC §2's convention: phase 0 tips Z onto -y)."""
    u = np.array([np.cos(phase_rad), np.sin(phase_rad), 0.0])
    K = np.array([[0, -u[2], u[1]], [u[2], 0, -u[0]], [-u[1], u[0], 0]])
    return np.eye(3) + np.sin(a_rad) * K + (1 - np.cos(a_rad)) * K @ K


def _geometric_oracle(T1, TI, flip, TR, TR_gre, n, eta=1.0, B1=1.0, M0=1.0):
    """The MPnRAGE steady state in closed form (the MP2RAGE equation of
    Marques et al. 2010 generalised to any number of blocks): per block the
    n pulses act as Z -> Z r^n + (1 - E1)(1 - r^n)/(1 - r), r = cos(a) E1;
    the inversion, the gaps and the blocks compose to Z -> A Z + B over one
    TR, whose fixed point is the steady state."""
    TI, flip = np.atleast_1d(TI), np.broadcast_to(np.radians(flip), np.shape(np.atleast_1d(TI)))
    c = n // 2
    E1 = np.exp(-TR_gre / T1)
    starts, ends = TI - c * TR_gre, TI - c * TR_gre + n * TR_gre
    gaps = np.diff(np.concatenate([[0.0], np.ravel(np.stack([starts, ends], 1)), [TR]]))[0::2]
    A, B = -eta, 0.0
    for i in range(len(TI)):
        E = np.exp(-gaps[i] / T1)
        A, B = A * E, B * E + 1 - E
        r = np.cos(B1 * flip[i]) * E1
        A, B = A * r ** n, B * r ** n + (1 - E1) * (1 - r ** n) / (1 - r)
    E = np.exp(-gaps[-1] / T1)
    A, B = A * E, B * E + 1 - E
    z = B / (1 - A)
    out, zc = [], -eta * z  # Z after the inversion
    for i in range(len(TI)):
        E = np.exp(-gaps[i] / T1)
        zc = zc * E + 1 - E
        r = np.cos(B1 * flip[i]) * E1
        out.append(M0 * np.sin(B1 * flip[i]) * (zc * r ** c + (1 - E1) * (1 - r ** c) / (1 - r)))
        zc = zc * r ** n + (1 - E1) * (1 - r ** n) / (1 - r)
    return np.array(out)


def _stepped_oracle(T1, TI, flip, TR, TR_gre, n, eta=1.0, repetitions=40):
    """The same protocol stepped pulse by pulse on the longitudinal
    magnetisation (ideal spoiling), repeated until periodic."""
    TI, flip = np.atleast_1d(TI), np.broadcast_to(np.radians(flip), np.shape(np.atleast_1d(TI)))
    c = n // 2
    z = 1.0
    for _ in range(repetitions):
        z, t, out = -eta * z, 0.0, []
        for i in range(len(TI)):
            t_pulse = TI[i] - c * TR_gre
            for k in range(n):
                z = 1 + (z - 1) * np.exp(-(t_pulse - t) / T1)
                if k == c:
                    out.append(np.sin(flip[i]) * z)
                z, t = z * np.cos(flip[i]), t_pulse
                t_pulse += TR_gre
            z, t = 1 + (z - 1) * np.exp(-(t_pulse - t) / T1), t_pulse
        z = 1 + (z - 1) * np.exp(-(TR - t) / T1)
    return np.array(out)


def _jacobian_matches_differences(sim, t, names, J, step=1e-6, rtol=1e-6, atol=1e-12):
    """J (voxels, names, samples) against central differences of
    sim.simulate in each name, steps relative to the largest value."""
    for i, k in enumerate(names):
        h = step * np.max(np.abs(t[k]))
        fd = (sim.simulate(**{**t, k: t[k] + h}).astype(complex) - sim.simulate(**{**t, k: t[k] - h})) / (2 * h)
        np.testing.assert_allclose(J[:, i], fd, rtol=rtol, atol=atol, err_msg=k)


class PlayedMP2RAGE(Simulator):
    """MP2RAGE through the EPG engine: inversion, two blocks of pulse,
    readout, spoil, relaxation; the samples at the k-space centres."""
    protocol = dict(MP2)
    tissue_properties = ("T1", "T2", "M0", "B1", "inv_efficiency")

    def repetition(self, p):
        n, c, tr = p["n_readouts"], p["n_readouts"] // 2, p["TR_gre"]
        ops, now = [Inversion()], 0.0
        for i, TI in enumerate(p["TI"]):
            start = TI - c * tr
            ops.append(Delay(start - now))
            for k in range(n):
                ops += [Pulse(p["flip"][i]), Readout(), Spoil(), Delay(tr)]
            now = start + n * tr
        ops.append(Delay(p["TR"] - now))
        return Sequence(ops)


@pytest.mark.parametrize("T1", [300.0, 800.0, 1400.0, 3500.0])
def test_mp2rage_against_the_closed_form_and_the_stepped_recursion(T1):
    s = MP2RAGESimulator(**MP2).simulate(T1=T1)
    args = (T1, MP2["TI"], MP2["flip"], MP2["TR"], MP2["TR_gre"], MP2["n_readouts"])
    np.testing.assert_allclose(s, _geometric_oracle(*args), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(s, _stepped_oracle(*args), rtol=1e-9, atol=1e-12)


def test_mp2rage_played_through_the_epg_engine():
    T1 = np.array([600.0, 1200.0, 2000.0])
    eta, B1 = 0.96, 0.9
    closed = MP2RAGESimulator(**MP2).simulate(T1=T1, inv_efficiency=eta, B1=B1, M0=1.3)
    played = PlayedMP2RAGE(repetitions=6, states=2).simulate(T1=T1, T2=50.0, inv_efficiency=eta, B1=B1, M0=1.3)
    c = MP2["n_readouts"] // 2
    centre = 1j * played[:, [c, MP2["n_readouts"] + c]]  # the readout after a phase-0 pulse is -i sin(a) Z
    np.testing.assert_allclose(centre, closed, atol=2e-6)


def test_mprage_and_mpnrage_blocks():
    one = MPRAGESimulator(TI=900.0, flip=8.0, TR=2300.0, TR_gre=7.0, n_readouts=176)
    np.testing.assert_allclose(one.simulate(T1=1000.0), _geometric_oracle(1000.0, 900.0, 8.0, 2300.0, 7.0, 176),
                               rtol=1e-12)
    three = MPnRAGESimulator(TI=[500.0, 1500.0, 2600.0], flip=[3.0, 4.0, 6.0], TR=4000.0, TR_gre=6.0,
                             n_readouts=100)
    s = three.simulate(T1=np.array([700.0, 1600.0]), inv_efficiency=0.9)
    assert s.shape == (2, 3)
    for v, T1 in enumerate([700.0, 1600.0]):
        np.testing.assert_allclose(s[v], _stepped_oracle(T1, [500.0, 1500.0, 2600.0], [3.0, 4.0, 6.0], 4000.0, 6.0,
                                                         100, eta=0.9), rtol=1e-9)
    # the Jacobian of three blocks against differences of the geometric oracle
    t = dict(T1=1300.0, B1=0.9, inv_efficiency=0.93)
    _, J = three.jacobian(("T1", "B1", "inv_efficiency"), **t)

    def oracle(T1, B1, inv_efficiency):
        return _geometric_oracle(T1, [500.0, 1500.0, 2600.0], [3.0, 4.0, 6.0], 4000.0, 6.0, 100, inv_efficiency, B1)

    for i, k in enumerate(t):
        h = 1e-6 * t[k]
        fd = (oracle(**{**t, k: t[k] + h}) - oracle(**{**t, k: t[k] - h})) / (2 * h)
        np.testing.assert_allclose(J[i], fd, rtol=1e-6, atol=1e-12, err_msg=k)


def test_mp2rage_uni_is_free_of_m0_and_bounded():
    mp2 = MP2RAGESimulator(**MP2)
    T1 = np.geomspace(200.0, 4000.0, 50)
    u = mp2.uni(mp2.simulate(T1=T1, M0=3.7))
    np.testing.assert_allclose(u, mp2.uni(mp2.simulate(T1=T1)), rtol=1e-12)
    assert np.all(np.abs(u) <= 0.5)
    # Marques et al.: UNI falls monotonically with T1 over the brain's range
    assert np.all(np.diff(u[(T1 > 700) & (T1 < 3000)]) < 0)


def test_mp2rage_jacobian_against_differences():
    mp2 = MP2RAGESimulator(**MP2)
    t = dict(T1=np.array([800.0, 1500.0]), B1=0.9, inv_efficiency=0.95, M0=1.2)
    names = ("T1", "B1", "inv_efficiency", "M0")
    s, J = mp2.jacobian(names, **t)
    assert J.shape == (2, 4, 2)
    _jacobian_matches_differences(mp2, t, names, J)
    s2, J2 = mp2rage_sim(**MP2, T1=800.0, diff="T1")
    np.testing.assert_allclose(J2, mp2.jacobian("T1", T1=800.0)[1], rtol=1e-14)


@pytest.mark.parametrize("kw,match", [
    (dict(TI=[700.0, 600.0]), "TI must increase"),
    (dict(TI=[300.0, 2500.0]), r"TI\[0\] = 300 ms leaves no room"),
    (dict(TI=[700.0, 1500.0]), "readout blocks 0 and 1 overlap"),
    (dict(TR=3000.0), "ends at 3060 ms, after TR = 3000 ms"),
    (dict(TI=[700.0]), "MP2RAGESimulator takes 2 inversion time"),
    (dict(flip=[4.0, -5.0]), "flip"),
])
def test_mp2rage_refusals(kw, match):
    with pytest.raises(ValueError, match=match):
        MP2RAGESimulator(**{**MP2, **kw})


# --------------------------------------------------------------------------
# Look-Locker

def _ll_recursion(T1, flip, spacing, n, TI, TR=None, eta=1.0, B1=1.0, repetitions=60):
    """Look-Locker stepped event by event: inversion, TI, then pulse
    (sampled), spacing, ...; repeated every TR until periodic."""
    a = np.radians(flip) * B1
    z, out = 1.0, []
    for _ in range(repetitions if TR is not None else 1):
        z = 1 + (-eta * z - 1) * np.exp(-TI / T1)
        out = []
        for k in range(n):
            out.append(np.sin(a) * z)
            z = z * np.cos(a)
            if k < n - 1:
                z = 1 + (z - 1) * np.exp(-spacing / T1)
        if TR is not None:
            z = 1 + (z - 1) * np.exp(-(TR - TI - (n - 1) * spacing) / T1)
    return np.array(out)


@pytest.mark.parametrize("TR", [None, 3000.0, 8000.0])
def test_look_locker_against_its_recursion(TR):
    ll = LookLockerSimulator(flip=7.0, spacing=90.0, n=25, TI=40.0, TR=TR)
    for T1 in (400.0, 1300.0):
        s = ll.simulate(T1=T1, inv_efficiency=0.92, B1=1.1, M0=0.8)
        np.testing.assert_allclose(s.real, 0.8 * _ll_recursion(T1, 7.0, 90.0, 25, 40.0, TR, 0.92, 1.1),
                                   rtol=1e-10, atol=1e-14)


def test_look_locker_recovers_at_the_apparent_t1():
    """Deichmann & Haase 1992: the samples recover towards their limit at
    1/T1* = 1/T1 - ln(cos a)/spacing."""
    flip, spacing, T1 = 10.0, 50.0, 1100.0
    s = LookLockerSimulator(flip=flip, spacing=spacing, n=200, TI=20.0).simulate(T1=T1).real
    t1_star = 1 / (1 / T1 - np.log(np.cos(np.radians(flip))) / spacing)
    a, E = np.radians(flip), np.exp(-spacing / T1)
    d = s - np.sin(a) * (1 - E) / (1 - np.cos(a) * E)  # distance from the limit
    np.testing.assert_allclose(d[1:] / d[:-1], np.exp(-spacing / t1_star), rtol=1e-9)


class PlayedLookLocker(Simulator):
    protocol = {"flip": 7.0, "spacing": 90.0, "n": 25, "TI": 40.0, "TR": 3000.0}
    tissue_properties = ("T1", "T2", "M0", "B1", "inv_efficiency")

    def repetition(self, p):
        ops = [Inversion(), Delay(p["TI"])]
        for k in range(p["n"]):
            ops += [Pulse(p["flip"]), Readout(), Spoil()]
            if k < p["n"] - 1:
                ops.append(Delay(p["spacing"]))
        ops.append(Delay(p["TR"] - p["TI"] - (p["n"] - 1) * p["spacing"]))
        return Sequence(ops)


def test_look_locker_played_through_the_epg_engine():
    T1 = np.array([500.0, 1500.0])
    closed = LookLockerSimulator(flip=7.0, spacing=90.0, n=25, TI=40.0, TR=3000.0).simulate(
        T1=T1, B1=0.95, inv_efficiency=0.9)
    played = PlayedLookLocker(repetitions=8, states=2).simulate(T1=T1, T2=60.0, B1=0.95, inv_efficiency=0.9)
    np.testing.assert_allclose(1j * played, closed, atol=2e-6)


def test_look_locker_jacobian_and_refusals():
    t = dict(T1=np.array([700.0, 1400.0]), B1=1.05, inv_efficiency=0.9, M0=1.1)
    names = ("T1", "B1", "inv_efficiency", "M0")
    s, J = ll_sim(flip=6.0, spacing=80.0, n=12, TI=30.0, TR=2500.0, **t, diff=names)
    ll = LookLockerSimulator(flip=6.0, spacing=80.0, n=12, TI=30.0, TR=2500.0)
    _jacobian_matches_differences(ll, t, names, J)
    with pytest.raises(ValueError, match="TR = 500 ms is shorter than the last pulse's time 910 ms"):
        LookLockerSimulator(flip=6.0, spacing=80.0, n=12, TI=30.0, TR=500.0)
    with pytest.raises(ValueError, match="spacing"):
        LookLockerSimulator(flip=6.0, spacing=0.0, n=12, TI=30.0)


# --------------------------------------------------------------------------
# RF-spoiled FLASH

def _flash_isochromats(flip, TR, TE, n, inc, T1, T2, B1=1.0, B0=0.0, M0=1.0, inversion=False, TI=0.0, N=512):
    """FLASH by an ensemble of N isochromats whose dephasing per TR is
    2 pi j / N (Bloch rotations about (cos phi, sin phi, 0), relaxation,
    B0 precession), averaged at each echo."""
    theta = 2 * np.pi * np.arange(N) / N
    fp = np.zeros(N, complex)  # Mx + i My per isochromat
    mz = np.ones(N)

    def relax(fp, mz, t):
        return fp * np.exp(-t / T2) * np.exp(-2j * np.pi * B0 * t * 1e-3), 1 + (mz - 1) * np.exp(-t / T1)

    if inversion:
        fp, mz = relax(fp, -mz, TI)
    out = []
    for k in range(n):
        phi = np.radians(inc * k * (k + 1) / 2)
        a = np.radians(np.broadcast_to(flip, (n,))[k]) * B1
        m = _pulse(a, phi) @ np.stack([fp.real, fp.imag, mz])
        fp, mz = m[0] + 1j * m[1], m[2]
        fp, mz = relax(fp, mz, TE)
        out.append(M0 * np.mean(fp) * np.exp(-1j * (phi - np.pi / 2)))
        fp = fp * np.exp(1j * theta)
        fp, mz = relax(fp, mz, TR - TE)
    return np.array(out)


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


def _bloch_dwell(m, b1_rad_per_ms, dwell_ms, T1, T2, B0):
    """Isochromats m (3, N) through one dwell of constant RF (b1: complex
    rad/ms, its angle the RF phase) by the exact exponential of the Bloch
    equation with relaxation and off-resonance (4x4 affine generator)."""
    from scipy.linalg import expm
    w1, phi, w0 = abs(b1_rad_per_ms), np.angle(b1_rad_per_ms), 2 * np.pi * B0 * 1e-3
    u = (np.cos(phi), np.sin(phi), 0.0)
    G = np.zeros((4, 4))
    G[:3, :3] = w1 * np.array([[0, -u[2], u[1]], [u[2], 0, -u[0]], [-u[1], u[0], 0]])
    G[:3, :3] += np.array([[-1 / T2, w0, 0], [-w0, -1 / T2, 0], [0, 0, -1 / T1]])
    G[2, 3] = 1 / T1
    E = expm(G * dwell_ms)
    return E[:3, :3] @ m + E[:3, 3:4]


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


# --------------------------------------------------------------------------
# Multi-echo: T2* (gradient echoes, T2') and T2 (spin echoes)

TES = np.array([3.0, 8.0, 14.0, 25.0])


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


def test_mese_ideal_refocusing_decays_at_t2_and_below_180_adds_stimulated_echoes():
    sim = MultiEchoSESimulator(n_echoes=16, ESP=10.0)
    s = sim.simulate(T1=1000.0, T2=np.array([40.0, 90.0]), M0=2.0)
    te = 10.0 * np.arange(1, 17)
    np.testing.assert_allclose(np.abs(s), 2.0 * np.exp(-te / np.array([[40.0], [90.0]])), rtol=2e-5)
    # second echo after two alpha refocusings (ideal crushers, ESP = 20 ms):
    # the spin echo sin^4(a/2) e^{-40/T2} plus the stimulated echo
    # (1/2) sin^2 a, transverse for 20 ms and stored on Z for 20 ms
    a = np.radians(150.0)
    second = np.sin(a / 2) ** 4 * np.exp(-40.0 / 60.0) + 0.5 * np.sin(a) ** 2 * np.exp(-20.0 / 60.0 - 20.0 / 1000.0)
    s = MultiEchoSESimulator(n_echoes=2, ESP=20.0, refocusing=150.0).simulate(T1=1000.0, T2=60.0)
    np.testing.assert_allclose(abs(s[1]), second, rtol=1e-5)
    with pytest.raises(ValueError, match="not both"):
        MultiEchoSESimulator(n_echoes=4, ESP=10.0, flip=np.full(4, 180.0))
    t = dict(T1=np.array([900.0, 1400.0]), T2=np.array([50.0, 110.0]), B1=np.array([0.8, 0.95]))
    sim = MultiEchoSESimulator(n_echoes=12, ESP=9.0)
    _, J = sim.jacobian(("T2", "B1"), **t)
    _jacobian_matches_differences(sim, t, ("T2", "B1"), J, step=1e-3, rtol=5e-3, atol=2e-4)  # float32 differences


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


@pytest.mark.parametrize("make,name,value", [
    (lambda: MultiEchoSESimulator(n_echoes=6, ESP=10.0, refocusing=150.0), "refocusing", 150.0),
    (lambda: FLASHSimulator(flip=10.0, TR=8.0, TE=3.0, n=20), "rf_spoiling", 117.0),
    (lambda: fmSSFPSimulator(flip=30.0, TR=5.0, n=20, sweep=10.0), "sweep", 10.0),
    (lambda: HyperechoSimulator(flip=[30.0, 70.0, 110.0], phases=[0.0, 40.0, 10.0], ESP=5.0), "phases",
     np.array([0.0, 40.0, 10.0])),
], ids=["mese refocusing", "flash rf_spoiling", "fmssfp sweep", "hyperecho phases"])
def test_gradients_of_protocol_values_the_trains_derive_from(make, name, value):
    """Protocol values that a train is built from (a refocusing flip for
    every echo, a quadratic phase schedule, the mirrored half of a
    hyperecho) keep their gradient, shaped like the value given."""
    sim = make()
    t = dict(T1=1000.0, T2=80.0, B0=5.0) if name != "refocusing" else dict(T1=1000.0, T2=80.0)
    s, pullback = sim.vjp(name, **t)
    g = pullback(2 * s)[name]
    assert np.shape(g) == np.shape(value)

    def loss(x):
        return np.sum(np.abs(sim.simulate(**t, **{name: x}).astype(complex)) ** 2)

    for i in np.ndindex(np.shape(value)):
        h = np.zeros(np.shape(value))
        h[i] = 1e-2
        np.testing.assert_allclose(g[i], (loss(value + h) - loss(value - h)) / 2e-2, rtol=2e-2, atol=1e-6)


def test_protocol_refusals_of_the_sequence_library():
    with pytest.raises(ValueError, match="with RF spoiling the phase changes every TR"):
        MultiEchoGRESimulator(flip=20.0, TR=30.0, TE=TES, repetitions="auto").simulate(T1=800.0, T2=60.0)
    from blochsim.simulators import MTSimulator
    with pytest.raises(ValueError, match="repetitions must be 1"):
        MTSimulator(flip=10.0, TR=30.0, repetitions=3)
    with pytest.raises(TypeError, match="plays no ideal inversion .* inv_efficiency would be ignored"):
        FLASHSimulator(flip=10.0, TR=8.0, TE=3.0, n=5).simulate(T1=1000.0, T2=80.0, inv_efficiency=0.9)

    class Balanced(Simulator):
        def repetition(self, p):
            return Delay(2.5) @ Readout() @ Delay(2.5) @ Pulse(30.0)

    with pytest.raises(TypeError, match="plays no ideal inversion"):  # the exact steady-state path
        Balanced(repetitions="auto").simulate(T1=800.0, T2=60.0, inv_efficiency=0.9)
    with pytest.raises(ValueError, match="fat_fraction must be <= 1, got 1.7"):
        WaterFatSimulator(TE=[1.0, 2.0]).simulate(fat_fraction=1.7)
    with pytest.raises(ValueError, match="alpha .* must be <= 1, got 1.2"):
        ASLSimulator(times=[1000.0], alpha=1.2)


# --------------------------------------------------------------------------
# DESPOT1 / DESPOT2

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


def test_despot2_against_the_bssfp_steady_state_and_its_fit():
    T1, T2, B1 = np.array([800.0, 1500.0]), np.array([50.0, 120.0]), np.array([0.9, 1.1])
    flips = np.array([10.0, 25.0, 40.0, 60.0])
    sim = DESPOT2Simulator(flip=flips, TR=5.0)
    s = sim.simulate(T1=T1, T2=T2, B1=B1)
    # Deoni 2003's bSSFP equation on resonance, the echo at TE = TR/2
    a = np.radians(flips) * B1[:, None]
    E1, E2 = np.exp(-5.0 / T1)[:, None], np.exp(-5.0 / T2)[:, None]
    deoni = (1 - E1) * np.sin(a) / (1 - (E1 - E2) * np.cos(a) - E1 * E2) * np.exp(-2.5 / T2[:, None])
    np.testing.assert_allclose(s.real, deoni, rtol=1e-12)
    for v in range(2):
        closed = bSSFPSimulator(flip=flips * B1[v], TR=5.0).simulate(T1=T1[v], T2=T2[v])
        np.testing.assert_allclose(s[v], closed, rtol=1e-10)
    played = TrueFISPSimulator(flip=flips[2], TR=5.0, nshots=3000).simulate(T1=T1, T2=T2, B1=B1)
    np.testing.assert_allclose(played[:, -1], s[:, 2], rtol=3e-4)
    fit = sim.fit(s, T1=T1, B1=B1)
    np.testing.assert_allclose(fit["T2"], T2, rtol=1e-8)
    np.testing.assert_allclose(fit["M0"], np.exp(-2.5 / T2), rtol=1e-8)
    _, J = sim.jacobian(("T2", "T1"), T1=T1, T2=T2, B1=B1)
    _jacobian_matches_differences(sim, dict(T1=T1, T2=T2, B1=B1), ("T2", "T1"), J)


def test_despot_refusals():
    with pytest.raises(ValueError, match="at least two flip angles"):
        DESPOT1Simulator(flip=[10.0], TR=5.0)
    with pytest.raises(ValueError, match="flip must be > 0 deg"):
        DESPOT1Simulator(flip=[0.0, 10.0], TR=5.0)
    with pytest.raises(ValueError, match="TE = 8 ms must be at most TR = 5 ms"):
        DESPOT1Simulator(flip=[5.0, 10.0], TR=5.0, TE=8.0)
    with pytest.raises(ValueError, match="signals must end in 2 flip angles"):
        DESPOT1Simulator(flip=[5.0, 10.0], TR=5.0).fit(np.ones(3))
    with pytest.raises(ValueError, match="T1 must be > 0"):
        DESPOT2Simulator(flip=[5.0, 10.0], TR=5.0).fit(np.ones(2), T1=-1.0)


# --------------------------------------------------------------------------
# Diffusion

class PGSE(Simulator):
    """A pulsed-gradient spin echo through the EPG engine: two narrow
    gradient lobes (one shift each) Delta apart around the refocusing
    pulse; diffusion acts on the dephased orders (SPEC §2)."""
    protocol = {"TE": 80.0, "Delta": 30.0}
    tissue_properties = ("T1", "T2", "M0", "D")

    def preparation(self, p):
        return Excitation(90.0, phase=90.0)

    def repetition(self, p):
        half, t1 = p["TE"] / 2, p["TE"] / 2 - p["Delta"] / 2
        t2 = half + p["Delta"] / 2
        return (Readout() @ Delay(p["TE"] - t2) @ Dephase() @ Delay(t2 - half) @ Refocusing(180.0)
                @ Delay(half - t1) @ Dephase() @ Delay(t1))


@pytest.mark.parametrize("b", [0.0, 500.0, 1000.0, 2500.0])
def test_diffusion_stejskal_tanner_against_the_played_pgse(b):
    """Narrow lobes of wavenumber dk, Delta apart: b = dk^2 Delta."""
    TE, Delta, voxel = 80.0, 30.0, 1e-3
    dk = np.sqrt(b * 1e6 / (Delta * 1e-3))  # rad/m from b in s/mm^2
    t = dict(T1=1000.0, T2=np.array([60.0, 90.0]), D=np.array([0.7, 2.0]), M0=1.1)
    played = PGSE(TE=TE, Delta=Delta, crusher_dephasing_rad=max(dk * voxel, 1e-9), voxel_size_m=voxel,
                  states=4).simulate(**t)
    closed = DiffusionSimulator(b=b, TE=TE).simulate(T2=t["T2"], D=t["D"], M0=t["M0"])
    np.testing.assert_allclose(np.abs(played[:, -1]), np.abs(closed[:, 0]), rtol=2e-6)


def _dirs(n, seed):
    g = np.random.default_rng(seed).normal(size=(n, 3))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def test_diffusion_tensor_against_the_axially_symmetric_adc_and_the_played_pgse():
    """A fibre along u with diffusivities l_par and l_perp: the ADC along g
    is l_perp + (l_par - l_perp)(g.u)^2; one direction played through the
    EPG as a PGSE with that D."""
    u = np.array([0.3, -0.5, 0.81])
    u /= np.linalg.norm(u)
    l_par, l_perp = 1.8, 0.35
    D = l_perp * np.eye(3) + (l_par - l_perp) * np.outer(u, u)
    t = dict(T2=70.0, M0=1.2, Dxx=D[0, 0], Dyy=D[1, 1], Dzz=D[2, 2], Dxy=D[0, 1], Dxz=D[0, 2], Dyz=D[1, 2])
    g = _dirs(30, 3)
    b = np.linspace(0.0, 3000.0, 30)
    s = DiffusionTensorSimulator(b=b, directions=g, TE=80.0).simulate(**t)
    adc = l_perp + (l_par - l_perp) * (g @ u) ** 2
    np.testing.assert_allclose(s.real, 1.2 * np.exp(-80.0 / 70.0) * np.exp(-1e-3 * b * adc), rtol=1e-12)
    # the isotropic tensor is the scalar Stejskal-Tanner signal
    iso = DiffusionTensorSimulator(b=b, directions=g, TE=80.0, TR=3000.0).simulate(
        T1=900.0, T2=70.0, Dxx=0.8, Dyy=0.8, Dzz=0.8)
    np.testing.assert_allclose(iso, DiffusionSimulator(b=b, TE=80.0, TR=3000.0).simulate(T1=900.0, T2=70.0, D=0.8),
                               rtol=1e-12)
    Delta, voxel, j = 30.0, 1e-3, 20
    dk = np.sqrt(b[j] * 1e6 / (Delta * 1e-3))
    played = PGSE(TE=80.0, Delta=Delta, crusher_dephasing_rad=dk * voxel, voxel_size_m=voxel, states=4).simulate(
        T1=1000.0, T2=70.0, D=adc[j], M0=1.2)
    np.testing.assert_allclose(abs(played[-1]), s[j].real, rtol=2e-6)


def test_diffusion_tensor_fit_recovers_the_tensor_and_the_jacobian():
    rng = np.random.default_rng(5)
    b = np.concatenate([[0.0, 0.0], np.full(20, 1000.0), np.full(20, 2000.0)])
    g = np.concatenate([np.eye(3)[:2], _dirs(20, 1), _dirs(20, 2)])
    sim = DiffusionTensorSimulator(b=b, directions=g, TE=80.0)
    Q = np.linalg.qr(rng.normal(size=(5, 3, 3)))[0]
    lam = rng.uniform(0.2, 2.0, size=(5, 3))
    D = np.einsum("vij,vj,vkj->vik", Q, lam, Q)
    t = dict(T2=np.full(5, 70.0), M0=rng.uniform(0.5, 2.0, 5), Dxx=D[:, 0, 0], Dyy=D[:, 1, 1], Dzz=D[:, 2, 2],
             Dxy=D[:, 0, 1], Dxz=D[:, 0, 2], Dyz=D[:, 1, 2])
    fit = sim.fit_tensor(sim.simulate(**t))
    for k in ("Dxx", "Dyy", "Dzz", "Dxy", "Dxz", "Dyz"):
        np.testing.assert_allclose(fit[k], t[k], atol=1e-10, err_msg=k)
    np.testing.assert_allclose(fit["S0"], t["M0"] * np.exp(-80.0 / 70.0), rtol=1e-10)
    names = ("Dxx", "Dxy", "T2")
    s, J = sim.jacobian(names, **t)
    _jacobian_matches_differences(sim, t, names, J, step=1e-6, rtol=1e-6, atol=1e-12)


def test_diffusion_tensor_refusals():
    with pytest.raises(ValueError, match="needs directions"):
        DiffusionTensorSimulator(b=[0.0, 1000.0], TE=80.0)
    with pytest.raises(ValueError, match=r"directions must have shape \(2, 3\)"):
        DiffusionTensorSimulator(b=[0.0, 1000.0], directions=np.ones((3, 3)), TE=80.0)
    with pytest.raises(ValueError, match="zero row at b > 0"):
        DiffusionTensorSimulator(b=[0.0, 1000.0], directions=np.zeros((2, 3)), TE=80.0)
    sim = DiffusionTensorSimulator(b=[0.0, 1000.0], directions=[[0.0, 0.0, 1.0]] * 2, TE=80.0)
    with pytest.raises(ValueError, match="Dxx must be >= 0"):
        sim.simulate(T2=70.0, Dxx=-0.1, Dyy=1.0, Dzz=1.0)
    with pytest.raises(TypeError, match="Dzz"):
        sim.simulate(T2=70.0, Dxx=1.0, Dyy=1.0)
    with pytest.raises(ValueError, match="do not determine the tensor"):
        sim.fit_tensor(np.ones(2))
    with pytest.raises(ValueError, match="signals must end in 2 contrasts"):
        sim.fit_tensor(np.ones(3))


def test_diffusion_with_repetition_jacobian_and_refusals():
    sim = DiffusionSimulator(b=[0.0, 800.0, 1600.0], TE=70.0, TR=3000.0)
    t = dict(T1=np.array([900.0, 1400.0]), T2=80.0, D=np.array([0.5, 1.5]), M0=1.3)
    s = sim.simulate(**t)
    se = (1 - 2 * np.exp(-(3000.0 - 35.0) / t["T1"]) + np.exp(-3000.0 / t["T1"])) * np.exp(-70.0 / 80.0)
    np.testing.assert_allclose(s, 1.3 * se[:, None] * np.exp(-1e-3 * np.outer(t["D"], [0.0, 800.0, 1600.0])),
                               rtol=1e-13)
    names = ("T1", "T2", "D", "M0")
    _, J = sim.jacobian(names, **t)
    _jacobian_matches_differences(sim, t, names, J)
    with pytest.raises(TypeError, match="needs tissue property 'T1' with a TR"):
        sim.simulate(T2=80.0, D=1.0)
    with pytest.raises(ValueError, match="b"):
        DiffusionSimulator(b=[-1.0], TE=70.0)


# --------------------------------------------------------------------------
# IR-bSSFP

def _irbssfp_isochromat(flip, TR, TE, n, TI, T1, T2, B0=0.0, B1=1.0, eta=1.0, M0=1.0):
    """One isochromat (the train is balanced): inversion, TI, -a/2 at phase
    180, TR/2, then pulses of alternating phase sampled TE after each with
    the receiver following; times i."""
    m = np.array([0.0, 0.0, -eta])

    def rot(m, a_deg, phi_deg):
        return _pulse(np.radians(a_deg) * B1, np.radians(phi_deg)) @ m

    def free(m, t):
        f = (m[0] + 1j * m[1]) * np.exp(-t / T2) * np.exp(-2j * np.pi * B0 * t * 1e-3)
        return np.array([f.real, f.imag, 1 + (m[2] - 1) * np.exp(-t / T1)])

    m = free(m, TI)
    m = free(rot(m, flip / 2, 180.0), TR / 2)
    out = []
    for k in range(n):
        ph = 180.0 * (k % 2)
        m = free(rot(m, flip, ph), TE)
        out.append(1j * M0 * (m[0] + 1j * m[1]) * np.exp(-1j * np.radians(ph)))
        m = free(m, TR - TE)
    return np.array(out)


@pytest.mark.parametrize("B0", [0.0, 37.0])
def test_irbssfp_against_a_single_isochromat(B0):
    t = dict(T1=1100.0, T2=85.0, B0=B0, B1=0.93, inv_efficiency=0.95, M0=1.2)
    s = IRbSSFPSimulator(flip=45.0, TR=5.0, nshots=200, TI=15.0).simulate(**t)
    ref = _irbssfp_isochromat(45.0, 5.0, 2.5, 200, 15.0, 1100.0, 85.0, B0, 0.93, 0.95, 1.2)
    np.testing.assert_allclose(s, ref, atol=3e-6)


def test_irbssfp_reaches_the_balanced_steady_state():
    s = IRbSSFPSimulator(flip=40.0, TR=4.0, nshots=6000, TI=10.0).simulate(T1=600.0, T2=60.0)
    ss = bSSFPSimulator(flip=40.0, TR=4.0).simulate(T1=600.0, T2=60.0)
    np.testing.assert_allclose(s[-1], ss[..., 0], atol=2e-5)


# --------------------------------------------------------------------------
# DESS

def _dess_isochromats(flip, TR, TE, n, T1, T2, B0=0.0, B1=1.0, M0=1.0, N=1024):
    """DESS by an ensemble of N isochromats dephased 2 pi j / N by each TR's
    gradient: the two echoes of the n-th TR, times i."""
    theta = 2 * np.pi * np.arange(N) / N
    fp, mz = np.zeros(N, complex), np.ones(N)
    a = np.radians(flip) * B1

    def free(fp, mz, t):
        return fp * np.exp(-t / T2 - 2j * np.pi * B0 * t * 1e-3), 1 + (mz - 1) * np.exp(-t / T1)

    for _ in range(n):
        # a phase-0 pulse about x: F+ = Mx + i My
        mx, my = fp.real, fp.imag
        my, mz = my * np.cos(a) - mz * np.sin(a), my * np.sin(a) + mz * np.cos(a)
        fp = mx + 1j * my
        fp, mz = free(fp, mz, TE)
        s1 = 1j * M0 * np.mean(fp)
        fp = fp * np.exp(1j * theta)
        fp, mz = free(fp, mz, TR - 2 * TE)
        s2 = 1j * M0 * np.mean(fp)
        fp, mz = free(fp, mz, TE)
    return np.array([s1, s2])


@pytest.mark.parametrize("B0", [0.0, 9.0])
def test_dess_against_an_isochromat_ensemble(B0):
    t = dict(T1=800.0, T2=45.0, B0=B0, B1=0.95, M0=1.1)
    s = DESSSimulator(flip=35.0, TR=18.0, TE=4.0, repetitions=150).simulate(**t)
    ref = _dess_isochromats(35.0, 18.0, 4.0, 150, 800.0, 45.0, B0, 0.95, 1.1)
    np.testing.assert_allclose(s, ref, atol=3e-6)


def test_dess_refusals():
    with pytest.raises(ValueError, match="TE = 10 ms must be at most TR/2 = 9 ms"):
        DESSSimulator(flip=30.0, TR=18.0, TE=10.0)


# --------------------------------------------------------------------------
# Hyperecho

def _crushed_train_isochromats(exc_flip, exc_phase, flips, phases, ESP, T1, T2, B0=0.0, B1=1.0, N=128):
    """A crushed spin-echo train by N isochromats: the excitation, then per
    echo ESP/2 of relaxation and precession, a crusher (dephasing 2 pi j/N),
    the refocusing pulse, the same crusher, ESP/2, and the echo averaged."""
    theta = 2 * np.pi * np.arange(N) / N
    m = np.zeros((3, N))
    m[2] = 1.0

    def rotate(m, flip, phase):
        return _pulse(np.radians(flip) * B1, np.radians(phase)) @ m

    def free(m, t):
        fp = (m[0] + 1j * m[1]) * np.exp(-t / T2 - 2j * np.pi * B0 * t * 1e-3)
        return np.stack([fp.real, fp.imag, 1 + (m[2] - 1) * np.exp(-t / T1)])

    def crush(m):
        fp = (m[0] + 1j * m[1]) * np.exp(1j * theta)
        return np.stack([fp.real, fp.imag, m[2]])

    m, out = rotate(m, exc_flip, exc_phase), []
    for f, ph in zip(flips, phases):
        m = free(crush(rotate(crush(free(m, ESP / 2)), f, ph)), ESP / 2)
        out.append(np.mean(m[0] + 1j * m[1]))
    return np.array(out)


@pytest.mark.parametrize("B0", [0.0, 13.0])
def test_hyperecho_every_echo_against_an_isochromat_ensemble(B0):
    rng = np.random.default_rng(7)
    flips, phases = rng.uniform(20.0, 170.0, 5), rng.uniform(0.0, 360.0, 5)
    s = HyperechoSimulator(flip=flips, phases=phases, ESP=6.0).simulate(T1=900.0, T2=70.0, B0=B0, B1=0.95)
    train = np.concatenate([flips, [180.0], flips[::-1]])
    train_phases = np.concatenate([phases, [0.0], 180.0 - phases[::-1]])
    ref = _crushed_train_isochromats(90.0, 90.0, train, train_phases, 6.0, 900.0, 70.0, B0, 0.95)
    np.testing.assert_allclose(s, ref, atol=3e-6)


@pytest.mark.parametrize("seed,B0,exc_phase", [(1, 0.0, 90.0), (2, 25.0, 90.0), (3, -7.0, 20.0)])
def test_hyperecho_refocuses_every_pathway(seed, B0, exc_phase):
    """Hennig & Scheffler 2001: without relaxation the hyperecho holds the
    whole excited magnetisation, whatever the flips, phases and
    off-resonance, while the echoes before it do not."""
    rng = np.random.default_rng(seed)
    flips, phases = rng.uniform(10.0, 170.0, 7), rng.uniform(0.0, 360.0, 7)
    s = HyperechoSimulator(flip=flips, phases=phases, ESP=6.0, exc_phase=exc_phase).simulate(
        T1=1e12, T2=1e12, B0=B0)
    assert s.shape == (15,)
    np.testing.assert_allclose(abs(s[-1]), 1.0, atol=3e-6)
    assert np.all(np.abs(s[:-1]) < 0.999)
    # with T2 decay alone the hyperecho is the plain spin echo's (the
    # pathways spend different times in Z, where T1 = inf keeps them)
    with_t2 = HyperechoSimulator(flip=np.full(7, 180.0), ESP=6.0).simulate(T1=1e12, T2=80.0)
    np.testing.assert_allclose(abs(with_t2[-1]), np.exp(-15 * 6.0 / 80.0), rtol=1e-5)


# --------------------------------------------------------------------------
# fmSSFP

def _fmssfp_isochromat(flip, TR, TE, n, inc, sweep, T1, T2, B0=0.0, B1=1.0):
    """One isochromat under the swept-phase balanced train, times i."""
    m = np.array([0.0, 0.0, 1.0])
    out, phi = [], 0.0
    for k in range(n):
        if k:
            phi += inc + sweep * k
        ph = np.radians(phi)
        m = _pulse(np.radians(flip) * B1, ph) @ m
        for t, record in ((TE, True), (TR - TE, False)):
            f = (m[0] + 1j * m[1]) * np.exp(-t / T2 - 2j * np.pi * B0 * t * 1e-3)
            m = np.array([f.real, f.imag, 1 + (m[2] - 1) * np.exp(-t / T1)])
            if record:
                out.append(1j * f * np.exp(-1j * ph))
    return np.array(out)


@pytest.mark.parametrize("sweep,B0", [(0.0, 0.0), (0.9, 0.0), (0.9, 31.0), (-2.0, 12.0)])
def test_fmssfp_against_a_single_isochromat(sweep, B0):
    s = fmSSFPSimulator(flip=35.0, TR=5.0, n=300, sweep=sweep).simulate(T1=900.0, T2=70.0, B0=B0, B1=1.05)
    ref = _fmssfp_isochromat(35.0, 5.0, 2.5, 300, 180.0, sweep, 900.0, 70.0, B0, 1.05)
    np.testing.assert_allclose(s, ref, atol=5e-6)


# --------------------------------------------------------------------------
# Water and fat

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


# --------------------------------------------------------------------------
# Double angle

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


# --------------------------------------------------------------------------
# Arterial spin labelling

def _buxton_quad(t_ms, labeling, tau_ms, alpha, T1b_ms, lam, CBF, ATT_ms, T1_ms, M0):
    """Buxton's convolution integral by quadrature, from its definition."""
    from scipy.integrate import quad
    f = CBF / 6000.0
    t, tau, att, T1b = t_ms * 1e-3, tau_ms * 1e-3, ATT_ms * 1e-3, T1b_ms * 1e-3
    k = 1 / (T1_ms * 1e-3) + f / lam

    def c(tp):
        return alpha * (np.exp(-att / T1b) if labeling == "pcasl" else np.exp(-tp / T1b))

    hi = min(t, att + tau)
    if hi <= att:
        return 0.0
    val = quad(lambda tp: c(tp) * np.exp(-(t - tp) * k), att, hi, epsabs=0, epsrel=1e-12)[0]
    return 2 * M0 / lam * f * val


@pytest.mark.parametrize("labeling", ["pcasl", "pasl"])
def test_asl_against_the_convolution_integral(labeling):
    times = np.array([200.0, 700.0, 1500.0, 2200.0, 3500.0])
    tau = 1200.0 if labeling == "pasl" else 1800.0
    sim = ASLSimulator(times=times, labeling=labeling, tau=tau)
    for CBF, ATT, T1 in [(60.0, 900.0, 1300.0), (25.0, 1800.0, 1650.0)]:
        s = sim.simulate(CBF=CBF, ATT=ATT, T1=T1, M0=1.3)
        t_read = times + (tau if labeling == "pcasl" else 0.0)
        ref = [_buxton_quad(tr, labeling, tau, 0.85, 1650.0, 0.9, CBF, ATT, T1, 1.3) for tr in t_read]
        np.testing.assert_allclose(s.real, ref, rtol=1e-9, atol=1e-15)


def test_asl_pcasl_inverts_the_white_paper_formula():
    """Alsop et al. 2015 (MRM 73:102): with ATT <= PLD and tissue T1 =
    T1blood, CBF = 6000 λ ΔM e^{PLD/T1b} / (2 α T1b M0 (1 - e^{-τ/T1b})),
    exact up to the f/λ term of T1app."""
    PLD, tau, T1b = 1800.0, 1800.0, 1650.0
    dM = ASLSimulator(times=[PLD], tau=tau).simulate(CBF=50.0, ATT=1200.0, M0=1.0).real[0]
    cbf = 6000 * 0.9 * dM * np.exp(PLD / T1b) / (2 * 0.85 * T1b * 1e-3 * (1 - np.exp(-tau / T1b)))
    np.testing.assert_allclose(cbf, 50.0, rtol=0.02)


def test_asl_jacobian_and_refusals():
    sim = ASLSimulator(times=[300.0, 1000.0, 2500.0])
    t = dict(CBF=np.array([40.0, 70.0]), ATT=np.array([800.0, 1500.0]), T1=1400.0, M0=1.2)
    names = ("CBF", "ATT", "T1", "M0")
    _, J = sim.jacobian(names, **t)
    _jacobian_matches_differences(sim, t, names, J, step=1e-5, rtol=1e-5, atol=1e-14)
    with pytest.raises(ValueError, match="labeling must be 'pcasl' or 'pasl'"):
        ASLSimulator(times=[1.0], labeling="vsasl")
    with pytest.raises(ValueError, match="CBF"):
        sim.simulate(CBF=-1.0)


# --------------------------------------------------------------------------
# HSFP

def _balanced_isochromat(flips, TR, TE, inc, T1, T2, B0=0.0, B1=1.0, eta=None, TI=0.0):
    """One isochromat under a balanced train of flips at phases k·inc
    (after an inversion of efficiency eta when given), times i."""
    m = np.array([0.0, 0.0, 1.0 if eta is None else -eta])

    def free(m, t):
        f = (m[0] + 1j * m[1]) * np.exp(-t / T2 - 2j * np.pi * B0 * t * 1e-3)
        return np.array([f.real, f.imag, 1 + (m[2] - 1) * np.exp(-t / T1)])

    if eta is not None:
        m = free(m, TI)
    out = []
    for k, fl in enumerate(flips):
        ph = np.radians(k * inc)
        m = free(_pulse(np.radians(fl) * B1, ph) @ m, TE)
        out.append(1j * (m[0] + 1j * m[1]) * np.exp(-1j * ph))
        m = free(m, TR - TE)
    return np.array(out)


@pytest.mark.parametrize("inversion,B0", [(True, 0.0), (True, 23.0), (False, 8.0)])
def test_hsfp_against_a_single_isochromat(inversion, B0):
    flips = 5 + 60 * np.sin(np.linspace(0, np.pi, 250)) ** 2
    t = dict(T1=1100.0, T2=70.0, B0=B0, B1=0.92, **({"inv_efficiency": 0.96} if inversion else {}))
    s = HSFPSimulator(flip=flips, TR=4.5, TI=12.0, inversion=inversion).simulate(**t)
    ref = _balanced_isochromat(flips, 4.5, 2.25, 180.0, 1100.0, 70.0, B0, 0.92, 0.96 if inversion else None, 12.0)
    np.testing.assert_allclose(s, ref, atol=3e-6)


# --------------------------------------------------------------------------
# MOLLI

def _molli_isochromat(TI, RR, flip, TR, n, scheme, T1, T2, B0=0.0, B1=1.0, eta=1.0):
    """MOLLI on one isochromat: each image an alpha/2-prepared balanced
    block sampled at its centre pulse, spoiled after; times i."""
    m = np.array([0.0, 0.0, 1.0])

    def free(m, t):
        f = (m[0] + 1j * m[1]) * np.exp(-t / T2 - 2j * np.pi * B0 * t * 1e-3)
        return np.array([f.real, f.imag, 1 + (m[2] - 1) * np.exp(-t / T1)])

    def rot(m, a_deg, ph_deg):
        return _pulse(np.radians(a_deg) * B1, np.radians(ph_deg)) @ m

    out, c = [], n // 2
    for ti, (images, pause) in zip(TI, scheme):
        m = np.array([m[0], m[1], -eta * m[2]])
        now = 0.0
        for i in range(images):
            start = ti + i * RR - (c + 0.5) * TR
            m = free(rot(free(m, start - now), flip / 2, 180.0), TR / 2)
            for k in range(n):
                ph = 180.0 * (k % 2)
                m = free(rot(m, flip, ph), TR / 2)
                if k == c:
                    out.append(1j * (m[0] + 1j * m[1]) * np.exp(-1j * np.radians(ph)))
                m = free(m, TR / 2)
            m = np.array([0.0, 0.0, m[2]])
            now = start + (n + 0.5) * TR
        m = free(m, (images + pause) * RR - now)
    return np.array(out)


@pytest.mark.parametrize("B0", [0.0, 45.0])
def test_molli_against_a_single_isochromat(B0):
    kw = dict(TI=[110.0, 190.0], RR=900.0, flip=35.0, TR=2.6, n_readouts=36)
    t = dict(T1=1200.0, T2=48.0, B0=B0, B1=0.9, inv_efficiency=0.95)
    s = MOLLISimulator(**kw).simulate(**t)
    ref = _molli_isochromat([110.0, 190.0], 900.0, 35.0, 2.6, 36, ((5, 3), (3, 0)), 1200.0, 48.0, B0, 0.9, 0.95)
    np.testing.assert_allclose(s, ref, atol=3e-6)


HSFP_FLIPS = 5 + 60 * np.sin(np.linspace(0, np.pi, 80)) ** 2
# (simulator, its float64 oracle of (T1, T2, B1), B0 and the other tissue values)
PLAYED_ORACLES = {
    "IRbSSFP": (IRbSSFPSimulator(flip=45.0, TR=5.0, nshots=60, TI=15.0),
                lambda T1, T2, B1: _irbssfp_isochromat(45.0, 5.0, 2.5, 60, 15.0, T1, T2, 20.0, B1, 0.95, 1.2),
                dict(B0=20.0, inv_efficiency=0.95, M0=1.2)),
    "DESS": (DESSSimulator(flip=35.0, TR=18.0, TE=4.0, repetitions=60),
             lambda T1, T2, B1: _dess_isochromats(35.0, 18.0, 4.0, 60, T1, T2, 10.0, B1, 1.1),
             dict(B0=10.0, M0=1.1)),
    "fmSSFP": (fmSSFPSimulator(flip=35.0, TR=5.0, n=80, sweep=40.0),
               lambda T1, T2, B1: _fmssfp_isochromat(35.0, 5.0, 2.5, 80, 180.0, 40.0, T1, T2, 15.0, B1),
               dict(B0=15.0)),
    "HSFP": (HSFPSimulator(flip=HSFP_FLIPS, TR=4.5, TI=12.0, inversion=True),
             lambda T1, T2, B1: _balanced_isochromat(HSFP_FLIPS, 4.5, 2.25, 180.0, T1, T2, 8.0, B1, 0.96, 12.0),
             dict(B0=8.0, inv_efficiency=0.96)),
    "MOLLI": (MOLLISimulator(TI=[110.0, 190.0], RR=900.0, flip=35.0, TR=2.6, n_readouts=36),
              lambda T1, T2, B1: _molli_isochromat([110.0, 190.0], 900.0, 35.0, 2.6, 36, ((5, 3), (3, 0)), T1, T2,
                                                   5.0, B1, 0.95),
              dict(B0=5.0, inv_efficiency=0.95)),
}


@pytest.mark.parametrize("name", sorted(PLAYED_ORACLES))
def test_played_protocol_jacobians_against_differences_of_their_oracles(name):
    sim, oracle, rest = PLAYED_ORACLES[name]
    x = dict(T1=1100.0, T2=70.0, B1=0.93)
    _, J = sim.jacobian(("T1", "T2", "B1"), **x, **rest)
    for i, k in enumerate(("T1", "T2", "B1")):
        h = 1e-5 * x[k]
        fd = (oracle(**{**x, k: x[k] + h}) - oracle(**{**x, k: x[k] - h})) / (2 * h)
        np.testing.assert_allclose(J[i], fd, rtol=1e-3, atol=3e-6 * max(1.0, np.max(np.abs(fd))), err_msg=k)


def test_hyperecho_jacobian_against_differences():
    rng = np.random.default_rng(4)
    sim = HyperechoSimulator(flip=rng.uniform(60.0, 170.0, 6), phases=rng.uniform(0.0, 360.0, 6), ESP=6.0)
    t = dict(T1=np.array([900.0, 1500.0]), T2=np.array([60.0, 100.0]), B1=np.array([0.9, 1.05]))
    _, J = sim.jacobian(("T2", "B1"), **t)
    _jacobian_matches_differences(sim, t, ("T2", "B1"), J, step=1e-3, rtol=5e-3, atol=2e-4)  # float32 differences


def test_molli_refusals():
    with pytest.raises(ValueError, match="leaves no room"):
        MOLLISimulator(TI=[20.0, 200.0], RR=900.0, flip=35.0, TR=2.6, n_readouts=36)
    with pytest.raises(ValueError, match="runs past the heartbeat"):
        MOLLISimulator(TI=[890.0, 200.0], RR=900.0, flip=35.0, TR=2.6, n_readouts=36)
    with pytest.raises(ValueError, match="scheme"):
        MOLLISimulator(TI=[110.0], RR=900.0, flip=35.0, TR=2.6, n_readouts=36, scheme=((0, 3),))


# --------------------------------------------------------------------------
# repetitions="auto"

def test_auto_repetitions_reach_the_closed_form_steady_state():
    T1 = np.array([600.0, 1200.0, 2000.0])
    closed = MP2RAGESimulator(**MP2).simulate(T1=T1, inv_efficiency=0.96)
    played = PlayedMP2RAGE(repetitions="auto", states=2).simulate(T1=T1, T2=50.0, inv_efficiency=0.96)
    c = MP2["n_readouts"] // 2
    np.testing.assert_allclose(1j * played[:, [c, MP2["n_readouts"] + c]], closed, atol=2e-6)
    # the Jacobian and the pullback play as many
    s, J = PlayedMP2RAGE(repetitions="auto", states=2).jacobian("T1", T1=T1, T2=50.0)
    assert J.shape == s.shape
    from blochsim.simulators import bSSFPSimulator, TrueFISPSimulator
    ss = TrueFISPSimulator(flip=40.0, TR=5.0, nshots=2, repetitions="auto").simulate(T1=800.0, T2=60.0)
    np.testing.assert_allclose(ss[-1], bSSFPSimulator(flip=40.0, TR=5.0).simulate(T1=800.0, T2=60.0)[..., 0],
                               atol=3e-5)


@pytest.mark.parametrize("T1,T2,flip,B0", [(800.0, 60.0, 40.0, 0.0), (3000.0, 2000.0, 4.0, 0.0),
                                            (1500.0, 300.0, 25.0, 23.0)])
def test_auto_repetitions_exact_fixed_point_of_a_train_that_never_winds(T1, T2, flip, B0):
    """bSSFP played with repetitions='auto' reaches the balanced steady
    state of the closed form exactly, also where it settles over thousands
    of TRs (T1 = 3 s, T2 = 2 s, 4°); the Jacobian and the flip/TR gradient
    against the closed form's."""
    from blochsim.simulators import bSSFPSimulator, TrueFISPSimulator
    played = TrueFISPSimulator(flip=flip, TR=5.0, nshots=2, repetitions="auto")
    closed = bSSFPSimulator(flip=flip, TR=5.0)
    t = dict(T1=T1, T2=T2, B0=B0)
    ref = closed.simulate(**t)[..., 0]
    np.testing.assert_allclose(played.simulate(**t)[-1], ref, rtol=2e-6, atol=2e-7)
    names = ("T1", "T2", "B0")
    _, J = played.jacobian(names, **t)
    _, Jc = closed.jacobian(names, **t)
    np.testing.assert_allclose(J[:, -1], Jc[:, 0], rtol=1e-5, atol=1e-9)
    s, pullback = played.vjp(("flip", "TR", "T2"), **t)
    g = pullback(np.array([0.0, 2 * s[-1]]))
    sc, pullback_c = closed.vjp(("flip", "TR", "T2"), **t)
    gc = pullback_c(2 * sc)
    for k in ("flip", "TR", "T2"):
        np.testing.assert_allclose(g[k], gc[k], rtol=1e-5, atol=1e-12, err_msg=k)


def test_exact_steady_state_gradients_of_a_long_balanced_train():
    """HSFP played to its periodic steady state (repetitions='auto', exact):
    the periodic adjoint's gradients in every flip and in TR (whose default
    TE = TR/2 follows it) against central differences of the played signal."""
    flips = 5 + 60 * np.sin(np.linspace(0, np.pi, 120)) ** 2
    sim = HSFPSimulator(flip=flips, TR=4.5, repetitions="auto", inversion=False)
    t = dict(T1=np.linspace(500.0, 2000.0, 6), T2=80.0, B0=np.linspace(-20.0, 20.0, 6))
    s, pullback = sim.vjp(("flip", "TR", "T1"), **t)
    g = pullback(2 * s)

    def loss(**kw):
        return np.sum(np.abs(sim.simulate(**{**t, **kw}).astype(complex)) ** 2)

    for i in (0, 40, 119):
        h = np.zeros(flips.size)
        h[i] = 0.05
        np.testing.assert_allclose(g["flip"][i], (loss(flip=flips + h) - loss(flip=flips - h)) / 0.1, rtol=2e-3,
                                   atol=2e-6)  # float32 signals
    np.testing.assert_allclose(g["TR"], (loss(TR=4.6) - loss(TR=4.4)) / 0.2, rtol=1e-2)  # a small gradient
    dT1 = np.zeros(6)
    dT1[2] = 20.0  # a wide step: the loss moves little with T1 and the signals are float32
    np.testing.assert_allclose(g["T1"][2], (loss(T1=t["T1"] + dT1) - loss(T1=t["T1"] - dT1)) / 40.0, rtol=2e-3)


class Nutation(Simulator):
    """A 37° pulse and a sample per repetition: without relaxation the
    magnetisation turns for ever."""
    def repetition(self, p):
        return Readout() @ Pulse(37.0)


class WindingNutation(Simulator):
    """The same with a gradient and its rewinder around the sample: played
    by the engine, which finds no end to it either."""
    def repetition(self, p):
        return Readout() @ Dephase(-1) @ Dephase() @ Pulse(37.0)


def test_auto_repetitions_refuse_a_train_that_never_settles():
    with pytest.raises(ValueError, match="does not settle to a periodic steady state .* modulus 1"):
        Nutation(repetitions="auto").simulate(T1=1e12, T2=1e12)
    with pytest.raises(ValueError, match="did not reach a periodic steady state within 65536 playings"):
        WindingNutation(repetitions="auto").simulate(T1=1e12, T2=1e12)
    with pytest.raises(ValueError, match="repetitions must be a positive integer or 'auto', got 'often'"):
        Nutation(repetitions="often")


# --------------------------------------------------------------------------
# Slice profiles

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
    h = 1e-2
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


class NoB1(Simulator):
    """A played simulator without B1."""
    tissue_properties = ("T1", "T2", "M0")

    def repetition(self, p):
        return Readout() @ Pulse(30.0)


def test_protocol_maps_example_runs(capsys):
    """examples/protocol_maps.py: every map comes out near the phantom's truth."""
    import pathlib
    import re
    import runpy
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "protocol_maps.py"
    runpy.run_path(str(path), run_name="example")["main"](24)
    out = capsys.readouterr().out
    errors = {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"^(.*?)median error\s+([\d.]+) %", out, re.M)}
    assert errors["MD, diffusion tensor"] < 2.0 and errors["T2*, multi-echo GRE"] < 6.0
    assert errors["T1, DESPOT1 with the B1 map"] < errors["T1, DESPOT1 without it"]
    assert errors["T1, MP2RAGE UNI lookup"] < 10.0

