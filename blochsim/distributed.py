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


def _split(sim, values, what):
    """The tissue arrays (Dask or array-like, broadcast and chunked alike as
    Dask arrays over the voxel shape) and the constant values of a call."""
    arrays, consts = {}, {}
    for k, v in values.items():
        if k in sim.tissue_properties and (isinstance(v, da.Array) or np.ndim(v) > 0):
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
        kw[k] = np.full(1, _PROBE.get(k, 1.0), a.dtype if a.dtype.kind == "f" else np.float64)
    return getattr(host, name)(*args, **kw)


def _call(sim, name, args, names, consts, *blocks):
    kw = dict(consts)
    kw.update(zip(names, blocks))
    return getattr(sim, name)(*args, **kw)


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
    given = {k: np.shape(values[k]) for k in names}

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
            pieces = np.empty(lazy[0].numblocks, dtype=object)
            for idx in blocks:
                bshape = tuple(c[i] for c, i in zip(lazy[0].chunks, idx))
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
# Dictionaries


def _grid_params(grids, index):
    """Parameters of the atoms ``index`` (flat indices into the grids'
    Cartesian product, first axis slowest, as DictionaryMatcher.fit lays
    them out)."""
    index = np.asarray(index)
    sub = np.unravel_index(index, tuple(len(v) for v in grids.values()))
    return {k: v[i] for (k, v), i in zip(grids.items(), sub)}


def _atom_chunk(sim, grids, fixed, a, b, basis):
    """Unit atoms a to b - 1 (onto ``basis`` when given), complex64, and
    their norms, float64.  A worker whose simulator runs on its GPU
    projects there too: only the projections cross to the host."""
    from blochsim.estimators import _on_device
    from blochsim.estimators.dictionary import _simulate_table, _unit_rows
    params = _grid_params(grids, np.arange(a, b))
    if basis is not None and _on_device.simulator_on_device(sim):
        return _on_device.projected_chunk(sim, params, fixed, basis)
    atoms = _simulate_table(sim, params, fixed, b - a).astype(np.complex64, copy=False)
    unit, norms = _unit_rows(atoms)
    return np.ascontiguousarray(unit @ basis if basis is not None else unit), norms


def _gram_chunk(sim, grids, fixed, a, b):
    from blochsim.estimators.dictionary import _gram
    return _gram(_atom_chunk(sim, grids, fixed, a, b, None)[0])


def _sample_atoms(sim, grids, fixed, pick, chunk):
    from blochsim.estimators.dictionary import _simulate_table
    return _simulate_table(sim, _grid_params(grids, pick), fixed, chunk)


def _lazy_params(grids, chunk):
    """Each atom's parameters as Dask arrays (n_atoms,), computed from the
    grids chunk by chunk when read."""
    n = int(np.prod([len(v) for v in grids.values()]))
    index = da.arange(n, chunks=chunk)
    return {k: index.map_blocks(lambda i, k=k: _grid_params(grids, i)[k], dtype=np.float64) for k in grids}


def _dictionary_key(dm, contrasts):
    """What identifies a dictionary store's contents: the simulator (class
    and state), the grids, the fixed values and the options that shape the
    atoms."""
    import hashlib
    h = hashlib.sha256()
    sim = dm.simulator
    h.update(f"{type(sim).__module__}:{type(sim).__qualname__}".encode())
    for k in sorted(getattr(sim, "_given", {})):  # the protocol, not where or on how many threads it runs
        v = sim._given[k]
        a = np.asarray(v) if not callable(v) else None
        h.update(k.encode())
        if a is not None and a.dtype.kind in "biufc":
            h.update(str(a.dtype).encode() + repr(a.shape).encode() + np.ascontiguousarray(a).tobytes())
        else:
            h.update(repr(v).encode())
    h.update(repr((sorted(dm._fixed.items()), dm.rank, dm.chunk, contrasts, type(dm).auto_tolerance,
                   type(dm).auto_sample, type(dm).auto_bytes)).encode())
    for k, v in dm._grids.items():
        h.update(k.encode())
        h.update(np.ascontiguousarray(v, dtype=np.float64).tobytes())
    return h.hexdigest()


