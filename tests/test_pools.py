"""Pools (SPEC §3): exchanging pools with transverse states (Bloch–McConnell)
and the semisolid pool (binary spin bath), against oracles written here:
``scipy.linalg.expm`` of the Bloch–McConnell generator in Cartesian
components, the lineshape integrals by ``scipy.integrate.quad``, and the
fast-exchange limits."""
import numpy as np
import pytest
from scipy.integrate import quad
from scipy.linalg import expm

import blochsim
from blochsim import (Delay, Dephase, Excitation, Inversion, Pulse, Readout, RectPulse, Refocusing, SampledPulse, Saturation,
                      Simulator, Spoil)
from blochsim.simulators import CESTSimulator, FSESimulator, MRFSimulator, MTSimulator, SPGRSimulator

GAMMA_HZ_PER_T = 42.57747892e6


# --------------------------------------------------------------------------
# The oracle: Cartesian Bloch–McConnell, written from the SPEC conventions
# (F+ = Mx + i My; a phase-0 pulse rotates about +x and takes z to -y; B0
# turns F+ by exp(-2 pi i B0 t)).  Liquid pools carry (Mx, My, Mz), the
# semisolid pool Mz only; a last component holds the constant 1 for the
# recovery terms.

class Oracle:
    def __init__(self, T1, T2, B0=0.0, pools=(), bound=None):
        """pools: (f, k, T1, T2, shift) per exchanging pool (ms, Hz);
        bound: (f, k, T1) or None."""
        self.liquid = [(None, 0.0, T1, T2, 0.0)] + list(pools)
        self.bound = bound
        fa = 1.0 - sum(p[0] for p in pools) - (bound[0] if bound else 0.0)
        self.f = [fa] + [p[0] for p in pools]
        self.n = len(self.liquid)
        self.size = 3 * self.n + (1 if bound else 0) + 1
        self.B0 = B0

    def equilibrium(self):
        x = np.zeros(self.size)
        for j in range(self.n):
            x[3 * j + 2] = self.f[j]
        if self.bound:
            x[3 * self.n] = self.bound[0]
        x[-1] = 1.0
        return x

    def generator(self, w1=0.0, W=0.0):
        """d/dt per second; w1: RF amplitude (rad/s, phase 0); W: the
        semisolid pool's saturation rate (1/s)."""
        G = np.zeros((self.size, self.size))
        one = self.size - 1
        fa = self.f[0]
        for j, (_, k, T1, T2, shift) in enumerate(self.liquid):
            x, y, z = 3 * j, 3 * j + 1, 3 * j + 2
            R1, R2 = 1e3 / T1, 1e3 / T2
            w = 2 * np.pi * (self.B0 + shift)
            G[x, x] -= R2
            G[y, y] -= R2
            G[z, z] -= R1
            G[z, one] += R1 * self.f[j]
            G[x, y] += w
            G[y, x] -= w
            G[y, z] -= w1
            G[z, y] += w1
            if j > 0:
                for c in range(3):
                    a, b = c, 3 * j + c
                    G[a, a] -= k * self.f[j]
                    G[b, a] += k * self.f[j]
                    G[b, b] -= k * fa
                    G[a, b] += k * fa
        if self.bound:
            fb, kb, T1b = self.bound
            zb = 3 * self.n
            R1 = 1e3 / T1b
            G[zb, zb] -= R1 + W
            G[zb, one] += R1 * fb
            G[2, 2] -= kb * fb
            G[zb, 2] += kb * fb
            G[zb, zb] -= kb * fa
            G[2, zb] += kb * fa
        return G

    def evolve(self, x, t_ms, **kw):
        return expm(self.generator(**kw) * t_ms * 1e-3) @ x

    def transverse(self, x):
        return sum(x[3 * j] + 1j * x[3 * j + 1] for j in range(self.n))

    def longitudinal(self, x):
        return sum(x[3 * j + 2] for j in range(self.n))

    def rotate(self, x, flip_deg, phase_deg=0.0):
        """Hard pulse at phase phi: rotation about (cos phi, sin phi, 0)."""
        a, phi = np.radians(flip_deg), np.radians(phase_deg)
        u = np.array([np.cos(phi), np.sin(phi), 0.0])
        K = np.array([[0, -u[2], u[1]], [u[2], 0, -u[0]], [-u[1], u[0], 0]])
        R = np.eye(3) + np.sin(a) * K + (1 - np.cos(a)) * K @ K
        y = x.copy()
        for j in range(self.n):
            y[3 * j:3 * j + 3] = R @ x[3 * j:3 * j + 3]
        return y

    def invert(self, x):
        y = x.copy()
        for j in range(self.n):
            y[3 * j + 2] = -x[3 * j + 2]
        return y


def sl_integral(x):
    """The super-Lorentzian's g(x) by quad, split at the magic angle."""
    u0 = 1 / np.sqrt(3)

    def f(u):
        w = 3 * u * u - 1
        return np.sqrt(2 / np.pi) * np.exp(-2 * x * x / (w * w)) / abs(w)

    return (quad(f, 0, u0, epsabs=0, epsrel=1e-12, limit=500)[0]
            + quad(f, u0, 1, epsabs=0, epsrel=1e-12, limit=500)[0])


def oracle_lineshape(kind, df, T2_ms):
    T2 = T2_ms * 1e-3
    x = 2 * np.pi * df * T2
    if kind == "lorentzian":
        return T2 / np.pi / (1 + x * x)
    if kind == "gaussian":
        return T2 / np.sqrt(2 * np.pi) * np.exp(-x * x / 2)
    # the integral down to x = 1e-3; the classic form of Gloor 2008 from x_c = 2 pi 1.5 kHz 12 us
    xc = 2 * np.pi * 1.5e3 * 12e-6 if kind == "super-lorentzian-cutoff" else 1e-3
    if abs(x) < xc:
        # the even quadratic matched in value and slope at x_c
        g_c = sl_integral(xc)
        slope = (sl_integral(xc * (1 + 1e-5)) - sl_integral(xc * (1 - 1e-5))) / (2e-5 * xc)
        b = slope / (2 * xc)
        return T2 * (g_c + b * (x * x - xc * xc))
    return T2 * sl_integral(x)


# --------------------------------------------------------------------------
# Sequences played for the tests

class InversionProbe(Simulator):
    """Inversion, TI, then a 90° pulse read at once: -i times the liquid Z."""
    protocol = {"TI": 100.0}

    def repetition(self, p):
        return Readout() @ Pulse(90.0) @ Delay(p["TI"]) @ Inversion()


class FID(Simulator):
    """An excitation, then a sample every `dt` ms."""
    protocol = {"flip": 90.0, "phase": 0.0, "dt": 1.0, "n": 10}

    def preparation(self, p):
        return Excitation(p["flip"], phase=p["phase"])

    def repetition(self, p):
        return Readout() @ Delay(p["dt"])

    def check_protocol(self, p):
        p["repetitions"] = p["n"]
        return p


class FIDAll(Simulator):
    """FID recording every sample (the train unrolled)."""
    protocol = {"flip": 90.0, "phase": 0.0, "dt": 1.0, "n": 10}

    def preparation(self, p):
        return Excitation(p["flip"], phase=p["phase"])

    def repetition(self, p):
        return (Readout() @ Delay(p["dt"])) ** p["n"]


class SaturationTrain(Simulator):
    """n sub-pulses of a rectangular off-resonance saturation, each followed
    by its share of the pulse's time, then a 90° read of the liquid Z."""
    protocol = {"flip": 600.0, "duration": 10.0, "offset": 2000.0, "n": 40}

    def repetition(self, p):
        n = p["n"]
        sub = Delay(p["duration"] / n) @ Saturation(p["flip"] / n, p["duration"] / n, offset=p["offset"])
        return Readout() @ Pulse(90.0) @ Spoil() @ sub ** n


def _fid_oracle(o, flip, phase, dt, n):
    x = o.rotate(o.equilibrium(), flip, phase)
    out = []
    for _ in range(n):
        x = o.evolve(x, dt)
        out.append(o.transverse(x))
    return np.array(out)


# --------------------------------------------------------------------------
# Physics

@pytest.mark.parametrize("TI", [1.0, 40.0, 250.0, 900.0])
def test_semisolid_longitudinal_recovery(TI):
    tissue = dict(T1=1200.0, T2=80.0, bound_fraction=0.15, bound_exchange=30.0, bound_T1=300.0)
    s = InversionProbe(TI=TI).simulate(**tissue)
    o = Oracle(1200.0, 80.0, bound=(0.15, 30.0, 300.0))
    # the inversion leaves the semisolid pool untouched
    x = o.evolve(o.invert(o.equilibrium()), TI)
    np.testing.assert_allclose(s, [-1j * o.longitudinal(x)], atol=2e-6)


@pytest.mark.parametrize("TI", [5.0, 300.0])
def test_two_liquid_pools_longitudinal_recovery(TI):
    tissue = dict(T1=1000.0, T2=80.0, poolB_fraction=0.25, poolB_exchange=15.0, poolB_T1=400.0, poolB_T2=15.0)
    s = InversionProbe(TI=TI).simulate(**tissue)
    o = Oracle(1000.0, 80.0, pools=[(0.25, 15.0, 400.0, 15.0, 0.0)])
    x = o.evolve(o.invert(o.equilibrium()), TI)
    np.testing.assert_allclose(s, [-1j * o.longitudinal(x)], atol=2e-6)


