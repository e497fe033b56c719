"""Helpers the simulator families share: protocol checks, closed-form pieces
and the function forms."""
from __future__ import annotations

import numpy as np

from blochsim._arrays import validate as V


def _train(name, value, n=None, *, low=None, strict=False, unit=""):
    """A per-event protocol array: scalar broadcast to n, or exactly n entries."""
    arr = V.protocol_array(name, value, low=low, strict=strict, unit=unit, length=n)
    if n is None:
        return np.atleast_1d(arr)
    return np.broadcast_to(arr, (n,)).astype(np.float64)


def _scalar(name, value, **bounds):
    """A scalar protocol parameter as a float (bounds as V.protocol_array)."""
    return float(V.protocol_array(name, value, ndim_max=0, **bounds))


def _ernst(a, TR, T1):
    """sin a (1 - E1) / (1 - cos a E1), E1 = e^{-TR/T1}: the spoiled steady
    state over M0, with 1 - E1 by expm1 so that it stays exact where E1
    rounds to 1 (T1 far longer than TR, a flip of 0)."""
    u = -np.expm1(-TR / T1)
    return np.sin(a) * u / (u + 2 * np.sin(a / 2) ** 2 * (1 - u))


def _relaxes(TR, T1, T2=None):
    """Refuse a steady state whose TR is so short against T1 (and T2) that
    no relaxation happens in double precision: the closed form is then
    0/0 (and without relaxation no steady state exists)."""
    times = [("T1", T1)] + ([] if T2 is None else [("T2", T2)])
    TR = np.real(TR)  # the real part: derivatives by the complex step pass through here
    for name, T in times:
        T = np.real(T)
        ratio = np.asarray(TR, dtype=np.float64) / np.asarray(T, dtype=np.float64)
        if np.any(ratio < _MIN_RELAXATION):
            raise ValueError(f"TR = {float(np.min(TR)):g} ms against {name} = {float(np.max(T)):g} ms relaxes "
                             f"nothing in double precision (TR/{name} < {_MIN_RELAXATION:g}): the steady state "
                             "is not defined")


#: smallest TR/T1 (TR/T2) a closed-form steady state resolves
_MIN_RELAXATION = 1e-9


def _need(sim, p, keys):
    """Refuse a call whose protocol lacks any of ``keys``."""
    for k in keys:
        if p[k] is None:
            raise TypeError(f"{type(sim).__name__} needs protocol parameter {k!r}")


def _te_of(p):
    """TE for the operators: a TE that defaults to TR/2 follows TR, so that
    TR's gradient (vjp) includes TE's share; the value is unchanged."""
    te = p["TE"]
    if p.get("_TE_is_half_TR"):
        te = te + 0.5 * (p["TR"] - float(p["TR"]))
    return te


def _echo_within(p, limit, what="TR"):
    """Refuse an echo time TE past ``limit`` (ms)."""
    if p["TE"] > limit:
        raise ValueError(f"TE = {p['TE']:g} ms must be at most {what} = {limit:g} ms")


def _contrasts(p, names):
    """Broadcast scalar-or-per-contrast protocol arrays to one contrast axis."""
    arrs = [np.atleast_1d(p[k]) for k in names]
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrs))
    except ValueError:
        raise ValueError("protocol arrays do not broadcast to one contrast count: " +
                         ", ".join(f"{k} {a.shape}" for k, a in zip(names, arrs))) from None
    return [np.broadcast_to(a, shape) for a in arrs]


def _complex_step(sim, p, t, names):
    """Derivatives of a real closed form by the complex step (Squire &
    Trapp 1998, SIAM Rev 40:110): for a signal real-analytic in each tissue
    value x, Im f(x + i h) / h is its derivative to round-off."""
    out = {}
    for k in names:
        x = t.get(k, np.ones((1, 1)))
        h = 1e-30 * np.maximum(np.abs(x), 1.0)
        out[k] = np.imag(sim.signal(p, {**t, k: x + 1j * h})) / h
    return out


def _function_form(cls, name):
    def f(**kwargs):
        proto = {k: v for k, v in kwargs.items() if k in cls._common or k in cls.protocol
                 or k in ("device", "threads")}
        rest = {k: v for k, v in kwargs.items() if k not in proto and k not in ("diff", "order")}
        if "diff" in kwargs:
            return cls(**proto).jacobian(kwargs["diff"], kwargs.get("order", 1), **rest)
        return cls(**proto).simulate(**rest)

    f.__name__ = name
    f.__qualname__ = name
    f.__doc__ = (f"Function form of :class:`{cls.__name__}`: protocol and tissue as keywords.\n\n"
                 f"``{name}(**kw)`` is ``{cls.__name__}(**protocol).simulate(**tissue)``; see the class "
                 f"for the parameters, units and the returned array.  With ``diff=`` (a tissue "
                 f"property or a sequence of them) it returns ``(signal, J)``, as "
                 f":meth:`{cls.__name__}.jacobian`.\n")
    return f