def fit_dictionary(dm, n, contrasts, store):
    """DictionaryMatcher.fit(..., dask=True) after its grids are parsed:
    the subspace, then the atoms as a Dask array (persisted, in a Zarr
    store, or a graph simulated again at every match)."""
    from blochsim.estimators.dictionary import _basis
    sim, grids, fixed, chunk = dm.simulator, dm._grids, dm._fixed, dm.chunk
    if not (store is None or store == "memory" or isinstance(store, (str, bytes)) or hasattr(store, "__fspath__")):
        raise TypeError(f"DictionaryMatcher.fit: store must be 'memory', a path or None, got {store!r}")
    spans = [(a, min(a + chunk, n)) for a in range(0, n, chunk)]
    key = _dictionary_key(dm, contrasts)
    group = None
    if store not in (None, "memory"):
        import os
        store = os.path.abspath(os.fspath(store))  # the workers' working folders may differ from this one
        _store_meta(dm, key, contrasts, None)  # a protocol a store cannot hold is refused before any work
        group = _open_store(store, key, "DictionaryMatcher.fit")
    if group is not None and "basis" in group:
        basis = group["basis"][...] if group.attrs["meta"]["compressed"] else None
    elif dm.rank == "auto" and n * contrasts * 8 > dm.auto_bytes:
        basis = dm._sampled_basis(
            n, lambda pick: dask.compute(dask.delayed(_sample_atoms, pure=True)(sim, grids, fixed, pick, chunk))[0])
    elif isinstance(dm.rank, int) and dm.rank < contrasts:
        grams = [dask.delayed(_gram_chunk, pure=True)(sim, grids, fixed, a, b) for a, b in spans]
        basis = _basis(dask.compute(tree_sum(grams))[0], rank=dm.rank)
    else:
        basis = None
    width = contrasts if basis is None else basis.shape[1]
    parts = [dask.delayed(_atom_chunk, pure=True)(sim, grids, fixed, a, b, basis) for a, b in spans]
    atoms = da.concatenate([da.from_delayed(p[0], (b - a, width), np.complex64) for p, (a, b) in zip(parts, spans)])
    norms = da.concatenate([da.from_delayed(p[1], (b - a,), np.float64) for p, (a, b) in zip(parts, spans)])
    if store == "memory":
        atoms, norms = dask.persist(atoms, norms)
    elif store is not None:
        atoms, norms = _write_store(store, group, key, dm, contrasts, basis, parts, spans, width)
    return _lazy_matcher(dm, contrasts, basis, atoms, norms, store)


def _lazy_matcher(dm, contrasts, basis, atoms, norms, store):
    """``dm`` holding a Dask dictionary: its atoms and norms (Dask arrays,
    null atoms kept and skipped at matching), its parameters from the
    grids."""
    dm.contrasts = contrasts
    dm.params = _lazy_params(dm._grids, dm.chunk)
    dm._basis = basis
    dm._atoms, dm._norms = atoms, norms
    dm._original = None
    dm._group_of = None
    dm._lazy = {"store": store}
    return dm


def _open_store(path, key, what):
    """The Zarr group at ``path`` when it holds this dictionary (complete or
    not), None when there is none; refuses a store of another dictionary."""
    import os

    import zarr
    if not os.path.exists(os.fspath(path)):
        return None
    group = zarr.open_group(os.fspath(path), mode="a")
    meta = group.attrs.get("meta")
    if meta is None or meta.get("format") != "blochsim-dictionary-zarr":
        raise ValueError(f"{what}: {os.fspath(path)} exists and is not a blochsim dictionary store")
    if meta.get("key") != key:
        raise ValueError(f"{what}: the store {os.fspath(path)} holds another dictionary (another simulator, "
                         f"grids or options); give a new path or remove it")
    return group


def _write_chunk(path, j, a, b, part):
    """Write atom chunk j and mark it done (a chunk not marked is written
    again on resume)."""
    import zarr
    group = zarr.open_group(path, mode="r+")
    group["atoms"][a:b] = part[0]
    group["norms"][a:b] = part[1]
    group["done"][j] = 1
    return 1


def _write_store(path, group, key, dm, contrasts, basis, parts, spans, width):
    """Write the dictionary's missing chunks to the Zarr store at ``path``
    and mark it complete; its atoms and norms read back lazily."""
    import json
    import os

    import zarr
    path = os.fspath(path)
    n, chunk = spans[-1][1], dm.chunk
    if group is None:
        group = zarr.open_group(path, mode="w")
        group.create_array("atoms", shape=(n, width), chunks=(chunk, width), dtype=np.complex64, fill_value=0)
        group.create_array("norms", shape=(n,), chunks=(chunk,), dtype=np.float64, fill_value=0)
        group.create_array("done", shape=(len(spans),), chunks=(1,), dtype=np.uint8, fill_value=0)
        group.create_array("basis", data=basis if basis is not None else np.zeros((0, 0), np.complex64))
        for k, v in dm._grids.items():
            group.create_array("grid_" + k, data=np.asarray(v, np.float64))
        from blochsim.estimators.dictionary import _protocol_record
        for k, v in _protocol_record(dm.simulator, "DictionaryMatcher.fit", "a store")[1].items():
            group.create_array("protocol_" + k, data=v)
        group.attrs["meta"] = _store_meta(dm, key, contrasts, basis)
    done = group["done"][...]
    writes = [dask.delayed(_write_chunk, pure=False)(path, j, a, b, parts[j])
              for j, (a, b) in enumerate(spans) if not done[j]]
    if writes:
        dask.compute(writes)
    if not np.all(group["done"][...]):  # pragma: no cover - every write above succeeded or raised
        raise RuntimeError(f"DictionaryMatcher.fit: chunks of {path} were not written")
    meta = dict(group.attrs["meta"])
    meta["complete"] = True
    group.attrs["meta"] = json.loads(json.dumps(meta))
    return da.from_zarr(group["atoms"]), da.from_zarr(group["norms"])


