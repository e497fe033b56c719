"""Reading a Pulseq file's blocks into blochsim operators: the RF events
and their models, the timeline of RF and ADC centres, and the operators
of one playing (the model: :mod:`blochsim.pulseq`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from blochsim._arrays import validate as V
from blochsim.pulseq.dephasing import DEFAULT_VOXEL_M, _Dephasing
from blochsim.pulseq.file import PulseqBlock, PulseqError, _File
from blochsim.sequence import GAMMA_RAD_PER_S_PER_T, Delay, Dephase, Pulse, Readout, RectPulse, Sequence, Spoil
from blochsim.sequence.operators import _Moment

_HZ_PER_UT = GAMMA_RAD_PER_S_PER_T / (2 * np.pi) * 1e-6
_AXES = {"x": 0, "y": 1, "z": 2}


def _trap_moments(amp, rise, flat, fall, delay, t):
    """Moments (cycles/m) of trapezoids [amplitude Hz/m, rise, flat, fall,
    delay, all s] from the block start to times t (s), over arrays."""
    x = t - delay
    r = np.clip(x, 0.0, rise)
    d = np.clip(x - rise - flat, 0.0, fall)
    # a ramp of zero length contributes nothing (and is not divided by)
    m = amp * np.divide(r * r, 2 * rise, out=np.zeros_like(r), where=rise > 0)
    m += amp * np.clip(x - rise, 0.0, flat)
    m += amp * (d - np.divide(d * d, 2 * fall, out=np.zeros_like(d), where=fall > 0))
    return m


@dataclass
class _RF:
    """An RF event: the waveform (Hz, gamma B1 / 2π) at its sample times
    (s from the pulse start), held over raster cells or piecewise linear
    between time points; where it sits in its block; its centre (s from the
    pulse start), frequency (Hz) and phase (rad)."""

    rid: int
    wave: np.ndarray
    times: np.ndarray
    linear: bool
    raster: float
    delay: float
    centre: float
    freq: float
    phase: float
    known: dict = field(default_factory=dict, repr=False)  # what is derived from the waveform, shared

    @property
    def duration(self):
        return float(self.times[-1]) if self.linear else self.wave.size * self.raster

    def _derived(self, name, compute):
        if name not in self.known:
            self.known[name] = compute()
        return self.known[name]

    def area(self):
        """∫ wave dt, cycles (complex)."""
        if self.linear:
            return self._derived("area", lambda: complex(np.sum(0.5 * (self.wave[1:] + self.wave[:-1])
                                                               * np.diff(self.times))))
        return self._derived("area", lambda: complex(np.sum(self.wave) * self.raster))

    def energy(self):
        """∫ |wave|² dt, Hz² s."""
        def compute():
            if self.linear:
                a, b = self.wave[:-1], self.wave[1:]
                return float(np.sum(np.diff(self.times) * (np.abs(a) ** 2 + np.abs(b) ** 2
                                                           + np.real(a * np.conj(b))) / 3))
            return float(np.sum(np.abs(self.wave) ** 2) * self.raster)
        return self._derived("energy", compute)

    def one_phase(self):
        """Whether every non-zero sample has the same phase up to sign (read
        from the phase shape when the event is read, ``_Reader._read_rf``)."""
        return self.known["one_phase"]

    def cells(self):
        """The waveform on the raster: samples at the cell centres (s from
        the pulse start) and their values."""
        if not self.linear:
            return self.times, self.wave

        def compute():
            n = int(round(self.duration / self.raster))
            t = (np.arange(n) + 0.5) * self.raster
            w = np.interp(t, self.times, self.wave.real, left=0.0, right=0.0) + 1j * np.interp(
                t, self.times, self.wave.imag, left=0.0, right=0.0)
            return t, w
        return self._derived("cells", compute)


class _Reader(_Dephasing):
    """Builds the operators of a parsed file."""

    def __init__(self, f: _File, rf_mode, dephasing, axis, unit, field_strength, voxel_size_m=None, periodic=False):
        self.f = f
        self.periodic = periodic
        self.field_strength = None if field_strength is None else float(
            V.protocol_array("field_strength", field_strength, low=0.0, strict=True, unit="T", ndim_max=0))
        if rf_mode not in ("auto", "hard", "shaped"):
            raise ValueError(f"rf must be 'auto', 'hard' or 'shaped', got {rf_mode!r}")
        if not (callable(dephasing) or dephasing in ("moment", "keyed", "spoil")):
            raise ValueError(f"dephasing must be 'moment', 'keyed', 'spoil' or a callable, got {dephasing!r}")
        self.rf_mode, self.dephasing = rf_mode, dephasing
        if isinstance(axis, str):
            if axis not in _AXES:
                raise ValueError(f"axis must be 'x', 'y', 'z' or a 3-vector, got {axis!r}")
            axis = np.eye(3)[_AXES[axis]]
        if axis is not None:
            axis = np.asarray(axis, dtype=np.float64)
            if axis.shape != (3,) or not np.all(np.isfinite(axis)) or np.linalg.norm(axis) == 0:
                raise ValueError(f"axis must be 'x', 'y', 'z' or a non-zero 3-vector, got {axis!r}")
            axis = axis / np.linalg.norm(axis)
        self.axis = axis
        self.unit = None if unit is None else float(
            V.protocol_array("unit", unit, low=0.0, strict=True, unit="cycles/m", ndim_max=0))
        self.voxel = DEFAULT_VOXEL_M if voxel_size_m is None else voxel_size_m
        self.max_samples = None  # shaped pulses on their raster, unless a caller coarsens them
        self._rfs, self._waves = {}, {}
        self._timeline()

    # -- events ------------------------------------------------------------

    def _moment(self, grads, t):
        """Moment vector (cycles/m) of a block's gradients from its start to t (s)."""
        m = np.zeros(3)
        for i, g in enumerate(grads):
            if g is None:
                continue
            _, row = g  # an arbitrary gradient (trapezoids: _trap_moments)
            # 1.3: amp shape delay; 1.4: amp shape time delay; 1.5: amp first last shape time delay
            minor = self.f.version[1]
            amp, sid, tid, delay = ((row[0], int(row[3]), int(row[4]), row[5] * 1e-6) if minor >= 5
                                    else (row[0], int(row[1]), int(row[2]), row[3] * 1e-6) if minor == 4
                                    else (row[0], int(row[1]), 0, row[2] * 1e-6))
            wave = amp * self.f.shape(sid, "a gradient")
            if tid:  # corner points, linear between them
                times = delay + self.f.shape(tid, "a gradient") * self.f.grad_raster
                if t <= times[0]:
                    continue
                xs = np.concatenate([times[times < t], [min(t, times[-1])]])
                ys = np.interp(xs, times, wave)
                m[i] = float(np.sum(0.5 * (ys[1:] + ys[:-1]) * np.diff(xs)))
            else:  # samples held over each raster cell
                r = self.f.grad_raster
                cover = np.clip((t - delay - np.arange(wave.size) * r) / r, 0.0, 1.0)
                m[i] = float(np.sum(wave * r * cover))
        return m

    def _rf(self, rid, block):
        if rid not in self._rfs:
            self._rfs[rid] = self._read_rf(rid, block)
        return self._rfs[rid]

    def _read_rf(self, rid, block):
        r = self.f.row("RF", rid, block)
        raster = self.f.rf_raster
        if self.f.version[1] >= 5:  # amp mag phase time center delay freqPPM phasePPM freq phase
            amp, mag_id, ph_id, time_id, center, delay, freq, phase = (r[0], int(r[1]), int(r[2]), int(r[3]),
                                                                       r[4] * 1e-6, r[5], r[8], r[9])
            if r[7] != 0.0:
                raise PulseqError(f"{self.f.path}: RF {rid} has a phase offset in ppm, which is not read")
            if r[6] != 0.0:  # an offset that scales with the field: fat saturation and the like
                if self.field_strength is None:
                    raise PulseqError(f"{self.f.path}: RF {rid} has a frequency offset of {r[6]:g} ppm: give "
                                      "field_strength (T) to read it")
                freq = freq + r[6] * self.field_strength * _HZ_PER_UT * 1e6 * 1e-6
        elif self.f.version[1] == 4:  # amp mag phase time delay freq phase
            amp, mag_id, ph_id, time_id, delay, freq, phase = r[0], int(r[1]), int(r[2]), int(r[3]), r[4], r[5], r[6]
            center = None
        else:  # 1.3: amp mag phase delay freq phase
            amp, mag_id, ph_id, delay, freq, phase = r[0], int(r[1]), int(r[2]), r[3], r[4], r[5]
            time_id, center = 0, None
        key = (amp, mag_id, ph_id, time_id)
        if key in self._waves:
            wave, times, known = self._waves[key]
            return _RF(rid, wave, times, bool(time_id), raster, delay * 1e-6,
                       self._peak_centre(wave, times, known) if center is None else center, freq, phase, known)
        mag = self.f.shape(mag_id, f"RF {rid}")
        known = {}
        if ph_id:
            ph = self.f.shape(ph_id, f"RF {rid}")
            if ph.size != mag.size:
                raise PulseqError(f"{self.f.path}: RF {rid}: magnitude and phase shapes differ in length")
            # one phase up to sign: the non-zero samples' phases (cycles) differ by multiples of 1/2
            on = mag != 0
            p0 = ph[np.argmax(on)]
            half = 2.0 * (ph - p0)
            whole = np.round(half)
            known["one_phase"] = bool(np.all(np.abs(half - whole)[on] <= 1e-9))
            if known["one_phase"]:
                sign = 1.0 - 2.0 * (whole.astype(np.int64) & 1)
                wave = (amp * sign * mag) * np.exp(2j * np.pi * p0)
            else:
                wave = amp * mag * np.exp(2j * np.pi * ph)
        else:
            wave = (amp * mag).astype(np.complex128)
            known["one_phase"] = True  # real samples: one phase up to sign
        if time_id < 0:
            raise PulseqError(f"{self.f.path}: RF {rid} has time shape {time_id} (oversampled regular sampling), "
                              "which is not read")
        if time_id:
            times = self.f.shape(time_id, f"RF {rid}") * raster
            if times.size != mag.size or np.any(np.diff(times) < 0):
                raise PulseqError(f"{self.f.path}: RF {rid}: its time shape is not {mag.size} increasing times")
        else:
            times = (np.arange(mag.size) + 0.5) * raster
        self._waves[key] = (wave, times, known)
        return _RF(rid, wave, times, bool(time_id), raster, delay * 1e-6,
                   self._peak_centre(wave, times, known) if center is None else center, freq, phase, known)

    @staticmethod
    def _peak_centre(wave, times, known):
        """The centre of a version 1.4 pulse, which the file does not give:
        the peak of the magnitude (the middle of a plateau)."""
        if "peak_centre" not in known:
            a = np.abs(wave)
            peak = a >= np.max(a) * (1 - 1e-5)
            known["peak_centre"] = 0.5 * float(times[peak][0] + times[peak][-1])
        return known["peak_centre"]

    def _timeline(self):
        """Blocks, the RF and ADC events in time order, and the cumulative
        gradient moment at each event's centre (vectorised over blocks)."""
        f = self.f
        B = f.blocks
        self.num = B[:, 0]
        self.dur = f.durations
        self.start = np.concatenate([[0.0], np.cumsum(self.dur)[:-1]])
        self.total = float(np.sum(self.dur))
        self.has_rf, self.has_adc = B[:, 2] != 0, B[:, 6] != 0
        self.has_grad = np.any(B[:, 3:6] != 0, axis=1)
        traps, arbs = f.rows["TRAP"], f.rows["GRADIENTS"]
        top = int(max([0, *traps, *arbs]))
        trap_tab = np.zeros((top + 1, 5))
        kind = np.zeros(top + 1, np.int8)  # 0 none, 1 trapezoid, 2 arbitrary
        for i, r in traps.items():
            trap_tab[i], kind[i] = r, 1
        for i in arbs:
            kind[i] = 2
        ids = B[:, 3:6]
        bad = (ids < 0) | (ids > top)
        bad[~bad] = (ids[~bad] != 0) & (kind[ids[~bad]] == 0)
        if np.any(bad):
            j = int(np.argmax(np.any(bad, axis=1)))
            raise PulseqError(f"{f.path}: block {B[j, 0]} names gradient {ids[j][bad[j]][0]}, which neither [TRAP] "
                              "nor [GRADIENTS] holds")
        self._trap_tab, self._gkind = trap_tab, kind
        area = trap_tab[:, 0] * 1e-6 * (trap_tab[:, 2] + 0.5 * (trap_tab[:, 1] + trap_tab[:, 3]))
        for i, r in arbs.items():
            area[i] = self._moment([("arb", r), None, None], math.inf)[0]
        self.net = area[ids]  # (n, 3)
        # events: RF centres and ADC centres, each (block, time in block)
        ev_b, ev_when, ev_kind, ev_pay = [], [], [], []
        for j in np.flatnonzero(self.has_rf):
            rf = self._rf(int(B[j, 2]), int(B[j, 0]))
            ev_b.append(j)
            ev_when.append(rf.delay + rf.centre)
            ev_kind.append("rf")
            ev_pay.append((rf, bool(self.has_grad[j])))
        adc_cache = {}
        for j in np.flatnonzero(self.has_adc):
            aid = int(B[j, 6])
            if aid not in adc_cache:
                a = f.row("ADC", aid, int(B[j, 0]))
                # 1.4: num dwell delay freq phase; 1.5: num dwell delay freqPPM phasePPM freq phase phase_id
                if f.version[1] >= 5:
                    if a[3] != 0.0 or a[4] != 0.0:
                        raise PulseqError(f"{f.path}: ADC {aid} has an offset in ppm, which is not read")
                    num, dwell, delay, freq, phase = a[0], a[1] * 1e-9, a[2] * 1e-6, a[5], a[6]
                else:
                    num, dwell, delay, freq, phase = a[0], a[1] * 1e-9, a[2] * 1e-6, a[3], a[4]
                half = 0.5 * num * dwell
                adc_cache[aid] = (delay, delay + half, phase + 2 * np.pi * freq * half)
            delay, centre, phase = adc_cache[aid]
            ev_b.append(j)
            ev_when.append(centre)
            ev_kind.append("adc")
            ev_pay.append((phase, delay))
        ev_b = np.asarray(ev_b, dtype=np.int64)
        ev_when = np.asarray(ev_when, dtype=np.float64)
        order = np.lexsort((ev_when, ev_b)) if ev_b.size else np.zeros(0, np.int64)
        self.ev_b, self.ev_when = ev_b[order], ev_when[order]
        self.ev_kind = [ev_kind[i] for i in order]
        self.ev_pay = [ev_pay[i] for i in order]
        late = self.ev_when > self.dur[self.ev_b] + 1e-9
        if np.any(late):
            raise PulseqError(f"{f.path}: block {B[self.ev_b[np.argmax(late)], 0]}: an event's centre lies past the "
                              f"block's end ({self.dur[self.ev_b[np.argmax(late)]] * 1e3:g} ms)")
        cum = np.concatenate([np.zeros((1, 3)), np.cumsum(self.net, axis=0)])
        self.end_moment = cum[-1]
        partial = np.zeros((self.ev_b.size, 3))
        G = ids[self.ev_b]  # (events, 3): each event's block's gradients
        K = kind[G]
        tr = K == 1
        if np.any(tr):
            amp, rise, flat, fall, delay = (trap_tab[G[tr]] * np.array([1, 1e-6, 1e-6, 1e-6, 1e-6])).T
            t = self.ev_when[np.nonzero(tr)[0]]
            partial[tr] = _trap_moments(amp, rise, flat, fall, delay, t)
        for e, ax in zip(*np.nonzero(K == 2)):
            row = [None, None, None]
            row[ax] = ("arb", arbs[int(G[e, ax])])
            partial[e, ax] = self._moment(row, float(self.ev_when[e]))[ax]
        self.points = cum[self.ev_b] + partial
        self.point_block = self.num[self.ev_b]

    @property
    def blocks(self):
        """The blocks as a dephasing handler sees them."""
        return [PulseqBlock(int(self.num[j]), float(self.start[j]), float(self.dur[j]), bool(self.has_rf[j]),
                            bool(self.has_adc[j]), self.net[j].copy()) for j in range(self.num.size)]

    @property
    def events(self):
        """Per block, its events: (time in block, kind, payload)."""
        out = [[] for _ in range(self.num.size)]
        for j, w, k, pay in zip(self.ev_b, self.ev_when, self.ev_kind, self.ev_pay):
            out[j].append((float(w), k, pay if k == "rf" else pay[0]))
        return out

    # -- dephasing ----------------------------------------------------------

    def _hard_ok(self, rf, selective):
        return rf.one_phase() and (selective or rf.freq == 0.0)

    def _rf_ops(self, rf, selective, block):
        """(operators, time from the pulse start at which they begin, their
        duration): the pulse as the RF model plays it."""
        hard = self.rf_mode == "hard" or (self.rf_mode == "auto" and self._hard_ok(rf, selective))
        if hard and not self._hard_ok(rf, selective):
            why = ("its waveform's phase varies (adiabatic, frequency or phase modulated)" if not rf.one_phase()
                   else f"it is {rf.freq:g} Hz off resonance without a gradient")
            raise PulseqError(f"{self.f.path}: block {block}: RF {rf.rid} cannot be played as a hard pulse: {why}; "
                              "read with rf='shaped' or 'auto'")
        # the file's phase at time t from the pulse start: phase + 2 pi freq t; SPEC's is its negative
        centre_phase = rf.phase + 2 * np.pi * rf.freq * rf.centre
        if hard:
            area = rf.area()
            flip = np.degrees(2 * np.pi * abs(area))
            energy = rf.energy()
            power = energy * rf.duration / abs(area) ** 2 if area != 0 else 1.0
            ph = -np.degrees(centre_phase + np.angle(area))
            return [Pulse(flip, ph, rf.duration * 1e3, 0.0 if selective else rf.freq, power)], rf.centre, 0.0
        t, w = rf.cells()
        dwell = rf.raster
        coarse = bool(self.max_samples and w.size > self.max_samples) and not selective
        if coarse:
            # averaged over groups of k cells, each group then an exact rectangle (RF, off-resonance and
            # relaxation together): each group's area kept, its samples' detail not
            k = -(-w.size // self.max_samples)
            pad = (-w.size) % k
            w = np.concatenate([w, np.zeros(pad, w.dtype)]).reshape(-1, k).mean(axis=1)
            t = t[0] - 0.5 * dwell + (np.arange(w.size) + 0.5) * k * dwell
            dwell = k * dwell
        freq = 0.0 if selective else rf.freq
        ops = []
        # runs of equal samples (a pulse without a gradient plays each run as one exact rectangle)
        edges = np.arange(w.size + 1) if selective else np.concatenate(
            [[0], np.flatnonzero(w[1:] != w[:-1]) + 1, [w.size]])
        for i, j in zip(edges[:-1].tolist(), edges[1:].tolist()):
            # the file's phase at the start of the run (a RectPulse) or at the sample's centre (a rotation)
            if selective:
                base = centre_phase
            else:
                base = rf.phase + 2 * np.pi * rf.freq * (t[i] - (0.5 * dwell if j - i > 1 or coarse else 0.0))
            ph = -math.degrees(base + np.angle(w[i]))
            if j - i > 1 or coarse:
                d = (j - i) * dwell
                ops.append(RectPulse(360.0 * abs(w[i]) * d, d * 1e3, ph, freq) if w[i] != 0 else Delay(d * 1e3))
            else:
                half = Delay(0.5 * dwell * 1e3)
                ops += [half, Pulse(360.0 * abs(w[i]) * dwell, ph, dwell * 1e3, freq, 1.0), half]
        start = float(t[0] - 0.5 * dwell)
        return ops, start, w.size * dwell

    def ops(self):
        if self.dephasing in ("moment", "keyed"):
            return self._moment_ops()
        self.unit_vector = np.zeros(3)
        ops, e, before, wrap = [], 0, None, 0
        for b, evs in zip(self.blocks, self.events):
            cursor = 0.0  # time in the block the operators have reached
            for when, kind, payload in evs:
                shift = [] if before is None or not before[e] else (
                    [Spoil()] if before[e] == "spoil" else [Dephase(int(before[e]))])
                e += 1
                if kind == "adc":
                    ops += [Delay(1e3 * (when - cursor))] + shift + [Readout(-np.degrees(payload))]
                    cursor = when
                    continue
                rf, selective = payload
                pulse, begin, length = self._rf_ops(rf, selective, b.index)
                at = rf.delay + begin
                if at < cursor - 1e-9:
                    raise PulseqError(f"{self.f.path}: block {b.index}: RF {rf.rid} overlaps the block's ADC "
                                      "centre, which blochsim cannot play")
                ops += [Delay(1e3 * max(at - cursor, 0.0))] + shift + pulse
                cursor = max(at, cursor) + length
            rest = b.duration - cursor
            if rest < -1e-9:
                raise PulseqError(f"{self.f.path}: block {b.index}: its events run past its duration "
                                  f"({b.duration * 1e3:g} ms)")
            ops.append(Delay(1e3 * max(rest, 0.0)))
            if self.dephasing == "spoil":
                if not b.rf and not b.adc and np.any(np.abs(b.moment) > 0):
                    ops.append(Spoil())
            elif callable(self.dephasing):
                k = self.dephasing(b)
                if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
                    raise TypeError(f"the dephasing handler must return an int for block {b.index}, got {k!r}")
                if k:
                    ops.append(Dephase(int(k)))
        if wrap:
            ops.append(Spoil() if wrap == "spoil" else Dephase(int(wrap)))
        return [op for op in ops if not (isinstance(op, Delay) and op.duration == 0.0)]


    def _shift_times(self):
        """For each event, the time (s) at which the moment since the
        previous event is applied: the centroid of that moment's magnitude
        along the dephasing direction over the blocks (or parts of blocks)
        that carry it, so that the shift sits on the crusher or spoiler
        that makes it.  (The EPG's gradients are instantaneous; D and v act
        on each order for the time it holds.)"""
        n = len(self.ev_kind)
        at = self.start[self.ev_b] + self.ev_when if n else np.zeros(0)
        u = self.unit_vector
        keyed = getattr(self, "keyed_axes", None)
        if keyed is not None and np.any(keyed):
            # the moment-keyed EPG: the magnitude summed over the axes it follows
            weight = keyed.astype(np.float64)

            def along(x):
                return np.abs(x) @ weight
        else:
            norm = math.hypot(*u.tolist())
            if n < 2 or not (0.0 < norm < math.inf):
                return at
            d = u / norm
            weight = np.abs(d)

            def along(x):
                return np.abs(x @ d)
        if n < 2:
            return at
        # per block: its moment along the direction and where it sits (the trapezoids' centroids)
        parts = np.abs(self.net) * weight  # (blocks, 3)
        w = parts.sum(axis=1)
        ids = self.f.blocks[:, 3:6]
        r, f, fa, dl = (self._trap_tab[:, i] * 1e-6 for i in (1, 2, 3, 4))
        with np.errstate(divide="ignore", invalid="ignore"):
            centroid = dl + (r * r / 3 + f * (r + 0.5 * f) + 0.5 * fa * (r + f + fa / 3)) / (
                0.5 * r + f + 0.5 * fa)
        centroid = np.where(self._gkind == 1, np.where(np.isfinite(centroid), centroid, 0.0), np.nan)
        c = centroid[ids]  # (blocks, 3), nan for arbitrary gradients and none
        c = np.where(np.isnan(c), 0.5 * self.dur[:, None], c)
        with np.errstate(divide="ignore", invalid="ignore"):
            inside = np.where(w > 0, np.sum(parts * c, axis=1) / w, 0.5 * self.dur)
        mid = self.start + inside
        W = np.concatenate([[0.0], np.cumsum(w)])
        WT = np.concatenate([[0.0], np.cumsum(w * mid)])
        part = self.points - (np.concatenate([np.zeros((1, 3)), np.cumsum(self.net, axis=0)])[self.ev_b])
        before = along(part)  # from the event's block start to the event
        after = along(self.net[self.ev_b] - part)  # from the event to its block's end
        end = self.start[self.ev_b] + self.dur[self.ev_b]
        j0, j1 = self.ev_b[:-1], self.ev_b[1:]
        wt = (after[:-1] * 0.5 * (at[:-1] + end[:-1]) + before[1:] * 0.5 * (self.start[j1] + at[1:])
              + WT[j1] - WT[np.minimum(j0 + 1, j1)])
        ws = after[:-1] + before[1:] + W[j1] - W[np.minimum(j0 + 1, j1)]
        out = at.copy()
        # within one block, or no moment: at the event
        use = (j0 != j1) & (ws > 0)
        out[1:][use] = wt[use] / ws[use]
        return out

    def _moment_ops(self):
        """The operators with shifts from the moments: one pass over the
        events in time order (delays between them merge, as the event
        stream would merge them)."""
        before, wrap, self.unit_vector = self._shifts()
        when = self._shift_times()
        ops, cursor = [], 0.0  # the time the operators have reached, s from the file's start
        pulses = {}
        blocks = self.ev_b.tolist()
        starts = self.start[self.ev_b].tolist()
        event_at = (self.start[self.ev_b] + self.ev_when).tolist()
        ends = (self.start + self.dur)[self.ev_b].tolist()
        when = when.tolist()
        for e, kind in enumerate(self.ev_kind):
            j, t0 = blocks[e], starts[e]
            k = before[e]
            shift = []
            if k:
                # the shift where the interval's gradients are (what D and v see), at latest the event
                t_shift = min(max(when[e], cursor), event_at[e])
                ops.append(Delay(1e3 * (t_shift - cursor)))
                cursor = t_shift
                shift = ([Spoil()] if k == "spoil" else [_Moment(k, self.keyed_step)] if isinstance(k, tuple)
                         else [Dephase(int(k))])
            if kind == "adc":
                at = event_at[e]
                if at < cursor - 1e-9:
                    raise PulseqError(f"{self.f.path}: block {self.num[j]}: its ADC centre falls inside an RF "
                                      "pulse, which blochsim cannot play")
                ops += shift + [Delay(1e3 * max(at - cursor, 0.0)), Readout(-math.degrees(self.ev_pay[e][0]))]
                cursor = max(at, cursor)
                continue
            rf, selective = self.ev_pay[e]
            key = (rf.rid, selective)
            if key not in pulses:
                pulses[key] = self._rf_ops(rf, selective, int(self.num[j]))
            pulse, begin, length = pulses[key]
            at = t0 + rf.delay + begin
            if at < cursor - 1e-9:
                raise PulseqError(f"{self.f.path}: block {self.num[j]}: RF {rf.rid} overlaps the block's ADC "
                                  "centre, which blochsim cannot play")
            ops += shift + [Delay(1e3 * max(at - cursor, 0.0))] + pulse
            cursor = max(at, cursor) + length
            if cursor > ends[e] + 1e-9:
                raise PulseqError(f"{self.f.path}: block {self.num[j]}: its events run past its duration "
                                  f"({self.dur[j] * 1e3:g} ms)")
        ops.append(Delay(1e3 * max(self.total - cursor, 0.0)))
        if wrap:
            ops.append(Spoil() if wrap == "spoil" else _Moment(wrap, self.keyed_step) if isinstance(wrap, tuple)
                       else Dephase(int(wrap)))
        return [op for op in ops if not (isinstance(op, Delay) and op.duration == 0.0)]


def _field_strength(f, field_strength):
    if field_strength is None and "B0" in f.defs:
        try:
            return float(f.defs["B0"][0])
        except (ValueError, IndexError):
            raise PulseqError(f"{f.path}: [DEFINITIONS] B0 is not a number") from None
    return field_strength


def read_pulseq(path, rf="auto", dephasing="moment", axis=None, unit=None, field_strength=None,
                voxel_size_m=None, periodic=False) -> Sequence:
    """The operators of a Pulseq file (see the module's notes for what is
    read and how).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.seq`` file (format 1.4 or 1.5).
    rf : {"auto", "hard", "shaped"}
        Each RF event as a hard pulse at its centre, played from its
        waveform, or hard where that is exact for the slice-centre spin and
        shaped otherwise (default).
    dephasing : {"moment", "keyed", "spoil"} or callable
        How gradients become EPG shifts: whole numbers of the moments'
        common unit, on one EPG order (default; where one order cannot hold
        them, several axes that dephase independently or moments with no
        common unit, the states are keyed by their 3-D moment instead, as
        ``"keyed"`` does); states keyed by their moment vector on a lattice
        of 1e-3 cycles across the voxel per axis (``"keyed"``: the
        moment-keyed EPG of :mod:`blochsim.sequence.keyed`); ideal spoiling by
        blocks with a net moment and no RF or ADC; or ``dephasing(block) ->
        int`` shifts at the end of each :class:`PulseqBlock`.
    axis : {"x", "y", "z"} or array_like, shape (3,), optional
        Follow the moment along this direction alone.
    unit : float, cycles/m, optional
        Moment of one shift (checked: a moment that is not a whole number
        of it is refused).
    field_strength : float, T, optional
        Needed for RF frequency offsets given in ppm (format 1.5; default:
        the file's ``B0`` definition if it has one).
    voxel_size_m : float, m, optional
        The voxel the moments dephase: a moment is a whole number of the
        unit when its remainder puts under 1e-3 cycles across it.
    periodic : bool, optional
        The file is played again after its end (``repetitions``): the
        moment from its last RF or ADC event round to its first counts too.

    Returns
    -------
    Sequence
    """
    return _read(path, rf, dephasing, axis, unit, field_strength, voxel_size_m, periodic)[0]


def _read(path, rf, dephasing, axis, unit, field_strength, voxel_size_m, periodic):
    f = _File(path)
    reader = _Reader(f, rf, dephasing, axis, unit, _field_strength(f, field_strength), voxel_size_m, periodic)
    return Sequence(reader.ops()), reader.unit_vector