def test_exchanging_pool_fid():
    tissue = dict(T1=900.0, T2=50.0, B0=12.0, poolB_fraction=0.3, poolB_exchange=20.0, poolB_T2=10.0,
                  poolB_T1=500.0, poolB_shift=100.0)
    s = FIDAll(phase=30.0, dt=1.0, n=12).simulate(**tissue)
    o = Oracle(900.0, 50.0, B0=12.0, pools=[(0.3, 20.0, 500.0, 10.0, 100.0)])
    np.testing.assert_allclose(s, _fid_oracle(o, 90.0, 30.0, 1.0, 12), atol=2e-6)


def test_four_exchanging_pools_and_semisolid_fid():
    pools = [(0.1, 20.0, 500.0, 10.0, 100.0), (0.05, 80.0, 800.0, 30.0, -250.0),
             (0.08, 5.0, 1500.0, 120.0, 40.0), (0.02, 300.0, 600.0, 5.0, 700.0)]
    tissue = dict(T1=900.0, T2=60.0, B0=-7.0, bound_fraction=0.12, bound_exchange=25.0, bound_T1=700.0)
    for x, (f, k, T1, T2, sh) in zip("BCDE", pools):
        tissue.update({f"pool{x}_fraction": f, f"pool{x}_exchange": k, f"pool{x}_T1": T1, f"pool{x}_T2": T2,
                       f"pool{x}_shift": sh})
    # a 60° pulse keeps longitudinal magnetisation, so the semisolid
    # exchange moves Z while the FID is recorded
    s = FIDAll(flip=60.0, phase=-45.0, dt=0.7, n=15).simulate(**tissue)
    o = Oracle(900.0, 60.0, B0=-7.0, pools=pools, bound=(0.12, 25.0, 700.0))
    np.testing.assert_allclose(s, _fid_oracle(o, 60.0, -45.0, 0.7, 15), atol=3e-6)


@pytest.mark.parametrize("kind", ["super-lorentzian", "lorentzian", "gaussian"])
def test_semisolid_saturation_sample_by_sample(kind):
    """A rectangular off-resonance pulse split into sub-pulses, against the
    same splitting done with expm and the lineshape from quad."""
    T2b, B0, B1 = 0.012, 40.0, 0.9
    flip, dur, offset, n = 1500.0, 10.0, 2000.0, 40
    tissue = dict(T1=1100.0, T2=70.0, B0=B0, B1=B1, bound_fraction=0.14, bound_exchange=40.0, bound_T1=900.0,
                  bound_T2=T2b)
    s = SaturationTrain(flip=flip, duration=dur, offset=offset, n=n, lineshape=kind).simulate(**tissue)
    o = Oracle(1100.0, 70.0, B0=B0, bound=(0.14, 40.0, 900.0))
    G = oracle_lineshape(kind, offset - B0, T2b)
    dt = dur / n * 1e-3
    w1 = np.radians(flip / n) * B1 / dt
    W = np.pi * w1 ** 2 * G
    x = o.equilibrium()
    for _ in range(n):
        x[3 * o.n] *= np.exp(-W * dt)
        x = o.evolve(x, dur / n)
    # read by a 90° pulse that B1 scales too
    want = -1j * np.sin(np.radians(90.0 * B1)) * o.longitudinal(x)
    # the semisolid pool is saturated, and free water sees it through exchange
    assert x[3 * o.n] < 0.75 * 0.14
    assert o.longitudinal(x) < (1 - 0.14) - 5e-3
    np.testing.assert_allclose(s, [want], atol=2e-6)


def test_rectangular_pulse_on_exchanging_pools_against_continuous_expm():
    """A constant-amplitude pulse played sample by sample (SampledPulse) on
    two exchanging pools, against expm of the continuous generator with the
    RF field in it."""
    b1_uT, dwell_us, n = 1.5, 10.0, 1500
    tissue = dict(T1=1000.0, T2=60.0, poolB_fraction=0.1, poolB_exchange=200.0, poolB_T1=800.0,
                  poolB_T2=20.0, poolB_shift=150.0)

    class Rect(Simulator):
        def repetition(self, p):
            return Readout() @ Pulse(90.0) @ Spoil() @ Readout() @ SampledPulse(np.full(n, b1_uT), dwell_us)

    s = Rect().simulate(**tissue)
    o = Oracle(1000.0, 60.0, pools=[(0.1, 200.0, 800.0, 20.0, 150.0)])
    w1 = 2 * np.pi * GAMMA_HZ_PER_T * b1_uT * 1e-6
    x = o.evolve(o.equilibrium(), n * dwell_us * 1e-3, w1=w1)
    assert abs(o.transverse(x)) > 0.05
    np.testing.assert_allclose(s[0], o.transverse(x), atol=2e-4)
    np.testing.assert_allclose(s[1], -1j * o.longitudinal(x), atol=2e-4)


def test_fast_exchange_recovery_at_mean_rate():
    f, T1, T1b = 0.3, 1000.0, 300.0
    R1 = (1 - f) / T1 + f / T1b
    for TI in (20.0, 200.0, 700.0):
        s = InversionProbe(TI=TI).simulate(T1=T1, T2=80.0, poolB_fraction=f, poolB_exchange=1e7, poolB_T1=T1b)
        np.testing.assert_allclose(s, [-1j * (1 - 2 * np.exp(-R1 * TI))], atol=2e-5)


def test_fast_exchange_precession_at_mean_shift():
    f, shift, T2, T2b = 0.3, 200.0, 80.0, 20.0
    R2 = (1 - f) / T2 + f / T2b
    s = FIDAll(dt=0.5, n=20).simulate(T1=1000.0, T2=T2, poolB_fraction=f, poolB_exchange=1e7, poolB_T2=T2b,
                                      poolB_shift=shift)
    t = 0.5 * np.arange(1, 21)
    want = -1j * np.exp(-R2 * t - 2j * np.pi * f * shift * t * 1e-3)
    np.testing.assert_allclose(s, want, atol=5e-4)
    # and without fast exchange the two frequencies beat: far from the mean
    slow = FIDAll(dt=0.5, n=20).simulate(T1=1000.0, T2=T2, poolB_fraction=f, poolB_exchange=1.0, poolB_T2=T2b,
                                         poolB_shift=shift)
    assert np.max(np.abs(slow - want)) > 0.05


def test_zero_fractions_equal_single_pool_bit_for_bit():
    flip = np.concatenate([np.linspace(5, 60, 50), np.linspace(60, 2, 50)])
    mrf = MRFSimulator(flip=flip, TR=10.0, states=16)
    T1 = np.array([400.0, 1000.0, 2000.0])
    T2 = np.array([40.0, 80.0, 150.0])
    ref = mrf.simulate(T1=T1, T2=T2)
    zero = dict(bound_fraction=0.0, bound_exchange=30.0, poolB_fraction=np.zeros(3), poolB_shift=100.0,
                poolC_fraction=0.0)
    np.testing.assert_array_equal(mrf.simulate(T1=T1, T2=T2, **zero), ref)
    s, J = mrf.jacobian(("T1", "T2"), T1=T1, T2=T2, **zero)
    s0, J0 = mrf.jacobian(("T1", "T2"), T1=T1, T2=T2)
    np.testing.assert_array_equal(s, s0)
    np.testing.assert_array_equal(J, J0)
    # differentiated at a zero fraction, the pooled kernel runs: equal to
    # round-off
    s, J = mrf.jacobian("poolB_fraction", T1=T1, T2=T2, poolB_fraction=0.0, poolB_T2=20.0)
    np.testing.assert_allclose(s, ref, atol=2e-6)


def test_first_echo_is_free_fraction_of_single_pool():
    """The first echo of an FSE train is made from the excitation's
    transverse magnetisation alone, which the semisolid pool does not
    exchange: (1 - f) times the single-pool echo, pulses saturating or not."""
    fse = FSESimulator(ESP=10.0, flip=np.full(6, 130.0))
    one = fse.simulate(T1=1000.0, T2=80.0, B1=0.9)
    s = fse.simulate(T1=1000.0, T2=80.0, B1=0.9, bound_fraction=0.2, bound_exchange=50.0)
    np.testing.assert_allclose(s[0], 0.8 * one[0], rtol=1e-6)
    # later echoes carry stimulated paths through Z, which exchange reaches
    assert abs(s[3] - 0.8 * one[3]) > 1e-4

    class SaturatingFSE(Simulator):
        def preparation(self, p):
            return Excitation(90.0, phase=90.0, duration=2.0)

        def repetition(self, p):
            half = Delay(5.0)
            return (Readout() @ half @ Dephase() @ Refocusing(130.0, duration=3.0) @ Dephase() @ half) ** 6

    sat = SaturatingFSE()
    a = sat.simulate(T1=1000.0, T2=80.0, B1=0.9)
    b = sat.simulate(T1=1000.0, T2=80.0, B1=0.9, bound_fraction=0.2, bound_exchange=50.0)
    np.testing.assert_allclose(b[0], 0.8 * a[0], rtol=1e-6)
    assert abs(b[3] - 0.8 * a[3]) > 1e-4


