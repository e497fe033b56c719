"""Packing a playing of operators into the kernels' event stream
(events.hpp), and the provenance of traced values for reverse mode."""
from __future__ import annotations

import numpy as np

from blochsim.sequence.operators import (Delay, Dephase, Inversion, Pulse, Readout, RectPulse, Saturation, Spoil,
                                         _Moment, drive_value)
from blochsim.sequence.traced import Traced

# Event flag bits (events.hpp).
EV_RF, EV_INVERSION, EV_READOUT, EV_SPOIL, EV_SATURATION, EV_DRIVEN, EV_DUAL = 1, 2, 4, 8, 16, 32, 64


class EventStream:
    """The packed event stream of one playing of a sequence (events.hpp),
    as NumPy arrays ready for the kernels."""

    __slots__ = ("interval", "flags", "shift_before", "shift_after", "flip_rad", "phase_rad",
                 "rx_phase_rad", "slot", "duration_s", "n_samples", "total_shifts", "rf_table",
                 "rf_duration_s", "rf_offset_hz", "rf_power", "driven", "driven_table", "moments",
                 "moment_step", "channels", "drive_op", "drive_sources", "transmit")

    @property
    def n_events(self):
        return self.flags.shape[0]

    def real_subspace(self, off_axis: bool):
        """(real_path, common_phase_rad): the real-subspace verdict (SPEC §1)."""
        if off_axis:
            return False, 0.0
        rf = (self.flags & EV_RF) != 0
        if not np.any(rf):
            return True, 0.0
        ph = self.phase_rad[rf].astype(np.float64)
        phi0 = float(ph[0])
        # every phase equal to phi0 modulo pi
        d = np.abs(np.sin(ph - phi0))
        return bool(np.all(d < 1e-6)), phi0


def _structure_key(op):
    if isinstance(op, Dephase):
        return (Dephase, int(op.orders))
    if isinstance(op, Saturation):
        return (Saturation, bool(op.dual))
    return type(op) if not isinstance(op, Pulse) else Pulse


class _Layout:
    """What a sequence's shape fixes: the grouping of operators into events,
    flags, shifts and output slots.  Values (flips, phases, durations) are
    gathered from the operators into these positions at every call."""

    def __init__(self, ops, n_recorded_from):
        n_ops = len(ops)
        ev_flags, sb, sa, rf_op, rx_op = [], [], [], [], []
        delay_op, delay_event = [], []
        moment_op, moment_at = [], []  # _Moment ops, and 2 event + side (0 before the pulse, 1 after)
        stage = 0
        cur = None

        def open_event():
            nonlocal cur, stage
            cur = {"flags": 0, "sb": 0, "sa": 0, "rf": -1, "rx": -1, "has_iv": False}
            stage = 0

        def close():
            ev_flags.append(cur["flags"])
            sb.append(cur["sb"])
            sa.append(cur["sa"])
            rf_op.append(cur["rf"])
            rx_op.append(cur["rx"])
            open_event()

        open_event()
        for j, op in enumerate(ops):
            if isinstance(op, Delay):
                if stage > 0:
                    close()
                delay_op.append(j)
                delay_event.append(len(ev_flags))
                cur["has_iv"] = True
            elif isinstance(op, _Moment):
                moment_op.append(j)
                if stage <= 1:
                    stage = 1
                    moment_at.append(2 * len(ev_flags))
                elif stage <= 3 or not cur["flags"] & EV_SPOIL:
                    stage = 4
                    moment_at.append(2 * len(ev_flags) + 1)
                else:
                    close()
                    stage = 1
                    moment_at.append(2 * len(ev_flags))
            elif isinstance(op, Dephase):
                n = int(op.orders)
                if stage <= 1:
                    cur["sb"] += n
                    stage = 1
                elif stage <= 3:
                    cur["sa"] += n
                    stage = 4
                elif cur["flags"] & EV_SPOIL:
                    close()
                    cur["sb"] = n
                    stage = 1
                else:
                    cur["sa"] += n
            elif isinstance(op, (Pulse, Inversion, Saturation, RectPulse)):
                if stage >= 2:
                    close()
                if isinstance(op, Pulse):
                    cur["flags"] |= EV_RF
                    cur["rf"] = j
                elif isinstance(op, Saturation):
                    cur["flags"] |= EV_SATURATION | (EV_DUAL if op.dual else 0)
                    cur["rf"] = j
                elif isinstance(op, RectPulse):
                    cur["flags"] |= EV_DRIVEN
                    cur["rf"] = j
                else:
                    cur["flags"] |= EV_INVERSION
                stage = 2
            elif isinstance(op, Readout):
                if stage >= 3:
                    close()
                if j >= n_recorded_from:
                    cur["flags"] |= EV_READOUT
                cur["rx"] = j
                stage = 3
            elif isinstance(op, Spoil):
                cur["flags"] |= EV_SPOIL
                cur["sa"] = 0
                stage = 4
            else:
                raise TypeError(f"not a sequence operator: {op!r}")
        if stage > 0 or cur["has_iv"]:
            close()

        self.n_ops = n_ops
        self.flags = np.array(ev_flags, dtype=np.uint32)
        self.shift_before = np.array(sb, dtype=np.int32)
        self.shift_after = np.array(sa, dtype=np.int32)
        self.rf_op = np.array(rf_op, dtype=np.int64)
        self.rx_op = np.array(rx_op, dtype=np.int64)
        self.delay_op = np.array(delay_op, dtype=np.int64)
        self.delay_event = np.array(delay_event, dtype=np.int64)
        self.moment_op = np.array(moment_op, dtype=np.int64)
        self.moment_at = np.array(moment_at, dtype=np.int64)
        ro = (self.flags & EV_READOUT) != 0
        self.slot = np.zeros(len(ev_flags), dtype=np.int32)
        self.slot[ro] = np.arange(int(ro.sum()), dtype=np.int32)
        self.n_samples = int(ro.sum())


