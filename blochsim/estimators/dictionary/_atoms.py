"""The kernels both halves of the dictionary estimator share: atoms made
unit rows, their Gram matrix and basis, the best atoms of a block of
signals and their exact refinement, and the protocol record a stored
dictionary carries."""
from __future__ import annotations

import importlib
import numbers

import numpy as np

from blochsim import _core
from blochsim.estimators._common import _simulate_table
from blochsim.subspace import gram, leading


def _protocol_record(sim, what, where):
    """The simulator's protocol as (JSON-able values, arrays), refusing a
    value ``where`` (a file, a store) cannot hold."""
    arrays, protocol = {}, {}
    for key, value in getattr(sim, "_given", {}).items():
        if value is None or isinstance(value, (bool, str, numbers.Number)):
            protocol[key] = value.item() if isinstance(value, np.generic) else value
            continue
        try:
            a = np.asarray(value)
        except Exception:
            a = None
        if a is None or a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
            raise ValueError(f"{what}: the protocol parameter {key} ({type(value).__name__}) cannot be written "
                             f"to {where}")
        arrays[key] = a
    return protocol, arrays


def _rebuild(name, protocol, arrays):
    """The shipped simulator class ``module:qualname`` with its protocol."""
    module, _, qualname = name.partition(":")
    if not (module == "blochsim" or module.startswith("blochsim.")):
        raise ValueError(f"DictionaryMatcher.load: the dictionary was made by {qualname} ({module}), which is "
                         f"not shipped with blochsim; pass simulator= to load it")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj(**protocol, **arrays)


def _exact(sim, params_at, fixed, flat, idx, norms, k, chunk):
    """Re-rank each signal's candidate atoms ``idx`` (n, m), whose norms are
    ``norms`` (n, m), by their exact inner products with the full signal,
    the atoms simulated again (``params_at(indices)`` their parameters); the
    k best as (indices, <unit atom, s>)."""
    n, m = idx.shape
    best_i = np.empty((n, k), np.int64)
    best_d = np.empty((n, k), np.complex128)
    rows = max(1, chunk // m)
    for a in range(0, n, rows):
        ic = idx[a:a + rows]
        atoms = _simulate_table(sim, params_at(ic.reshape(-1)), fixed, chunk)
        atoms = atoms.astype(np.complex128).reshape(len(ic), m, -1)
        d = np.einsum("vmc,vc->vm", atoms.conj(), flat[a:a + rows].astype(np.complex128))
        d /= norms[a:a + rows]
        order = np.argsort(-np.abs(d), axis=1, kind="stable")[:, :k]
        best_i[a:a + rows] = np.take_along_axis(ic, order, 1)
        best_d[a:a + rows] = np.take_along_axis(d, order, 1)
    return best_i, best_d


def _basis(G, tolerance=None, rank=None):
    """The leading eigenvectors of the Gram matrix G as a complex64 basis:
    ``rank`` of them, or the fewest that keep all but ``tolerance`` of the
    energy."""
    U, _ = leading(G, rank, tolerance)
    return _flush(np.ascontiguousarray(U.astype(np.complex64)))


#: parts of unit vectors below this are set to 0: they change no inner
#: product in single precision, and products of two of them would be
#: subnormal, which x86 multiplies a hundred times slower
_FLUSH = 1e-18


def _flush(unit):
    """``unit`` (complex, rows or columns of unit norm) with the real and
    imaginary parts below :data:`_FLUSH` set to 0, in place."""
    flat = unit.view(unit.real.dtype)
    flat[np.abs(flat) < _FLUSH] = 0
    return unit


def _unit_rows(atoms):
    """Rows scaled to unit norm (null rows stay null), and their norms
    (float64, summed in float64)."""
    atoms = np.ascontiguousarray(atoms)
    flat = atoms.view(atoms.real.dtype).reshape(len(atoms), -1) if np.iscomplexobj(atoms) else atoms
    norms = np.sqrt(np.einsum("ij,ij->i", flat, flat, dtype=np.float64))
    scale = (1.0 / np.where(norms > 0, norms, 1.0)).astype(atoms.real.dtype)
    unit = atoms * scale[:, None]
    return (_flush(unit) if np.iscomplexobj(unit) else unit), norms


def _best(q, atoms, m, threads):
    """The m best atoms of each signal by abs(<atom, s>)², ties to the lower
    atom index, from the fused matching kernel (match.hpp): q (n, r) and
    atoms (N, r) complex; (indices (n, m) int64, <atom, s> (n, m)
    complex128, powers (n, m) float64 -- the single-precision ranking key),
    best first; slots past the atoms hold index -1 and power -1."""
    q = np.ascontiguousarray(q, dtype=np.complex64)
    atoms = np.ascontiguousarray(atoms, dtype=np.complex64)
    n, r = q.shape
    idx = np.empty((n, m), np.int64)
    power = np.empty((n, m), np.float32)
    dot = np.empty((n, 2 * m), np.float64)
    _core.match(q.view(np.float32).reshape(n, 2 * r), atoms.view(np.float32).reshape(len(atoms), 2 * r),
                idx, power, dot, threads=threads)
    return idx, dot.view(np.complex128), power.astype(np.float64)


#: candidates kept beyond those asked for, re-ranked by their
#: double-precision inner products: the single-precision ranking can swap
#: atoms whose scores differ by about 1e-7, and the exact order of the
#: candidates then decides
EXACT_MARGIN = 3


def _exact_order(idx, dot, m):
    """The m best candidates (idx, dot) (n, m') by their double-precision
    powers abs(dot)², ties to the lower atom index, empty slots last."""
    power = np.where(idx >= 0, dot.real ** 2 + dot.imag ** 2, -1.0)
    order = np.lexsort((np.where(idx < 0, np.iinfo(np.int64).max, idx), -power), axis=1)[:, :m]
    return np.take_along_axis(idx, order, 1), np.take_along_axis(dot, order, 1)


def _merge_best(m, *parts):
    """The m best of candidate sets (indices, values..., power), each (n,
    m_i), by power, ties to the lower atom index, empty slots (index -1)
    last; the tuple's other arrays follow."""
    cat = [np.concatenate(x, axis=1) for x in zip(*parts)]
    idx, power = cat[0], cat[-1]
    if idx.size == 0:
        return tuple(x[:, :m] for x in cat)
    order = np.lexsort((np.where(idx < 0, np.iinfo(np.int64).max, idx), -power), axis=1)[:, :m]
    return tuple(np.take_along_axis(x, order, 1) for x in cat)