def test_mt_saturation_per_tr_lowers_the_steady_state_with_exchange():
    """An MT-prepared spoiled train (an off-resonance saturation pulse every
    TR): the magnetisation transfer ratio is 0 without exchange (free water
    never sees the saturated pool) and grows with the exchange rate."""

    class MTSpoiled(Simulator):
        protocol = {"mt_flip": 600.0}

        def repetition(self, p):
            ops = Delay(20.0) @ Spoil() @ Readout() @ Pulse(10.0) @ Delay(1.0)
            if p["mt_flip"] > 0:
                ops = ops @ Saturation(p["mt_flip"], 8.0, offset=1500.0)
            return ops

    mt, ref = MTSpoiled(repetitions=150), MTSpoiled(repetitions=150, mt_flip=0.0)
    t = dict(T1=1000.0, T2=60.0, bound_fraction=0.15)
    mtr = [1 - abs(mt.simulate(**t, bound_exchange=k)[0]) / abs(ref.simulate(**t, bound_exchange=k)[0])
           for k in (0.0, 5.0, 20.0, 60.0)]
    assert abs(mtr[0]) < 1e-6
    assert 0.01 < mtr[1] < mtr[2] < mtr[3] < 0.8


# --------------------------------------------------------------------------
# Lineshapes

@pytest.mark.parametrize("df", [14.0, 30.0, 50.0, 128.0, 300.0, 700.0, 1500.0, 1800.0, 2500.0, 4000.0, 8000.0,
                                20000.0, 60000.0])
def test_super_lorentzian_against_quad(df):
    """The defining integral down to tens of Hz (at 12 us; 13 Hz is x = 1e-3)."""
    G = blochsim.lineshape(df, 0.012)
    np.testing.assert_allclose(G, T2_S * sl_integral(2 * np.pi * df * T2_S), rtol=1e-8)
    np.testing.assert_allclose(blochsim.lineshape(df * 12 / 40, 0.040), 0.040e-3 * sl_integral(2 * np.pi * df * T2_S),
                               rtol=1e-8)


T2_S = 12e-6


def test_super_lorentzian_inside_13_hz_is_continued_smoothly():
    f = np.linspace(0.0, 13.26, 14)
    G = blochsim.lineshape(f, 0.012)
    assert np.all(np.isfinite(G)) and np.all(np.diff(G) < 0)
    np.testing.assert_allclose(G, [oracle_lineshape("super-lorentzian", x, 0.012) for x in f], rtol=1e-7)
    xm = 1e-3 / (2 * np.pi * T2_S)  # the join, Hz
    np.testing.assert_allclose(blochsim.lineshape(xm, 0.012), T2_S * sl_integral(1e-3), rtol=1e-8)


def test_super_lorentzian_cutoff_is_the_classic_continuation():
    """lineshape='super-lorentzian-cutoff': the quadratic from 1.5 kHz of
    Gloor et al. 2008, which stays well below the integral where CEST
    looks (0.49-0.95 of it between 50 Hz and 1 kHz)."""
    T2 = 0.012
    kind = "super-lorentzian-cutoff"
    f = np.linspace(0.0, 1500.0, 31)
    G = blochsim.lineshape(f, T2, kind)
    # finite, even, decreasing, and joined to the integral at 1.5 kHz
    assert np.all(np.isfinite(G)) and np.all(np.diff(G) < 0)
    np.testing.assert_allclose(blochsim.lineshape(-f, T2, kind), G)
    np.testing.assert_allclose(G, [oracle_lineshape(kind, x, T2) for x in f], rtol=1e-7)
    edge = oracle_lineshape("super-lorentzian", 1500.0, T2)
    np.testing.assert_allclose(G[-1], edge, rtol=1e-8)
    # slope matched: one-sided differences across the join agree
    h = 1.0
    left = (blochsim.lineshape(1500.0, T2, kind) - blochsim.lineshape(1500.0 - h, T2, kind)) / h
    right = (oracle_lineshape("super-lorentzian", 1500.0 + h, T2) - edge) / h
    np.testing.assert_allclose(left, right, rtol=2e-3)
    # the on-resonance value of Gloor et al. 2008 (about 1.4e-5 s at 12 us) in size
    assert 1.2e-5 < G[0] < 1.7e-5
    ratio = blochsim.lineshape([50.0, 1000.0], T2, kind) / blochsim.lineshape([50.0, 1000.0], T2)
    np.testing.assert_allclose(ratio, [0.49, 0.95], atol=0.01)
    # above the cut-off both forms are the integral
    np.testing.assert_array_equal(blochsim.lineshape(3000.0, T2, kind), blochsim.lineshape(3000.0, T2))


@pytest.mark.parametrize("kind", ["lorentzian", "gaussian", "super-lorentzian", "super-lorentzian-cutoff"])
def test_lineshapes_are_densities_over_angular_frequency(kind):
    T2 = 0.012
    f = np.linspace(0, 400e3, 400001)
    G = blochsim.lineshape(f, T2, kind)
    total = 2 * np.trapezoid(G, 2 * np.pi * f)
    tail = 0.0
    if kind == "lorentzian":  # the Lorentzian's tail past 400 kHz
        tail = 2 * (0.5 - np.arctan(2 * np.pi * 400e3 * T2 * 1e-3) / np.pi)
    if kind.startswith("super-lorentzian"):
        # the integral's area is 1 (its log divergence at resonance is
        # integrable); the continuation below x_c holds the quadratic's
        # area there instead of the integral's
        xc = 2 * np.pi * 1.5e3 * 12e-6 if kind.endswith("cutoff") else 1e-3
        g_c = sl_integral(xc)
        slope = (sl_integral(xc * (1 + 1e-5)) - sl_integral(xc * (1 - 1e-5))) / (2e-5 * xc)
        b = slope / (2 * xc)
        quadratic = 2 * ((g_c - b * xc ** 2) * xc + b * xc ** 3 / 3)
        near = 2 * quad(sl_integral, 0, xc, limit=200)[0]
        tail = near - quadratic
        assert (0.03 < tail < 0.12) if kind.endswith("cutoff") else (0 < tail < 1e-3)
    np.testing.assert_allclose(total + tail, 1.0, rtol=1e-4)


def test_power_factor():
    assert blochsim.power_factor(np.ones(100)) == pytest.approx(1.0)
    t = np.linspace(-1, 1, 2001)
    gauss = np.exp(-t ** 2 / (2 * 0.25 ** 2))
    # n sum b^2 / (sum b)^2 -> (2 int b^2) / (int b)^2 on [-1, 1]
    b2 = quad(lambda x: np.exp(-x * x / 0.0625), -1, 1)[0]
    b1 = quad(lambda x: np.exp(-x * x / 0.125), -1, 1)[0]
    assert blochsim.power_factor(gauss) == pytest.approx(2 * b2 / b1 ** 2, rel=1e-3)


# --------------------------------------------------------------------------
# Derivatives

POOLED = dict(T1=900.0, T2=60.0, M0=1.3, B1=0.95, B0=8.0, bound_fraction=0.12, bound_exchange=30.0,
              bound_T1=800.0, bound_T2=0.011, poolB_fraction=0.15, poolB_exchange=25.0, poolB_T1=500.0,
              poolB_T2=12.0, poolB_shift=60.0)


class MTTrain(Simulator):
    """A short RF-spoiled-like train with saturating pulses, off-resonance
    preparation and a crusher, recording every TR."""
    protocol = {"n": 12}

    def preparation(self, p):
        return Delay(3.0) @ Saturation(500.0, 8.0, offset=1800.0) @ Inversion()

    def repetition(self, p):
        ops = []
        for i in range(p["n"]):
            ops += [Pulse(35.0 + 5 * i, phase=(17.0 * i * i) % 360, duration=1.2), Readout(), Dephase(),
                    Delay(6.0)]
        from blochsim.sequence import Sequence
        return Sequence(ops)


@pytest.mark.parametrize("name", ["T1", "T2", "M0", "B1", "B0", "bound_fraction", "bound_exchange", "bound_T1",
                                  "bound_T2", "poolB_fraction", "poolB_exchange", "poolB_T1", "poolB_T2",
                                  "poolB_shift"])
def test_jacobian_against_central_differences(name):
    sim = MTTrain(states=16)
    s, J = sim.jacobian(name, **POOLED)
    v = POOLED[name]
    # the signal is single precision: a step wide enough for its round-off
    h = 1e-2 * abs(v)
    up = sim.simulate(**{**POOLED, name: v + h}).astype(np.complex128)
    dn = sim.simulate(**{**POOLED, name: v - h}).astype(np.complex128)
    fd = (up - dn) / (2 * h)
    scale = np.max(np.abs(fd))
    assert scale > 0
    np.testing.assert_allclose(J, fd, atol=3e-3 * scale + 2e-4)


def test_jacobian_in_passes_equals_single_directions():
    names = ("T1", "T2", "bound_fraction", "bound_exchange", "poolB_fraction", "poolB_shift", "B1")
    sim = MTTrain(states=16)
    s, J = sim.jacobian(names, **POOLED)
    assert J.shape == (len(names), 12)
    np.testing.assert_allclose(s, sim.simulate(**POOLED), atol=2e-6)
    for i, k in enumerate(names):
        np.testing.assert_allclose(J[i], sim.jacobian(k, **POOLED)[1], rtol=1e-6, atol=1e-7)


def test_jacobian_of_exchanging_fid_against_oracle_differences():
    """d signal / d poolB_exchange and poolB_shift against central
    differences of the float64 oracle."""
    base = dict(T1=900.0, T2=50.0, poolB_fraction=0.3, poolB_exchange=20.0, poolB_T2=10.0, poolB_T1=500.0,
                poolB_shift=100.0)
    sim = FIDAll(dt=1.0, n=8)
    _, J = sim.jacobian(("poolB_exchange", "poolB_shift"), **base)

    def oracle(k, sh):
        o = Oracle(900.0, 50.0, pools=[(0.3, k, 500.0, 10.0, sh)])
        return _fid_oracle(o, 90.0, 0.0, 1.0, 8)

    dk = (oracle(20.01, 100.0) - oracle(19.99, 100.0)) / 0.02
    ds = (oracle(20.0, 100.01) - oracle(20.0, 99.99)) / 0.02
    np.testing.assert_allclose(J[0], dk, atol=2e-6)
    np.testing.assert_allclose(J[1], ds, atol=2e-6)


