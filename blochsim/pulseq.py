"""Reading Pulseq sequence files (Layton et al. 2017, MRM 77:1544; the
open file format of pulseq.github.io, versions 1.4 and 1.5) into blochsim
operators: :meth:`blochsim.Simulator.from_pulseq`.

What is read, and the limits of the model
------------------------------------------
- Blocks play in order for their durations (``BlockDurationRaster``).
- RF events become a hard :class:`Pulse` at the pulse centre (``rf="hard"``,
  the default: the flip is 2π·amplitude·|∫shape dt|, the phase the event's
  phase plus the shape's mean phase), or the waveform played sample by
  sample (``rf="shaped"``, :class:`SampledPulse`, its frequency offset as a
  phase ramp).  An RF event in a block with a gradient is slice selective:
  its frequency offset places the slice, and the simulated spin sits at the
  slice centre, so it plays on resonance.  Without a gradient the offset is
  the spins' (fat saturation, MT): in hard mode such a pulse leaves water
  alone and only saturates a semisolid pool (:class:`Saturation`); play it
  shaped to rotate water off resonance.  Offsets in ppm (format 1.5) need
  the field strength (``field_strength`` or the file's ``B0`` definition);
  phase offsets in ppm are refused.
- ADC events become one :class:`Readout` each, at the ADC centre (the
  k-space centre), with the ADC's phase offset: one sample per ADC.
- Gradients decide the dephasing (the EPG is one-dimensional).  With
  ``dephasing="moment"`` the gradient moment along one ``axis`` (default:
  the axis whose blocks without RF or ADC carry the most net moment) is
  integrated; at each RF centre and ADC centre the moment since the last
  one becomes that many shifts of ``unit`` (default: the largest net moment
  of one such block, the spoiler or crusher), the rounding remainder
  carried on.  Moments on the other axes are taken as balanced.  With
  ``dephasing="spoil"`` a block with net moment and no RF or ADC spoils
  ideally.  A callable ``dephasing(block)`` receives a :class:`PulseqBlock`
  and returns the shifts (an int) applied at the block's end.
- Not read: extensions (labels, triggers, rotations), the gradients' effect
  on B0 (eddy currents, concomitant fields), slice profiles (use
  ``rf="shaped"`` at one position, or ``slice_profile``), ADC dwell and
  sample count beyond locating the centre, soft delays.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from blochsim.sequence import (GAMMA_RAD_PER_S_PER_T, Delay, Dephase, Pulse, Readout, SampledPulse, Saturation,
                               Sequence, Spoil)
from blochsim import _validate as V
from blochsim.simulator import Simulator

_HZ_PER_UT = GAMMA_RAD_PER_S_PER_T / (2 * np.pi) * 1e-6
_AXES = {"x": 0, "y": 1, "z": 2}


@dataclass
class PulseqBlock:
    """One block of a Pulseq file, as a dephasing handler sees it.

    Attributes
    ----------
    index : int
        Block number in the file (from 1).
    start, duration : float, s
    rf, adc : bool
        Whether the block holds an RF or ADC event.
    moment : numpy.ndarray, shape (3,), cycles/m
        Net gradient moment (x, y, z) of the block.
    """

    index: int
    start: float
    duration: float
    rf: bool
    adc: bool
    moment: np.ndarray = field(default_factory=lambda: np.zeros(3))


class PulseqError(ValueError):
    """A Pulseq file blochsim cannot read; the message names the file and the line."""


def decompress_shape(values, n):
    """Samples of a Pulseq shape from its stored form.

    Stored with as many values as samples, the values are the samples;
    otherwise they are the run-length-encoded derivative: a value given
    twice in a row is followed by the count of its further repetitions,
    and the samples are the cumulative sum.

    Parameters
    ----------
    values : array_like
        The numbers stored after ``num_samples``.
    n : int
        ``num_samples``.

    Returns
    -------
    numpy.ndarray, float64, shape (n,)
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size == n:
        return v.copy()
    out, i = [], 0
    while i < v.size:
        if i + 1 < v.size and v[i] == v[i + 1]:
            if i + 2 >= v.size:
                raise ValueError("a repeated value ends the shape without its count")
            count = int(round(v[i + 2]))
            out.extend([v[i]] * (count + 2))
            i += 3
        else:
            out.append(v[i])
            i += 1
    if len(out) != n:
        raise ValueError(f"the shape decompresses to {len(out)} samples, not num_samples = {n}")
    return np.cumsum(out)


