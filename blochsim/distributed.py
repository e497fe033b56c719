"""Blochsim on Dask: simulations, dictionaries and PERK training as Dask graphs.

A simulator's ``simulate``, ``jacobian`` and ``vjp`` called with a
``dask.array.Array`` among the tissue values return lazy Dask arrays,
chunked along the voxels like the input, computed on whatever scheduler is
active: threads by default, a ``dask.distributed.Client`` if one exists
(``pip install "blochsim[distributed]"``).  :class:`~blochsim.estimators.
DictionaryMatcher` and :class:`~blochsim.estimators.PERK` fit on a cluster
with ``fit(..., dask=True)``; their ``map`` of a Dask array returns Dask
maps.  ``import blochsim`` never imports Dask; this module does.

Determinism: every task computes a fixed piece (voxel chunks as given;
dictionary chunks of ``chunk`` atoms; PERK training blocks of
:data:`blochsim.estimators.perk.TRAINING_BLOCK` draws, each seeded by its counter) and pieces are
combined in a fixed order (a binary tree over the piece index), so a result
is bitwise the same on one process, on threads and on any number of
workers, and when Dask retries a task of a lost worker.  Tissue values in
Dask arrays are checked chunk by chunk when computed.
"""
from __future__ import annotations

import copy
import itertools
import operator

import numpy as np

try:
    import dask
    import dask.array as da
    from dask.delayed import Delayed
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError("blochsim.distributed needs Dask: pip install 'blochsim[distributed]'") from e

__all__ = ["lazy_call", "tree_sum"]

# a valid value of each tissue property, for the one-voxel call that tells
# a lazy call's sample count and dtype without computing anything
_PROBE = {"T1": 1000.0, "T2": 80.0, "T2star": 40.0, "T2prime": 50.0, "M0": 1.0, "B1": 1.0, "B0": 0.0,
          "B1phase": 0.0, "inv_efficiency": 1.0, "D": 1.0, "v": 0.0, "Dxx": 1.0, "Dyy": 1.0, "Dzz": 1.0,
          "Dxy": 0.0, "Dxz": 0.0, "Dyz": 0.0, "fat_fraction": 0.1, "CBF": 50.0, "ATT": 1000.0,
          "bound_fraction": 0.1, "bound_exchange": 10.0, "bound_T1": 1000.0, "bound_T2": 0.012}
for _x in "BCDE":
    _PROBE.update({f"pool{_x}_fraction": 0.05, f"pool{_x}_exchange": 10.0, f"pool{_x}_T1": 1000.0,
                   f"pool{_x}_T2": 50.0, f"pool{_x}_shift": 0.0})