_LAYOUTS: dict = {}
_LAYOUT_CACHE_SIZE = 64


def pack(preparation, repetition, repetitions: int = 1) -> EventStream:
    """Pack a playing into an EventStream.

    The grouping into events depends only on the sequence's shape (which
    operators, in which order, with which shifts) and is computed once per
    shape; later calls with the same shape only gather the new values.

    Parameters
    ----------
    preparation : Operator or None
        Played once at the start.
    repetition : Operator
        One repetition, played ``repetitions`` times; only the readouts of the
        last playing are recorded.
    repetitions : int
        Number of playings of ``repetition``.
    """
    return _pack(preparation, repetition, repetitions, False)[0]


# Event-gradient columns of the adjoint kernels (epg/adjoint.hpp EventGradient;
# pools/adjoint.hpp PooledEventGradient adds the pulse's duration and
# offset) and the factor from their SI unit to the operators' unit.
_GRAD_DURATION, _GRAD_FLIP, _GRAD_PHASE, _GRAD_RX, _GRAD_RF_DURATION, _GRAD_RF_OFFSET = 0, 1, 2, 3, 4, 5
_MS_TO_S = 1e-3
_DEG_TO_RAD = np.pi / 180.0


def pack_with_provenance(preparation, repetition, repetitions: int = 1):
    """Pack a playing whose operators carry :class:`Traced` values, and
    record where each traced value went.

    Every event that a Delay opens keeps an interval, even of zero length,
    so that its duration has a gradient.

    Returns
    -------
    stream : EventStream
    provenance : dict
        For each protocol parameter named in the traced values, a tuple
        ``(event, column, index, part, coef)``: the real (part 0) or
        imaginary (part 1) part of the parameter's entry ``index`` moves
        column ``column`` (interval duration_s, flip_rad, phase_rad,
        rx_phase_rad, pulse duration_s, pulse offset_hz) of event ``event`` by
        ``coef`` per public unit.
    """
    s, ops, lay = _pack(preparation, repetition, repetitions, True)
    rows = {}

    def record(event, column, value, factor):
        if isinstance(value, Traced):
            for (name, index, part), c in value.terms.items():
                rows.setdefault(name, []).append((event, column, index, part, c * factor))

    for e, j in enumerate(lay.rf_op):
        if j >= 0:
            op = ops[j]
            record(e, _GRAD_FLIP, op.flip, _DEG_TO_RAD)
            if isinstance(op, (Pulse, RectPulse)):
                record(e, _GRAD_PHASE, op.phase, _DEG_TO_RAD)
            record(e, _GRAD_RF_DURATION, op.duration, _MS_TO_S)
            record(e, _GRAD_RF_OFFSET, op.offset, 1.0)
    for e, j in enumerate(lay.rx_op):
        if j >= 0 and lay.flags[e] & EV_READOUT:
            record(e, _GRAD_RX, ops[j].phase, _DEG_TO_RAD)
    for j, e in zip(lay.delay_op, lay.delay_event):
        record(int(e), _GRAD_DURATION, ops[j].duration, _MS_TO_S)
    provenance = {}
    for name, r in rows.items():
        ev, col, idx, part, coef = zip(*r)
        provenance[name] = (np.array(ev, np.int64), np.array(col, np.int64), list(idx), np.array(part, np.int64),
                            np.array(coef))
    return s, provenance



