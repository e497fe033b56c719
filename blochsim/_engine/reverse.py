"""Reverse-mode assembly: cotangents checked and shaped, and the adjoint's
per-event and per-voxel gradients turned into gradients of the protocol
parameters (through the packer's provenance) and of the tissue (per public
unit, reduced to each property's shape)."""
from __future__ import annotations

import numpy as np

from blochsim import _core
from blochsim._arrays import validate as V


def fields_and_scale(names):
    """The kernels' tissue field of each name and the SI value of one of its
    public units (a derivative per SI unit times it is per public unit)."""
    return ([_core.TISSUE_FIELDS.index(V.TISSUE_UNITS[k][1]) for k in names],
            np.array([V.TISSUE_UNITS[k][0] for k in names]))


def cotangent(value, shape, of="the signal's", dtype=np.complex64):
    """A pullback's cotangent ``value`` as a C-contiguous complex array
    (complex64 by default) of the signal's shape (or the Jacobian's:
    ``of``)."""
    c = np.asarray(value)
    if c.dtype.kind not in "fc":
        raise TypeError(f"cotangent must be a float or complex array, got dtype {c.dtype}")
    if c.shape != tuple(shape):
        raise ValueError(f"cotangent must have {of} shape {tuple(shape)}, got {c.shape}")
    if not np.all(np.isfinite(c)):
        raise ValueError("cotangent must be finite")
    return np.ascontiguousarray(c, dtype=dtype)


def reduce_to(g, shape):
    """Sum g over the axes it was broadcast along from ``shape``."""
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, (a, b) in enumerate(zip(shape, g.shape)) if a == 1 and b != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def assemble(names, p, prov, pshapes, ev, tg, scale, tissue_names, shape, tshapes):
    """The pullback's dict from the adjoint's per-event and per-voxel
    gradients: protocol entries through their provenance, tissue per public
    unit reduced to each property's shape."""
    out = {}
    if ev.shape[1] < 6:  # the single-pool adjoint has no pulse duration or offset columns
        ev = np.concatenate([ev, np.zeros((ev.shape[0], 6 - ev.shape[1]))], axis=1)
    for k in names:
        if k in tshapes:
            j = tissue_names.index(k)
            g = (tg[:, j].astype(np.float64) * scale[j]).reshape(shape)
            out[k] = reduce_to(g, tshapes[k])
            continue
        full = np.shape(p[k])
        cplx = np.iscomplexobj(p[k])
        g = np.zeros(full, dtype=np.complex128 if cplx else np.float64)
        if k in prov:
            event, column, index, part, coef = prov[k]
            contrib = coef * ev[event, column]
            flat = np.zeros(len(contrib), np.int64) if full == () else \
                np.ravel_multi_index(tuple(np.array(index).T), full)
            size = max(int(np.prod(full)), 1)
            # a complex entry's gradient is dL/dRe + i dL/dIm (SPEC §4)
            g = np.bincount(flat, weights=np.where(part == 0, contrib, 0.0), minlength=size)
            if cplx:
                g = g + 1j * np.bincount(flat, weights=np.where(part == 1, contrib, 0.0), minlength=size)
            g = g.reshape(full)
        out[k] = g.sum().reshape(()) if pshapes[k] == () and g.shape != () else g
    return out