class _File:
    """The sections of a Pulseq file, parsed."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"no Pulseq file at {self.path!r}")
        self.version = None
        self.defs = {}
        self.blocks, self.rf, self.trap, self.grad, self.adc, self.shapes = [], {}, {}, {}, {}, {}
        section, shape_id, shape_n, shape_vals = None, None, None, []
        with open(self.path) as f:
            lines = f.read().splitlines()
        ver = {}
        for number, raw in enumerate(lines, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("["):
                if section == "SHAPES" and shape_id is not None:
                    self._end_shape(shape_id, shape_n, shape_vals, number)
                    shape_id = None
                section = line.strip("[]").strip().upper()
                continue
            tok = line.split()
            try:
                if section == "VERSION":
                    ver[tok[0]] = int(tok[1])
                elif section == "DEFINITIONS":
                    self.defs[tok[0]] = tok[1:]
                elif section == "BLOCKS":
                    self.blocks.append([int(t) for t in tok])
                elif section == "RF":
                    # version 1.5 ends the row with a letter (the pulse's use)
                    self.rf[int(tok[0])] = [float(t) for t in tok[1:] if not t.isalpha()]
                elif section == "TRAP":
                    self.trap[int(tok[0])] = [float(t) for t in tok[1:]]
                elif section == "GRADIENTS":
                    self.grad[int(tok[0])] = [float(t) for t in tok[1:]]
                elif section == "ADC":
                    self.adc[int(tok[0])] = [float(t) for t in tok[1:]]
                elif section == "SHAPES":
                    if tok[0] == "shape_id":
                        if shape_id is not None:
                            self._end_shape(shape_id, shape_n, shape_vals, number)
                        shape_id, shape_n, shape_vals = int(tok[1]), None, []
                    elif tok[0] == "num_samples":
                        shape_n = int(tok[1])
                    else:
                        shape_vals.append(float(tok[0]))
            except (ValueError, IndexError):
                raise PulseqError(f"{self.path}, line {number}: cannot read {raw.strip()!r} in [{section}]") from None
        if section == "SHAPES" and shape_id is not None:
            self._end_shape(shape_id, shape_n, shape_vals, len(lines))
        if "major" not in ver or "minor" not in ver:
            raise PulseqError(f"{self.path}: no [VERSION] section with major and minor")
        self.version = (ver["major"], ver["minor"])
        if self.version[0] != 1 or self.version[1] not in (4, 5):
            raise PulseqError(f"{self.path}: Pulseq version {ver['major']}.{ver['minor']} is not read "
                              "(versions 1.4 and 1.5 are)")
        if not self.blocks:
            raise PulseqError(f"{self.path}: no [BLOCKS]")
        self.block_raster = self._def("BlockDurationRaster", 1e-5)
        self.grad_raster = self._def("GradientRasterTime", 1e-5)
        self.rf_raster = self._def("RadiofrequencyRasterTime", 1e-6)

    def _def(self, name, default):
        return float(self.defs[name][0]) if name in self.defs else default

    def _end_shape(self, sid, n, vals, number):
        if n is None:
            raise PulseqError(f"{self.path}, line {number}: shape {sid} has no num_samples")
        try:
            self.shapes[sid] = decompress_shape(vals, n)
        except ValueError as e:
            raise PulseqError(f"{self.path}: shape {sid}: {e}") from None

    def shape(self, sid, what):
        if sid not in self.shapes:
            raise PulseqError(f"{self.path}: {what} names shape {sid}, which [SHAPES] does not hold")
        return self.shapes[sid]


def _trap_moment(row, t):
    """Moment (cycles/m) of a trapezoid [amplitude Hz/m, rise, flat, fall,
    delay µs] from the block start to time t (s)."""
    amp, rise, flat, fall, delay = row[0], row[1] * 1e-6, row[2] * 1e-6, row[3] * 1e-6, row[4] * 1e-6
    x = t - delay
    if x <= 0:
        return 0.0
    m = 0.0
    r = min(x, rise)
    m += amp * r * r / (2 * rise) if rise > 0 else 0.0
    x -= rise
    if x <= 0:
        return m
    m += amp * min(x, flat)
    x -= flat
    if x <= 0:
        return m
    d = min(x, fall)
    m += amp * (d - d * d / (2 * fall)) if fall > 0 else 0.0
    return m


class _Reader:
    """Builds the operators of a parsed file."""

    def __init__(self, f: _File, rf_mode, dephasing, axis, unit, field_strength):
        self.f = f
        self.field_strength = None if field_strength is None else float(
            V.protocol_array("field_strength", field_strength, low=0.0, strict=True, unit="T", ndim_max=0))
        if rf_mode not in ("hard", "shaped"):
            raise ValueError(f"rf must be 'hard' or 'shaped', got {rf_mode!r}")
        if not (callable(dephasing) or dephasing in ("moment", "spoil")):
            raise ValueError(f"dephasing must be 'moment', 'spoil' or a callable, got {dephasing!r}")
        self.rf_mode, self.dephasing = rf_mode, dephasing
        self.blocks = self._blocks()
        if isinstance(axis, str):
            if axis not in _AXES:
                raise ValueError(f"axis must be 'x', 'y', 'z' or a 3-vector, got {axis!r}")
            axis = np.eye(3)[_AXES[axis]]
        if axis is None:
            free = [b.moment for b in self.blocks if not b.rf and not b.adc]
            axis = np.eye(3)[int(np.argmax(np.sum(np.abs(free), axis=0)))] if free else np.eye(3)[2]
        axis = np.asarray(axis, dtype=np.float64)
        if axis.shape != (3,) or not np.all(np.isfinite(axis)) or np.linalg.norm(axis) == 0:
            raise ValueError(f"axis must be 'x', 'y', 'z' or a non-zero 3-vector, got {axis!r}")
        self.axis = axis / np.linalg.norm(axis)
        if unit is None:
            free = [abs(float(b.moment @ self.axis)) for b in self.blocks if not b.rf and not b.adc]
            unit = max(free) if free else 0.0
        unit = float(V.protocol_array("unit", unit, low=0.0, unit="cycles/m", ndim_max=0))
        if dephasing == "moment" and not unit > 0:
            raise ValueError(f"{f.path}: no gradient moment to dephase by: give unit (cycles/m) or "
                             "dephasing='spoil' or a callable")
        self.unit = unit

    def _grad_rows(self, row):
        """The block's gradient events (x, y, z): ('trap', row), ('arb', row) or None."""
        out = []
        for gid in row[3:6]:
            if gid == 0:
                out.append(None)
            elif gid in self.f.trap:
                out.append(("trap", self.f.trap[gid]))
            elif gid in self.f.grad:
                out.append(("arb", self.f.grad[gid]))
            else:
                raise PulseqError(f"{self.f.path}: block {row[0]} names gradient {gid}, which no section holds")
        return out

    def _moment(self, grads, t):
        """Moment vector (cycles/m) of a block's gradients from its start to t (s)."""
        m = np.zeros(3)
        for i, g in enumerate(grads):
            if g is None:
                continue
            kind, row = g
            if kind == "trap":
                m[i] = _trap_moment(row, t)
            else:
                # 1.4: amp shape time delay; 1.5: amp first last shape time delay
                amp, sid, tid, delay = ((row[0], int(row[3]), int(row[4]), row[5] * 1e-6) if self.f.version[1] >= 5
                                        else (row[0], int(row[1]), int(row[2]), row[3] * 1e-6))
                wave = amp * self.f.shape(sid, "a gradient")
                if tid:  # corner points, linear between them
                    times = delay + self.f.shape(tid, "a gradient") * self.f.grad_raster
                    if t <= times[0]:
                        continue
                    xs = np.concatenate([times[times < t], [min(t, times[-1])]])
                    ys = np.interp(xs, times, wave)
                    m[i] = float(np.sum(0.5 * (ys[1:] + ys[:-1]) * np.diff(xs)))
                else:  # samples held over each raster interval
                    r = self.f.grad_raster
                    cover = np.clip((t - delay - np.arange(wave.size) * r) / r, 0.0, 1.0)
                    m[i] = float(np.sum(wave * r * cover))
        return m

    def _blocks(self):
        out, t = [], 0.0
        self._rows = []
        for row in self.f.blocks:
            if len(row) < 7:
                raise PulseqError(f"{self.f.path}: block {row[0] if row else '?'} has {len(row)} fields, "
                                  "expected 8 (NUM DUR RF GX GY GZ ADC EXT)")
            dur = row[1] * self.f.block_raster
            grads = self._grad_rows(row)
            b = PulseqBlock(row[0], t, dur, row[2] != 0, row[6] != 0, self._moment(grads, np.inf))
            out.append(b)
            self._rows.append((row, grads))
            t += dur
        return out

    def _rf(self, rid, index):
        """An RF event: its waveform (Hz, gamma B1 / 2 pi) with the sample
        times and widths from the pulse start, start and end in the block,
        centre, frequency offset (Hz) and phase (rad)."""
        if rid not in self.f.rf:
            raise PulseqError(f"{self.f.path}: block {index} names RF {rid}, which [RF] does not hold")
        r = self.f.rf[rid]
        v15 = self.f.version[1] >= 5
        if len(r) < (10 if v15 else 7):
            raise PulseqError(f"{self.f.path}: RF {rid} has {len(r)} fields, too few for version "
                              f"{self.f.version[0]}.{self.f.version[1]}")
        if v15:  # amp mag phase time center delay freqPPM phasePPM freq phase
            amp, mag_id, ph_id, time_id, center, delay, freq, phase = (r[0], int(r[1]), int(r[2]), int(r[3]),
                                                                       r[4], r[5], r[8], r[9])
            if r[7] != 0.0:
                raise PulseqError(f"{self.f.path}: RF {rid} has a phase offset in ppm, which is not read")
            if r[6] != 0.0:  # an offset that scales with the field: fat saturation and the like
                if self.field_strength is None:
                    raise PulseqError(f"{self.f.path}: RF {rid} has a frequency offset of {r[6]:g} ppm: give "
                                      "field_strength (T) to read it")
                freq = freq + r[6] * 1e-6 * self.field_strength * _HZ_PER_UT * 1e6
        else:  # amp mag phase time delay freq phase
            amp, mag_id, ph_id, time_id, delay, freq, phase = r[0], int(r[1]), int(r[2]), int(r[3]), r[4], r[5], r[6]
            center = None
        mag = self.f.shape(mag_id, f"RF {rid}")
        ph = self.f.shape(ph_id, f"RF {rid}") if ph_id else np.zeros_like(mag)
        if ph.size != mag.size:
            raise PulseqError(f"{self.f.path}: RF {rid}: magnitude and phase shapes differ in length")
        raster = self.f.rf_raster
        if time_id:
            times = self.f.shape(time_id, f"RF {rid}") * raster
            dt = np.diff(np.concatenate([times, [times[-1] + raster]]))
        else:
            dt = np.full(mag.size, raster)
            times = (np.arange(mag.size) + 0.5) * raster
        if center is None:  # version 1.4: the peak of the magnitude (the middle of a plateau)
            peak = np.abs(mag) >= np.max(np.abs(mag)) * (1 - 1e-9)
            center = 1e6 * float(np.mean(times[peak]))
        start = delay * 1e-6
        return dict(wave_hz=amp * mag * np.exp(2j * np.pi * ph), times=times, dt=dt, start=start,
                    end=start + float(times[-1] + 0.5 * dt[-1]), centre=start + center * 1e-6, freq=freq,
                    phase=phase)

    def ops(self):
        ops = []
        carried = 0.0  # the moment along the axis not yet turned into shifts, cycles/m
        last = 0.0  # where the carried moment was last brought up to date
        for b, (row, grads) in zip(self.blocks, self._rows):
            events = []  # (time in the block, kind, payload)
            if row[2]:
                rf = self._rf(row[2], row[0])
                if any(g is not None for g in grads):
                    # slice selective: the offset places the slice, and the simulated spin sits at its centre
                    rf["freq"] = 0.0
                events.append(("rf", rf))
            if row[6]:
                if row[6] not in self.f.adc:
                    raise PulseqError(f"{self.f.path}: block {row[0]} names ADC {row[6]}, which [ADC] does not hold")
                a = self.f.adc[row[6]]
                # 1.4: num dwell delay freq phase; 1.5: num dwell delay freqPPM phasePPM freq phase phase_id
                num, dwell_ns, delay_us, phase = a[0], a[1], a[2], a[6] if self.f.version[1] >= 5 else a[4]
                if self.f.version[1] >= 5 and a[4] != 0.0:
                    raise PulseqError(f"{self.f.path}: ADC {row[6]} has a phase offset in ppm, which is not read")
                events.append(("adc", dict(centre=delay_us * 1e-6 + 0.5 * num * dwell_ns * 1e-9, phase=phase)))
            events.sort(key=lambda e: e[1]["centre"])
            cursor = 0.0  # time in the block the operators have reached
            for kind, ev in events:
                if self.dephasing == "moment":
                    carried += float(self._moment(grads, ev["centre"]) @ self.axis) - last
                    last = float(self._moment(grads, ev["centre"]) @ self.axis)
                    k = int(np.round(carried / self.unit))
                    carried -= k * self.unit
                    shift = [Dephase(k)] if k else []
                else:
                    shift = []
                if kind == "adc":
                    ops += [Delay(1e3 * (ev["centre"] - cursor))] + shift + [Readout(np.degrees(ev["phase"]))]
                    cursor = ev["centre"]
                elif self.rf_mode == "hard":
                    area = np.sum(ev["wave_hz"] * ev["dt"])  # cycles
                    flip, ph = np.degrees(2 * np.pi * abs(area)), np.degrees(ev["phase"] + np.angle(area))
                    dur_ms = 1e3 * (ev["end"] - ev["start"])
                    power = float(np.sum(np.abs(ev["wave_hz"]) ** 2 * ev["dt"]) * (ev["end"] - ev["start"])
                                  / abs(area) ** 2) if area != 0 else 1.0
                    pulse = (Saturation(flip, dur_ms, ev["freq"], power) if ev["freq"] != 0.0
                             else Pulse(flip, ph, dur_ms, 0.0, power))
                    ops += [Delay(1e3 * (ev["centre"] - cursor))] + shift + [pulse]
                    cursor = ev["centre"]
                else:
                    wave_uT = ev["wave_hz"] * np.exp(2j * np.pi * ev["freq"] * ev["times"]) / _HZ_PER_UT
                    step = ev["dt"]
                    if not np.allclose(step, step[0]):
                        raise PulseqError(f"{self.f.path}: block {row[0]}: rf='shaped' needs an evenly sampled "
                                          "RF waveform")
                    pulse = SampledPulse(wave_uT, step[0] * 1e6, np.degrees(ev["phase"]))
                    ops += [Delay(1e3 * max(ev["start"] - cursor, 0.0))] + shift + [pulse]
                    cursor = max(cursor, ev["start"]) + pulse.duration * 1e-3
            rest = b.duration - cursor
            if rest < -1e-9:
                raise PulseqError(f"{self.f.path}: block {row[0]}: its events run past its duration "
                                  f"({b.duration * 1e3:g} ms)")
            ops.append(Delay(1e3 * max(rest, 0.0)))
            if self.dephasing == "moment":
                carried += float(b.moment @ self.axis) - last
                last = 0.0
            elif self.dephasing == "spoil":
                if not b.rf and not b.adc and np.any(np.abs(b.moment) > 0):
                    ops.append(Spoil())
            else:
                k = self.dephasing(b)
                if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
                    raise TypeError(f"the dephasing handler must return an int for block {b.index}, got {k!r}")
                if k:
                    ops.append(Dephase(int(k)))
        return [op for op in ops if not (isinstance(op, Delay) and op.duration == 0.0)]


