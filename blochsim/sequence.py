"""Sequence operators and their packing into the kernels' event stream.

Operators compose with ``@`` as operators on a state do: ``B @ A`` plays A
first, then B (so a written product reads right to left in time)::

    echo = Readout() @ Delay(5.0) @ Dephase() @ Refocusing(180.0) @ Dephase() @ Delay(5.0)
    cpmg = echo @ echo @ Excitation(90.0, phase=90.0)

Units are the console's: ms for durations, degrees for flips and phases,
µT and µs for sampled pulses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from blochsim import _validate as V

GAMMA_RAD_PER_S_PER_T = 2.0 * np.pi * 42.57747892e6

# Event flag bits (events.hpp).
EV_RF, EV_INVERSION, EV_READOUT, EV_SPOIL, EV_SATURATION, EV_DRIVEN = 1, 2, 4, 8, 16, 32


def _elementwise(op):
    """A binary operator of :class:`Traced` applied entry by entry when the
    other operand is an array (giving an object array of Traced)."""
    def method(self, o):
        if isinstance(o, np.ndarray) and o.ndim > 0:
            return np.array([op(self, x) for x in o.reshape(-1)], dtype=object).reshape(o.shape)
        return op(self, o)

    method.__name__ = op.__name__
    return method


class Traced:
    """A protocol value with its first-order dependence on protocol entries.

    ``value`` is the number; ``terms`` maps ``(name, index, part)`` (a
    protocol parameter, an index into it, ``()`` for a scalar, and 0 for
    the real part of the entry or 1 for its imaginary part) to d value / d
    entry.  Arithmetic carries the terms (sums, products, quotients), so the
    operators a simulator builds from a traced protocol record where each
    flip, phase and duration came from, and :meth:`Simulator.vjp` maps the
    kernels' per-event gradients back to the protocol arrays.
    """

    __slots__ = ("value", "terms")
    __array_ufunc__ = None  # NumPy scalars defer to the reflected operators

    def __init__(self, value, terms=None):
        self.value = float(value)
        self.terms = dict(terms) if terms else {}

    @staticmethod
    def _lift(x):
        return x if isinstance(x, Traced) else Traced(float(x))

    @staticmethod
    def _combine(a, ca, b, cb):
        terms = {k: ca * c for k, c in a.terms.items()} if ca != 0.0 else {}
        if cb != 0.0:
            for k, c in b.terms.items():
                terms[k] = terms.get(k, 0.0) + cb * c
        return terms

    def __float__(self):
        return self.value

    @_elementwise
    def __add__(self, o):
        o = Traced._lift(o)
        return Traced(self.value + o.value, Traced._combine(self, 1.0, o, 1.0))

    __radd__ = __add__

    @_elementwise
    def __sub__(self, o):
        o = Traced._lift(o)
        return Traced(self.value - o.value, Traced._combine(self, 1.0, o, -1.0))

    @_elementwise
    def __rsub__(self, o):
        return Traced._lift(o) - self

    @_elementwise
    def __mul__(self, o):
        o = Traced._lift(o)
        return Traced(self.value * o.value, Traced._combine(self, o.value, o, self.value))

    __rmul__ = __mul__

    @_elementwise
    def __truediv__(self, o):
        o = Traced._lift(o)
        q = self.value / o.value
        return Traced(q, Traced._combine(self, 1.0 / o.value, o, -q / o.value))

    @_elementwise
    def __rtruediv__(self, o):
        return Traced._lift(o) / self

    def __mod__(self, o):
        # a wrap by a constant period: the derivative is the value's (almost everywhere)
        if isinstance(o, Traced) and o.terms:
            raise TypeError("a traced value can be wrapped by a constant period only")
        return Traced(self.value % float(o), self.terms)

    def __neg__(self):
        return Traced(-self.value, {k: -c for k, c in self.terms.items()})

    def __pos__(self):
        return self

    def __lt__(self, o):
        return self.value < float(o)

    def __le__(self, o):
        return self.value <= float(o)

    def __gt__(self, o):
        return self.value > float(o)

    def __ge__(self, o):
        return self.value >= float(o)

    def __repr__(self):
        return f"Traced({self.value!r}, {self.terms!r})"


class TracedComplex:
    """A complex protocol entry as its traced real and imaginary parts
    (``re``, ``im``: :class:`Traced`), for the operators that take complex
    values (:class:`SampledPulse` waveforms)."""

    __slots__ = ("re", "im")

    def __init__(self, re, im):
        self.re, self.im = re, im

    def __complex__(self):
        return complex(self.re.value, self.im.value)


def trace(name, value):
    """``value`` (a float or complex scalar or array) as traced entries of
    the protocol parameter ``name``: a :class:`Traced` (or
    :class:`TracedComplex`) scalar, or an object array of them."""
    a = np.asarray(value)
    cplx = a.dtype.kind == "c"
    a = a.astype(np.complex128 if cplx else np.float64)

    def entry(x, i):
        if cplx:
            return TracedComplex(Traced(x.real, {(name, i, 0): 1.0}), Traced(x.imag, {(name, i, 1): 1.0}))
        return Traced(x, {(name, i, 0): 1.0})

    if a.ndim == 0:
        return entry(a[()], ())
    out = np.empty(a.shape, dtype=object)
    for i in np.ndindex(a.shape):
        out[i] = entry(a[i], i)
    return out


def _modulus_and_angle(x):
    """|x| and arg x of a traced or plain waveform sample, with the
    derivatives of both (d|x| = (re dre + im dim)/|x|, d arg = (re dim -
    im dre)/|x|^2; both 0 at x = 0)."""
    if isinstance(x, TracedComplex):
        re, im = x.re, x.im
    elif isinstance(x, Traced):
        re, im = x, Traced(0.0)
    else:
        z = complex(x)
        return abs(z), float(np.angle(z))
    r = float(np.hypot(re.value, im.value))
    if r == 0.0:
        return Traced(0.0), Traced(0.0)
    modulus = Traced(r, Traced._combine(re, re.value / r, im, im.value / r))
    angle = Traced(float(np.arctan2(im.value, re.value)),
                   Traced._combine(re, -im.value / r ** 2, im, re.value / r ** 2))
    return modulus, angle


def _value(x):
    """The number of a possibly traced operator value."""
    return x.value if isinstance(x, Traced) else x


class Operator:
    """Base of all sequence operators.  ``a @ b`` plays ``b`` then ``a``."""

    def ops(self):
        """The elementary operators in time order."""
        return [self]

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

    def ops(self):
        return list(self._ops)

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
    """

    flip: float
    phase: float = 0.0
    duration: float = 0.0
    offset: float = 0.0
    power_factor: float = 1.0

    def __post_init__(self):
        _check_pulse_fields(self, ("flip", "phase", "duration", "offset", "power_factor"))


