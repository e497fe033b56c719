"""The sequence operators (pulses, delays, dephasing, readouts, ...), their
checks, and sampled pulses.

Units are the console's: ms for durations, degrees for flips and phases,
µT and µs for sampled pulses."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from blochsim._arrays import validate as V
from blochsim.sequence.traced import Traced, TracedComplex, _modulus_and_angle, _value


#: The proton gyromagnetic ratio, rad/s/T (2π × 42.577 MHz/T).
GAMMA_RAD_PER_S_PER_T = 2.0 * np.pi * 42.57747892e6


class Operator:
    """Base of all sequence operators.  ``a @ b`` plays ``b`` then ``a``."""

    def ops(self):
        """The elementary operators in time order."""
        return [self]

    def _key(self):
        """A hashable snapshot of the operators (their reprs)."""
        return tuple(repr(o) for o in self.ops())

    def __matmul__(self, other):
        if not isinstance(other, Operator):
            return NotImplemented
        return Sequence(other.ops() + self.ops())

    def __rmatmul__(self, other):
        if not isinstance(other, Operator):
            return NotImplemented
        return Sequence(self.ops() + other.ops())

    def __pow__(self, n: int):
        """``op ** n`` plays ``op`` n times."""
        n = V.positive_int("repetition count", n, minimum=0)
        return Sequence(self.ops() * n)


class Sequence(Operator):
    """A list of elementary operators in time order (first played first).

    Parameters
    ----------
    ops : iterable of Operator
        Operators in time order; nested sequences are flattened.
    """

    def __init__(self, ops=()):
        flat = []
        for op in ops:
            if not isinstance(op, Operator):
                raise TypeError(f"a Sequence holds Operators, got {type(op).__name__}")
            flat.extend(op.ops())
        self._ops = flat
        self._snapshot = None

    def ops(self):
        return list(self._ops)

    def _key(self):
        """A hashable snapshot of the operators (their reprs), made once:
        a Sequence's operators are fixed when it is made."""
        if self._snapshot is None:
            self._snapshot = tuple(repr(o) for o in self._ops)
        return self._snapshot

    def __len__(self):
        return len(self._ops)

    def __iter__(self):
        return iter(self._ops)

    def __repr__(self):
        return f"Sequence({len(self._ops)} operators)"


def _check_scalar_fields(op, names):
    for name in names:
        x = _value(getattr(op, name))
        # a finite float (the common case, e.g. every sample of a shaped
        # pulse) needs no trip through NumPy
        if isinstance(x, float) and math.isfinite(x):
            continue
        v = V.as_float_array(name, x)
        V.check_finite(name, v)
        if v.ndim != 0:
            raise ValueError(f"{name} of a {type(op).__name__} must be a scalar, got shape {v.shape}")


def _check_pulse_fields(op, names):
    _check_scalar_fields(op, names)
    if float(_value(op.duration)) < 0:
        raise ValueError(f"duration of a {type(op).__name__} must be >= 0 ms, got {_value(op.duration)!r}")
    if float(_value(op.power_factor)) <= 0:
        raise ValueError(f"power_factor of a {type(op).__name__} must be > 0, got {_value(op.power_factor)!r}")


@dataclass(frozen=True)
class Pulse(Operator):
    """Hard RF pulse.

    The rotation is instantaneous.  A pulse with a ``duration`` also
    saturates the semisolid pool when the tissue has one (``bound_fraction``;
    SPEC §3): Z_b <- Z_b exp(-pi G(offset - B0) (B1 flip)^2 power_factor /
    duration), G the lineshape of the simulator's ``lineshape``.

    Parameters
    ----------
    flip : float
        Nominal flip angle, degrees (scaled per voxel by B1).
    phase : float, optional
        RF phase, degrees (plus the voxel's B1phase).  Phase 0 tips Z onto
        -y: from equilibrium a 90° pulse gives F+ = -i.
    duration : float, optional
        Pulse duration, ms, for the semisolid pool's saturation only
        (default 0: no saturation).
    offset : float, optional
        Frequency of the pulse relative to the water resonance, Hz (for the
        semisolid pool's lineshape).
    power_factor : float, optional
        p = duration * integral(b^2 dt) / (integral(b dt))^2 of the pulse
        shape b(t): 1 for a rectangle (see :func:`power_factor`).
    channels : sequence of complex, optional
        Parallel transmission: this pulse's complex drive of each transmit
        channel (its own shim).  With ``B1`` given as the channels'
        sensitivities S_c (complex, shape ``(channels, *voxels)``) the
        pulse plays in each voxel with flip ``flip * abs(B)`` and phase
        ``phase + angle(B)``, B = sum_c S_c channels[c].  None (default):
        the simulator's ``shim`` (or B1 as one map).
    """

    flip: float
    phase: float = 0.0
    duration: float = 0.0
    offset: float = 0.0
    power_factor: float = 1.0
    channels: tuple | None = None

    def __post_init__(self):
        _check_pulse_fields(self, ("flip", "phase", "duration", "offset", "power_factor"))
        if self.channels is not None:
            object.__setattr__(self, "channels", _channel_weights(self.channels))