def _store_meta(dm, key, contrasts, basis):
    """The store's metadata (the protocol's arrays go to the store beside it)."""
    from blochsim.estimators.dictionary import _protocol_record
    cls = type(dm.simulator)
    protocol, _ = _protocol_record(dm.simulator, "DictionaryMatcher.fit", "a store")
    return {"format": "blochsim-dictionary-zarr", "version": 1, "key": key, "complete": False,
            "simulator": f"{cls.__module__}:{cls.__qualname__}", "protocol": protocol, "fixed": dm._fixed,
            "grids": list(dm._grids), "rank": dm.rank, "refine": dm.refine, "chunk": dm.chunk,
            "contrasts": contrasts, "compressed": basis is not None}


def open_dictionary(cls, path, simulator=None):
    """A DictionaryMatcher reading a complete Zarr store written by
    ``fit(..., dask=True, store=path)``; the atoms stay in the store."""
    import os

    import zarr
    from blochsim.estimators.dictionary import _rebuild
    path = os.fspath(path)
    group = zarr.open_group(path, mode="r")
    meta = group.attrs.get("meta")
    if meta is None or meta.get("format") != "blochsim-dictionary-zarr" or meta.get("version") != 1:
        raise ValueError(f"DictionaryMatcher.load: {path} is not a version-1 blochsim dictionary store")
    if not meta.get("complete"):
        raise ValueError(f"DictionaryMatcher.load: {path} is incomplete (a fit that stopped): fit again with the "
                         f"same simulator, grids and store to resume it")
    if simulator is None:
        arrays = {k[len("protocol_"):]: group[k][...] for k in group.array_keys() if k.startswith("protocol_")}
        simulator = _rebuild(meta["simulator"], meta["protocol"], arrays)
    dm = cls(simulator, rank=meta["rank"], chunk=meta["chunk"], refine=meta["refine"])
    dm._grids = {k: group["grid_" + k][...] for k in meta["grids"]}
    dm._fixed = dict(meta["fixed"])
    if _dictionary_key(dm, int(meta["contrasts"])) != meta["key"]:
        raise ValueError(f"DictionaryMatcher.load: {path} was made by another simulator or protocol than "
                         f"{type(simulator).__name__}'s ({meta['simulator']})")
    return _lazy_matcher(dm, int(meta["contrasts"]), group["basis"][...] if meta["compressed"] else None,
                         da.from_zarr(group["atoms"]), da.from_zarr(group["norms"]), path)


def _project(block, contrasts, basis):
    """A voxel chunk's signals (checked), complex64, and their projections."""
    from blochsim.estimators._common import _signals
    flat = _signals(block, contrasts, "DictionaryMatcher.match").reshape(-1, contrasts).astype(np.complex64)
    return flat, (flat @ basis if basis is not None else flat)


def _pair_top(projected, atoms, norms, offset, m):
    """The m best atoms of one atom chunk for one voxel chunk by the fused
    matching kernel: (indices, <unit atom, s>, power, norms), best first."""
    from blochsim.estimators._common import _threads
    from blochsim.estimators.dictionary import _best
    q = projected[1]
    keep = np.flatnonzero(norms > 0)  # a null atom matches nothing
    idx, dot, power = _best(q, atoms if len(keep) == len(norms) else atoms[keep], m, _threads(None))
    local = keep[np.maximum(idx, 0)] if len(keep) else np.zeros_like(idx)
    return np.where(idx >= 0, local + offset, -1), dot, power, norms[local]


def _merge_top(a, b):
    """The m best of two candidate sets, ties to the lower atom index."""
    from blochsim.estimators.dictionary import _merge_best
    idx, dot, norm, power = _merge_best(a[0].shape[1], (a[0], a[1], a[3], a[2]), (b[0], b[1], b[3], b[2]))
    return idx, dot, power, norm


