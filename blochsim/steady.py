"""The exact periodic steady state of a repetition that never winds.

A repetition without unbalanced gradients (no :class:`Dephase`) keeps the
state at order 0: the magnetisation (F = Mx + i My, Z) of one isochromat.
One playing is then an affine map x -> A x + b of x = (Re F, Im F, Z) per
voxel, and the periodic steady state is its fixed point
x* = (I - A)^{-1} b (Hargreaves et al. 2001, MRM 46:149, for balanced
SSFP), reached exactly instead of by playing the repetition until it
settles.  The maps are composed in float64 NumPy, per voxel; derivatives
come by the complex step (Squire & Trapp 1998, SIAM Rev 40:110), every
operation being real-analytic in the tissue and protocol values.
"""
from __future__ import annotations

import numpy as np

from blochsim.sequence import Delay, Inversion, Pulse, Readout, Saturation, Spoil, Traced

# Operators the order-0 map plays; Saturation acts on a semisolid pool only,
# which this path never has.
_PLAYED = (Pulse, Delay, Inversion, Spoil, Readout, Saturation)
_STEP = 1e-30
_RAD = np.pi / 180.0  # (np.radians refuses the complex step)


def never_winds(ops) -> bool:
    """True when every operator keeps the state at order 0.

    Parameters
    ----------
    ops : iterable of Operator
        A repetition's elementary operators.

    Returns
    -------
    bool
    """
    return all(isinstance(op, _PLAYED) for op in ops)


def program(ops):
    """The repetition as steps the order-0 map plays.

    Parameters
    ----------
    ops : iterable of Operator
        Operators for which :func:`never_winds` holds.

    Returns
    -------
    list of tuple
        ("pulse", flip_deg, phase_deg), ("delay", ms), ("inversion",),
        ("spoil",) or ("readout", phase_deg); each value a float or a
        :class:`Traced`.
    """
    out = []
    for op in ops:
        if isinstance(op, Pulse):
            out.append(("pulse", op.flip, op.phase))
        elif isinstance(op, Delay):
            out.append(("delay", op.duration))
        elif isinstance(op, Inversion):
            out.append(("inversion",))
        elif isinstance(op, Spoil):
            out.append(("spoil",))
        elif isinstance(op, Readout):
            out.append(("readout", op.phase))
    return out


def _num(x, direction):
    """The value of x, plus i h times its derivative along ``direction`` (a
    protocol entry (name, index, part)) when x is traced."""
    if isinstance(x, Traced):
        return x.value + (1j * _STEP * x.terms.get(direction, 0.0) if direction is not None else 0.0)
    return float(x)


class _Tissue:
    """The tissue values the order-0 maps read, broadcast to the voxels."""

    def __init__(self, tissue, shape, stepped):
        def get(k, default):
            return np.broadcast_to(tissue[k], shape) if k in tissue else default

        self.T1, self.T2 = get("T1", None), get("T2", None)
        self.B1, self.B0 = get("B1", 1.0), get("B0", 0.0)
        self.B1phase = get("B1phase", 0.0) * _RAD
        self.eta, self.M0 = get("inv_efficiency", 1.0), np.asarray(get("M0", 1.0))
        self.dtype = np.complex128 if stepped or any(np.iscomplexobj(v) for v in tissue.values()) else np.float64