class Excitation(Pulse):
    """An excitation pulse (a :class:`Pulse`; the name documents intent)."""


class Refocusing(Pulse):
    """A refocusing pulse (a :class:`Pulse`; default flip 180°)."""

    def __init__(self, flip: float = 180.0, phase: float = 0.0, duration: float = 0.0, offset: float = 0.0,
                 power_factor: float = 1.0, channels=None):
        super().__init__(flip, phase, duration, offset, power_factor, channels)


def _channel_weights(raw):
    """A pulse's channel drive as a tuple, checked (1-D, numeric, finite):
    Python complex numbers, or the traced entries of a protocol waveform
    (:class:`Traced`, :class:`TracedComplex`) as given."""
    w = np.asarray(raw, dtype=object if _is_traced(raw) else None)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"channels of a Pulse must be a non-empty 1-D sequence, got shape {w.shape}")
    if w.dtype == object:
        if not all(isinstance(x, (Traced, TracedComplex)) for x in w):
            raise TypeError("channels of a Pulse must be numbers, one per transmit channel, got objects")
        values = np.array([drive_value(x) for x in w])
    elif w.dtype.kind not in "biufc":
        raise TypeError(f"channels of a Pulse must be numbers, one per transmit channel, got dtype {w.dtype}")
    else:
        values = w.astype(np.complex128)
    if not np.all(np.isfinite(values)):
        raise ValueError(f"channels of a Pulse must be finite, got {values.tolist()!r}")
    return tuple(w) if w.dtype == object else tuple(complex(x) for x in values)


def _is_traced(raw):
    try:
        return any(isinstance(x, (Traced, TracedComplex)) for x in np.asarray(raw, dtype=object).reshape(-1))
    except (TypeError, ValueError):
        return False


def drive_value(x) -> complex:
    """The complex number of one channel's drive (plain or traced)."""
    if isinstance(x, TracedComplex):
        return complex(x)
    if isinstance(x, Traced):
        return complex(x.value)
    return complex(x)


@dataclass(frozen=True)
class Saturation(Operator):
    """An RF pulse that saturates the semisolid pool only, leaving the
    liquid pools untouched: the idealised off-resonance MT preparation
    (SPEC §3).  Without a semisolid pool in the tissue it does nothing.

    Parameters
    ----------
    flip : float
        Nominal flip angle of the pulse, degrees (scaled per voxel by B1):
        the integral of gamma B1(t) dt.
    duration : float
        Pulse duration, ms (> 0).
    offset : float, optional
        Pulse frequency relative to the water resonance, Hz.
    power_factor : float, optional
        As for :class:`Pulse` (1 for a rectangle).
    dual : bool, optional
        A dual-offset pulse (inhomogeneous MT): its power is split evenly
        between +offset and -offset (a cosine-modulated pulse of the same
        energy), so that a semisolid pool with dipolar order (``bound_T1D``)
        is saturated as in Varma et al. 2015 (JMR 260:67); without dipolar
        order the two halves add as one pulse would at a symmetric
        lineshape.
    """

    flip: float
    duration: float
    offset: float = 0.0
    power_factor: float = 1.0
    dual: bool = False

    def __post_init__(self):
        _check_pulse_fields(self, ("flip", "duration", "offset", "power_factor"))
        if not isinstance(self.dual, (bool, np.bool_)):
            raise TypeError(f"dual of a Saturation must be a bool, got {self.dual!r}")
        if float(_value(self.duration)) <= 0:
            raise ValueError(f"duration of a Saturation must be > 0 ms, got {_value(self.duration)!r}")