class Excitation(Pulse):
    """An excitation pulse (a :class:`Pulse`; the name documents intent)."""


class Refocusing(Pulse):
    """A refocusing pulse (a :class:`Pulse`; default flip 180°)."""

    def __init__(self, flip: float = 180.0, phase: float = 0.0, duration: float = 0.0, offset: float = 0.0,
                 power_factor: float = 1.0):
        super().__init__(flip, phase, duration, offset, power_factor)


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
    """

    flip: float
    duration: float
    offset: float = 0.0
    power_factor: float = 1.0

    def __post_init__(self):
        _check_pulse_fields(self, ("flip", "duration", "offset", "power_factor"))
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
        area is |sum b|, the power sum |b|^2).
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
    waveform : array_like, µT, shape (n,)
        B1 samples; complex values carry the RF phase.
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
        traced = w.dtype == object  # a traced protocol waveform (Simulator.vjp)
        values = _waveform_values("waveform", w)
        d = _dwell_us(dwell)
        deg_per_uT = np.degrees(GAMMA_RAD_PER_S_PER_T * 1e-6 * d * 1e-6)  # flip = gamma |B1| dwell
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
        return self.waveform.size * self.dwell * 1e-3


def _waveform_values(name, w):
    """The numbers of a (possibly traced) 1-D waveform, checked."""
    traced = w.dtype == object
    values = np.array([complex(x) if isinstance(x, TracedComplex) else _value(x) for x in w.reshape(-1)]
                      ).reshape(w.shape) if traced else w
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {w.shape}")
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


def hyperbolic_secant(duration: float = 10.24, peak_B1: float = 13.5, mu: float = 5.0, beta: float = 800.0,
                      dwell: float = 10.0) -> SampledPulse:
    """The hyperbolic-secant adiabatic inversion pulse (Silver, Joseph and
    Hoult 1985, Phys Rev A 31:2753), played sample by sample.

    B1(t) = peak_B1 sech(beta t) with the frequency sweep
    -mu beta tanh(beta t) (rad/s), i.e. the RF phase -mu ln cosh(beta t),
    t from -duration/2 to duration/2.  It inverts every spin whose offset
    lies well inside the sweep (+- mu beta / 2 pi Hz) once the adiabatic
    condition gamma peak_B1 >> sqrt(mu) beta holds, nearly independent of
    B1 above that threshold.

    Parameters
    ----------
    duration : float, ms
    peak_B1 : float, µT
    mu : float
        Dimensionless sweep factor.
    beta : float, rad/s
        Modulation rate.
    dwell : float, µs
        Sample spacing.

    Returns
    -------
    SampledPulse

    Examples
    --------
    >>> from blochsim.sequence import hyperbolic_secant
    >>> hyperbolic_secant().waveform.shape
    (1024,)
    """
    for name, v in (("duration", duration), ("peak_B1", peak_B1), ("mu", mu), ("beta", beta)):
        V.protocol_array(name, v, low=0.0, strict=True, ndim_max=0)
    d = _dwell_us(dwell)
    n = int(round(float(duration) * 1e3 / d))
    if n < 1:
        raise ValueError(f"duration = {duration} ms is shorter than one dwell of {d} us")
    t_s = (np.arange(n) + 0.5 - n / 2) * d * 1e-6
    bt = float(beta) * t_s
    return SampledPulse(float(peak_B1) / np.cosh(bt) * np.exp(-1j * float(mu) * np.log(np.cosh(bt))), d)


def slice_profile(shape, dwell: float, flip: float, offsets=None, n: int = 64, extent: float = 1.5):
    """The slice profile of a shaped excitation, integrated ahead of time:
    the effective flip angle at each slice position, as ``slice_profile=``
    of the played simulators takes it.

    Across the slice the select gradient puts spin z at the offset
    Δf(z) = γ G z from the pulse.  Each offset's rotation is the product
    of the samples' exact rotations about the effective field (B1 sample,
    Δf), as Cayley–Klein pairs (Pauly et al. 1991, IEEE TMI 10:53); its
    effective flip is arccos Mz from equilibrium (the rephasing lobe
    assumed to undo the phase across the slice).

    Parameters
    ----------
    shape : array_like, shape (m,)
        The pulse envelope (any unit, complex allowed), scaled to ``flip``
        as :meth:`SampledPulse.normalised` does.
    dwell : float, µs
    flip : float, deg
        Nominal flip angle (at the slice centre, on resonance).
    offsets : array_like, Hz, optional
        The slice positions as pulse offsets, evenly spaced.  Default:
        ``n`` offsets across ``extent`` times the full width at half
        maximum of the pulse's small-tip profile.
    n : int
        Positions of the default offsets.
    extent : float
        Span of the default offsets, in full widths at half maximum.

    Returns
    -------
    scales : numpy.ndarray, shape (positions,)
        Effective flip over nominal flip at each position.
    weights : numpy.ndarray, shape (positions,)
        Equal weights (the positions are even), summing to 1.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.sequence import slice_profile
    >>> scales, weights = slice_profile(np.sinc(np.linspace(-3, 3, 300)) * np.hanning(300), dwell=10.0, flip=30.0)
    >>> scales.shape, round(float(scales.max()), 1)
    ((64,), 1.0)
    """
    values = _waveform_values("shape", np.asarray(shape))
    area = abs(np.sum(values))
    if area == 0:
        raise ValueError("shape has zero area: it cannot be scaled to a flip angle")
    d = _dwell_us(dwell) * 1e-6
    flip = float(V.protocol_array("flip", flip, low=0.0, strict=True, unit="deg", ndim_max=0))
    w1 = np.radians(flip) * values / area / d  # rad/s per sample, complex: its phase the RF phase
    if offsets is None:
        n = V.positive_int("n", n, minimum=2)
        if not (np.isfinite(extent) and extent > 0):
            raise ValueError(f"extent must be > 0, got {extent!r}")
        # the small-tip profile is the pulse's Fourier transform: its FWHM sets the slice
        pad = 64 * values.size
        spec = np.abs(np.fft.fftshift(np.fft.fft(values, pad)))
        freq = np.fft.fftshift(np.fft.fftfreq(pad, d))
        inside = freq[spec >= 0.5 * spec.max()]
        fwhm = float(inside.max() - inside.min()) + 1.0 / (pad * d)
        offsets = np.linspace(-0.5, 0.5, n) * extent * fwhm
    offsets = np.atleast_1d(V.protocol_array("offsets", offsets))
    dw = 2 * np.pi * offsets
    a = np.ones(offsets.shape, dtype=np.complex128)
    b = np.zeros(offsets.shape, dtype=np.complex128)
    for x in w1:
        wx, wy = x.real, x.imag
        rate = np.sqrt(wx * wx + wy * wy + dw * dw)
        phi = rate * d
        with np.errstate(invalid="ignore", divide="ignore"):
            nx, ny, nz = (np.where(rate > 0, c / rate, 0.0) for c in (wx, wy, dw))
        aj = np.cos(phi / 2) - 1j * nz * np.sin(phi / 2)
        bj = -1j * (nx + 1j * ny) * np.sin(phi / 2)
        a, b = aj * a - np.conj(bj) * b, bj * a + np.conj(aj) * b
    mz = np.clip(np.abs(a) ** 2 - np.abs(b) ** 2, -1.0, 1.0)
    scales = np.arccos(mz) / np.radians(flip)
    return scales, np.full(scales.shape, 1.0 / scales.size)


# --------------------------------------------------------------------------
# Packing

class EventStream:
    """The packed event stream of one playing of a sequence (events.hpp),
    as NumPy arrays ready for the kernels."""

    __slots__ = ("interval", "flags", "shift_before", "shift_after", "flip_rad", "phase_rad",
                 "rx_phase_rad", "slot", "duration_s", "n_samples", "total_shifts", "rf_table",
                 "rf_duration_s", "rf_offset_hz", "rf_power", "driven", "driven_table")

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
    return type(op) if not isinstance(op, Pulse) else Pulse


class _Layout:
    """What a sequence's shape fixes: the grouping of operators into events,
    flags, shifts and output slots.  Values (flips, phases, durations) are
    gathered from the operators into these positions at every call."""

    def __init__(self, ops, n_recorded_from):
        n_ops = len(ops)
        ev_flags, sb, sa, rf_op, rx_op = [], [], [], [], []
        delay_op, delay_event = [], []
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
                    cur["flags"] |= EV_SATURATION
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


# Event-gradient columns of the adjoint kernels (adjoint.hpp EventGradient;
# pools_adjoint.hpp PooledEventGradient adds the pulse's duration and
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
    for j, op in enumerate(ops):
        if isinstance(op, (Pulse, Saturation, RectPulse)):
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
    uniq, inv = np.unique(dur[has_iv], return_inverse=True)
    interval = np.full(n, -1, dtype=np.int32)
    interval[has_iv] = inv.astype(np.int32)
    s.interval = interval
    s.duration_s = np.ascontiguousarray(uniq, dtype=np.float64)
    one = len(prep) + len(rep)
    s.total_shifts = int(sum(abs(int(o.orders)) for o in ops[:one] if isinstance(o, Dephase)))
    return s, ops, lay