def _affine(step, t, values):
    """One step's map x -> T x + c of x = (Re F, Im F, Z), with the step's
    values (numbers: flip and phase in degrees, duration in ms)."""
    kind = step[0]
    if kind == "pulse":
        a = values[0] * _RAD * t.B1
        ph = values[1] * _RAD + t.B1phase
        c2, s2, sa, ca = np.cos(a / 2) ** 2, np.sin(a / 2) ** 2, np.sin(a), np.cos(a)
        C1, S1, C2, S2 = np.cos(ph), np.sin(ph), np.cos(2 * ph), np.sin(2 * ph)
        R = np.empty(np.broadcast_shapes(np.shape(a), np.shape(ph)) + (3, 3), dtype=t.dtype if np.isrealobj(a) and
                     np.isrealobj(ph) else np.complex128)
        R[..., 0, 0], R[..., 0, 1], R[..., 0, 2] = c2 + s2 * C2, s2 * S2, sa * S1
        R[..., 1, 0], R[..., 1, 1], R[..., 1, 2] = s2 * S2, c2 - s2 * C2, -sa * C1
        R[..., 2, 0], R[..., 2, 1], R[..., 2, 2] = -sa * S1, sa * C1, ca
        return R, 0.0
    if kind == "delay":
        tau = values[0]
        E1 = np.exp(-tau / t.T1) if t.T1 is not None else np.ones_like(tau)
        E2 = np.exp(-tau / t.T2) if t.T2 is not None else np.ones_like(tau)
        th = -2 * np.pi * t.B0 * tau * 1e-3
        P = np.zeros(np.broadcast_shapes(np.shape(E1), np.shape(E2), np.shape(th)) + (3, 3),
                     dtype=np.result_type(E1, E2, th, t.dtype))
        P[..., 0, 0], P[..., 0, 1] = E2 * np.cos(th), -E2 * np.sin(th)
        P[..., 1, 0], P[..., 1, 1] = E2 * np.sin(th), E2 * np.cos(th)
        P[..., 2, 2] = E1
        c = np.zeros(np.shape(E1) + (3,), dtype=P.dtype)
        c[..., 2] = 1 - E1
        return P, c
    if kind == "inversion":
        D = np.zeros(np.shape(t.eta) + (3, 3), dtype=np.result_type(t.eta, t.dtype))
        D[..., 0, 0], D[..., 1, 1], D[..., 2, 2] = 1.0, 1.0, -np.asarray(t.eta)
        return D, 0.0
    return np.diag([0.0, 0.0, 1.0]), 0.0  # spoil


def _rows(rx_deg):
    """The readout's rows: Re and Im of F e^{-i rx} as maps of x."""
    c, s = np.cos(rx_deg * _RAD), np.sin(rx_deg * _RAD)
    return np.array([c, s, 0.0 * c]), np.array([-s, c, 0.0 * c])


def _apply(T, c, x):
    return np.einsum("...ij,...j->...i", T, x) + c


def _trajectory(prog, t, shape, direction=None):
    """The fixed point x* of one playing and the states before every step
    (a list), after checking the playing forgets its start."""
    A = np.broadcast_to(np.eye(3, dtype=t.dtype), shape + (3, 3))
    b = np.zeros(shape + (3,), dtype=t.dtype)
    maps = []
    for step in prog:
        if step[0] == "readout":
            maps.append(None)
            continue
        T, c = _affine(step, t, [_num(v, direction) for v in step[1:]])
        maps.append((T, c))
        A, b = T @ A, _apply(T, c, b)
    radius = np.max(np.abs(np.linalg.eigvals(A.real)), axis=-1) if A.size else np.zeros(0)
    if np.any(radius >= 1 - 1e-9):
        raise ValueError("repetitions='auto': the repetition does not settle to a periodic steady state (one "
                         f"playing keeps magnetisation of modulus {float(np.max(radius)):.6g}: no relaxation "
                         "or spoiling removes it); give repetitions as a number")
    x = np.linalg.solve(np.eye(3) - A, b[..., None])[..., 0]
    states = []
    for m in maps:
        states.append(x)
        if m is not None:
            x = _apply(m[0], m[1], x)
    return A, maps, states


def samples(prog, tissue, shape, direction=None):
    """Steady-state samples of a program.

    Parameters
    ----------
    prog : list
        From :func:`program`.
    tissue : dict of array_like
        Tissue values in public units (T1, T2 ms; B0 Hz; B1phase deg; B1,
        M0, inv_efficiency), broadcast to ``shape``; complex for a complex
        step.
    shape : tuple
        The voxel shape.
    direction : tuple, optional
        A protocol entry (name, index, part) to take the complex step along.

    Returns
    -------
    re, im : numpy.ndarray, shape (*shape, samples)
        Real and imaginary parts of the samples (complex when stepped).

    Raises
    ------
    ValueError
        When one playing keeps magnetisation (a map of spectral radius 1).
    """
    t = _Tissue(tissue, shape, direction is not None)
    _, _, states = _trajectory(prog, t, shape, direction)
    re, im = [], []
    for step, x in zip(prog, states):
        if step[0] == "readout":
            r, i = _rows(_num(step[1], direction))
            re.append(np.einsum("...j,j->...", x, r))
            im.append(np.einsum("...j,j->...", x, i))
    if not re:
        return np.zeros(shape + (0,), dtype=t.dtype), np.zeros(shape + (0,), dtype=t.dtype)
    M0 = t.M0[..., None]
    return M0 * np.stack(re, axis=-1), M0 * np.stack(im, axis=-1)