def tree_sum(parts, add=operator.add):
    """Delayed sum of ``parts`` (delayed values or values) pairwise in a
    fixed binary tree over their order (the first two, the next two, ...,
    then the pairs' sums likewise, an odd last one carried up), so that the
    float rounding does not depend on how or where they were computed."""
    parts = list(parts)
    if not parts:
        raise ValueError("tree_sum of nothing")
    while len(parts) > 1:
        parts = [dask.delayed(add, pure=True)(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0] if isinstance(parts[0], Delayed) else dask.delayed(parts[0])


# a multi-channel B1 travels as one voxel-shaped plane per channel, under
# these names, and is stacked again in each block
_CHANNEL = "B1 channel "


def _channel_planes(values):
    """The call's values with a multi-channel B1 (complex, (channels,
    *voxels)) as one plane per channel, and the channel count (0: none)."""
    b1 = values.get("B1")
    if b1 is None or np.dtype(getattr(b1, "dtype", np.asarray(b1).dtype)).kind != "c" or np.ndim(b1) == 0:
        return values, 0
    values = dict(values)
    b1 = values.pop("B1")
    for c in range(b1.shape[0]):
        values[f"{_CHANNEL}{c}"] = b1[c]
    return values, b1.shape[0]


def _stacked(kw):
    """kw with the channel planes stacked into B1 (channels, *voxels)."""
    planes = sorted((k for k in kw if k.startswith(_CHANNEL)), key=lambda k: int(k[len(_CHANNEL):]))
    if planes:
        kw["B1"] = np.stack([np.asarray(kw.pop(k)) for k in planes])
    return kw


def _split(sim, values, what):
    """The tissue arrays (Dask or array-like, broadcast and chunked alike as
    Dask arrays over the voxel shape) and the constant values of a call."""
    arrays, consts = {}, {}
    for k, v in values.items():
        if (k in sim.tissue_properties or k.startswith(_CHANNEL)) and (isinstance(v, da.Array) or np.ndim(v) > 0):
            arrays[k] = v
        else:
            if isinstance(v, da.Array):
                raise TypeError(f"{what}: {k} is a Dask array, but only tissue values may be "
                                f"({type(sim).__name__} models {list(sim.tissue_properties)})")
            consts[k] = v
    for k, v in arrays.items():
        if isinstance(v, da.Array) and any(np.isnan(c) for cs in v.chunks for c in cs):
            raise ValueError(f"{what}: {k} is a Dask array of unknown chunk sizes (from a boolean index, say); "
                             f"call {k}.compute_chunk_sizes() first")
    try:
        shape = np.broadcast_shapes(*(np.shape(v) for v in arrays.values()))
    except ValueError:
        shapes = {k: np.shape(v) for k, v in arrays.items()}
        raise ValueError(f"{what}: tissue shapes {shapes} do not broadcast") from None
    lazy = [da.broadcast_to(v if isinstance(v, da.Array) else da.from_array(np.asarray(v)), shape)
            for v in arrays.values()]
    ind = tuple(range(len(shape)))
    _, lazy = da.core.unify_chunks(*itertools.chain.from_iterable((a, ind) for a in lazy))
    return dict(zip(arrays, lazy)), consts, shape


def _probe(sim, name, args, arrays, consts):
    """The call on one voxel of valid values on the host: what the lazy
    call's blocks return, per voxel."""
    host = copy.copy(sim)
    if getattr(host, "device", None) is not None:
        host.device = "cpu"
    kw = dict(consts)
    for k, a in arrays.items():
        kw[k] = np.full(1, _PROBE.get(k, 1.0), a.dtype if a.dtype.kind in "fc" else np.float64)
    return getattr(host, name)(*args, **_stacked(kw))


def _call(sim, name, args, names, consts, *blocks):
    kw = dict(consts)
    kw.update(zip(names, blocks))
    return getattr(sim, name)(*args, **_stacked(kw))


def _simulate_block(sim, name, args, names, consts, *blocks):
    return np.asarray(_call(sim, name, args, names, consts, *blocks))


def _jacobian_block(sim, name, args, names, consts, *blocks):
    s, J = _call(sim, name, args, names, consts, *blocks)
    s, J = np.asarray(s), np.asarray(J)
    J = J if J.ndim == s.ndim + 1 else J[..., None, :]
    return np.concatenate([s[..., None, :], J], axis=-2)


def _vjp_signal_block(sim, name, args, names, consts, *blocks):
    return np.asarray(_call(sim, name, args, names, consts, *blocks)[0])


def _vjp_block(sim, name, args, names, consts, cot, *blocks):
    _, pullback = _call(sim, name, args, names, consts, *blocks)
    return pullback(np.asarray(cot))


def lazy_call(sim, name, args, values):
    """``sim.<name>(*args, **values)`` (simulate, jacobian or vjp) with Dask
    arrays among the tissue values, as a lazy Dask graph over the voxel
    chunks (what the simulators' public methods hand over)."""
    what = f"{type(sim).__name__}.{name}"
    if name not in ("simulate", "jacobian", "vjp"):
        raise TypeError(f"{what} takes NumPy or device arrays, not Dask arrays (compute the chunks you need, or "
                        f"call it inside a task of your own)")
    args = list(args)
    if name == "simulate" and args:
        values["out"] = args.pop(0)
    if name == "jacobian" and len(args) > 2:
        values["out"] = args.pop(2)
    if values.pop("out", None) is not None:
        raise TypeError(f"{what}: out= is not taken with Dask inputs (the result is a lazy Dask array)")
    args = tuple(args)
    values, channels = _channel_planes(values)
    arrays, consts, shape = _split(sim, values, what)
    names = tuple(arrays)
    lazy = list(arrays.values())
    nd = len(shape)
    probe = _probe(sim, name, args, arrays, consts)
    common = (sim, name, args, names, consts)
    if name == "simulate":
        p = np.asarray(probe)
        extra = p.shape[1:]
        return da.map_blocks(_simulate_block, *common, *lazy, new_axis=list(range(nd, nd + len(extra))),
                             chunks=lazy[0].chunks + tuple((n,) for n in extra), dtype=p.dtype,
                             meta=np.empty((0,) * (nd + len(extra)), p.dtype))
    if name == "jacobian":
        s, J = (np.asarray(a) for a in probe)
        one = J.ndim == s.ndim
        m = 1 if one else J.shape[1]
        dtype = np.result_type(s.dtype, J.dtype)
        both = da.map_blocks(_jacobian_block, *common, *lazy, new_axis=[nd, nd + 1],
                             chunks=lazy[0].chunks + ((1 + m,), (s.shape[-1],)), dtype=dtype,
                             meta=np.empty((0,) * (nd + 2), dtype))
        return both[..., 0, :].astype(s.dtype), (both[..., 1, :] if one else both[..., 1:, :]).astype(J.dtype)
    s0, pull0 = probe
    s0 = np.asarray(s0)
    signal = da.map_blocks(_vjp_signal_block, *common, *lazy, new_axis=[nd], chunks=lazy[0].chunks + ((s0.shape[-1],),),
                           dtype=s0.dtype, meta=np.empty((0,) * (nd + 1), s0.dtype))
    g0 = pull0(np.ones_like(s0))
    given = {k: np.shape(values[k]) for k in names if not k.startswith(_CHANNEL)}
    if channels:  # the maps' gradient: (channels, *voxels) from each block
        names = tuple(k for k in names if not k.startswith(_CHANNEL)) + ("B1",)
        given["B1"] = (channels,) + np.broadcast_shapes(*(np.shape(values[f"{_CHANNEL}{c}"])
                                                          for c in range(channels)))

    def pullback(cotangent):
        """dL/d name for each name of ``wrt`` (Dask arrays): a tissue
        property's shaped as passed, a protocol parameter's summed over the
        voxel chunks in a fixed tree."""
        cot = cotangent if isinstance(cotangent, da.Array) else da.from_array(np.asarray(cotangent))
        if cot.shape != signal.shape:
            raise ValueError(f"{what} pullback: the cotangent has shape {cot.shape}; the signal has "
                             f"{signal.shape}")
        cot = cot.rechunk(signal.chunks)
        blocks = list(np.ndindex(*lazy[0].numblocks)) if nd else [()]
        parts = {}
        for idx in blocks:
            parts[idx] = dask.delayed(_vjp_block, pure=True)(*common, cot.blocks[idx + (0,)],
                                                             *(a.blocks[idx] for a in lazy))
        out = {}
        for k, g in g0.items():
            g = np.asarray(g)
            if k not in names:  # a protocol parameter or a scalar tissue value: summed over the chunks
                out[k] = da.from_delayed(tree_sum([parts[idx][k] for idx in blocks]), shape=g.shape, dtype=g.dtype)
                continue
            lead = (channels,) if channels and k == "B1" else ()
            pieces = np.empty(lazy[0].numblocks, dtype=object)
            for idx in blocks:
                bshape = lead + tuple(c[i] for c, i in zip(lazy[0].chunks, idx))
                pieces[idx] = da.from_delayed(parts[idx][k], shape=bshape, dtype=g.dtype)
            full = da.block(pieces.tolist()) if nd else pieces[()]
            out[k] = full if given[k] == shape else _sum_to(full, given[k])
        return out

    return signal, pullback


def _sum_to(g, shape):
    """g (the voxel shape) summed over the axes a value of ``shape`` was
    broadcast along."""
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes).reshape(shape) if axes else g


