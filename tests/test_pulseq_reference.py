"""Pulseq files written by pypulseq (the format's reference implementation)
and read back by Simulator.from_pulseq with default options, against an
oracle written here: a float64 extended phase graph that keys every
configuration by its exact three-dimensional gradient moment, driven by
pypulseq's own reading of the same file (its blocks, RF objects, gradient
waveforms and ADC times).  Hard pulses rotate at their centres; pulses the
hard model cannot hold (adiabatic, off resonance without a gradient) are
stepped raster cell by raster cell with the exact exponential of the
Bloch equation (RF, B0, relaxation) in every cell.

The oracle works in SPEC's frame (right-handed RF rotations, spins at
B0 > 0 turning by -2 pi B0 t), so it takes the file's phases negated, as
the module notes of blochsim.pulseq document; the frequency convention is
pinned separately by B0 sweeps, whose peaks must sit at B0 = +f.

pypulseq's own example scripts are not in its wheel or sdist; the writers
here build the same kinds of sequence (spin echo, turbo spin echo at 180°
and 120° with and without an off-centre slice and with phase encoding,
RF-spoiled gradient echo, bSSFP, inversion recovery with an adiabatic
inversion, an off-resonant Gaussian) with its API.
"""
import numpy as np
import pytest
from scipy.linalg import expm

pp = pytest.importorskip("pypulseq")

# the writers leave RF and ADC delays to pypulseq, which raises them to the dead times and says so
pytestmark = pytest.mark.filterwarnings("ignore:Specified (RF|ADC) delay:UserWarning")

from blochsim import Simulator  # noqa: E402
from blochsim.pulseq import PulseqError, PulseqWarning  # noqa: E402

SYSTEM = dict(max_grad=32, grad_unit="mT/m", max_slew=130, slew_unit="T/m/s", rf_ringdown_time=20e-6,
              rf_dead_time=100e-6, adc_dead_time=10e-6)
TOL = 2e-4  # of M0, every sample


def _system():
    return pp.Opts(**SYSTEM)


def _write(seq, path):
    seq.write(str(path))
    return path


# --------------------------------------------------------------------------
# the oracle


class _Timeline:
    """pypulseq's reading of a file: RF and ADC events at their times, and
    the gradient moment (cycles/m, per axis) from piecewise-linear
    integration of its gradient waveforms."""

    def __init__(self, path):
        seq = pp.Sequence()
        seq.read(str(path))
        self.seq = seq
        waves = seq.waveforms()
        self.grad = [np.asarray(w, dtype=float) for w in waves[:3]]
        self.events = []
        t = 0.0
        for i, dur in zip(seq.block_events, seq.block_durations.values()):
            b = seq.get_block(i)
            selective = any(getattr(b, g, None) is not None for g in ("gx", "gy", "gz"))
            if b.rf is not None:
                self.events.append((t + b.rf.delay + b.rf.center, "rf", (b.rf, selective, t + b.rf.delay)))
            if b.adc is not None:
                half = 0.5 * b.adc.num_samples * b.adc.dwell
                self.events.append((t + b.adc.delay + half, "adc", b.adc.phase_offset + 2 * np.pi * b.adc.freq_offset * half))
            t += dur
        self.events.sort(key=lambda e: e[0])

    def moment(self, t0, t1, axes):
        """Moment vector from t0 to t1 on the dephasing axes (others 0)."""
        m = np.zeros(3)
        for a in axes:
            tt, g = self.grad[a]
            if tt.size == 0:
                continue
            xs = np.concatenate([[t0], tt[(tt > t0) & (tt < t1)], [t1]])
            ys = np.interp(xs, tt, g, left=0.0, right=0.0)
            m[a] = np.sum(0.5 * (ys[1:] + ys[:-1]) * np.diff(xs))
        return m


def _rotation(axis_xyz, angle):
    """Right-handed rotation of (Mx, My, Mz) about a unit axis."""
    x, y, z = axis_xyz
    K = np.array([[0, -z, y], [z, 0, -x], [-y, x, 0]])
    return np.eye(3) + np.sin(angle) * K + (1 - np.cos(angle)) * K @ K


class _MomentEPG:
    """float64 EPG over exact moment vectors: M+(r) = sum_m F[m] e^{2 pi i m.r},
    Mz(r) = sum_m Z[m] e^{2 pi i m.r}."""

    def __init__(self, T1, T2, B0, q=1e-2):
        self.T1, self.T2, self.B0, self.q = T1 * 1e-3, T2 * 1e-3, B0, q
        self.F, self.Z = {}, {(0, 0, 0): 1.0 + 0j}

    def key(self, m):
        return tuple(int(v) for v in np.round(np.asarray(m) / self.q))

    def relax(self, tau):
        if tau <= 0:
            return
        e2 = np.exp(-tau / self.T2) * np.exp(-2j * np.pi * self.B0 * tau)
        e1 = np.exp(-tau / self.T1)
        self.F = {k: v * e2 for k, v in self.F.items()}
        self.Z = {k: v * e1 for k, v in self.Z.items()}
        self.Z[(0, 0, 0)] = self.Z.get((0, 0, 0), 0.0) + (1 - e1)

    def shift(self, dm):
        d = self.key(dm)
        if any(d):
            self.F = {tuple(a + b for a, b in zip(k, d)): v for k, v in self.F.items()}

    def apply(self, R, affine=None):
        """(Mx, My, Mz) <- R (Mx, My, Mz) at every configuration (+ affine at m = 0)."""
        keys = set(self.F) | set(self.Z) | {tuple(-a for a in k) for k in self.F}
        F, Z = {}, {}
        for k in keys:
            neg = tuple(-a for a in k)
            fp, fm, z = self.F.get(k, 0.0), np.conj(self.F.get(neg, 0.0)), self.Z.get(k, 0.0)
            v = R @ np.array([(fp + fm) / 2, (fp - fm) / 2j, z])
            if affine is not None and not any(k):
                v = v + affine
            f, zz = v[0] + 1j * v[1], v[2]
            if abs(f) > 1e-13:
                F[k] = f
            if abs(zz) > 1e-13:
                Z[k] = zz
        self.F, self.Z = F, Z


def _rf_cells(rf):
    """The RF waveform on its raster (Hz, complex) at the cell centres
    (s from the pulse start): held samples, or linear between time points."""
    raster = 1e-6
    t = np.asarray(rf.t, dtype=float)
    sig = np.asarray(rf.signal, dtype=complex)
    regular = np.allclose(t, (np.arange(t.size) + 0.5) * raster)
    if regular:
        return t, sig, raster
    n = int(round(t[-1] / raster))
    c = (np.arange(n) + 0.5) * raster
    return c, np.interp(c, t, sig.real) + 1j * np.interp(c, t, sig.imag), raster


def _cell_propagator(w_hz, theta, B0, T1, T2, dt):
    """exp of the Bloch equation over one cell: RF of amplitude w (Hz) at
    SPEC phase theta, off-resonance B0, relaxation (4x4 affine)."""
    w1 = 2 * np.pi * w_hz
    Om = np.array([w1 * np.cos(theta), w1 * np.sin(theta), -2 * np.pi * B0])
    A = np.zeros((4, 4))
    A[:3, :3] = np.array([[0, -Om[2], Om[1]], [Om[2], 0, -Om[0]], [-Om[1], Om[0], 0]])
    A[0, 0] = A[1, 1] = -1 / (T2 * 1e-3)
    A[2, 2] = -1 / (T1 * 1e-3)
    A[2, 3] = 1 / (T1 * 1e-3)
    E = expm(A * dt)
    return E[:3, :3], E[:3, 3]


def oracle(path, T1, T2, B0=0.0, M0=1.0, axes=(0, 1, 2), shaped=False):
    """The file's samples by the exact-moment EPG (SPEC's frame).  ``axes``:
    the gradient axes that dephase (phase encoding left out where the
    reader leaves it out); ``shaped``: every pulse stepped cell by cell."""
    tl = _Timeline(path)
    epg = _MomentEPG(T1, T2, B0)
    out, now, last_t = [], 0.0, 0.0
    for when, kind, data in tl.events:
        if kind == "adc":
            epg.relax(when - now)
            epg.shift(tl.moment(last_t, when, axes))
            now = last_t = when
            out.append(M0 * epg.F.get((0, 0, 0), 0.0) * np.exp(1j * data))  # receiver at SPEC's -phase
            continue
        rf, selective, start = data
        t, w, dt = _rf_cells(rf)
        area = np.sum(w) * dt if np.allclose(t, (np.arange(t.size) + 0.5) * dt) else np.trapezoid(rf.signal, rf.t)
        one_phase = np.allclose(np.imag(w * np.exp(-1j * np.angle(w[np.argmax(abs(w))]))), 0, atol=1e-9 * abs(w).max())
        hard = not shaped and one_phase and (selective or rf.freq_offset == 0)
        centre_phase = rf.phase_offset + 2 * np.pi * rf.freq_offset * rf.center
        if hard:
            epg.relax(when - now)
            epg.shift(tl.moment(last_t, when, axes))
            now = last_t = when
            theta = -(centre_phase + np.angle(area))
            epg.apply(_rotation((np.cos(theta), np.sin(theta), 0.0), 2 * np.pi * abs(area)))
            continue
        epg.relax(start - now)
        epg.shift(tl.moment(last_t, when, axes))
        last_t = when
        for ti, wi in zip(t, w):
            base = centre_phase if selective else rf.phase_offset + 2 * np.pi * rf.freq_offset * ti
            theta = -(base + np.angle(wi))
            R, c = _cell_propagator(abs(wi), theta, B0, T1, T2, dt)
            # one cell acts on every configuration alike; recovery only at m = 0
            epg.apply(R, affine=c)
        now = start + t.size * dt
    return np.array(out)


# --------------------------------------------------------------------------
# the sequences, written with pypulseq