def _unitary_rotation_terms(flip_rad):
    """cos²(a/2), sin²(a/2), sin a, cos a of each flip, for the float32
    rotation table, with the rounding of cos²(a/2) and cos a diffused
    along the stream's small flips.

    Near 1, float32 holds a number to 2**-24 only.  Rounded one by one,
    cos²(a/2) of a small flip errs in the same direction at every sample of
    a pulse played sample by sample (thousands of them for a Pulseq
    waveform on a 1 µs raster), and the magnetisation grows or shrinks by
    1e-4.  For flips under about 1° (sin²(a/2) < 1e-4) the running sums are
    rounded to multiples of 2**-24 instead and their differences taken,
    which keeps every entry within 2**-24 of its value and the sum of the
    errors below 2**-25, so the stream stays unitary to round-off.  (Every
    multiple of 2**-24 in [-1, 1] is a float32.)  Larger flips, whose
    rounding errors do not line up, are rounded as they are, so that a
    change of one flip changes no other entry.
    """
    c2, s2 = np.cos(flip_rad / 2) ** 2, np.sin(flip_rad / 2) ** 2
    ca = np.cos(flip_rad)
    small = s2 < 1e-4

    def diffused(x):
        sums = np.round(np.cumsum(x) * 2.0 ** 24)
        return np.diff(sums, prepend=0.0) * 2.0 ** -24

    if np.any(small):
        c2, ca = c2.copy(), ca.copy()
        c2[small], ca[small] = diffused(c2[small]), diffused(ca[small])
    return c2, s2, np.sin(flip_rad), ca


def _channel_drives(drives, pulses, rf_op, n_ops):
    """(n_events, channels) complex128 channel drive of each RF event's
    pulse (NaN for a pulse without its own) and (n_events,) the number of
    the pulse that drives it (its place in ``pulses``, the distinct pulses
    with their own drive; -1 for none); (None, None) when no pulse has one.
    ``drives`` maps an operator's index to its pulse's number."""
    if not drives:
        return None, None
    counts = {len(op.channels) for op in pulses}
    if len(counts) > 1:
        raise ValueError(f"pulses drive different numbers of transmit channels: {sorted(counts)}")
    values = np.array([[drive_value(x) for x in op.channels] for op in pulses], dtype=np.complex128)
    number = np.full(n_ops + 1, -1, dtype=np.int64)
    for j, k in drives.items():
        number[j] = k
    per_event = number[rf_op]
    out = np.full((per_event.size, values.shape[1]), np.nan, dtype=np.complex128)
    out[per_event >= 0] = values[per_event[per_event >= 0]]
    return out, per_event