def test_threads_do_not_change_results():
    T1 = np.linspace(500, 1500, 7)
    a = MTTrain(states=16, threads=1).simulate(**{**POOLED, "T1": T1})
    b = MTTrain(states=16, threads=3).simulate(**{**POOLED, "T1": T1})
    np.testing.assert_array_equal(a, b)
    assert a.shape == (7, 12)


def test_voxel_arrays_broadcast():
    f = np.array([[0.05], [0.1], [0.2]])
    k = np.array([10.0, 30.0])
    s = MTTrain(states=16).simulate(**{**POOLED, "bound_fraction": f, "bound_exchange": k})
    assert s.shape == (3, 2, 12)
    one = MTTrain(states=16).simulate(**{**POOLED, "bound_fraction": 0.1, "bound_exchange": 30.0})
    np.testing.assert_array_equal(s[1, 1], one)


# --------------------------------------------------------------------------
# Refusals

@pytest.mark.parametrize("kw, match", [
    (dict(bound_fraction=0.6, poolB_fraction=0.5), "sum to 1.1"),
    (dict(poolB_fraction=1.2), "poolB_fraction must be <= 1"),
    (dict(poolB_fraction=-0.1), "poolB_fraction must be >= 0"),
    (dict(bound_fraction=0.1, bound_exchange=-3.0), "bound_exchange must be >= 0"),
    (dict(poolB_fraction=0.1, poolB_T2=0.0), "poolB_T2 must be > 0"),
    (dict(bound_fraction=0.1, bound_T1=-5.0), "bound_T1 must be > 0"),
    (dict(poolB_T1=500.0), "poolB_T1 was given without poolB_fraction"),
    (dict(bound_exchange=20.0), "bound_exchange was given without bound_fraction"),
    (dict(poolC_fraction=0.1), "poolC_fraction was given without poolB_fraction"),
    (dict(poolB_fraction=np.array([0.1, np.nan])), "poolB_fraction must be finite"),
])
def test_pool_refusals(kw, match):
    with pytest.raises(ValueError, match=match):
        FID().simulate(T1=1000.0, T2=80.0, **kw)


def test_fraction_sum_names_the_voxel():
    with pytest.raises(ValueError, match=r"at voxel \(1,\).*bound_fraction=0.5.*poolB_fraction=0.6"):
        FID().simulate(T1=1000.0, T2=80.0, bound_fraction=np.array([0.1, 0.5]), poolB_fraction=np.array([0.1, 0.6]))


def test_pools_refuse_diffusion_and_second_order():
    fse = FSESimulator(ESP=10.0, flip=np.full(4, 180.0), crusher_dephasing_rad=8 * np.pi, voxel_size_m=1e-3)
    with pytest.raises(ValueError, match="D is not modelled together with pools"):
        fse.simulate(T1=1000.0, T2=80.0, D=1.0, bound_fraction=0.1)
    with pytest.raises(ValueError, match="D is not modelled together with pools"):
        fse.vjp("flip", T1=1000.0, T2=80.0, D=1.0, bound_fraction=0.1)
    with pytest.raises(ValueError, match="second order is not available with pools"):
        fse.jacobian_vjp("T2", "flip", T1=1000.0, T2=80.0, bound_fraction=0.1)


def test_pools_refuse_an_unusable_device_and_closed_forms():
    if not blochsim.backends()["cuda"]["available"]:
        with pytest.raises(RuntimeError, match="device='cuda' was asked for"):
            FID(device="cuda").simulate(T1=1000.0, T2=80.0, bound_fraction=0.1)
    with pytest.raises(TypeError, match="does not model tissue property 'bound_fraction'"):
        SPGRSimulator(flip=10.0, TR=5.0, TE=2.0).simulate(T1=1000.0, T2star=30.0, bound_fraction=0.1)


def test_lineshape_and_pulse_refusals():
    with pytest.raises(ValueError, match="lineshape must be one of"):
        FID(lineshape="voigt")
    with pytest.raises(ValueError, match="shape must be one of"):
        blochsim.lineshape(0.0, 0.012, "voigt")
    with pytest.raises(ValueError, match="bound_T2 must be > 0"):
        blochsim.lineshape(0.0, 0.0)
    with pytest.raises(ValueError, match="duration of a Pulse must be >= 0"):
        Pulse(90.0, duration=-1.0)
    with pytest.raises(ValueError, match="duration of a Saturation must be > 0"):
        Saturation(500.0, 0.0)
    with pytest.raises(ValueError, match="power_factor of a Saturation must be > 0"):
        Saturation(500.0, 5.0, power_factor=0.0)
    with pytest.raises(ValueError, match="zero area"):
        blochsim.power_factor(np.array([1.0, -1.0]))
    with pytest.raises(TypeError, match="cannot differentiate with respect to 'poolF_fraction'"):
        FID().jacobian("poolF_fraction", T1=1000.0, T2=80.0)


def test_saturation_without_semisolid_pool_is_a_no_op():
    class Sat(Simulator):
        def repetition(self, p):
            return Readout() @ Pulse(90.0) @ Delay(2.0) @ Saturation(800.0, 5.0, offset=1000.0)

    class Plain(Simulator):
        def repetition(self, p):
            return Readout() @ Pulse(90.0) @ Delay(2.0)

    np.testing.assert_array_equal(Sat().simulate(T1=1000.0, T2=80.0), Plain().simulate(T1=1000.0, T2=80.0))


# --------------------------------------------------------------------------
# Exact rectangular pulses

@pytest.mark.parametrize("offset, phase", [(0.0, 0.0), (350.0, 40.0), (-1200.0, 90.0)])
def test_rect_pulse_against_expm_with_pools(offset, phase):
    """A RectPulse on free water, an exchanging pool and the semisolid pool
    against expm of the continuous generator in the pulse's frame."""
    flip, dur, B0, B1 = 400.0, 6.0, 15.0, 0.95
    tissue = dict(T1=1000.0, T2=50.0, B0=B0, B1=B1, poolB_fraction=0.12, poolB_exchange=150.0, poolB_T1=700.0,
                  poolB_T2=15.0, poolB_shift=420.0, bound_fraction=0.1, bound_exchange=35.0, bound_T1=900.0,
                  bound_T2=0.011)

    class Rect(Simulator):
        def repetition(self, p):
            return Readout() @ Pulse(90.0) @ Spoil() @ Readout() @ RectPulse(flip, dur, phase=phase, offset=offset)

    s = Rect().simulate(**tissue)
    # the oracle in the frame of the pulse: every frequency shifted by
    # -offset, the RF along (cos phase, sin phase); then back to the water
    # frame (F+ turned by -2 pi offset t)
    o = Oracle(1000.0, 50.0, B0=B0 - offset, pools=[(0.12, 150.0, 700.0, 15.0, 420.0)], bound=(0.1, 35.0, 900.0))
    w1 = np.radians(flip) * B1 / (dur * 1e-3)
    W = np.pi * w1 ** 2 * oracle_lineshape("super-lorentzian", offset - B0, 0.011)
    G = o.generator(w1=w1, W=W)
    # RF phase: rotate the generator's RF axis by conjugating with Rz
    c, sn = np.cos(np.radians(phase)), np.sin(np.radians(phase))
    Rz = np.eye(o.size)
    for j in range(o.n):
        Rz[3 * j:3 * j + 2, 3 * j:3 * j + 2] = [[c, -sn], [sn, c]]
    x = expm(Rz @ G @ Rz.T * dur * 1e-3) @ o.equilibrium()
    transverse = o.transverse(x) * np.exp(-2j * np.pi * offset * dur * 1e-3)
    assert abs(transverse) > 0.01
    np.testing.assert_allclose(s[0], transverse, atol=3e-6)
    np.testing.assert_allclose(s[1], -1j * np.sin(np.radians(90 * B1)) * o.longitudinal(x), atol=3e-6)


def test_short_rect_pulse_is_the_hard_pulse():
    """As its duration goes to 0 at fixed flip, a RectPulse becomes the hard
    pulse of the same flip and phase (single pool, echo train)."""

    class Train(Simulator):
        protocol = {"rect": True}

        def repetition(self, p):
            ops = []
            for i in range(6):
                pulse = RectPulse(70.0 + 10 * i, 1e-4, phase=30.0 * i) if p["rect"] else Pulse(70.0 + 10 * i,
                                                                                            30.0 * i)
                ops += [Delay(4.0), pulse, Readout(), Dephase()]
            from blochsim.sequence import Sequence
            return Sequence(ops)

    t = dict(T1=900.0, T2=70.0, B0=20.0, B1=0.9)
    np.testing.assert_allclose(Train().simulate(**t), Train(rect=False).simulate(**t), atol=1e-5)


