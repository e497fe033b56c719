"""Traced values: numbers that carry their derivative with respect to
protocol entries through the operators' arithmetic, so that the packer can
record where each protocol value went (reverse mode, SPEC §4)."""
from __future__ import annotations

import numpy as np


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