def spin_echo(path, TE=20e-3, thickness=5e-3):
    sys = _system()
    seq = pp.Sequence(sys)
    rf90, gz90, gzr = pp.make_sinc_pulse(np.pi / 2, duration=2e-3, slice_thickness=thickness, phase_offset=np.pi / 2,
                                         return_gz=True, system=sys, use="excitation")
    rf180, gz180, _ = pp.make_sinc_pulse(np.pi, duration=2e-3, slice_thickness=thickness, return_gz=True, system=sys,
                                         use="refocusing")
    crush = pp.make_trapezoid("z", area=4 / thickness, duration=1.5e-3, system=sys)
    gx = pp.make_trapezoid("x", flat_area=64 / 0.25, flat_time=3.2e-3, system=sys)
    adc = pp.make_adc(64, duration=gx.flat_time, delay=gx.rise_time, system=sys)
    gxpre = pp.make_trapezoid("x", area=gx.area / 2, duration=1.5e-3, system=sys)
    seq.add_block(rf90, gz90)
    seq.add_block(gzr, gxpre)
    t_ref = TE / 2 - (pp.calc_duration(gz90) - pp.calc_rf_center(rf90)[0] - rf90.delay) - pp.calc_duration(gzr) \
        - pp.calc_duration(crush) - rf180.delay - pp.calc_rf_center(rf180)[0]
    seq.add_block(pp.make_delay(round(t_ref / 1e-5) * 1e-5))
    seq.add_block(crush)
    seq.add_block(rf180, gz180)
    seq.add_block(crush)
    t_adc = TE / 2 - (pp.calc_duration(gz180) - rf180.delay - pp.calc_rf_center(rf180)[0]) - pp.calc_duration(crush) \
        - gx.rise_time - gx.flat_time / 2
    seq.add_block(pp.make_delay(round(t_adc / 1e-5) * 1e-5))
    seq.add_block(gx, adc)
    return _write(seq, path)


