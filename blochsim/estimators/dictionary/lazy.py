"""The dictionary estimator on Dask: atoms simulated, compressed and
stored (Zarr) chunk by chunk, and signals matched as a graph, each chunk by
the kernels of the in-process estimator (:mod:`._atoms`); imported by
:class:`DictionaryMatcher` only for Dask inputs, ``dask=True`` or a store.
"""
from __future__ import annotations

import numpy as np

import dask
import dask.array as da

from blochsim.distributed import tree_sum



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
    from blochsim.estimators.dictionary._atoms import _simulate_table, _unit_rows
    params = _grid_params(grids, np.arange(a, b))
    if basis is not None and _on_device.simulator_on_device(sim):
        return _on_device.projected_chunk(sim, params, fixed, basis)
    atoms = _simulate_table(sim, params, fixed, b - a).astype(np.complex64, copy=False)
    unit, norms = _unit_rows(atoms)
    return np.ascontiguousarray(unit @ basis if basis is not None else unit), norms


def _gram_chunk(sim, grids, fixed, a, b):
    from blochsim.subspace import gram
    return gram(_atom_chunk(sim, grids, fixed, a, b, None)[0])


def _sample_atoms(sim, grids, fixed, pick, chunk):
    from blochsim.estimators.dictionary._atoms import _simulate_table
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
    from blochsim.estimators.dictionary._atoms import _basis
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
        from blochsim.estimators.dictionary._atoms import _protocol_record
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
    from blochsim.estimators.dictionary._atoms import _protocol_record
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
    from blochsim.estimators.dictionary._atoms import _rebuild
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
    from blochsim.estimators.dictionary._atoms import _best
    q = projected[1]
    keep = np.flatnonzero(norms > 0)  # a null atom matches nothing
    idx, dot, power = _best(q, atoms if len(keep) == len(norms) else atoms[keep], m, _threads(None))
    local = keep[np.maximum(idx, 0)] if len(keep) else np.zeros_like(idx)
    return np.where(idx >= 0, local + offset, -1), dot, power, norms[local]


def _merge_top(a, b):
    """The m best of two candidate sets, ties to the lower atom index."""
    from blochsim.estimators.dictionary._atoms import _merge_best
    idx, dot, norm, power = _merge_best(a[0].shape[1], (a[0], a[1], a[3], a[2]), (b[0], b[1], b[3], b[2]))
    return idx, dot, power, norm


def _finish(sim, grids, table, original, fixed, projected, top, k, m, refine, chunk):
    """Maps of one voxel chunk from its candidates, re-ranked exactly when
    ``refine``: parameters, index, score and M0, each (n, k).  A
    Dask-fitted dictionary's parameters come from its ``grids``; an
    in-process one's from its ``table`` of kept atoms, with their
    ``original`` indices."""
    from blochsim.estimators.dictionary._atoms import _exact, _exact_order

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
    from blochsim.estimators.dictionary._atoms import EXACT_MARGIN
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