@dataclass(frozen=True)
class RectPulse(Operator):
    """A rectangular RF pulse played exactly: over its ``duration`` the RF
    field acts together with relaxation, exchange, off-resonance and the
    semisolid pool's saturation (the Bloch–McConnell equations with the RF
    term, solved per voxel by a matrix exponential).  It takes its duration
    of time.  Sequences with one play on the pooled host kernel, with or
    without pools in the tissue.

    Parameters
    ----------
    flip : float
        Nominal flip angle, degrees (scaled per voxel by B1): gamma B1 times
        the duration.
    duration : float
        ms (> 0).
    phase : float, optional
        RF phase at the start of the pulse, degrees (plus B1phase).
    offset : float, optional
        Frequency of the pulse relative to the water resonance, Hz: spins at
        B0 = offset are on resonance with it.
    """

    flip: float
    duration: float
    phase: float = 0.0
    offset: float = 0.0
    power_factor = 1.0

    def __post_init__(self):
        _check_pulse_fields(self, ("flip", "duration", "phase", "offset"))
        if float(_value(self.duration)) <= 0:
            raise ValueError(f"duration of a RectPulse must be > 0 ms, got {_value(self.duration)!r}")


def power_factor(waveform) -> float:
    """The power factor p = n * sum(b^2) / (sum b)^2 of a pulse shape
    sampled evenly (1 for a rectangle; about 2 for a Gaussian cut at 2 sigma).

    Parameters
    ----------
    waveform : array_like, shape (n,)
        Samples of the pulse envelope b(t), any unit (complex samples: the
        area is abs(sum b), the power sum abs(b)²).
    """
    b = np.asarray(waveform)
    if b.ndim != 1 or b.size == 0:
        raise ValueError(f"waveform must be a non-empty 1-D array, got shape {b.shape}")
    area = np.sum(b)
    if abs(area) == 0:
        raise ValueError("waveform has zero area: its power factor is undefined")
    return float(b.size * np.sum(np.abs(b) ** 2) / abs(area) ** 2)


@dataclass(frozen=True)
class Inversion(Operator):
    """Ideal inversion: Z_k <- -eta Z_k at every order (eta = tissue
    ``inv_efficiency``, default 1); transverse states untouched."""


@dataclass(frozen=True)
class Delay(Operator):
    """Free evolution for ``duration`` ms: relaxation, recovery,
    off-resonance, diffusion, flow (SPEC §2)."""

    duration: float

    def __post_init__(self):
        x = _value(self.duration)
        if isinstance(x, float) and 0.0 <= x < math.inf:  # the common case, without NumPy
            return
        v = V.as_float_array("duration", x)
        V.check_finite("duration", v)
        if v.ndim != 0 or float(v) < 0:
            raise ValueError(f"Delay duration must be a scalar >= 0 ms, got {_value(self.duration)!r}")


@dataclass(frozen=True)
class Dephase(Operator):
    """An unbalanced gradient: shift every transverse order by ``orders``
    (negative values dephase the other way)."""

    orders: int = 1

    def __post_init__(self):
        if isinstance(self.orders, bool) or not isinstance(self.orders, (int, np.integer)):
            raise TypeError(f"Dephase orders must be an integer, got {self.orders!r}")


@dataclass(frozen=True)
class _Moment(Operator):
    """A gradient moment of three axes (cycles/m) and the step of the
    lattice its states are keyed on (cycles/m), played by the moment-keyed
    EPG (blochsim/sequence/keyed.py): the Pulseq reader's shift for files
    one EPG order cannot hold."""

    moment: tuple = (0.0, 0.0, 0.0)
    step: float = 1.0


@dataclass(frozen=True)
class Spoil(Operator):
    """Ideal spoiler: every transverse state is set to zero."""


@dataclass(frozen=True)
class Readout(Operator):
    """Record M0 · F+_0 · exp(-i phase) as the next sample.

    Parameters
    ----------
    phase : float, optional
        Receiver phase, degrees.
    dephasing : float, optional
        Reversible dephasing time of the sample, ms: its distance from the
        spin echo of the pathway it reads (TE for a gradient echo, 0 at a
        spin echo).  With the tissue property ``T2prime`` the sample is
        multiplied by exp(-dephasing / T2prime): the average over a
        Lorentzian spread of off-resonance within the voxel.
    """

    phase: float = 0.0
    dephasing: float = 0.0

    def __post_init__(self):
        _check_scalar_fields(self, ("phase", "dephasing"))
        if float(_value(self.dephasing)) < 0:
            raise ValueError(f"dephasing of a Readout must be >= 0 ms, got {_value(self.dephasing)!r}")