_CACHE = {}


def read_pulseq(path, rf="hard", dephasing="moment", axis=None, unit=None, field_strength=None) -> Sequence:
    """The operators of a Pulseq file (see the module's notes for what is
    read and how).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.seq`` file (format 1.4 or 1.5).
    rf : {"hard", "shaped"}
        Each RF event as a hard pulse at its centre, or played sample by
        sample.
    dephasing : {"moment", "spoil"} or callable
        How gradients become EPG shifts: the moment along ``axis`` in
        shifts of ``unit``; ideal spoiling by blocks with a net moment and
        no RF or ADC; or ``dephasing(block) -> int`` shifts at the end of
        each :class:`PulseqBlock`.
    axis : {"x", "y", "z"} or array_like, shape (3,), optional
        Dephasing direction (default: the axis whose blocks without RF or
        ADC carry the most net moment).
    unit : float, cycles/m, optional
        Moment of one shift (default: the largest net moment of a block
        without RF or ADC).
    field_strength : float, T, optional
        Needed for RF frequency offsets given in ppm (format 1.5; default:
        the file's ``B0`` definition if it has one).

    Returns
    -------
    Sequence
    """
    f = _File(path)
    if field_strength is None and "B0" in f.defs:
        field_strength = float(f.defs["B0"][0])
    return Sequence(_Reader(f, rf, dephasing, axis, unit, field_strength).ops())


