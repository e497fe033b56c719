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
    def get(k, default):
        return np.broadcast_to(tissue[k], shape) if k in tissue else default

    T1, T2 = get("T1", None), get("T2", None)
    B1, B0 = get("B1", 1.0), get("B0", 0.0)
    B1phase = get("B1phase", 0.0) * _RAD
    eta, M0 = get("inv_efficiency", 1.0), get("M0", 1.0)
    dtype = np.complex128 if any(np.iscomplexobj(v) for v in tissue.values()) or direction is not None \
        else np.float64
    M = np.broadcast_to(np.eye(3, dtype=dtype), shape + (3, 3)).copy()  # the map since the start
    v = np.zeros(shape + (3,), dtype=dtype)
    reads = []  # (row of Re, offset, row of Im, offset) per sample, as maps of the start state
    for step in prog:
        kind = step[0]
        if kind == "pulse":
            a = _num(step[1], direction) * _RAD * B1
            ph = _num(step[2], direction) * _RAD + B1phase
            c2, s2, sa, ca = np.cos(a / 2) ** 2, np.sin(a / 2) ** 2, np.sin(a), np.cos(a)
            C1, S1, C2, S2 = np.cos(ph), np.sin(ph), np.cos(2 * ph), np.sin(2 * ph)
            R = np.empty(np.broadcast_shapes(np.shape(a), np.shape(ph)) + (3, 3), dtype=dtype)
            R[..., 0, 0], R[..., 0, 1], R[..., 0, 2] = c2 + s2 * C2, s2 * S2, sa * S1
            R[..., 1, 0], R[..., 1, 1], R[..., 1, 2] = s2 * S2, c2 - s2 * C2, -sa * C1
            R[..., 2, 0], R[..., 2, 1], R[..., 2, 2] = -sa * S1, sa * C1, ca
            M, v = R @ M, np.einsum("...ij,...j->...i", R, v)
        elif kind == "delay":
            tau = _num(step[1], direction)
            E1 = np.exp(-tau / T1) if T1 is not None else 1.0
            E2 = np.exp(-tau / T2) if T2 is not None else 1.0
            th = -2 * np.pi * B0 * tau * 1e-3
            P = np.zeros(np.broadcast_shapes(np.shape(E1), np.shape(E2), np.shape(th)) + (3, 3), dtype=dtype)
            P[..., 0, 0], P[..., 0, 1] = E2 * np.cos(th), -E2 * np.sin(th)
            P[..., 1, 0], P[..., 1, 1] = E2 * np.sin(th), E2 * np.cos(th)
            P[..., 2, 2] = E1
            M, v = P @ M, np.einsum("...ij,...j->...i", P, v)
            v = v.copy()
            v[..., 2] = v[..., 2] + (1 - E1)
        elif kind == "inversion":
            M, v = M.copy(), v.copy()
            M[..., 2, :] = M[..., 2, :] * -np.asarray(eta)[..., None]
            v[..., 2] = v[..., 2] * -eta
        elif kind == "spoil":
            M, v = M.copy(), v.copy()
            M[..., :2, :] = 0.0
            v[..., :2] = 0.0
        elif kind == "readout":
            rx = _num(step[1], direction) * _RAD
            c, s = np.cos(rx), np.sin(rx)
            re_row, im_row = c * M[..., 0, :] + s * M[..., 1, :], c * M[..., 1, :] - s * M[..., 0, :]
            reads.append((re_row, c * v[..., 0] + s * v[..., 1], im_row, c * v[..., 1] - s * v[..., 0]))
    A, b = M, v
    radius = np.max(np.abs(np.linalg.eigvals(A.real)), axis=-1) if A.size else np.zeros(0)
    if np.any(radius >= 1 - 1e-9):
        raise ValueError("repetitions='auto': the repetition does not settle to a periodic steady state (one "
                         f"playing keeps magnetisation of modulus {float(np.max(radius)):.6g}: no relaxation "
                         "or spoiling removes it); give repetitions as a number")
    x = np.linalg.solve(np.eye(3) - A, b[..., None])[..., 0]
    re = np.stack([np.einsum("...j,...j->...", r, x) + o for r, o, _, _ in reads], axis=-1) if reads else \
        np.zeros(shape + (0,), dtype=dtype)
    im = np.stack([np.einsum("...j,...j->...", r, x) + o for _, _, r, o in reads], axis=-1) if reads else \
        np.zeros(shape + (0,), dtype=dtype)
    M0 = np.asarray(M0)[..., None]
    return M0 * re, M0 * im


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


def entry_derivative(prog, tissue, shape, direction):
    """d samples / d one protocol entry by the complex step.

    Parameters
    ----------
    prog, tissue, shape
        As for :func:`samples`; ``prog`` built from a traced protocol.
    direction : tuple
        (name, index, part) of the entry, as :func:`blochsim.sequence.trace`
        labels it.

    Returns
    -------
    numpy.ndarray, complex128, shape (*shape, samples)
    """
    re, im = samples(prog, tissue, shape, direction)
    return (re.imag + 1j * im.imag) / _STEP