def test_rect_pulse_jacobian_against_differences():
    class Rect(Simulator):
        def repetition(self, p):
            return Readout() @ Delay(2.0) @ Readout() @ RectPulse(300.0, 5.0, offset=250.0)

    base = dict(T1=1000.0, T2=50.0, B0=5.0, B1=1.05, poolB_fraction=0.12, poolB_exchange=150.0, poolB_shift=420.0,
                bound_fraction=0.1, bound_exchange=35.0, bound_T2=0.011)
    names = ("B0", "B1", "poolB_exchange", "poolB_shift", "bound_fraction", "bound_T2")
    _, J = Rect().jacobian(names, **base)
    for i, k in enumerate(names):
        # a wide step: the semisolid pool moves the signal little, and float32
        # round-off of the differences must stay small against it
        h = 1e-2 * abs(base[k])
        fd = (Rect().simulate(**{**base, k: base[k] + h}).astype(complex)
              - Rect().simulate(**{**base, k: base[k] - h}).astype(complex)) / (2 * h)
        np.testing.assert_allclose(J[i], fd, atol=3e-3 * np.max(np.abs(fd)) + 2e-4, err_msg=k)


def test_rect_pulse_refusals():
    with pytest.raises(ValueError, match="duration of a RectPulse must be > 0"):
        RectPulse(90.0, 0.0)

    class Rect(Simulator):
        def repetition(self, p):
            return Readout() @ RectPulse(90.0, 1.0)

    with pytest.raises(ValueError, match="second order is not available"):
        Rect().jacobian_vjp("T2", "T2", T1=1000.0, T2=80.0)


# --------------------------------------------------------------------------
# CEST and MT simulators

CEST_TISSUE = dict(T1=1300.0, T2=70.0, B0=12.0, B1=0.9, poolB_fraction=0.01, poolB_exchange=800.0, poolB_T1=1000.0,
                   poolB_T2=15.0, poolB_shift=3.5 * 127.7, bound_fraction=0.1, bound_exchange=25.0, bound_T2=0.012)


def _cest_oracle(offsets_ppm, field, b1, n, tp, td, t):
    """The Z-spectrum of a train of rectangular pulses by expm in the frame
    of the RF at each offset (spoiled after each pulse), in the test: the
    shaped oracle below with one segment."""
    return _shaped_cest_oracle(offsets_ppm, field, b1, [1.0], n, tp, td, t)


def test_cest_z_spectrum_against_expm():
    offsets = np.array([-20.0, -3.5, -1.0, 0.0, 0.4, 2.0, 3.5, 5.0, 50.0])
    cest = CESTSimulator(offsets=offsets, field_strength=3.0, B1sat=1.2, n_pulses=4, pulse_duration=50.0,
                         pulse_delay=10.0, normalize=False)
    z = cest.simulate(**CEST_TISSUE)
    assert z.shape == (9,)
    np.testing.assert_allclose(z, _cest_oracle(offsets, 3.0, 1.2, 4, 50.0, 10.0, CEST_TISSUE), atol=3e-6)
    # water is saturated on resonance; the pool makes the spectrum asymmetric
    assert abs(z[3]) < 0.1 and abs(z[0]) > 0.5
    assert z[6].real < z[1].real - 0.01


def test_cest_voxels_and_jacobian():
    offsets = np.linspace(-5, 5, 11)
    cest = CESTSimulator(offsets=offsets, B1sat=1.0, pulse_duration=200.0)
    T1 = np.array([1000.0, 1500.0])
    t = {**CEST_TISSUE, "T1": T1}
    z = cest.simulate(**t)
    assert z.shape == (2, 11)
    np.testing.assert_allclose(z[1], cest.simulate(**{**CEST_TISSUE, "T1": 1500.0}), rtol=1e-6)
    names = ("poolB_exchange", "B0", "T1")
    s, J = cest.jacobian(names, **t)
    assert J.shape == (2, 3, 11)
    for i, k in enumerate(names):
        v = np.asarray(t[k], dtype=float)
        h = 1e-2 * np.maximum(np.abs(v), 1.0)
        fd = (cest.simulate(**{**t, k: v + h}).astype(complex) - cest.simulate(**{**t, k: v - h}).astype(complex))
        fd /= 2 * (h if np.ndim(h) == 0 else h[:, None])
        np.testing.assert_allclose(J[:, i], fd, atol=3e-3 * np.max(np.abs(fd)) + 1e-6, err_msg=k)


def test_mt_simulator_against_tr_recursion():
    t = dict(T1=1000.0, T2=60.0, B0=5.0, B1=1.1, bound_fraction=0.15, bound_exchange=30.0, bound_T1=1000.0,
             bound_T2=0.012)
    flip, TR, mt_flip, mt_dur, mt_off, n = 12.0, 30.0, 500.0, 8.0, 1500.0, 60
    s = MTSimulator(flip=flip, TR=TR, mt_flip=mt_flip, mt_duration=mt_dur, mt_offset=mt_off, n_tr=n).simulate(**t)
    o = Oracle(1000.0, 60.0, B0=5.0 - mt_off, bound=(0.15, 30.0, 1000.0))
    w1 = np.radians(mt_flip) * 1.1 / (mt_dur * 1e-3)
    W = np.pi * w1 ** 2 * oracle_lineshape("super-lorentzian", mt_off - 5.0, 0.012)
    mt = expm(o.generator(w1=w1, W=W) * mt_dur * 1e-3)
    free = Oracle(1000.0, 60.0, B0=5.0, bound=(0.15, 30.0, 1000.0))
    x = free.equilibrium()
    for i in range(n):
        x = free.rotate(x, flip * 1.1)
        sample = 1j * free.transverse(x)
        x[:2] = 0.0
        x = free.evolve(x, TR - mt_dur)
        x = mt @ x  # Z only after the spoiler: the frame does not matter
        x[:2] = 0.0
    np.testing.assert_allclose(s, [sample], atol=2e-6)
    ref = MTSimulator(flip=flip, TR=TR, mt_flip=0.0, n_tr=n).simulate(**t)
    assert 0.2 < 1 - abs(s[0]) / abs(ref[0]) < 0.8


def test_cest_and_mt_refusals():
    with pytest.raises(TypeError, match="needs protocol parameter 'offsets'"):
        CESTSimulator().simulate(T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match="field_strength must be > 0"):
        CESTSimulator(offsets=[1.0], field_strength=0.0)
    with pytest.raises(ValueError, match="pulse_duration must be > 0"):
        CESTSimulator(offsets=[1.0], pulse_duration=0.0)
    with pytest.raises(ValueError, match="mt_duration must be < TR"):
        MTSimulator(flip=10.0, TR=5.0, mt_duration=8.0)
    with pytest.raises(ValueError, match="second order is not available"):
        MTSimulator(flip=10.0, TR=30.0).jacobian_vjp("T1", "flip", T1=1000.0, T2=60.0)


# --------------------------------------------------------------------------
# Reverse mode

def _central(f, v, h):
    """Central differences of the scalar function f at every entry of v."""
    v = np.asarray(v, dtype=float)
    g = np.zeros(v.shape)
    for i in np.ndindex(v.shape):
        up, dn = v.copy(), v.copy()
        up[i] += h
        dn[i] -= h
        g[i] = (f(up) - f(dn)) / (2 * h)
    return g


class EveryEvent(Simulator):
    """An exact off-resonance pulse, then hard pulses that also saturate the
    semisolid pool, with readout phases: every event value the pooled
    adjoint differentiates."""
    protocol = {"flips": np.array([40.0, 70.0, 25.0]), "phases": np.array([0.0, 30.0, 75.0]), "TR": 7.0,
                "sat_duration": 2.0, "sat_offset": 900.0, "rect_flip": 200.0, "rect_duration": 3.0,
                "rect_phase": 20.0, "rect_offset": 150.0, "rx": 10.0}

    def repetition(self, p):
        from blochsim.sequence import Sequence
        ops = [RectPulse(p["rect_flip"], p["rect_duration"], phase=p["rect_phase"], offset=p["rect_offset"]),
               Readout(p["rx"])]
        for i in range(3):
            ops += [Delay(p["TR"]), Pulse(p["flips"][i], p["phases"][i], duration=p["sat_duration"],
                                          offset=p["sat_offset"]), Readout(p["rx"])]
        return Sequence(ops)


EVERY_TISSUE = dict(T1=900.0, T2=60.0, M0=1.3, B1=0.95, B0=8.0, bound_fraction=0.12, bound_exchange=30.0,
                    bound_T1=800.0, bound_T2=0.011, poolB_fraction=0.15, poolB_exchange=25.0, poolB_T1=500.0,
                    poolB_T2=12.0, poolB_shift=60.0)


def _rect_oracle(x, p, t, pools, bound):
    """An exact rectangular pulse (p["rect_*"], Lorentzian semisolid line)
    on the Cartesian state x: in its frame (RF phase by conjugation with
    Rz), then back to the water frame (F+ turned by -2 pi offset duration)."""
    B1, B0 = t["B1"], t["B0"]
    rect = Oracle(t["T1"], t["T2"], B0=B0 - p["rect_offset"], pools=pools, bound=bound)
    tau = p["rect_duration"] * 1e-3
    w1 = np.radians(p["rect_flip"]) * B1 / tau
    G = rect.generator(w1=w1, W=np.pi * w1 ** 2 * oracle_lineshape("lorentzian", p["rect_offset"] - B0,
                                                                     t["bound_T2"]))
    c, sn = np.cos(np.radians(p["rect_phase"])), np.sin(np.radians(p["rect_phase"]))
    Rz = np.eye(rect.size)
    for j in range(rect.n):
        Rz[3 * j:3 * j + 2, 3 * j:3 * j + 2] = [[c, -sn], [sn, c]]
    x = expm(Rz @ G @ Rz.T * tau) @ x
    th = -2 * np.pi * p["rect_offset"] * tau
    for j in range(rect.n):
        mx, my = x[3 * j], x[3 * j + 1]
        x[3 * j], x[3 * j + 1] = mx * np.cos(th) - my * np.sin(th), mx * np.sin(th) + my * np.cos(th)
    return x