def _pack(preparation, repetition, repetitions, keep_zero):
    """pack(), also returning the operators and their layout; with
    keep_zero every event with a Delay keeps an interval of its length."""
    prep = preparation.ops() if preparation is not None else []
    rep = repetition.ops()
    ops = prep + rep * repetitions
    first_recorded = len(prep) + len(rep) * (repetitions - 1)
    key = (tuple(_structure_key(o) for o in prep), tuple(_structure_key(o) for o in rep), repetitions)
    lay = _LAYOUTS.get(key)
    if lay is None:
        lay = _Layout(ops, first_recorded)
        if len(_LAYOUTS) >= _LAYOUT_CACHE_SIZE:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        _LAYOUTS[key] = lay

    flips = np.zeros(len(ops) + 1, dtype=np.float64)
    phases = np.zeros(len(ops) + 1, dtype=np.float64)
    durs = np.zeros(len(ops) + 1, dtype=np.float64)
    rf_dur = np.zeros(len(ops) + 1, dtype=np.float64)
    rf_off = np.zeros(len(ops) + 1, dtype=np.float64)
    rf_pow = np.ones(len(ops) + 1, dtype=np.float64)
    drives = {}  # op index: a pulse's channel drive (Pulse.channels)
    sources = {}  # id of a pulse with its own drive: (its number, the pulse)
    for j, op in enumerate(ops):
        if isinstance(op, (Pulse, Saturation, RectPulse)):
            if isinstance(op, Pulse) and op.channels is not None:
                drives[j] = sources.setdefault(id(op), (len(sources), op))[0]
            flips[j] = op.flip
            phases[j] = op.phase if isinstance(op, (Pulse, RectPulse)) else 0.0
            rf_dur[j] = op.duration
            rf_off[j] = op.offset
            rf_pow[j] = op.power_factor
        elif isinstance(op, Readout):
            phases[j] = op.phase
        elif isinstance(op, Delay):
            durs[j] = op.duration
    n = lay.flags.shape[0]
    s = EventStream()
    s.flags = lay.flags
    s.shift_before = lay.shift_before
    s.shift_after = lay.shift_after
    s.slot = lay.slot
    s.n_samples = lay.n_samples
    # index -1 reads the zero sentinel at the end of the value arrays
    flip_rad = np.radians(flips[lay.rf_op])
    phase_rad = np.radians(phases[lay.rf_op])
    s.flip_rad = flip_rad.astype(np.float32)
    s.phase_rad = phase_rad.astype(np.float32)
    rx_rad = np.radians(phases[lay.rx_op])
    s.rx_phase_rad = rx_rad.astype(np.float32)
    # each pulse's rotation at B1 = 1 and each receiver phase, in double
    # precision (events.hpp RfTableField)
    s.rf_table = np.ascontiguousarray(np.stack([
        *_unitary_rotation_terms(flip_rad), np.cos(phase_rad), np.sin(phase_rad), np.cos(rx_rad), np.sin(rx_rad)],
        axis=1), dtype=np.float32)
    # the pulses' durations, offsets and power factors, for the semisolid
    # pool (null when no pulse has a duration)
    s.rf_duration_s = s.rf_offset_hz = s.rf_power = None
    if np.any(rf_dur[lay.rf_op] > 0):
        s.rf_duration_s = np.ascontiguousarray(rf_dur[lay.rf_op] * 1e-3, dtype=np.float32)
        s.rf_offset_hz = np.ascontiguousarray(rf_off[lay.rf_op], dtype=np.float32)
        s.rf_power = np.ascontiguousarray(rf_pow[lay.rf_op], dtype=np.float32)
    # exact rectangular pulses: each event's row of the table of distinct ones
    s.driven = s.driven_table = None
    drv = (lay.flags & EV_DRIVEN) != 0
    if np.any(drv):
        rows = np.stack([rf_dur[lay.rf_op] * 1e-3, flip_rad, phase_rad, rf_off[lay.rf_op]], axis=1)[drv]
        table, index = np.unique(rows, axis=0, return_inverse=True)
        s.driven = np.full(n, -1, dtype=np.int32)
        s.driven[drv] = index.reshape(-1).astype(np.int32)
        s.driven_table = np.ascontiguousarray(table, dtype=np.float64)
    dur = np.bincount(lay.delay_event, weights=durs[lay.delay_op], minlength=n)[:n] * 1e-3
    if keep_zero:
        has_iv = np.zeros(n, dtype=bool)
        has_iv[lay.delay_event[lay.delay_event < n]] = True
    else:
        has_iv = dur > 0
    # to the picosecond: durations summed from a file's block timings differ
    # in their last bits, and each distinct one costs exponentials per voxel
    uniq, inv = np.unique(np.round(dur[has_iv], 12), return_inverse=True)
    interval = np.full(n, -1, dtype=np.int32)
    interval[has_iv] = inv.astype(np.int32)
    s.interval = interval
    s.duration_s = np.ascontiguousarray(uniq, dtype=np.float64)
    pulses = [op for _, op in sorted(sources.values(), key=lambda x: x[0])]
    s.channels, s.drive_op = _channel_drives(drives, pulses, lay.rf_op, len(ops))
    s.drive_sources = [op.channels for op in pulses] or None
    s.transmit = None  # per-pulse transmit settings: blochsim._modifiers fills them for a call
    s.moments, s.moment_step = None, 0.0
    if lay.moment_op.size:
        m = np.zeros((2 * n, 3))
        np.add.at(m, lay.moment_at, np.array([ops[j].moment for j in lay.moment_op.tolist()], dtype=np.float64))
        s.moments = m.reshape(n, 2, 3)  # cycles/m
        s.moment_step = float(ops[int(lay.moment_op[0])].step)
    one = len(prep) + len(rep)
    s.total_shifts = int(sum(abs(int(o.orders)) for o in ops[:one] if isinstance(o, Dephase)))
    return s, ops, lay