# --------------------------------------------------------------------------
# PERK


def _perk_block(perk, uncertainty, known_names, signals, *known):
    maps = perk.map(signals, known=dict(zip(known_names, known)), uncertainty=uncertainty)
    return np.stack([maps[k] for k in sorted(maps)], axis=-1)


def perk_map(perk, signals, known, uncertainty):
    """PERK.map of Dask signals (or known maps): a map per voxel chunk."""
    if perk._model is None:
        raise RuntimeError("PERK.map needs a fitted PERK: call fit() first")
    sig = signals if isinstance(signals, da.Array) else da.from_array(np.asarray(signals))
    if sig.ndim == 0 or sig.shape[-1] != perk.contrasts:
        raise ValueError(f"PERK.map: signals have {sig.shape[-1] if sig.ndim else 0} contrasts along their last "
                         f"axis (shape {sig.shape}); the fitted simulator gives {perk.contrasts}")
    sig = sig.rechunk(sig.chunks[:-1] + ((perk.contrasts,),))
    shape = sig.shape[:-1]
    known = dict(known or {})
    names = tuple(k for k in perk.known if k in known)
    cols = []
    for k in names:
        v = known[k]
        try:
            v = da.broadcast_to(v if isinstance(v, da.Array) else da.from_array(np.asarray(v, np.float64)), shape)
        except ValueError:
            raise ValueError(f"PERK.map: known {k} of shape {np.shape(v)} does not broadcast to the voxel shape "
                             f"{shape}") from None
        cols.append(v.rechunk(sig.chunks[:-1]))
    outputs = sorted(perk.names + ([k + "_std" for k in perk.names] if uncertainty else []))
    nd = len(shape)
    ind = tuple(range(nd))
    stacked = da.blockwise(_perk_block, ind + (nd,), perk, None, uncertainty, None, names, None,
                           sig, ind + (nd,), *itertools.chain.from_iterable((c, ind) for c in cols),
                           new_axes={nd: len(outputs)}, dtype=np.float32, concatenate=True,
                           meta=np.empty((0,) * (nd + 1), np.float32))
    return {k: stacked[..., i] for i, k in enumerate(outputs)}