def _every_event_oracle(p, t):
    """EveryEvent's samples in float64 by the Cartesian oracle, in the test."""
    pools = [(t["poolB_fraction"], t["poolB_exchange"], t["poolB_T1"], t["poolB_T2"], t["poolB_shift"])]
    bound = (t["bound_fraction"], t["bound_exchange"], t["bound_T1"])
    o = Oracle(t["T1"], t["T2"], B0=t["B0"], pools=pools, bound=bound)
    B1, B0, zb = t["B1"], t["B0"], 3 * o.n
    x = _rect_oracle(o.equilibrium(), p, t, pools, bound)
    rx = np.exp(-1j * np.radians(p["rx"]))
    out = [t["M0"] * o.transverse(x) * rx]
    g_sat = oracle_lineshape("lorentzian", p["sat_offset"] - B0, t["bound_T2"])
    for i in range(3):
        x = o.evolve(x, p["TR"])
        alpha = np.radians(p["flips"][i]) * B1
        x[zb] *= np.exp(-np.pi * g_sat * alpha ** 2 / (p["sat_duration"] * 1e-3))
        x = o.rotate(x, p["flips"][i] * B1, p["phases"][i])
        out.append(t["M0"] * o.transverse(x) * rx)
    return np.array(out)


def test_vjp_against_oracle_differences_for_every_event_value_and_pool_property():
    """Every protocol value (exact pulse flip, duration, phase and offset;
    flips, phases, saturating durations and offsets; TR; receiver phase) and
    every tissue and pool property, against central differences of the
    float64 oracle."""
    sim = EveryEvent(lineshape="lorentzian", states=4)
    T1 = np.array([900.0, 1400.0])
    tissue = {**EVERY_TISSUE, "T1": T1}
    p = dict(EveryEvent.protocol)
    names = tuple(p) + tuple(EVERY_TISSUE)
    s, pullback = sim.vjp(names, **tissue)
    rng = np.random.default_rng(3)
    w = (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape)).astype(np.complex64)
    g = pullback(w)

    def loss(pp, tt):
        total = 0.0
        for v, T1v in enumerate(T1):
            total += np.sum(np.real(np.conj(w[v]) * _every_event_oracle(pp, {**tt, "T1": T1v})))
        return total

    np.testing.assert_allclose(s, [_every_event_oracle(p, {**EVERY_TISSUE, "T1": v}) for v in T1], atol=3e-6)
    for k in p:
        h = 1e-4 * max(np.max(np.abs(p[k])), 1.0)
        fd = _central(lambda v: loss({**p, k: v if np.ndim(p[k]) else float(v)}, EVERY_TISSUE), p[k], h)
        assert np.shape(g[k]) == np.shape(p[k])
        np.testing.assert_allclose(g[k], fd, rtol=2e-4, atol=1e-7 * max(np.max(np.abs(fd)), 1.0), err_msg=k)
    for k in EVERY_TISSUE:
        v0 = tissue[k]
        h = 1e-5 * max(np.max(np.abs(v0)), 1e-3)
        if k == "T1":
            fd = np.array([(_every_event_oracle(p, {**EVERY_TISSUE, "T1": T + h})
                            - _every_event_oracle(p, {**EVERY_TISSUE, "T1": T - h})) / (2 * h) for T in T1])
            fd = np.sum(np.real(np.conj(w) * fd), axis=-1)
        else:
            fd = _central(lambda v: loss(p, {**EVERY_TISSUE, k: float(v)}), v0, h)
        assert np.shape(g[k]) == np.shape(v0)
        np.testing.assert_allclose(g[k], fd, rtol=2e-4, atol=1e-6 * max(np.max(np.abs(fd)), 1e-3), err_msg=k)


def test_vjp_with_dephasing_equals_the_jacobian_and_differences():
    """MRF-type train with shifts, both pool kinds: the tissue gradient
    equals the contraction of the Jacobian (itself pinned against
    differences above), and the flip and TR gradients match central
    differences of the signal."""
    flip = np.concatenate([np.linspace(10, 60, 12), np.linspace(60, 5, 12)])
    sim = MRFSimulator(flip=flip, TR=9.0, TI=20.0, states=12)
    t = {**{k: v for k, v in POOLED.items() if k != "B0"}, "T2": np.array([50.0, 90.0])}
    names = ("T1", "T2", "M0", "B1", "bound_fraction", "bound_exchange", "bound_T2", "poolB_fraction",
             "poolB_exchange", "poolB_shift")
    s, pullback = sim.vjp(("flip", "TR") + names, **t)
    rng = np.random.default_rng(5)
    w = rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape)
    g = pullback(w)
    _, J = sim.jacobian(names, **t)
    for i, k in enumerate(names):
        ref = np.real(np.conj(w) * J[:, i]).sum(axis=-1)
        np.testing.assert_allclose(g[k], ref if np.ndim(t[k]) else ref.sum(), rtol=1e-4, atol=1e-8, err_msg=k)

    def loss(**kw):
        return np.sum(np.real(np.conj(w) * sim.simulate(**t, **kw).astype(np.complex128)))

    for j in (0, 7, 20):
        up, dn = flip.copy(), flip.copy()
        up[j] += 0.05
        dn[j] -= 0.05
        fd = (loss(flip=up) - loss(flip=dn)) / 0.1
        np.testing.assert_allclose(g["flip"][j], fd, rtol=5e-3, atol=2e-5)
    fd = (loss(TR=9.02) - loss(TR=8.98)) / 0.04
    np.testing.assert_allclose(g["TR"], fd, rtol=5e-3)


def test_cest_vjp_against_oracle_differences():
    offsets = np.array([-3.5, -1.0, 0.5, 3.5])
    proto = dict(B1sat=1.2, n_pulses=3, pulse_duration=40.0, pulse_delay=10.0)
    cest = CESTSimulator(offsets=offsets, field_strength=3.0, normalize=False, **proto)
    names = ("B1sat", "pulse_duration", "pulse_delay", "offsets", "B0", "poolB_exchange", "bound_fraction", "T1")
    z, pullback = cest.vjp(names, **CEST_TISSUE)
    w = np.array([1.0, -2.0, 0.5, 3.0])
    g = pullback(w)

    def loss(off=offsets, b1=1.2, tp=40.0, td=10.0, **t):
        return np.sum(w * np.real(_cest_oracle(off, 3.0, b1, 3, tp, td, {**CEST_TISSUE, **t})))

    fd = {"B1sat": _central(lambda v: loss(b1=float(v)), 1.2, 1e-5),
          "pulse_duration": _central(lambda v: loss(tp=float(v)), 40.0, 1e-4),
          "pulse_delay": _central(lambda v: loss(td=float(v)), 10.0, 1e-4),
          "offsets": _central(lambda v: loss(off=v), offsets, 1e-5)}
    for k in ("B0", "poolB_exchange", "bound_fraction", "T1"):
        v0 = CEST_TISSUE[k]
        fd[k] = _central(lambda v: loss(**{k: float(v)}), v0, 1e-5 * max(abs(v0), 1.0))
    for k in names:
        assert np.shape(g[k]) == np.shape(fd[k]), k
        np.testing.assert_allclose(g[k], fd[k], rtol=3e-4, atol=1e-6 * np.max(np.abs(fd[k])), err_msg=k)


def _mt_oracle(flip, TR, mt_flip, mt_dur, mt_off, n, t):
    """The MTSimulator's last sample by the TR recursion, in the test."""
    o = Oracle(t["T1"], t["T2"], B0=t["B0"] - mt_off, bound=(t["bound_fraction"], t["bound_exchange"], 1000.0))
    w1 = np.radians(mt_flip) * t["B1"] / (mt_dur * 1e-3)
    W = np.pi * w1 ** 2 * oracle_lineshape("super-lorentzian", mt_off - t["B0"], t["bound_T2"])
    mt = expm(o.generator(w1=w1, W=W) * mt_dur * 1e-3)
    free = Oracle(t["T1"], t["T2"], B0=t["B0"], bound=(t["bound_fraction"], t["bound_exchange"], 1000.0))
    x = free.equilibrium()
    for i in range(n):
        x = free.rotate(x, flip * t["B1"])
        sample = 1j * free.transverse(x)
        x[:2] = 0.0
        x = free.evolve(x, TR - mt_dur)
        x = mt @ x  # Z only after the spoiler: the frame does not matter
        x[:2] = 0.0
    return sample