def tse(path, flip=180.0, echoes=8, ESP=15e-3, slice_pos=0.0, phase_encode=True, thickness=5e-3, shots=1,
        TR=300e-3, spoil=2.75):
    """CPMG: 90°(90°) then refocusing pulses at phase 0 between crushers,
    a readout centred between them; optional phase encoding on y, rewound
    after each echo; an off-centre slice with the phase offset that cancels
    the frequency's phase at each pulse centre.  With ``shots`` > 1, as
    pypulseq's TSE example plays it: a first shot without ADC (a dummy),
    and each shot ending with a spoiler on z (``spoil`` crusher areas)
    before the next excitation ``TR`` after it, an interval whose moments
    leave the train's proportion of x to z."""
    sys = _system()
    seq = pp.Sequence(sys)
    rf90, gz90, gzr = pp.make_sinc_pulse(np.pi / 2, duration=2e-3, slice_thickness=thickness, phase_offset=np.pi / 2,
                                         return_gz=True, system=sys, use="excitation")
    rfr, gzs, _ = pp.make_sinc_pulse(np.radians(flip), duration=2e-3, slice_thickness=thickness, return_gz=True,
                                     system=sys, use="refocusing")
    for rf, gz in ((rf90, gz90), (rfr, gzs)):
        rf.freq_offset = gz.amplitude * slice_pos
        rf.phase_offset = rf.phase_offset - 2 * np.pi * rf.freq_offset * pp.calc_rf_center(rf)[0]
    crush = pp.make_trapezoid("z", area=4 / thickness, duration=1.2e-3, system=sys)
    spoiler = pp.make_trapezoid("z", area=spoil * 4 / thickness, duration=3e-3, system=sys)
    gx = pp.make_trapezoid("x", flat_area=64 / 0.25, flat_time=2.56e-3, system=sys)
    adc = pp.make_adc(64, duration=gx.flat_time, delay=gx.rise_time, system=sys)
    gxpre = pp.make_trapezoid("x", area=gx.area / 2, duration=1.2e-3, system=sys)
    half_exc = pp.calc_duration(gz90) - rf90.delay - pp.calc_rf_center(rf90)[0]
    pre_ref = rfr.delay + pp.calc_rf_center(rfr)[0]
    post_ref = pp.calc_duration(gzs) - pre_ref
    fill1 = ESP / 2 - half_exc - pp.calc_duration(gzr) - pp.calc_duration(crush) - pre_ref
    d1 = ESP / 2 - post_ref - pp.calc_duration(crush) - pp.calc_duration(gx) / 2
    d2 = ESP / 2 - pp.calc_duration(gx) / 2 - pp.calc_duration(crush) - pre_ref
    for shot in range(shots):
        seq.add_block(rf90, gz90)
        seq.add_block(gzr, gxpre)
        seq.add_block(pp.make_delay(round(fill1 / 1e-5) * 1e-5))
        sampled = shots == 1 or shot > 0
        for e in range(echoes):
            pe = pp.make_trapezoid("y", area=(e - echoes // 2) / 0.25, duration=1.2e-3, system=sys)
            seq.add_block(crush)
            seq.add_block(rfr, gzs)
            seq.add_block(crush, *([pe] if phase_encode else []))
            seq.add_block(pp.make_delay(round(d1 / 1e-5) * 1e-5))
            seq.add_block(gx, *([adc] if sampled else []))
            seq.add_block(pp.make_delay(round(d2 / 1e-5) * 1e-5), *([pp.scale_grad(pe, -1)] if phase_encode else []))
        if shots > 1:
            seq.add_block(spoiler)
            seq.add_block(pp.make_delay(round((TR - echoes * ESP - ESP / 2) / 1e-5) * 1e-5))
    return _write(seq, path)


def tse_unequal(path, flip=120.0, echoes=8, ESP=15e-3, thickness=5e-3, vary=True):
    """A spin-echo train whose crushers, on z and on x, change area from
    echo to echo with no common unit (z: 1 + 0.137 (e mod 5), x: 1 + 0.291
    (e mod 4) times a base area; with vary=False the same every echo, z and
    x still of unequal areas), equal on either side of each refocusing
    pulse: one EPG order cannot hold its moments."""
    sys = _system()
    seq = pp.Sequence(sys)
    rf90, gz90, gzr = pp.make_sinc_pulse(np.pi / 2, duration=2e-3, slice_thickness=thickness, phase_offset=np.pi / 2,
                                         return_gz=True, system=sys, use="excitation")
    rfr, gzs, _ = pp.make_sinc_pulse(np.radians(flip), duration=2e-3, slice_thickness=thickness, return_gz=True,
                                     system=sys, use="refocusing")
    gx = pp.make_trapezoid("x", flat_area=64 / 0.25, flat_time=2.56e-3, system=sys)
    adc = pp.make_adc(64, duration=gx.flat_time, delay=gx.rise_time, system=sys)
    gxpre = pp.make_trapezoid("x", area=gx.area / 2, duration=1.2e-3, system=sys)
    half_exc = pp.calc_duration(gz90) - rf90.delay - pp.calc_rf_center(rf90)[0]
    pre_ref = rfr.delay + pp.calc_rf_center(rfr)[0]
    post_ref = pp.calc_duration(gzs) - pre_ref
    seq.add_block(rf90, gz90)
    seq.add_block(gzr, gxpre)
    seq.add_block(pp.make_delay(round((ESP / 2 - half_exc - pp.calc_duration(gzr) - 1.2e-3 - pre_ref) / 1e-5) * 1e-5))
    d1 = ESP / 2 - post_ref - 1.2e-3 - pp.calc_duration(gx) / 2
    d2 = ESP / 2 - pp.calc_duration(gx) / 2 - 1.2e-3 - pre_ref
    for e in range(echoes):
        cz = pp.make_trapezoid("z", area=2 / thickness * (1 + 0.137 * (e % 5 if vary else 1)), duration=1.2e-3,
                               system=sys)
        cx = pp.make_trapezoid("x", area=1.5 / thickness * (1 + 0.291 * (e % 4 if vary else 1)), duration=1.2e-3,
                               system=sys)
        seq.add_block(cz, cx)
        seq.add_block(rfr, gzs)
        seq.add_block(cz, cx)
        seq.add_block(pp.make_delay(round(d1 / 1e-5) * 1e-5))
        seq.add_block(gx, adc)
        seq.add_block(pp.make_delay(round(d2 / 1e-5) * 1e-5))
    return _write(seq, path)


def _spoiled_train(seq, sys, n, flip, TR, thickness, flat_time=2.56e-3, spoil_z=True, phase_encode=True,
                   inc=117.0):
    """n TRs of an RF-spoiled gradient echo: slice-selective pulse at the
    quadratic phase, readout prephaser (and phase encoding, rewound), the
    readout with its ADC following the RF phase, spoilers on x (and z)."""
    rf, gz, gzr = pp.make_sinc_pulse(np.radians(flip), duration=1e-3, slice_thickness=thickness, return_gz=True,
                                     system=sys, use="excitation")
    gx = pp.make_trapezoid("x", flat_area=64 / 0.25, flat_time=flat_time, system=sys)
    adc = pp.make_adc(64, duration=gx.flat_time, delay=gx.rise_time, system=sys)
    gxpre = pp.make_trapezoid("x", area=-gx.area / 2, duration=1e-3, system=sys)
    spoil_x = pp.make_trapezoid("x", area=2 * gx.area, duration=2e-3, system=sys)
    spoil_z = [pp.make_trapezoid("z", area=4 / thickness, duration=2e-3, system=sys)] if spoil_z else []
    used = pp.calc_duration(gz) + pp.calc_duration(gxpre, gzr) + pp.calc_duration(gx) + pp.calc_duration(spoil_x)
    for k in range(n):
        phase = np.radians(inc) * k * (k + 1) / 2 % (2 * np.pi)
        rf.phase_offset = phase
        adc.phase_offset = phase
        pe = [pp.make_trapezoid("y", area=((k % 16) - 8) / 0.25, duration=1e-3, system=sys)] if phase_encode else []
        seq.add_block(rf, gz)
        seq.add_block(gxpre, gzr, *pe)
        seq.add_block(gx, adc)
        seq.add_block(spoil_x, *spoil_z, *[pp.scale_grad(g, -1) for g in pe])
        seq.add_block(pp.make_delay(round((TR - used) / 1e-5) * 1e-5))


def spoiled_gre(path, n=60, flip=15.0, TR=10e-3, thickness=5e-3):
    sys = _system()
    seq = pp.Sequence(sys)
    _spoiled_train(seq, sys, n, flip, TR, thickness)
    return _write(seq, path)


def bssfp(path, n=40, flip=40.0, TR=6e-3, thickness=5e-3):
    sys = _system()
    seq = pp.Sequence(sys)
    rf, gz, gzr = pp.make_sinc_pulse(np.radians(flip), duration=1e-3, slice_thickness=thickness, return_gz=True,
                                     system=sys, use="excitation")
    gx = pp.make_trapezoid("x", flat_area=64 / 0.25, flat_time=1.28e-3, system=sys)
    adc = pp.make_adc(64, duration=gx.flat_time, delay=gx.rise_time, system=sys)
    gxpre = pp.make_trapezoid("x", area=-gx.area / 2, duration=0.8e-3, system=sys)
    gzr = pp.make_trapezoid("z", area=gzr.area, duration=0.8e-3, system=sys)
    gzr_after = pp.make_trapezoid("z", area=gzr.area, duration=0.8e-3, system=sys)
    used = pp.calc_duration(gz) + 2 * pp.calc_duration(gxpre, gzr) + pp.calc_duration(gx)
    half = pp.make_delay(round((TR - used) / 2 / 1e-5) * 1e-5)
    prep = pp.make_sinc_pulse(np.radians(flip / 2), duration=1e-3, slice_thickness=thickness, return_gz=True,
                              system=sys, phase_offset=np.pi)
    seq.add_block(prep[0], prep[1])
    seq.add_block(prep[2])
    seq.add_block(pp.make_delay(round((TR / 2 - pp.calc_duration(prep[1]) - pp.calc_duration(prep[2])) / 1e-5) * 1e-5))
    for k in range(n):
        rf.phase_offset = np.pi * (k % 2)
        adc.phase_offset = np.pi * (k % 2)
        seq.add_block(rf, gz)
        seq.add_block(gxpre, gzr)
        seq.add_block(half)
        seq.add_block(gx, adc)
        seq.add_block(half)
        seq.add_block(pp.scale_grad(gxpre, 1), pp.scale_grad(gzr_after, 1))
    return _write(seq, path)


def ir_gre(path, TI=300e-3, n=20, flip=10.0, TR=8e-3, thickness=5e-3, flat_time=1.28e-3):
    """Adiabatic (hyperbolic-secant) inversion, spoiler, TI, then an RF-spoiled
    gradient-echo train (64 ADC samples over the readout's flat_time)."""
    sys = _system()
    seq = pp.Sequence(sys)
    inv = pp.make_adiabatic_pulse("hypsec", duration=10.24e-3, system=sys)
    spoil = pp.make_trapezoid("z", area=8 / thickness, duration=3e-3, system=sys)
    seq.add_block(inv)
    seq.add_block(spoil)
    seq.add_block(pp.make_delay(round((TI - pp.calc_duration(spoil) - pp.calc_duration(inv) / 2) / 1e-5) * 1e-5))
    _spoiled_train(seq, sys, n, flip, TR, thickness, flat_time=flat_time, spoil_z=False, phase_encode=False)
    return _write(seq, path)


def shifted_gaussian(path, offset=300.0, flip=90.0):
    """A non-selective Gaussian at +offset Hz, then an ADC of the FID."""
    sys = _system()
    seq = pp.Sequence(sys)
    rf = pp.make_gauss_pulse(np.radians(flip), duration=4e-3, time_bw_product=2, freq_offset=offset, system=sys)
    seq.add_block(rf)
    seq.add_block(pp.make_adc(1, duration=20e-6, system=sys))
    return _write(seq, path)


def haste(path, echoes=32):
    """Single-shot TSE (HASTE-like): a long CPMG train, phase encoding
    rewound after every echo."""
    return tse(path, echoes=echoes, ESP=15e-3)


def epi(path, n=32, thickness=5e-3, fov=0.256):
    """Single-shot gradient-echo EPI: an excitation, prephasers, then n
    readout lobes of alternating sign with a phase-encoding blip between
    them, one ADC per lobe."""
    sys = _system()
    seq = pp.Sequence(sys)
    rf, gz, gzr = pp.make_sinc_pulse(np.radians(90.0), duration=2e-3, slice_thickness=thickness, return_gz=True,
                                     system=sys, use="excitation")
    dk = 1 / fov
    gx = pp.make_trapezoid("x", flat_area=n * dk, flat_time=0.32e-3, system=sys)
    adc = pp.make_adc(n, duration=gx.flat_time, delay=gx.rise_time, system=sys)
    blip = pp.make_trapezoid("y", area=dk, duration=0.1e-3, system=sys)
    gxpre = pp.make_trapezoid("x", area=-gx.area / 2, duration=1e-3, system=sys)
    gypre = pp.make_trapezoid("y", area=-n / 2 * dk, duration=1e-3, system=sys)
    seq.add_block(rf, gz)
    seq.add_block(gxpre, gypre, gzr)
    for k in range(n):
        seq.add_block(gx if k % 2 == 0 else pp.scale_grad(gx, -1), adc)
        seq.add_block(blip)
    return _write(seq, path)



def epi_se(path, n=16, thickness=3e-3, fov=0.256, TE=40e-3):
    """Spin-echo EPI in the form of pypulseq's write_epi_se example: a sinc
    excitation and its rephaser with the in-plane prephasers, a 180° block
    pulse between spoilers on z of twice the slice gradient's area, then n
    readout lobes of alternating sign with blips, the k-space centre at TE."""
    sys = _system()
    seq = pp.Sequence(sys)
    rf, gz, _ = pp.make_sinc_pulse(np.pi / 2, duration=3e-3, slice_thickness=thickness, apodization=0.5,
                                   time_bw_product=4, return_gz=True, delay=sys.rf_dead_time, system=sys,
                                   use="excitation")
    dk = 1 / fov
    gx = pp.make_trapezoid("x", flat_area=n * dk, flat_time=3.2e-4, system=sys)
    adc = pp.make_adc(n, duration=gx.flat_time, delay=gx.rise_time, system=sys)
    pre = 8e-4
    gz_reph = pp.make_trapezoid("z", area=-gz.area / 2, duration=pre, system=sys)
    gx_pre = pp.make_trapezoid("x", area=gx.area / 2 - dk / 2, duration=pre, system=sys)
    gy_pre = pp.make_trapezoid("y", area=n / 2 * dk, duration=pre, system=sys)
    gy = pp.make_trapezoid("y", area=dk, duration=np.ceil(2 * np.sqrt(dk / sys.max_slew) / 1e-5) * 1e-5, system=sys)
    rf180 = pp.make_block_pulse(np.pi, delay=sys.rf_dead_time, duration=5e-4, system=sys, use="refocusing")
    spoil = pp.make_trapezoid("z", area=2 * gz.area, duration=3 * pre, system=sys)
    to_centre = (n / 2 + 0.5) * pp.calc_duration(gx) + n / 2 * pp.calc_duration(gy)
    c90 = rf.delay + pp.calc_rf_center(rf)[0]
    c180 = rf180.delay + pp.calc_rf_center(rf180)[0]
    d1 = TE / 2 - pp.calc_duration(gz) + c90 - pre - pp.calc_duration(spoil) - c180
    d2 = TE / 2 - pp.calc_duration(rf180) + c180 - pp.calc_duration(spoil) - to_centre
    seq.add_block(rf, gz)
    seq.add_block(gx_pre, gy_pre, gz_reph)
    seq.add_block(pp.make_delay(round(d1 / 1e-5) * 1e-5))
    seq.add_block(spoil)
    seq.add_block(rf180)
    seq.add_block(spoil)
    seq.add_block(pp.make_delay(round(d2 / 1e-5) * 1e-5))
    for k in range(n):
        seq.add_block(gx if k % 2 == 0 else pp.scale_grad(gx, -1), adc)
        seq.add_block(gy)
    seq.add_block(pp.make_delay(1e-4))
    return _write(seq, path)

def long_gre(path, trs):
    """An RF-spoiled gradient echo of 5 blocks a TR (a file of 5 trs blocks)."""
    return spoiled_gre(path, n=trs)


# --------------------------------------------------------------------------
# the tests

TISSUE = dict(T1=900.0, T2=70.0)


def _check(path, axes=(0, 1, 2), B0s=(0.0,), **kw):
    sim = Simulator.from_pulseq(path, **kw)
    for B0 in B0s:
        s = sim.simulate(**TISSUE, B0=B0)
        ref = oracle(path, **TISSUE, B0=B0, axes=axes)
        assert s.shape == ref.shape
        np.testing.assert_allclose(s, ref, atol=TOL, rtol=0, err_msg=f"B0 = {B0}")
    return sim


def test_spin_echo_against_the_exact_moment_epg(tmp_path):
    path = spin_echo(tmp_path / "se.seq")
    _check(path, B0s=(0.0, 23.0))
    # and the spin echo's closed form at the file's echo time
    (t_exc, _, _), _, (t_adc, _, _) = _Timeline(path).events
    TE = 1e3 * (t_adc - t_exc)
    s = Simulator.from_pulseq(path).simulate(T1=1e6, T2=np.array([50.0, 100.0]), B0=31.0)
    np.testing.assert_allclose(np.abs(s[:, 0]), np.exp(-TE / np.array([50.0, 100.0])), rtol=1e-5)


@pytest.mark.parametrize("flip", [180.0, 120.0])
@pytest.mark.parametrize("slice_pos", [0.0, 5.1e-3])
def test_turbo_spin_echo_against_the_exact_moment_epg(tmp_path, flip, slice_pos):
    """Every echo, on and off the slice centre, with phase encoding on y
    (rewound after each echo: left out, the samples at the k-space centre)."""
    path = tse(tmp_path / "tse.seq", flip=flip, slice_pos=slice_pos)
    _check(path, axes=(0, 2), B0s=(0.0, 17.0))
    if flip == 180.0:
        # ideal refocusing of the slice-centre spin: e^(-TE/T2) at every echo time of the file
        events = _Timeline(path).events
        TE = 1e3 * (np.array([t for t, kind, _ in events if kind == "adc"]) - events[0][0])
        s = Simulator.from_pulseq(path).simulate(T1=1e6, T2=80.0)
        np.testing.assert_allclose(np.abs(s), np.exp(-TE / 80.0), rtol=2e-5)


@pytest.mark.parametrize("shots, echoes, spoil", [(3, 16, 2.75), (4, 8, 3.0)])
def test_turbo_spin_echo_in_shots_plays_by_default(tmp_path, shots, echoes, spoil):
    """pypulseq's TSE example's form: shots whose spoilers leave the
    train's proportion of x to z, so that neither axis alone nor both on
    one lattice hold the moments.  Played with default options (the
    train's direction on its lattice, each spoiler a generator of its own)
    against the oracle, at a short T2 and at CSF's, where pathways that
    cross the shots survive."""
    path = tse(tmp_path / "shots.seq", shots=shots, echoes=echoes, spoil=spoil, phase_encode=False)
    sim = Simulator.from_pulseq(path)
    for tissue in (TISSUE, dict(T1=4000.0, T2=2000.0)):
        for B0 in (0.0, 13.0):
            np.testing.assert_allclose(sim.simulate(**tissue, B0=B0), oracle(path, **tissue, B0=B0, axes=(0, 2)),
                                       atol=TOL, rtol=0, err_msg=f"{tissue}, B0 = {B0}")



def test_the_default_plays_keyed_by_moment_where_that_is_less_work(tmp_path, monkeypatch):
    """A train whose refocusing leaves most orders of its band empty (TSE
    shots whose spoilers push the states hundreds of orders out) plays its
    simulate and jacobian on the moment-keyed EPG, and vjp on one order;
    both against the oracle, and the Jacobians against each other.  An EPI
    (one order, a band of one) stays on one order."""
    from blochsim._engine import host as _backend_host
    from blochsim.sequence import keyed

    played = []
    for name in ("keyed_forward", "forward", "keyed_jacobian", "jacobian"):
        monkeypatch.setattr(_backend_host, name, lambda *a, _f=getattr(_backend_host, name), _n=name, **k: (
            played.append(_n), _f(*a, **k))[1])
    path = tse(tmp_path / "shots.seq", shots=3, echoes=16, phase_encode=False)
    sim = Simulator.from_pulseq(path)
    tissue = dict(T1=4000.0, T2=2000.0, B0=13.0)
    want = oracle(path, **tissue, axes=(0, 2))
    s = sim.simulate(**tissue)
    _, J = sim.jacobian(("T2", "B0"), **tissue)
    assert played == ["keyed_forward", "keyed_jacobian"]
    np.testing.assert_allclose(s, want, atol=TOL, rtol=0)
    v, grads = sim.vjp(["T2"], **tissue)
    np.testing.assert_allclose(v, want, atol=TOL, rtol=0)
    monkeypatch.setattr(keyed, "PREFER_MARGIN", np.inf)
    played.clear()
    np.testing.assert_allclose(sim.simulate(**tissue), want, atol=TOL, rtol=0)
    _, J1 = sim.jacobian(("T2", "B0"), **tissue)
    assert played == ["forward", "jacobian"]
    for d in range(2):
        np.testing.assert_allclose(J[:, d], J1[:, d], atol=1e-3 * np.abs(J1[:, d]).max(), rtol=0)
    monkeypatch.undo()
    for name in ("keyed_forward", "forward"):
        monkeypatch.setattr(_backend_host, name, lambda *a, _f=getattr(_backend_host, name), _n=name, **k: (
            played.append(_n), _f(*a, **k))[1])
    played.clear()
    Simulator.from_pulseq(epi(tmp_path / "epi.seq", n=16)).simulate(**TISSUE)
    assert played == ["forward"]
    # a broadcast past memory: refused by the memory check, before any plane is made
    with pytest.raises(MemoryError, match=r"needs .* of host memory \(100,000,000,000 voxels"):
        sim.simulate(T1=np.ones((100000, 1)) * 1000.0, T2=np.ones((1, 1000000)) * 80.0)

def test_spoiled_gradient_echo_against_the_exact_moment_epg(tmp_path):
    path = spoiled_gre(tmp_path / "gre.seq")
    _check(path, axes=(0, 2), B0s=(0.0, 11.0))


def test_bssfp_b0_sweep_against_the_exact_moment_epg(tmp_path):
    path = bssfp(tmp_path / "bssfp.seq")
    _check(path, B0s=np.linspace(-150.0, 150.0, 7))


def test_adiabatic_inversion_recovery_against_the_exact_moment_epg(tmp_path):
    """The hyperbolic secant is phase modulated: played shaped by default,
    refused by rf='hard'."""
    path = ir_gre(tmp_path / "ir.seq")
    _check(path, axes=(0, 2), B0s=(0.0, 40.0))
    with pytest.raises(PulseqError, match="block 1: RF 1 cannot be played as a hard pulse: its waveform's phase "
                                          "varies"):
        Simulator.from_pulseq(path, rf="hard").simulate(**TISSUE)


@pytest.mark.filterwarnings(r"ignore:write\(\).*timing errors:UserWarning")  # pypulseq's own raster check
def test_an_adc_dwell_off_its_raster_plays_as_pypulseq_reads_it(tmp_path):
    """The inversion-recovery gradient echo with 64 samples over 2 ms: a
    dwell of 31.25 us, not a whole number of the 100 ns ADC raster, which
    pypulseq writes and reads; so does the reader, warning with the line,
    and the samples are the oracle's (from pypulseq's reading)."""
    path = ir_gre(tmp_path / "ir.seq", flat_time=2e-3)
    assert "31250" in path.read_text().split("[ADC]")[1].splitlines()[1]
    with pytest.warns(PulseqWarning, match=r"ir\.seq, line \d+: ADC 1's dwell is not on the ADC raster "
                                           r"\(1e-07 s\); read as written"):
        _check(path, axes=(0, 2), B0s=(0.0, 40.0))


def test_shifted_gaussian_resonates_at_plus_its_offset(tmp_path):
    """A 30° Gaussian at +300 Hz: the excited magnitude (its profile, near
    the small-tip Fourier transform) peaks at B0 = +300 Hz and is even
    about it, and every sample matches the cell-by-cell oracle."""
    path = shifted_gaussian(tmp_path / "gauss.seq", flip=30.0)
    B0 = np.linspace(-500.0, 500.0, 101)
    s = Simulator.from_pulseq(path).simulate(T1=1e6, T2=1e6, B0=B0)[:, 0]
    assert B0[np.argmax(np.abs(s))] == 300.0
    np.testing.assert_allclose(np.abs(s[80:71:-1]), np.abs(s[80:89]), rtol=5e-4)
    ref = np.array([oracle(path, T1=1e6, T2=1e6, B0=b)[0] for b in B0[::10]])
    np.testing.assert_allclose(s[::10], ref, atol=TOL)


@pytest.mark.parametrize("writer", ["spin_echo", "spoiled_gre"])
def test_shaped_mode_plays_every_waveform_unitary(tmp_path, writer):
    """rf='shaped' against the oracle stepping every pulse cell by cell;
    with T1 = T2 = inf and B0 = 0 a 16-echo CPMG keeps |M| = 1."""
    path = globals()[writer](tmp_path / "f.seq")
    s = Simulator.from_pulseq(path, rf="shaped").simulate(**TISSUE, B0=7.0)
    np.testing.assert_allclose(s, oracle(path, **TISSUE, B0=7.0, axes=(0, 2), shaped=True), atol=TOL)
    cpmg = tse(tmp_path / "cpmg.seq", echoes=16, phase_encode=False)
    s = Simulator.from_pulseq(cpmg, rf="shaped").simulate(T1=1e30, T2=1e30)
    np.testing.assert_allclose(np.abs(s), 1.0, atol=2e-5)


def test_block_pulse_flip_is_exact(tmp_path):
    """A block pulse is two time points: its area is exactly the flip."""
    sys = _system()
    seq = pp.Sequence(sys)
    seq.add_block(pp.make_block_pulse(np.radians(15.0), duration=0.5e-3, system=sys))
    seq.add_block(pp.make_adc(1, duration=10e-6, system=sys))
    path = _write(seq, tmp_path / "block.seq")
    for rf in ("auto", "hard", "shaped"):
        s = Simulator.from_pulseq(path, rf=rf).simulate(T1=1e6, T2=1e6)
        np.testing.assert_allclose(abs(s[0]), np.sin(np.radians(15.0)), rtol=2e-6, err_msg=rf)


def test_haste_and_epi_against_the_exact_moment_epg(tmp_path):
    """A 32-echo single-shot TSE, and a single-shot EPI whose blips (3.9
    cycles/m, 0.004 cycles across a 1 mm voxel) encode k-space and do not
    dephase: every lobe samples the FID, decaying with T2."""
    path = haste(tmp_path / "haste.seq")
    _check(path, axes=(0, 2))
    path = epi(tmp_path / "epi.seq")
    s = _check(path, axes=(0, 2)).simulate(**TISSUE)
    events = _Timeline(path).events
    t = 1e3 * (np.array([w for w, kind, _ in events if kind == "adc"]) - events[0][0])
    np.testing.assert_allclose(np.abs(s), np.exp(-t / TISSUE["T2"]), rtol=1e-4)


def isochromat_ensemble(path, T1, T2, B0=0.0, axes=(0, 2), N=400):
    """The file's samples by N isochromats spread over one period of its
    dephasing: the moments between events (pypulseq's reading) must all be
    whole multiples n of the first one, v, and isochromat j at s_j = j / N
    turns by 2 pi n s_j at each; hard rotations at the RF centres, B0 and
    relaxation between events (SPEC's frame), the sample the ensemble's
    mean transverse magnetisation."""
    tl = _Timeline(path)
    s = np.arange(N) / N
    M = np.zeros((N, 3))
    M[:, 2] = 1.0
    out, now, last, v = [], 0.0, 0.0, None
    for when, kind, data in tl.events:
        tau = when - now
        e2, e1 = np.exp(-tau / (T2 * 1e-3)), np.exp(-tau / (T1 * 1e-3))
        M[:, :2] *= e2
        M[:, 2] = 1 + (M[:, 2] - 1) * e1
        dm = tl.moment(last, when, axes) if out or now else np.zeros(3)  # nothing transverse before the first RF
        if v is None and np.linalg.norm(dm) > 1e-6:
            v = dm
        n = 0 if v is None else float(dm @ v / (v @ v))
        assert v is None or np.allclose(dm, round(n) * v, atol=1e-3 * np.linalg.norm(v))
        phi = 2 * np.pi * round(n) * s - 2 * np.pi * B0 * tau  # gradient, then SPEC's off-resonance
        fp = (M[:, 0] + 1j * M[:, 1]) * np.exp(1j * phi)
        M[:, 0], M[:, 1] = fp.real, fp.imag
        now = last = when
        if kind == "adc":
            out.append(np.mean(M[:, 0] + 1j * M[:, 1]) * np.exp(1j * data))
            continue
        rf = data[0]
        t, w, dt = _rf_cells(rf)
        area = np.sum(w) * dt if np.allclose(t, (np.arange(t.size) + 0.5) * dt) else np.trapezoid(rf.signal, rf.t)
        theta = -(rf.phase_offset + 2 * np.pi * rf.freq_offset * rf.center + np.angle(area))
        M = M @ _rotation((np.cos(theta), np.sin(theta), 0.0), 2 * np.pi * abs(area)).T
    return np.array(out)


@pytest.mark.parametrize("flip,slice_pos", [(120.0, 0.0), (120.0, 5.1e-3), (180.0, 0.0)])
def test_turbo_spin_echo_against_an_isochromat_ensemble(tmp_path, flip, slice_pos):
    """The CPMG files against isochromats (no Fourier states): the check of
    the exact-moment oracle itself and of the reader at once."""
    path = tse(tmp_path / "tse.seq", flip=flip, slice_pos=slice_pos, echoes=6)
    s = Simulator.from_pulseq(path).simulate(**TISSUE, B0=9.0)
    np.testing.assert_allclose(s, isochromat_ensemble(path, **TISSUE, B0=9.0), atol=TOL)
    np.testing.assert_allclose(oracle(path, **TISSUE, B0=9.0, axes=(0, 2)),
                               isochromat_ensemble(path, **TISSUE, B0=9.0), atol=1e-9)


def test_haste_against_an_isochromat_ensemble(tmp_path):
    """The single-shot TSE (its readouts and crushers on one dephasing
    direction) against isochromats across the voxel, off resonance."""
    path = haste(tmp_path / "haste.seq", echoes=16)
    s = Simulator.from_pulseq(path).simulate(**TISSUE, B0=9.0)
    np.testing.assert_allclose(s, isochromat_ensemble(path, **TISSUE, B0=9.0), atol=TOL)



def test_spin_echo_and_spin_echo_epi_against_isochromats_and_the_closed_form(tmp_path):
    """The spin echo and pypulseq's spin-echo EPI form against isochromats
    across one period of the spoilers on z, off resonance: the EPI's
    in-plane moments (its lobes and blips, at most 0.002 cycles across the
    voxel at an ADC's centre) encode k-space and do not dephase, so each
    line samples the echo, the k-space centre's line at TE, and every
    line's magnitude is e^{-t/T2} on resonance (a spin echo refocuses B0
    only at TE; at 9 Hz its lines turn, and the ensemble follows them)."""
    path = spin_echo(tmp_path / "se.seq")
    s = Simulator.from_pulseq(path).simulate(**TISSUE, B0=9.0)
    np.testing.assert_allclose(s, isochromat_ensemble(path, **TISSUE, B0=9.0, axes=(2,)), atol=TOL)
    path = epi_se(tmp_path / "epi_se.seq", n=16)
    sim = Simulator.from_pulseq(path)
    for B0 in (0.0, 9.0):
        s = sim.simulate(**TISSUE, B0=B0)
        assert s.shape == (16,)
        np.testing.assert_allclose(s, isochromat_ensemble(path, **TISSUE, B0=B0, axes=(2,)), atol=TOL)
        np.testing.assert_allclose(s, oracle(path, **TISSUE, B0=B0, axes=(2,)), atol=TOL)
    events = _Timeline(path).events
    rf = [w for w, kind, _ in events if kind != "adc"]
    t = np.array([w for w, kind, _ in events if kind == "adc"]) - rf[0]
    np.testing.assert_allclose(np.abs(sim.simulate(**TISSUE)), np.exp(-1e3 * t / TISSUE["T2"]), rtol=1e-4)
    assert abs(t[8] - 40e-3) < 1e-5 and abs(2 * (rf[1] - rf[0]) - 40e-3) < 1e-5

def test_the_formats_frame_is_the_conjugate_of_the_oracles(tmp_path):
    """frame="pulseq": the samples in the format's receiver frame, the
    complex conjugate of SPEC's oracle (off resonance, where the phase
    shows); the Jacobian conjugated with them; vjp pulls a cotangent of the
    returned samples back as its conjugate through SPEC's samples."""
    path = tse(tmp_path / "tse.seq", flip=120.0, echoes=4)
    fmt = Simulator.from_pulseq(path, frame="pulseq")
    s = fmt.simulate(**TISSUE, B0=17.0)
    ref = oracle(path, **TISSUE, B0=17.0, axes=(0, 2))
    np.testing.assert_allclose(s, np.conj(ref), atol=TOL, rtol=0)
    assert np.abs(np.imag(ref)).max() > 10 * TOL  # the phase shows
    spec = Simulator.from_pulseq(path)
    s1, J1 = spec.jacobian(("T2", "B0"), **TISSUE, B0=17.0)
    s2, J2 = fmt.jacobian(("T2", "B0"), **TISSUE, B0=17.0)
    np.testing.assert_array_equal(s2, np.conj(s1))
    np.testing.assert_array_equal(J2, np.conj(J1))
    g = np.random.default_rng(1).standard_normal(s.shape) + 1j * np.random.default_rng(2).standard_normal(s.shape)
    _, p1 = spec.vjp(("T2", "B0"), **TISSUE, B0=17.0)
    _, p2 = fmt.vjp(("T2", "B0"), **TISSUE, B0=17.0)
    for k, v in p2(g).items():
        np.testing.assert_allclose(v, p1(np.conj(g))[k], rtol=1e-6)
        # and the chain rule through the conjugated Jacobian: Re(conj(g) · dŝ)
        np.testing.assert_allclose(v, np.sum(np.real(np.conj(g) * J2[("T2", "B0").index(k)])), rtol=1e-4)
    with pytest.raises(ValueError, match="frame must be 'spec' or 'pulseq', got 'scanner'"):
        Simulator.from_pulseq(path, frame="scanner").simulate(**TISSUE)
    with pytest.raises(ValueError, match='jacobian_vjp does not take frame="pulseq"'):
        fmt.jacobian_vjp(("T2",), ("B1",), **TISSUE)


@pytest.mark.parametrize("flip, echoes", [(120.0, 12), (180.0, 8)])
def test_crushers_of_unequal_areas_on_two_axes_play_keyed_by_moment(tmp_path, flip, echoes):
    """One EPG order cannot hold these moments: by default the states are
    keyed by their 3-D moment, and every echo agrees with the oracle, at a
    short T2 and at CSF's (long-lived stimulated pathways), on and off
    resonance."""
    from blochsim.pulseq import read_pulseq

    path = tse_unequal(tmp_path / "unequal.seq", flip=flip, echoes=echoes)
    assert any(type(op).__name__ == "_Moment" for op in read_pulseq(path))
    sim = Simulator.from_pulseq(path)
    for tissue in (TISSUE, dict(T1=4000.0, T2=2000.0)):
        for B0 in (0.0, 13.0):
            np.testing.assert_allclose(sim.simulate(**tissue, B0=B0), oracle(path, **tissue, B0=B0, axes=(0, 2)),
                                       atol=TOL, rtol=0, err_msg=f"{tissue}, B0 = {B0}")
    # per voxel: B1 and B0 maps, the threads splitting them, each voxel as
    # it plays alone (the states kept depend on the call's B1 range)
    B1, B0 = np.array([0.8, 1.0, 1.1]), np.array([0.0, 5.0, -7.0])
    s = Simulator.from_pulseq(path, threads=2).simulate(**TISSUE, B1=B1, B0=B0)
    for i in range(3):
        np.testing.assert_allclose(s[i], sim.simulate(**TISSUE, B1=B1[i], B0=B0[i]), atol=1e-6)


@pytest.mark.parametrize("flip", [180.0, 120.0])
def test_keyed_by_moment_on_request_equals_the_oracle(tmp_path, flip):
    """dephasing="keyed" on a train one order holds: the same samples."""
    path = tse(tmp_path / "tse.seq", flip=flip, slice_pos=5.1e-3)
    _check(path, axes=(0, 2), B0s=(0.0, 17.0), dephasing="keyed")


def test_keyed_by_moment_vjp_is_the_pullback_of_its_jacobian(tmp_path):
    """vjp on the moment-keyed EPG with respect to tissue properties, as
    passed (broadcast shapes, a scalar), against central differences of the
    samples' real loss; and with a semisolid pool, against the pooled
    keyed Jacobian contracted by hand."""
    path = tse_unequal(tmp_path / "unequal.seq", echoes=6)
    sim = Simulator.from_pulseq(path)
    T1, T2 = np.array([800.0, 1200.0]), np.array([[60.0], [90.0]])
    s, pullback = sim.vjp(["T2", "B0"], T1=T1, T2=T2, B0=5.0)
    c = np.random.default_rng(0).normal(size=s.shape) + 1j * np.random.default_rng(1).normal(size=s.shape)
    g = pullback(c)
    assert g["T2"].shape == (2, 1) and np.shape(g["B0"]) == ()

    def loss(**kw):
        return np.sum((np.conj(c) * sim.simulate(T1=T1, **kw).astype(np.complex128)).real)

    h = 1e-2
    for i in range(2):
        up, down = T2.copy(), T2.copy()
        up[i] += h
        down[i] -= h
        fd = (loss(T2=up, B0=5.0) - loss(T2=down, B0=5.0)) / (2 * h)
        assert abs(g["T2"][i, 0] - fd) <= 5e-3 * abs(fd) + 1e-6
    fd = (loss(T2=T2, B0=5.0 + h) - loss(T2=T2, B0=5.0 - h)) / (2 * h)
    assert abs(g["B0"] - fd) <= 5e-3 * abs(fd) + 1e-6
    pools = dict(bound_fraction=0.1, bound_exchange=20.0)
    s, pullback = sim.vjp(["T2"], **TISSUE, **pools)
    _, J = sim.jacobian("T2", **TISSUE, **pools)
    c = 2 * s
    np.testing.assert_allclose(pullback(c)["T2"], np.sum((np.conj(c) * J).real), rtol=1e-6)


class _MomentTrain(Simulator):
    """A train of _Moment operators (as the Pulseq reader writes them for
    crushers of unequal areas) with a float protocol parameter."""

    protocol = {"ESP": 10.0}

    def repetition(self, p):
        from blochsim.sequence import Delay, Pulse, Readout, Sequence
        from blochsim.sequence.operators import _Moment

        ops = [Pulse(90.0, 90.0)]
        for e in range(4):
            m = (300.0 * (1 + 0.291 * e), 0.0, 400.0 * (1 + 0.137 * e))
            ops += [Delay(p["ESP"] / 2 - 1.0), _Moment(m, 1.0), Delay(1.0), Pulse(120.0), Delay(1.0), _Moment(m, 1.0),
                    Delay(p["ESP"] / 2 - 1.0), Readout()]
        return Sequence(ops)


def test_keyed_by_moment_refuses_what_it_does_not_play_by_name(tmp_path):
    path = tse_unequal(tmp_path / "unequal.seq", echoes=4)
    sim = Simulator.from_pulseq(path, dephasing="keyed")
    with pytest.raises(TypeError, match="jacobian_vjp .* is not played on it yet"):
        _MomentTrain().jacobian_vjp("T2", ("ESP",), **TISSUE)
    with pytest.raises(TypeError, match=r"vjp reaches tissue properties only, not the protocol parameters \['ESP'\]"):
        _MomentTrain().vjp(["ESP", "T2"], **TISSUE)
    with pytest.raises(ValueError, match="v needs the crusher geometry"):
        sim.simulate(**TISSUE, v=1.0)


class _PooledMomentEPG(_MomentEPG):
    """_MomentEPG with Bloch–McConnell pools (free water and exchanging
    pools, as pool_oracles.Oracle's generator has them; no semisolid pool):
    per liquid pool j, F[j] and Z[j] over exact moments; an interval is the
    exact exponential of the generator at every moment (recovery at m = 0),
    a pulse rotates every pool alike."""

    def __init__(self, T1, T2, B0, pools, q=1e-2):
        from pool_oracles import Oracle

        self.bm, self.q = Oracle(T1, T2, B0, pools=pools), q
        self.n = self.bm.n
        self.Fs = [{} for _ in range(self.n)]
        self.Zs = [{(0, 0, 0): self.bm.f[j] + 0j} for j in range(self.n)]

    def shift(self, dm):
        d = self.key(dm)
        if any(d):
            self.Fs = [{tuple(a + b for a, b in zip(k, d)): v for k, v in F.items()} for F in self.Fs]

    def apply(self, R, affine=None):
        """(Mx, My, Mz) of every pool <- R (3 n x 3 n) times them at every
        moment (+ affine at m = 0); a 3 x 3 R turns every pool alike."""
        if R.shape == (3, 3):
            R = np.kron(np.eye(self.n), R)
        keys = set()
        for F, Z in zip(self.Fs, self.Zs):
            keys |= set(F) | set(Z) | {tuple(-a for a in k) for k in F}
        Fs, Zs = [{} for _ in range(self.n)], [{} for _ in range(self.n)]
        for k in keys:
            neg = tuple(-a for a in k)
            v = []
            for F, Z in zip(self.Fs, self.Zs):
                fp, fm = F.get(k, 0.0), np.conj(F.get(neg, 0.0))
                v += [(fp + fm) / 2, (fp - fm) / 2j, Z.get(k, 0.0)]
            v = R @ np.array(v)
            if affine is not None and not any(k):
                v = v + affine
            for j in range(self.n):
                f, z = v[3 * j] + 1j * v[3 * j + 1], v[3 * j + 2]
                if abs(f) > 1e-13:
                    Fs[j][k] = f
                if abs(z) > 1e-13:
                    Zs[j][k] = z
        self.Fs, self.Zs = Fs, Zs

    def relax(self, tau):
        if tau > 0:
            E = expm(self.bm.generator() * tau)
            self.apply(E[:-1, :-1], affine=E[:-1, -1])

    def sample(self):
        return sum(F.get((0, 0, 0), 0.0) for F in self.Fs)


def pooled_oracle(path, T1, T2, pools, B0=0.0, axes=(0, 1, 2)):
    """The file's samples by the exact-moment EPG with pools (hard pulses
    at their centres, as oracle() plays them by default)."""
    tl = _Timeline(path)
    epg = _PooledMomentEPG(T1, T2, B0, pools)
    out, now = [], 0.0
    for when, kind, data in tl.events:
        epg.relax(when - now)
        epg.shift(tl.moment(now, when, axes))
        now = when
        if kind == "adc":
            out.append(epg.sample() * np.exp(1j * data))
            continue
        rf = data[0]
        t, w, dt = _rf_cells(rf)
        area = np.sum(w) * dt
        theta = -(rf.phase_offset + 2 * np.pi * rf.freq_offset * rf.center + np.angle(area))
        epg.apply(_rotation((np.cos(theta), np.sin(theta), 0.0), 2 * np.pi * abs(area)))
    return np.array(out)


POOL_B = dict(poolB_fraction=0.15, poolB_exchange=30.0, poolB_T1=800.0, poolB_T2=20.0, poolB_shift=40.0)


def test_keyed_by_moment_plays_exchanging_pools_against_the_pooled_oracle(tmp_path):
    """Crushers of unequal areas (the moment-keyed EPG) with an exchanging
    pool (Bloch–McConnell: exchange, its own relaxation and shift): every
    echo against the exact-moment EPG with the pools' exact exponentials,
    on and off resonance."""
    path = tse_unequal(tmp_path / "unequal.seq", echoes=6)
    sim = Simulator.from_pulseq(path)
    pools = [(POOL_B["poolB_fraction"], POOL_B["poolB_exchange"], POOL_B["poolB_T1"], POOL_B["poolB_T2"],
              POOL_B["poolB_shift"])]
    for B0 in (0.0, 11.0):
        ref = pooled_oracle(path, TISSUE["T1"], TISSUE["T2"], pools, B0=B0, axes=(0, 2))
        got = sim.simulate(**TISSUE, **POOL_B, B0=B0)
        np.testing.assert_allclose(got, ref, atol=TOL, rtol=0, err_msg=f"B0 = {B0}")
    # without exchange the pools are two trains summed by their fractions
    alone = sim.simulate(**TISSUE, **{**POOL_B, "poolB_exchange": 0.0, "poolB_shift": 0.0, "poolB_T1": TISSUE["T1"],
                                      "poolB_T2": TISSUE["T2"]})
    np.testing.assert_allclose(alone, sim.simulate(**TISSUE), atol=1e-6)


NETWORK = dict(exchange_B_bound=30.0, bound_T1D=5.0, bound2_fraction=0.05, bound2_exchange=10.0,
               exchange_bound_bound2=4.0)


@pytest.mark.parametrize("network", [False, True])
@pytest.mark.parametrize("flip", [180.0, 120.0])
def test_keyed_by_moment_plays_pools_as_the_one_order_path(tmp_path, flip, network):
    """A train one order holds, read keyed on request, with an exchanging
    and a semisolid pool (saturated by each pulse's power), and with them
    a network (pair rates, a second semisolid pool, dipolar order): the
    samples and the Jacobian the one-order pooled EPG gives."""
    path = tse(tmp_path / "tse.seq", flip=flip, slice_pos=5.1e-3)
    one, keyed = Simulator.from_pulseq(path), Simulator.from_pulseq(path, dephasing="keyed")
    kw = dict(**TISSUE, **POOL_B, B0=7.0, bound_fraction=0.1, bound_exchange=20.0, B1=np.array([0.9, 1.05]),
              **(NETWORK if network else {}))
    np.testing.assert_allclose(keyed.simulate(**kw), one.simulate(**kw), atol=1e-6)
    names = ["T2", "poolB_exchange", "bound_fraction"] + (["exchange_B_bound", "bound_T1D"] if network else [])
    s1, J1 = one.jacobian(names, **kw)
    s2, J2 = keyed.jacobian(names, **kw)
    np.testing.assert_allclose(s2, s1, atol=1e-6)
    np.testing.assert_allclose(J2, J1, atol=1e-6 * np.abs(J1).max())


def test_keyed_by_moment_says_a_long_call_before_it_runs(tmp_path, monkeypatch, capsys):
    """The cost (states x events x voxels) is known before the run: a call
    expected to pass LONG_CALL_S warns with its estimate, shows its progress
    on stderr, and returns what one call returns."""
    from blochsim.sequence import keyed

    path = tse_unequal(tmp_path / "unequal.seq", echoes=12)
    sim = Simulator.from_pulseq(path)
    T2 = np.linspace(40.0, 120.0, 70)
    quick = sim.simulate(T1=900.0, T2=T2)
    quick_pooled = sim.simulate(T1=900.0, T2=T2[:5], **POOL_B)
    monkeypatch.setattr(keyed, "SECONDS_PER_STATE_EVENT", 1.0)
    with pytest.warns(keyed.SlowCallWarning, match=r"up to [\d,]+ states .* 70 voxels on \d+ threads are expected "
                                                   r"to take about \d+ s"):
        slow = sim.simulate(T1=900.0, T2=T2)
    np.testing.assert_array_equal(slow, quick)
    err = capsys.readouterr().err
    assert "70 of 70 voxels (100 %)" in err and err.count("voxels (") >= 10
    # with pools (one voxel at a time in double precision): likewise
    with pytest.warns(keyed.SlowCallWarning, match=r"5 voxels on \d+ threads"):
        slow = sim.simulate(T1=900.0, T2=T2[:5], **POOL_B)
    np.testing.assert_array_equal(slow, quick_pooled)
    assert "5 of 5 voxels (100 %)" in capsys.readouterr().err


def test_keyed_by_moment_plays_shaped_pulses(tmp_path):
    """rf="shaped" on the moment-keyed EPG: every pulse stepped cell by
    cell, the moments placed where their gradients are (before each
    pulse), against the oracle stepping the same cells."""
    path = tse_unequal(tmp_path / "unequal.seq", echoes=3)
    s = Simulator.from_pulseq(path, rf="shaped", dephasing="keyed").simulate(**TISSUE)
    np.testing.assert_allclose(s, oracle(path, **TISSUE, axes=(0, 2), shaped=True), atol=TOL, rtol=0)


def _diffusion_spin_echo(path, area_z=1000.0, area_x=650.0, gap=5e-3):
    """Hard 90° and 180° pulses; crushers on z and x (one lobe each side of
    the 180°, ``gap`` from it): a Stejskal-Tanner pair on two axes."""
    sys = _system()
    seq = pp.Sequence(sys)
    rf90 = pp.make_block_pulse(np.pi / 2, duration=0.2e-3, system=sys, use="excitation")
    rf180 = pp.make_block_pulse(np.pi, duration=0.2e-3, system=sys, phase_offset=np.pi / 2, use="refocusing")
    cz = pp.make_trapezoid("z", area=area_z, duration=1.2e-3, system=sys)
    cx = pp.make_trapezoid("x", area=area_x, duration=1.2e-3, system=sys)
    seq.add_block(rf90)
    seq.add_block(cz, cx)
    seq.add_block(pp.make_delay(gap))
    seq.add_block(rf180)
    seq.add_block(pp.make_delay(gap))
    seq.add_block(cz, cx)
    seq.add_block(pp.make_adc(1, duration=10e-6, system=sys))
    return _write(seq, path)


def test_keyed_by_moment_diffuses_as_the_gradient_waveform_says(tmp_path):
    """The spin echo's attenuation by D on the moment-keyed EPG against
    b = (2π)² ∫ k(t)² dt of the pathway's moment k(t), integrated from the
    file's gradient waveforms as pypulseq reads them (the 180° negating
    it): the EPG holds each moment from the centroid of the gradient that
    makes it, which is within 3 % of b for lobes short beside their gap."""
    path = _diffusion_spin_echo(tmp_path / "dse.seq")
    tl = _Timeline(path)
    (t90, _, _), (t180, _, _), (tadc, _, _) = tl.events
    t = np.linspace(t90, tadc, 400001)
    b = 0.0
    for a in (0, 1, 2):
        tt, g = tl.grad[a]
        if tt.size == 0:
            continue
        gi = np.interp(t, tt, g, left=0.0, right=0.0)
        k = np.concatenate([[0.0], np.cumsum(0.5 * (gi[1:] + gi[:-1]) * np.diff(t))])
        k = np.where(t < t180, k, k - 2 * np.interp(t180, t, k))
        b += (2 * np.pi) ** 2 * np.sum(0.5 * (k[1:] ** 2 + k[:-1] ** 2) * np.diff(t))
    sim = Simulator.from_pulseq(path, dephasing="keyed")
    D = np.array([0.5, 3.0, 30.0])  # um²/ms
    r = np.abs(sim.simulate(T1=1e6, T2=1e6, D=D)[:, 0] / sim.simulate(T1=1e6, T2=1e6)[0])
    np.testing.assert_allclose(-np.log(r) / (D * 1e-9), b, rtol=0.03)


def _crushed_train(path, echoes=8, ux=200.0, uz=300.0, flip=120.0, ESP=12e-3):
    """Hard (non-selective) 90° and refocusing pulses, crushers on x and z
    whose areas change from echo to echo (x: 3 or 5 ux, z: 2, 3 or 4 uz
    cycles/m), an ADC at each echo and no readout gradient: moments whole
    on a lattice (ux, uz), so that an isochromat grid over one period of
    each axis is exact."""
    sys = _system()
    seq = pp.Sequence(sys)
    rf90 = pp.make_block_pulse(np.pi / 2, duration=0.2e-3, system=sys, phase_offset=np.pi / 2, use="excitation")
    rfr = pp.make_block_pulse(np.radians(flip), duration=0.2e-3, system=sys, use="refocusing")
    adc = pp.make_adc(1, duration=10e-6, system=sys)
    half = 0.5 * (ESP - 2 * 1.2e-3 - pp.calc_duration(rfr)) - 1.2e-3
    seq.add_block(rf90)
    seq.add_block(pp.make_delay(round((ESP / 2 - 1.2e-3 - pp.calc_duration(rf90)) / 1e-5) * 1e-5))
    for e in range(echoes):
        cx = pp.make_trapezoid("x", area=(3, 5)[e % 2] * ux, duration=1.2e-3, system=sys)
        cz = pp.make_trapezoid("z", area=(2, 3, 4)[e % 3] * uz, duration=1.2e-3, system=sys)
        seq.add_block(cx, cz)
        seq.add_block(rfr)
        seq.add_block(cx, cz)
        seq.add_block(pp.make_delay(round(half / 1e-5) * 1e-5))
        seq.add_block(adc)
        seq.add_block(pp.make_delay(round(half / 1e-5) * 1e-5))
    return _write(seq, path)


def isochromat_grid(path, T1, T2, units, B0=0.0):
    """The file's samples by isochromats on a grid over one period of each
    axis of ``units`` (cycles/m; x and z): every moment between events must
    be whole on it, and the grid holds twice the largest order reachable
    plus one per axis, so that no state aliases onto the origin; hard
    rotations at the RF centres, B0 and relaxation between events (SPEC's
    frame), each sample the grid's mean transverse magnetisation."""
    tl = _Timeline(path)
    incs, prev = [], 0.0
    for when, _, _ in tl.events:
        incs.append(tl.moment(prev, when, (0, 2))[[0, 2]] / np.asarray(units))
        prev = when
    incs = np.array(incs)
    n = np.round(incs)
    assert np.allclose(incs, n, atol=1e-6)
    N = 2 * np.abs(n).sum(axis=0).astype(int) + 1
    sx, sz = np.meshgrid(np.arange(N[0]) / N[0], np.arange(N[1]) / N[1], indexing="ij")
    sx, sz = sx.ravel(), sz.ravel()
    M = np.zeros((sx.size, 3))
    M[:, 2] = 1.0
    out, now = [], 0.0
    for (when, kind, data), (nx, nz) in zip(tl.events, n):
        tau = when - now
        e2, e1 = np.exp(-tau / (T2 * 1e-3)), np.exp(-tau / (T1 * 1e-3))
        M[:, :2] *= e2
        M[:, 2] = 1 + (M[:, 2] - 1) * e1
        phi = 2 * np.pi * (nx * sx + nz * sz) - 2 * np.pi * B0 * tau
        fp = (M[:, 0] + 1j * M[:, 1]) * np.exp(1j * phi)
        M[:, 0], M[:, 1] = fp.real, fp.imag
        now = when
        if kind == "adc":
            out.append(np.mean(M[:, 0] + 1j * M[:, 1]) * np.exp(1j * data))
            continue
        rf = data[0]
        t, w, dt = _rf_cells(rf)
        area = np.sum(w) * dt
        theta = -(rf.phase_offset + 2 * np.pi * rf.freq_offset * rf.center + np.angle(area))
        M = M @ _rotation((np.cos(theta), np.sin(theta), 0.0), 2 * np.pi * abs(area)).T
    return np.array(out)


@pytest.mark.parametrize("flip", [120.0, 150.0])
def test_keyed_by_moment_against_an_isochromat_grid(tmp_path, flip):
    """Crushers of unequal areas on two axes played by the moment-keyed EPG
    against isochromats on a grid over the voxel's period on x and z (no
    Fourier states): every sample within 2e-4 of M0, on and off
    resonance."""
    path = _crushed_train(tmp_path / "crushed.seq", flip=flip)
    sim = Simulator.from_pulseq(path, dephasing="keyed")
    for B0 in (0.0, 11.0):
        ref = isochromat_grid(path, **TISSUE, units=(200.0, 300.0), B0=B0)
        np.testing.assert_allclose(sim.simulate(**TISSUE, B0=B0), ref, atol=TOL, rtol=0, err_msg=f"B0 = {B0}")


def test_keyed_by_moment_jacobian_against_central_differences(tmp_path):
    """The moment-keyed EPG's forward-mode Jacobian (duals through the same
    maps) along every tissue property it plays, against central differences
    of its signal, and against the one-order Jacobian on a train both
    play."""
    path = tse_unequal(tmp_path / "unequal.seq", echoes=10)
    sim = Simulator.from_pulseq(path)
    base = dict(T1=900.0, T2=70.0, B1=0.95, B0=7.0, B1phase=10.0, D=2.0, M0=1.3)
    steps = dict(T1=1.0, T2=0.1, B1=1e-3, B0=0.05, B1phase=0.1, D=0.2, M0=1e-3)
    names = list(base)
    s, J = sim.jacobian(names, **{k: np.array([v, v]) for k, v in base.items()})
    np.testing.assert_allclose(s[0], sim.simulate(**base), rtol=1e-6, atol=1e-7)
    for i, name in enumerate(names):
        up, dn = dict(base), dict(base)
        up[name] += steps[name]
        dn[name] -= steps[name]
        fd = (sim.simulate(**up).astype(np.complex128) - sim.simulate(**dn)) / (2 * steps[name])
        np.testing.assert_allclose(J[0, i], fd, atol=2e-4 * np.abs(fd).max() + 1e-7, err_msg=name)
    np.testing.assert_array_equal(J[0], J[1])
    cpmg = tse(tmp_path / "tse.seq", flip=120.0, phase_encode=False)
    kw = dict(**TISSUE, B1=0.9, B0=3.0)
    one = Simulator.from_pulseq(cpmg).jacobian(["T2", "B1", "B0"], **kw)[1]
    keyed = Simulator.from_pulseq(cpmg, dephasing="keyed").jacobian(["T2", "B1", "B0"], **kw)[1]
    np.testing.assert_allclose(keyed, one, atol=1e-5 * np.abs(one).max())


def test_keyed_by_moment_bounds_what_its_pruning_drops(tmp_path, monkeypatch):
    """The bounded pruning's threshold is lowered until the summed bound of
    the states it drops (the largest change of any sample) is at most
    ERROR_BOUND, and the samples move by no more than that bound against a
    program that drops nothing it may need."""
    from blochsim.sequence import keyed

    path = tse_unequal(tmp_path / "unequal.seq", echoes=20)
    sim = Simulator.from_pulseq(path)
    s = sim.simulate(T1=3000.0, T2=300.0)
    prog = [p for _, p in keyed._PROGRAMS.values()][-1]
    assert 0.0 <= prog.error_bound <= keyed.ERROR_BOUND
    stream = [st for st, _ in keyed._PROGRAMS.values()][-1]
    loose = keyed.build(stream, t1_max=3.0, t2_max=0.3, prune=1e-5)
    assert loose.error_bound > prog.error_bound and loose.max_slots < prog.max_slots
    full = keyed.build(stream, t1_max=3.0, t2_max=0.3, prune=0.0)
    assert full.error_bound == 0.0 and full.max_slots >= prog.max_slots
    # the loose program's samples within its bound of the default's
    monkeypatch.setattr(keyed.program_for, "__defaults__", (1e-5, 1.0))
    keyed._PROGRAMS.clear()
    coarse = sim.simulate(T1=3000.0, T2=300.0)
    assert 0 < np.abs(coarse - s).max() <= loose.error_bound + prog.error_bound + 1e-6



def test_keyed_by_moment_drops_only_states_no_readout_can_reach(tmp_path, monkeypatch):
    """The backward pass's pruning (states no later readout can bring back
    to the origin) drops most of a 16-echo train of changing crushers'
    states, and no sample moves: against the program that keeps every
    state within the moments left to play, and against the oracle."""
    from blochsim.sequence import keyed

    path = tse_unequal(tmp_path / "unequal.seq", echoes=16)
    sim = Simulator.from_pulseq(path)
    tissue = dict(T1=3000.0, T2=300.0, B0=7.0)
    s = sim.simulate(**tissue)
    stream = [st for st, _ in keyed._PROGRAMS.values()][-1]
    tight = keyed.build(stream, t1_max=3.0, t2_max=0.3)
    monkeypatch.setattr(keyed, "READABLE_CAP", -1)
    box = keyed.build(stream, t1_max=3.0, t2_max=0.3)
    assert tight.cost < box.cost / 4 and tight.max_slots < box.max_slots / 2
    keyed._PROGRAMS.clear()
    np.testing.assert_allclose(sim.simulate(**tissue), s, atol=1e-6, rtol=0)
    np.testing.assert_allclose(s, oracle(path, **tissue, axes=(0, 2)), atol=TOL, rtol=0)


def test_the_core_refuses_a_keyed_program_past_its_slots(tmp_path):
    """A program's entries and its reach are checked before any block
    plays: a source past the map's slots, a reach that misses slots or the
    origin's Z, are refused, not read."""
    from blochsim import _core
    from blochsim._engine import host as _backend_host
    from blochsim.sequence import keyed

    sim = Simulator.from_pulseq(tse_unequal(tmp_path / "unequal.seq", echoes=6))
    p = sim._protocol_values({})
    s, ps, _, _ = sim._stream_for(p, {"T1", "T2"}, keyed=True)
    arrays, shape = sim._tissue(dict(TISSUE))
    si = _backend_host.si_planes(arrays, shape)
    prog = keyed.program_for("test", s, si, list(_core.TISSUE_FIELDS))
    out = np.empty((1, ps.n_samples), np.complex64)
    _core.forward_host(ps, si, 1, out, 1, program=prog)
    assert prog.reach.size == prog.slots[prog.slots >= 0].sum() and np.all(prog.reach[:1] & 4)
    src = prog.src.copy()
    src[np.flatnonzero(src >= 0)[-1]] = 6 * prog.max_slots
    no_origin_z = prog.reach.copy()
    no_origin_z[0] &= 3
    for bad_src, reach in ((src, prog.reach), (prog.src, prog.reach[:-1]), (prog.src, no_origin_z)):
        bad = keyed.KeyedProgram(prog.slots, prog.first, prog.dst, bad_src, prog.max_slots, 0.0, prog.cost, prog.k2,
                                 prog.k2_first, np.ascontiguousarray(reach))
        with pytest.raises(ValueError):
            _core.forward_host(ps, si, 1, out, 1, program=bad)

def mprage_like(path, n=12, flip=8.0, TR=8e-3, TI=40e-3, inc=117.0):
    """An MPRAGE-like block (the form of pypulseq's MPRAGE examples): a
    non-selective 180° inversion and its spoiler on z, then n RF-spoiled
    gradient echoes whose readout spoiler on x and spoiler on z leave no
    common unit (areas 2.3 readouts and 1.37 of the inversion's spoiler)."""
    sys = _system()
    seq = pp.Sequence(sys)
    inv = pp.make_block_pulse(np.pi, duration=1e-3, system=sys, use="inversion")
    sp_inv = pp.make_trapezoid("z", area=2000.0, duration=2e-3, system=sys)
    rf = pp.make_block_pulse(np.radians(flip), duration=0.2e-3, system=sys, use="excitation")
    gx = pp.make_trapezoid("x", flat_area=64 / 0.25, flat_time=1.28e-3, system=sys)
    adc = pp.make_adc(64, duration=gx.flat_time, delay=gx.rise_time, system=sys)
    gxpre = pp.make_trapezoid("x", area=-gx.area / 2, duration=0.8e-3, system=sys)
    spx = pp.make_trapezoid("x", area=2.3 * gx.area, duration=2.5e-3, system=sys)
    spz = pp.make_trapezoid("z", area=1.37 * 2000.0, duration=2.5e-3, system=sys)
    seq.add_block(inv)
    seq.add_block(sp_inv)
    fill = TI - pp.calc_duration(inv) / 2 - pp.calc_duration(sp_inv) - pp.calc_duration(rf) / 2
    seq.add_block(pp.make_delay(round(fill / 1e-5) * 1e-5))
    used = pp.calc_duration(rf) + pp.calc_duration(gxpre) + pp.calc_duration(gx) + pp.calc_duration(spx, spz)
    for k in range(n):
        phase = np.radians(inc) * k * (k + 1) / 2 % (2 * np.pi)
        rf.phase_offset = phase
        adc.phase_offset = phase
        seq.add_block(rf)
        seq.add_block(gxpre)
        seq.add_block(gx, adc)
        seq.add_block(spx, spz)
        seq.add_block(pp.make_delay(round((TR - used) / 1e-5) * 1e-5))
    return _write(seq, path)


@pytest.mark.parametrize("dephasing", ["moment", "keyed"])
def test_an_mprage_like_block_against_the_exact_moment_epg(tmp_path, dephasing):
    """Inversion, its spoiler and RF-spoiled readouts with spoilers of no
    common unit on two axes: by default (the spoilers spoil exactly) and on
    the moment-keyed EPG, every sample within 2e-4 of M0 of the oracle, at
    two tissues and off resonance."""
    path = mprage_like(tmp_path / "mprage.seq")
    sim = Simulator.from_pulseq(path, dephasing=dephasing)
    for tissue in (TISSUE, dict(T1=1400.0, T2=1200.0)):
        for B0 in (0.0, 9.0):
            np.testing.assert_allclose(sim.simulate(**tissue, B0=B0), oracle(path, **tissue, B0=B0, axes=(0, 2)),
                                       atol=TOL, rtol=0, err_msg=f"{tissue}, B0 = {B0}")
