"""Pools (SPEC §3): exchanging pools with transverse states (Bloch–McConnell)
and the semisolid pool (binary spin bath), against the oracles of
``pool_oracles``: the physics, the lineshapes, exact rectangular pulses,
refusals, the real planes, and the device's pooled register team run on
the host."""
import numpy as np
import pytest
from scipy.integrate import quad
from scipy.linalg import expm

import blochsim
from blochsim import (Delay, Dephase, Excitation, Pulse, Readout, RectPulse, Refocusing, SampledPulse, Saturation,
                      Simulator, Spoil)
from blochsim.simulators import FSESimulator, MRFSimulator, SPGRSimulator

from pool_oracles import (B_POOL, EVERY_TISSUE, FID, GAMMA_HZ_PER_T, MRF_FLIPS, MRF_PHASES, MT_POOL, T2_S, TEAM_CASES,
                          FIDAll, InversionProbe, Oracle, PhaseTrain, SaturationTrain, _fid_oracle,
                          _phase_train_oracle, _team, _without_bound, oracle_lineshape, sl_integral)


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


@pytest.mark.parametrize("n_pools, semisolid", [(4, True), (4, False), (3, True), (3, False), (2, True)])
def test_exchanging_pools_and_semisolid_fid(n_pools, semisolid):
    """Two to four exchanging pools, with and without the semisolid pool:
    the compiled counts (up to three liquid pools) and the run-time ones
    (four or five)."""
    pools = [(0.1, 20.0, 500.0, 10.0, 100.0), (0.05, 80.0, 800.0, 30.0, -250.0),
             (0.08, 5.0, 1500.0, 120.0, 40.0), (0.02, 300.0, 600.0, 5.0, 700.0)][:n_pools]
    tissue = dict(T1=900.0, T2=60.0, B0=-7.0)
    if semisolid:
        tissue.update(bound_fraction=0.12, bound_exchange=25.0, bound_T1=700.0)
    for x, (f, k, T1, T2, sh) in zip("BCDE", pools):
        tissue.update({f"pool{x}_fraction": f, f"pool{x}_exchange": k, f"pool{x}_T1": T1, f"pool{x}_T2": T2,
                       f"pool{x}_shift": sh})
    # a 60° pulse keeps longitudinal magnetisation, so the semisolid
    # exchange moves Z while the FID is recorded
    s = FIDAll(flip=60.0, phase=-45.0, dt=0.7, n=15).simulate(**tissue)
    o = Oracle(900.0, 60.0, B0=-7.0, pools=pools, bound=(0.12, 25.0, 700.0) if semisolid else None)
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