def test_mt_vjp_against_oracle_differences():
    t = dict(T1=1000.0, T2=60.0, B0=5.0, B1=1.1, bound_fraction=0.15, bound_exchange=30.0, bound_T1=1000.0,
             bound_T2=0.012)
    base = dict(flip=12.0, TR=30.0, mt_flip=500.0, mt_duration=8.0, mt_offset=1500.0)
    sim = MTSimulator(n_tr=40, **base)
    s, pullback = sim.vjp(tuple(base) + ("bound_fraction", "bound_exchange"), **t)
    g = pullback(np.array([1.0 - 0.5j], dtype=np.complex64))

    def loss(**kw):
        a = {**base, **{k: v for k, v in kw.items() if k in base}}
        tt = {**t, **{k: v for k, v in kw.items() if k in t}}
        v = _mt_oracle(a["flip"], a["TR"], a["mt_flip"], a["mt_duration"], a["mt_offset"], 40, tt)
        return v.real * 1.0 + v.imag * -0.5

    np.testing.assert_allclose(s, [_mt_oracle(12.0, 30.0, 500.0, 8.0, 1500.0, 40, t)], atol=2e-6)
    for k in g:
        v0 = {**base, **t}[k]
        h = 1e-5 * abs(v0)
        fd = (loss(**{k: v0 + h}) - loss(**{k: v0 - h})) / (2 * h)
        np.testing.assert_allclose(g[k], fd, rtol=3e-4, atol=1e-9, err_msg=k)


def test_pooled_vjp_threads_do_not_change_results():
    T1 = np.linspace(500, 1500, 9)
    flip = np.linspace(20, 60, 10)
    out = []
    for threads in (1, 3):
        sim = MRFSimulator(flip=flip, TR=8.0, states=8, threads=threads)
        s, pullback = sim.vjp(("flip", "T1", "bound_fraction"), **{**{k: v for k, v in POOLED.items() if k != "B0"}, "T1": T1})
        out.append(pullback(np.ones_like(s)))
    for k in out[0]:
        np.testing.assert_array_equal(out[0][k], out[1][k])


def test_pooled_vjp_refusals():
    sim = MRFSimulator(flip=np.full(4, 30.0), TR=8.0)
    with pytest.raises(ValueError, match="vjp with respect to 'bound_T1' needs bound_T1 passed"):
        sim.vjp("bound_T1", T1=1000.0, T2=80.0, bound_fraction=0.1)
    s, pullback = sim.vjp("flip", T1=1000.0, T2=80.0, bound_fraction=0.1)
    with pytest.raises(ValueError, match="cotangent must have the signal's shape"):
        pullback(np.ones(3))
    with pytest.raises(ValueError, match=r"pool fractions sum to 1.2 > 1 at voxel \(\)"):
        sim.vjp("flip", T1=1000.0, T2=80.0, bound_fraction=0.6, poolB_fraction=0.6)
    cest = CESTSimulator(offsets=[1.0, 2.0])
    with pytest.raises(ValueError, match="vjp with respect to 'B0' needs B0 passed"):
        cest.vjp("B0", T1=1000.0, T2=80.0)
    z, pullback = cest.vjp("B1sat", T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match=r"cotangent must have the signal's shape \(2,\)"):
        pullback(np.ones((2, 1)))


# --------------------------------------------------------------------------
# Shaped CEST pulses

def _shaped_cest_oracle(offsets_ppm, field, b1rms, shape, n, tp, td, t):
    """The Z-spectrum of a train of piecewise-constant pulses by expm per
    segment, in the frame of the RF at each offset (a negative sample is the
    RF along -x), spoiled after each pulse, in the test."""
    shape = np.asarray(shape, dtype=float)
    amps = b1rms * shape / np.sqrt(np.mean(shape ** 2))
    out = []
    for ppm in offsets_ppm:
        df = ppm * field * GAMMA_HZ_PER_T * 1e-6
        o = Oracle(t["T1"], t["T2"], B0=t["B0"] - df,
                   pools=[(t["poolB_fraction"], t["poolB_exchange"], t["poolB_T1"], t["poolB_T2"], t["poolB_shift"])],
                   bound=(t["bound_fraction"], t["bound_exchange"], 1000.0))
        g = oracle_lineshape("super-lorentzian", df - t["B0"], t["bound_T2"])
        dt = tp / len(shape) * 1e-3
        pulse = np.eye(o.size)
        for a in amps:
            w1 = 2 * np.pi * GAMMA_HZ_PER_T * a * 1e-6 * t["B1"]
            pulse = expm(o.generator(w1=w1, W=np.pi * w1 ** 2 * g) * dt) @ pulse
        delay = expm(o.generator() * td * 1e-3)
        x = o.equilibrium()
        for i in range(n):
            if i > 0:
                x = delay @ x
            x = pulse @ x
            for j in range(o.n):
                x[3 * j:3 * j + 2] = 0.0
        out.append(np.sin(np.radians(90 * t["B1"])) * o.longitudinal(x))
    return np.array(out)


@pytest.mark.parametrize("kind", ["gauss", "sinc"])
def test_shaped_cest_pulses_against_expm_per_segment(kind):
    u = np.linspace(-1, 1, 24)
    shape = np.exp(-(2 * u) ** 2) if kind == "gauss" else np.sinc(3 * u)  # the sinc has negative lobes
    offsets = np.array([-3.5, -1.0, 0.0, 1.5, 3.5])
    cest = CESTSimulator(offsets=offsets, B1sat=1.5, n_pulses=3, pulse_duration=40.0, pulse_delay=8.0,
                         pulse_shape=shape, normalize=False)
    z = cest.simulate(**CEST_TISSUE)
    np.testing.assert_allclose(z, _shaped_cest_oracle(offsets, 3.0, 1.5, shape, 3, 40.0, 8.0, CEST_TISSUE),
                               atol=3e-6)
    # the same B1 rms saturates water on resonance less deeply than a rectangle, off it differently
    rect = CESTSimulator(offsets=offsets, B1sat=1.5, n_pulses=3, pulse_duration=40.0, pulse_delay=8.0, normalize=False)
    assert np.max(np.abs(z - rect.simulate(**CEST_TISSUE))) > 1e-3
    # a constant shape is the rectangle
    flat = CESTSimulator(offsets=offsets, B1sat=1.5, n_pulses=3, pulse_duration=40.0, pulse_delay=8.0,
                         pulse_shape=np.full(5, 2.0), normalize=False)
    np.testing.assert_allclose(flat.simulate(**CEST_TISSUE), rect.simulate(**CEST_TISSUE), atol=2e-6)


def test_shaped_cest_vjp_against_oracle_differences():
    u = np.linspace(-1, 1, 12)
    shape = np.exp(-(2 * u) ** 2)
    offsets = np.array([-3.5, 0.5, 3.5])
    cest = CESTSimulator(offsets=offsets, B1sat=1.2, n_pulses=2, pulse_duration=30.0, pulse_delay=5.0,
                         pulse_shape=shape, normalize=False)
    z, pullback = cest.vjp(("B1sat", "pulse_duration", "poolB_exchange"), **CEST_TISSUE)
    w = np.array([1.0, -0.5, 2.0])
    g = pullback(w)

    def loss(b1=1.2, tp=30.0, **t):
        return np.sum(w * np.real(_shaped_cest_oracle(offsets, 3.0, b1, shape, 2, tp, 5.0, {**CEST_TISSUE, **t})))

    np.testing.assert_allclose(g["B1sat"], _central(lambda v: loss(b1=float(v)), 1.2, 1e-5), rtol=3e-4)
    np.testing.assert_allclose(g["pulse_duration"], _central(lambda v: loss(tp=float(v)), 30.0, 1e-4), rtol=3e-4)
    np.testing.assert_allclose(g["poolB_exchange"],
                               _central(lambda v: loss(poolB_exchange=float(v)), CEST_TISSUE["poolB_exchange"],
                                        1e-3), rtol=3e-4)


class _FakeDeviceArray:
    """Claims the CUDA array interface; CESTSimulator refuses it before any
    device call."""
    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_shaped_cest_refusals():
    with pytest.raises(ValueError, match="pulse_shape must be a non-empty 1-D array"):
        CESTSimulator(offsets=[1.0], pulse_shape=np.ones((2, 2)))
    with pytest.raises(ValueError, match="pulse_shape must be finite and not zero everywhere"):
        CESTSimulator(offsets=[1.0], pulse_shape=np.zeros(4))
    with pytest.raises(TypeError, match="cannot differentiate with respect to 'pulse_shape'"):
        CESTSimulator(offsets=[1.0], pulse_shape=np.ones(4)).vjp("pulse_shape", T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match="CESTSimulator takes NumPy tissue arrays.*T1 is a device array"):
        CESTSimulator(offsets=[1.0]).simulate(T1=_FakeDeviceArray(), T2=80.0)


class PhaseTrain(Simulator):
    """Pulses at changing phases, each after a delay, read at once; then an
    exact rectangular pulse, a pulse straight after it and two more pulses
    after delays: every way the host's complex planes change their frame."""
    protocol = {"flips": np.array([30.0, 55.0, 80.0, 20.0, 45.0, 60.0, 35.0]),
                "phases": np.array([0.0, 117.0, 351.0, 225.0, 40.0, 300.0, 75.0]), "TR": 6.0,
                "rect_flip": 150.0, "rect_duration": 2.0, "rect_phase": 50.0, "rect_offset": 120.0, "rx": 25.0}

    def repetition(self, p):
        from blochsim.sequence import Sequence
        f, ph = p["flips"], p["phases"]
        ops = []
        for i in range(4):
            ops += [Delay(p["TR"]), Pulse(f[i], ph[i]), Readout(p["rx"])]
        ops += [RectPulse(p["rect_flip"], p["rect_duration"], phase=p["rect_phase"], offset=p["rect_offset"]),
                Readout(p["rx"]), Pulse(f[4], ph[4]), Readout(p["rx"])]
        for i in (5, 6):
            ops += [Delay(p["TR"]), Pulse(f[i], ph[i]), Readout(p["rx"])]
        return Sequence(ops)