def _finish(sim, grids, table, original, fixed, projected, top, k, m, refine, chunk):
    """Maps of one voxel chunk from its candidates, re-ranked exactly when
    ``refine``: parameters, index, score and M0, each (n, k).  A
    Dask-fitted dictionary's parameters come from its ``grids``; an
    in-process one's from its ``table`` of kept atoms, with their
    ``original`` indices."""
    from blochsim.estimators.dictionary import _exact, _exact_order

    def params_at(i):
        return _grid_params(grids, i) if table is None else {name: v[i] for name, v in table.items()}

    flat = projected[0]
    wide_idx, wide_dots, _, wide_norms = top
    idx, dots = _exact_order(wide_idx, wide_dots, m)
    norms = np.take_along_axis(wide_norms, _positions(wide_idx, idx), 1)
    if refine:
        chosen, dots = _exact(sim, params_at, fixed, flat, idx, norms, k, chunk)
        norms = np.take_along_axis(norms, _positions(idx, chosen), 1)
        idx = chosen
    else:
        idx, dots, norms = idx[:, :k], dots[:, :k], norms[:, :k]
    qn = np.linalg.norm(flat.astype(np.complex128), axis=1)
    out = params_at(idx)
    out.update(index=idx if original is None else original[idx],
               score=np.abs(dots) / np.where(qn > 0, qn, 1.0)[:, None], M0=dots / norms)
    return out


def _positions(candidates, chosen):
    """Where each of ``chosen`` (n, k) sits in its row of ``candidates`` (n, m)."""
    return np.argmax(candidates[:, None, :] == chosen[:, :, None], axis=2)


def match_dictionary(dm, signals, k):
    """DictionaryMatcher.match of a Dask-fitted dictionary or of Dask
    signals: voxel chunks against atom chunks, each voxel's best kept by a
    tree reduction over the atom chunks; Dask maps of Dask signals."""
    lazy_in = isinstance(signals, da.Array)
    if lazy_in and any(np.isnan(c) for cs in signals.chunks for c in cs):
        raise ValueError("DictionaryMatcher.match: signals is a Dask array of unknown chunk sizes; call "
                         "signals.compute_chunk_sizes() first")
    if not lazy_in:
        from blochsim.estimators._common import _signals
        signals = _signals(signals, dm.contrasts, "DictionaryMatcher.match")
    elif signals.ndim == 0 or signals.shape[-1] != dm.contrasts:
        raise ValueError(f"DictionaryMatcher.match: signals have {signals.shape[-1] if signals.ndim else 0} "
                         f"contrasts along their last axis (shape {signals.shape}); the fitted simulator gives "
                         f"{dm.contrasts}")
    shape = signals.shape[:-1]
    n_vox = int(np.prod(shape))
    rows = max(dm.chunk, 16384)
    flat = (signals if lazy_in else da.from_array(signals)).reshape(n_vox, dm.contrasts).rechunk((rows, -1))
    atoms, norms = dm._atoms, dm._norms
    if not isinstance(atoms, da.Array):  # an in-process dictionary against Dask signals
        atoms, norms = da.from_array(atoms, chunks=(dm.chunk, -1)), da.from_array(np.asarray(norms), chunks=dm.chunk)
    refine = dm._basis is not None and dm._grids is not None and dm.refine > 0
    m = min(max(k, dm.refine), len(atoms)) if refine else k
    from blochsim.estimators.dictionary import EXACT_MARGIN
    wide = min(m + EXACT_MARGIN, len(atoms))  # candidates re-ranked exactly
    offsets = np.concatenate([[0], np.cumsum(atoms.chunks[0])[:-1]])
    atom_blocks, norm_blocks = atoms.to_delayed()[:, 0], norms.to_delayed()
    table = None if dm._lazy is not None else dm.params
    results = []
    for block in flat.to_delayed()[:, 0]:
        projected = dask.delayed(_project, pure=True)(block, dm.contrasts, dm._basis)
        pairs = [dask.delayed(_pair_top, pure=True)(projected, a, nb, int(off), wide)
                 for a, nb, off in zip(atom_blocks, norm_blocks, offsets)]
        results.append(dask.delayed(_finish, pure=True)(dm.simulator, dm._grids, table, dm._original, dm._fixed,
                                                        projected, tree_sum(pairs, _merge_top), k, m, refine,
                                                        dm.chunk))
    sizes = flat.chunks[0]
    probe = {name: v.dtype for name, v in dm.params.items()}
    probe.update(index=np.int64, score=np.float64, M0=np.complex128)
    maps = {}
    for name, dtype in probe.items():
        cols = [da.from_delayed(r[name], (n, k), dtype) for r, n in zip(results, sizes)]
        whole = da.concatenate(cols)
        maps[name] = whole[:, 0].reshape(shape) if k == 1 else whole.reshape(shape + (k,))
    return maps if lazy_in else dict(zip(maps, dask.compute(*maps.values())))


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