class SampledPulse(Sequence):
    """A shaped pulse played sample by sample: one hard rotation per sample,
    centred in its dwell, with free precession between.

    Parameters
    ----------
    waveform : array_like, µT, shape (n,) or (channels, n)
        B1 samples; complex values carry the RF phase.  Two dimensions:
        dynamic parallel transmission, one waveform per transmit channel;
        with ``B1`` given as the channels' complex sensitivities S_c (shape
        ``(channels, *voxels)``) sample j plays in each voxel as the field
        sum_c S_c waveform[c, j] (the channels' sensitivities relative to a
        channel driven at 1 µT).  As a protocol parameter it is reached by
        :meth:`Simulator.vjp` (dL/dRe + i dL/dIm of every sample).
    dwell : float, µs
        Duration of one sample.
    phase : float, optional
        Extra phase of the whole pulse, degrees.

    See Also
    --------
    SampledPulse.normalised : a pulse shape scaled to a nominal flip angle.
    hyperbolic_secant : the adiabatic inversion pulse.
    """

    def __init__(self, waveform, dwell: float, phase: float = 0.0):
        w = np.asarray(waveform)
        d = _dwell_us(dwell)
        deg_per_uT = np.degrees(GAMMA_RAD_PER_S_PER_T * 1e-6 * d * 1e-6)  # flip = gamma |B1| dwell
        if w.ndim == 2:
            # (a traced waveform keeps its entries as each sample's drive: Simulator.vjp reaches them)
            values = _waveform_values("waveform", w, ndim=2)
            half = Delay(0.5 * d * 1e-3)
            ops = []
            for j in range(values.shape[1]):
                ops += [half, Pulse(deg_per_uT, phase, channels=(w if w.dtype == object else values)[:, j]), half]
            super().__init__(ops)
            self.waveform = values
            self.dwell = d
            return
        traced = w.dtype == object  # a traced protocol waveform (Simulator.vjp)
        values = _waveform_values("waveform", w)
        samples = [_modulus_and_angle(x) for x in (w if traced else values)]
        super().__init__(_dwell_ops([deg_per_uT * m for m, _ in samples],
                                    [np.degrees(1.0) * a + phase for _, a in samples], d))
        self.waveform = values
        self.dwell = d

    @classmethod
    def normalised(cls, shape, dwell: float, flip, phase=0.0):
        """A pulse of the given shape scaled to a nominal flip angle.

        Parameters
        ----------
        shape : array_like, shape (n,)
            The envelope, any unit; complex samples carry their phase.  Its
            area ``|sum(shape)|`` is scaled to ``flip``: the on-resonance
            small-tip flip angle of the pulse.
        dwell : float, µs
        flip : float, deg
            Nominal flip angle (a traced protocol value is allowed, so
            :meth:`Simulator.vjp` reaches it).
        phase : float, optional
            Extra phase of the whole pulse, degrees.

        Returns
        -------
        SampledPulse
            ``waveform`` holds the B1 samples in µT.
        """
        values = _waveform_values("shape", np.asarray(shape))
        area = abs(np.sum(values))
        if area == 0:
            raise ValueError("shape has zero area: it cannot be scaled to a flip angle")
        d = _dwell_us(dwell)
        frac = np.abs(values) / area
        self = cls.__new__(cls)
        Sequence.__init__(self, _dwell_ops([flip * float(f) for f in frac],
                                           [float(np.degrees(a)) + phase for a in np.angle(values)], d))
        deg_per_uT = np.degrees(GAMMA_RAD_PER_S_PER_T * 1e-6 * d * 1e-6)
        self.waveform = values / area * float(_value(flip)) / deg_per_uT
        self.dwell = d
        return self

    @property
    def duration(self) -> float:
        """Length of the pulse, ms."""
        return self.waveform.shape[-1] * self.dwell * 1e-3


def _waveform_values(name, w, ndim=1):
    """The numbers of a (possibly traced) waveform of ``ndim`` dimensions, checked."""
    traced = w.dtype == object
    values = np.array([complex(x) if isinstance(x, TracedComplex) else _value(x) for x in w.reshape(-1)]
                      ).reshape(w.shape) if traced else w
    if w.ndim != ndim or w.size == 0:
        want = "a non-empty 1-D array" if ndim == 1 else "a non-empty array of shape (channels, samples)"
        raise ValueError(f"{name} must be {want}, got shape {w.shape}")
    if not (np.issubdtype(values.dtype, np.floating) or np.issubdtype(values.dtype, np.complexfloating)):
        raise TypeError(f"{name} must be float or complex, got dtype {values.dtype}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name} must be finite")
    return values


def _dwell_us(dwell):
    return float(V.protocol_array("dwell", dwell, low=0.0, strict=True, unit="us", ndim_max=0))


def _dwell_ops(flips_deg, phases_deg, dwell_us):
    half = Delay(0.5 * dwell_us * 1e-3)
    ops = []
    for f, ph in zip(flips_deg, phases_deg):
        ops += [half, Pulse(f, ph), half]
    return ops