class PulseqSimulator(Simulator):
    """A Pulseq file played through the EPG engine: one sample per ADC
    event (:func:`read_pulseq`; :meth:`Simulator.from_pulseq` builds it).

    Parameters
    ----------
    path : str or os.PathLike
    rf : {"hard", "shaped"}, optional
    dephasing : {"moment", "spoil"} or callable, optional
    axis : {"x", "y", "z"} or array_like, optional
    unit : float, cycles/m, optional
    field_strength : float, T, optional
        See :func:`read_pulseq`.
    states, repetitions, crusher_dephasing_rad, voxel_size_m, device, threads, ...
        See :class:`blochsim.Simulator`.

    Tissue: every property of :class:`blochsim.Simulator`.
    """

    protocol = {"path": None, "rf": "hard", "dephasing": "moment", "axis": None, "unit": None,
                "field_strength": None}

    def check_protocol(self, p):
        if p["path"] is None:
            return p
        path = os.fspath(p["path"])
        stamp = os.stat(path).st_mtime_ns if os.path.isfile(path) else None
        key = (path, stamp, p["rf"], p["dephasing"], None if p["axis"] is None else str(p["axis"]), str(p["unit"]),
               str(p["field_strength"]))
        if key not in _CACHE:
            if len(_CACHE) > 16:
                _CACHE.pop(next(iter(_CACHE)))
            _CACHE[key] = read_pulseq(path, p["rf"], p["dephasing"], p["axis"], p["unit"], p["field_strength"])
        p["_sequence"] = _CACHE[key]
        return p

    def repetition(self, p):
        if p["path"] is None:
            raise TypeError("PulseqSimulator needs path, the Pulseq file")
        return p["_sequence"]