def protocol_gradients(prog, tissue, shape, cotangent):
    """The gradient of a real loss of the steady-state samples with respect
    to every traced protocol entry, by the periodic adjoint: the states'
    adjoints run back through one playing from the adjoint of the fixed
    point, μ = (I − Aᵀ)⁻¹ ρ (ρ: one backward playing from zero), and each
    step's share λᵀ (∂T x + ∂c) is taken by the complex step of that step's
    own values.

    Parameters
    ----------
    prog, tissue, shape
        As for :func:`samples`, ``prog`` built from a traced protocol.
    cotangent : numpy.ndarray, complex, shape (*shape, samples)
        dL/dRe s + i dL/dIm s.

    Returns
    -------
    dict
        (name, index, part) -> dL/d entry, summed over the voxels.
    """
    t = _Tissue(tissue, shape, False)
    A, maps, states = _trajectory(prog, t, shape)
    g = np.broadcast_to(cotangent, shape + cotangent.shape[-1:]) * t.M0[..., None]
    reads = [j for j, step in enumerate(prog) if step[0] == "readout"]

    def backward(lam, visit=None):
        k = len(reads)
        for j in range(len(prog) - 1, -1, -1):
            if maps[j] is None:
                k -= 1
                r, i = _rows(_num(prog[j][1], None))
                if visit is not None:
                    visit(j, lam, g[..., k])
                lam = lam + g[..., k].real[..., None] * r + g[..., k].imag[..., None] * i
            else:
                if visit is not None:
                    visit(j, lam, None)
                lam = np.einsum("...ij,...i->...j", maps[j][0], lam)
        return lam

    rho = backward(np.zeros(shape + (3,)))
    mu = np.linalg.solve(np.swapaxes(np.eye(3) - A, -1, -2), rho[..., None])[..., 0]
    out = {}

    def visit(j, lam, gk):
        step, x = prog[j], states[j]
        for f, v in enumerate(step[1:]):
            if not (isinstance(v, Traced) and v.terms):
                continue
            values = [_num(w, None) for w in step[1:]]
            values[f] = values[f] + 1j * _STEP
            if gk is None:  # lam is the adjoint after the step
                T, c = _affine(step, t, values)
                d = (np.einsum("...ij,...j->...i", T, x) + c).imag / _STEP
                share = float(np.sum(lam * d))
            else:  # a readout: its phase moves the rows
                r, i = _rows(values[0])
                share = float(np.sum(gk.real * np.einsum("...j,j->...", x, r.imag / _STEP)
                                     + gk.imag * np.einsum("...j,j->...", x, i.imag / _STEP)))
            for key, coeff in v.terms.items():
                out[key] = out.get(key, 0.0) + coeff * share

    backward(mu, visit)
    return out


def signal(prog, tissue, shape):
    """Steady-state samples.

    Parameters
    ----------
    prog, tissue, shape
        As for :func:`samples`.

    Returns
    -------
    numpy.ndarray, complex128, shape (*shape, samples)
    """
    re, im = samples(prog, tissue, shape)
    return re + 1j * im


def tissue_derivative(prog, tissue, shape, name):
    """d samples / d tissue[name] (per public unit) by the complex step.

    Parameters
    ----------
    prog, tissue, shape
        As for :func:`samples`.
    name : str
        A key of ``tissue``.

    Returns
    -------
    numpy.ndarray, complex128, shape (*shape, samples)
    """
    x = np.asarray(tissue[name], dtype=np.float64)
    h = _STEP * np.maximum(np.abs(x), 1.0)
    re, im = samples(prog, {**tissue, name: x + 1j * h}, shape)
    return (re.imag + 1j * im.imag) / np.asarray(h)[..., None]