def _phase_train_oracle(p, t):
    """PhaseTrain's samples in float64 by the Cartesian oracle; the
    semisolid pool when t names bound_fraction."""
    pools = [(t["poolB_fraction"], t["poolB_exchange"], t["poolB_T1"], t["poolB_T2"], t["poolB_shift"])]
    b = (t["bound_fraction"], t["bound_exchange"], t["bound_T1"]) if "bound_fraction" in t else None
    o = Oracle(t["T1"], t["T2"], B0=t["B0"], pools=pools, bound=b)
    rx = t["M0"] * np.exp(-1j * np.radians(p["rx"]))
    x, ref = o.equilibrium(), []
    for i in range(7):
        if i == 4:
            x = _rect_oracle(x, p, {"bound_T2": 0.012, **t}, pools, b)
            ref.append(rx * o.transverse(x))
        else:
            x = o.evolve(x, p["TR"])
        x = o.rotate(x, p["flips"][i] * t["B1"], p["phases"][i])
        ref.append(rx * o.transverse(x))
    return np.array(ref)


def _without_bound(t):
    return {k: v for k, v in t.items() if not k.startswith("bound_")}


@pytest.mark.parametrize("bound", [False, True])
def test_phase_train_against_oracle(bound):
    t = EVERY_TISSUE if bound else _without_bound(EVERY_TISSUE)
    sim = PhaseTrain(lineshape="lorentzian")
    out = sim.simulate(**t, states=4)
    np.testing.assert_allclose(out, _phase_train_oracle(sim.protocol, t), atol=2e-6 * t["M0"])


@pytest.mark.parametrize("bound", [False, True])
def test_phase_train_jacobian_against_oracle_differences(bound):
    """The single-precision Jacobian on lanes (one exchanging pool, with and
    without the semisolid pool) against central differences of the float64
    oracle, through pulses at changing phases, an exact pulse and B0."""
    t = EVERY_TISSUE if bound else _without_bound(EVERY_TISSUE)
    names = ["T1", "T2", "M0", "B1", "B0", "poolB_fraction", "poolB_exchange", "poolB_T1", "poolB_T2", "poolB_shift"]
    if bound:
        names += ["bound_fraction", "bound_exchange", "bound_T1", "bound_T2"]
    sim = PhaseTrain(lineshape="lorentzian")
    s, J = sim.jacobian(tuple(names), **t, states=4)
    np.testing.assert_allclose(s, _phase_train_oracle(sim.protocol, t), atol=2e-6 * t["M0"])
    for i, k in enumerate(names):
        h = 1e-6 * abs(t[k])
        fd = (_phase_train_oracle(sim.protocol, {**t, k: t[k] + h})
              - _phase_train_oracle(sim.protocol, {**t, k: t[k] - h})) / (2 * h)
        np.testing.assert_allclose(J[i], fd, rtol=0, atol=2e-5 * np.max(np.abs(fd)) + 1e-9, err_msg=k)


@pytest.mark.parametrize("pools", [dict(bound_fraction=0.12, bound_exchange=25.0),
                                   dict(poolB_fraction=0.2, poolB_exchange=15.0, poolB_T2=20.0)])
def test_real_planes_equal_the_complex_path(pools):
    """Phases 0 and 180°, nothing off-axis: the host plays the MT pool and one
    exchanging pool on real planes (SPEC §1); the Jacobian's double-precision
    complex planes must agree to float round-off."""
    flips = np.concatenate([np.linspace(10, 70, 30), np.linspace(70, 5, 30)])
    phases = np.where(np.arange(60) % 3 == 0, 180.0, 0.0)
    sim = MRFSimulator(flip=flips, phases=phases, TR=9.0, TI=15.0, states=24)
    T1, T2 = np.array([600.0, 1100.0, 1700.0]), np.array([40.0, 80.0, 150.0])
    real = sim.simulate(T1=T1, T2=T2, **pools)
    complex_path = sim.jacobian("T1", T1=T1, T2=T2, **pools)[0]  # double precision, complex planes
    np.testing.assert_allclose(real, complex_path, atol=3e-6)


# --------------------------------------------------------------------------
# The device's pooled register team (pools/registers.hpp), run on the host
# with four members (the lanes of a vector), so that the shifts cross
# members as on the GPU: 16 orders a member on the real planes, 8 on the
# complex ones with the semisolid pool alone, 4 with an exchanging pool.

def _team(sim, **kw):
    sim._host_variant = 4
    try:
        return sim.simulate(**kw)
    finally:
        sim._host_variant = 0


class BothWays(Simulator):
    """Shifts both ways, several of them at once, a spoiler, inversion, and
    pulses at several phases with saturating durations."""

    def repetition(self, p):
        from blochsim.sequence import Sequence
        return Sequence([Inversion(), Delay(20.0), Excitation(90.0, 90.0), Dephase(), Delay(5.0),
                         Refocusing(150.0), Dephase(-1), Delay(3.0), Readout(), Dephase(2), Delay(4.0),
                         Pulse(60.0, 33.0, duration=1.5, offset=700.0), Dephase(-1), Readout(), Spoil(), Readout(),
                         Delay(2.0), Pulse(40.0, -20.0), Dephase(3), Readout(), Dephase(-3), Readout(60.0)])


MT_POOL = dict(bound_fraction=0.12, bound_exchange=25.0, bound_T1=700.0, bound_T2=0.011)
B_POOL = dict(poolB_fraction=0.2, poolB_exchange=15.0, poolB_T1=450.0, poolB_T2=20.0)
MRF_FLIPS = np.concatenate([np.linspace(5, 60, 40), np.linspace(60, 2, 40)])
MRF_PHASES = (37.0 * np.arange(80)) % 360.0
TEAM_CASES = [
    ("mrf real, MT, K = 32", lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, TI=20.0, states=32), MT_POOL),
    ("mrf real, MT, K = 13 (truncated team)", lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, states=13), MT_POOL),
    ("mrf real, MT, K = 60 (four members)", lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, states=60), MT_POOL),
    ("mrf real, poolB, B1, K = 27", lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, TI=20.0, states=27),
     {**B_POOL, "B1": np.array([0.8, 1.1, 1.0])}),
    ("mrf complex (phases), MT, K = 30",
     lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, phases=MRF_PHASES, states=30), MT_POOL),
    ("mrf complex, poolB shift, K = 11", lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, states=11),
     {**B_POOL, "poolB_shift": 50.0}),
    ("saturating train, both pools, K = 16", lambda: MTTrain(states=16), POOLED),
    ("saturating train, MT, K = 9", lambda: MTTrain(states=9), {**MT_POOL, "B0": np.array([0.0, 30.0, -5.0])}),
    ("shifts both ways, both pools, K = 14", lambda: BothWays(states=14), POOLED),
    ("shifts both ways, poolB, K = 15", lambda: BothWays(states=15), {**B_POOL, "poolB_shift": -80.0}),
    ("exact pulses, both pools, K = 12", lambda: EveryEvent(states=12), EVERY_TISSUE),
    ("exact pulses, MT, K = 16", lambda: EveryEvent(states=16), {**MT_POOL, "B0": 8.0}),
]


@pytest.mark.parametrize("name,make,pools", TEAM_CASES, ids=[c[0] for c in TEAM_CASES])
def test_pooled_register_team_equals_host_backend(name, make, pools):
    sim = make()
    kw = {"T1": np.array([600.0, 1100.0, 1700.0]), "T2": np.array([40.0, 80.0, 150.0]), **pools}
    ref = sim.simulate(**kw)
    out = _team(sim, **kw)
    assert np.max(np.abs(ref)) > 0.01
    np.testing.assert_allclose(out, ref, atol=3e-6 * np.max(np.abs(ref)))


def test_pooled_register_team_against_oracles():
    """The team against the expm oracle: the exchanging pool's FID and the
    semisolid pool's inversion recovery."""
    tissue = dict(T1=900.0, T2=50.0, B0=12.0, poolB_fraction=0.3, poolB_exchange=20.0, poolB_T2=10.0,
                  poolB_T1=500.0, poolB_shift=100.0)
    s = _team(FIDAll(phase=30.0, dt=1.0, n=12), **tissue)
    o = Oracle(900.0, 50.0, B0=12.0, pools=[(0.3, 20.0, 500.0, 10.0, 100.0)])
    np.testing.assert_allclose(s, _fid_oracle(o, 90.0, 30.0, 1.0, 12), atol=2e-6)
    tissue = dict(T1=1200.0, T2=80.0, bound_fraction=0.15, bound_exchange=30.0, bound_T1=300.0)
    s = _team(InversionProbe(TI=250.0), **tissue)
    o = Oracle(1200.0, 80.0, bound=(0.15, 30.0, 300.0))
    x = o.evolve(o.invert(o.equilibrium()), 250.0)
    np.testing.assert_allclose(s, [-1j * o.longitudinal(x)], atol=2e-6)


def test_pooled_register_team_refusals():
    # complex planes: 32 orders on the host's team
    sim = MRFSimulator(flip=MRF_FLIPS, TR=10.0, phases=MRF_PHASES, states=33)
    with pytest.raises(ValueError, match="states exceed what the register team holds"):
        _team(sim, T1=900.0, T2=60.0, **MT_POOL)
    # two exchanging pools: no team (the device plays them with the general kernel)
    with pytest.raises(ValueError, match="pool"):
        _team(MRFSimulator(flip=MRF_FLIPS, TR=10.0, states=8), T1=900.0, T2=60.0, **B_POOL, poolC_fraction=0.1,
              poolC_exchange=5.0)
