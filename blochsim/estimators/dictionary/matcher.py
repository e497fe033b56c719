"""Dictionary matching: simulated atoms, optionally compressed, matched by the
normalised inner product."""
from __future__ import annotations

import json
import numbers
import os

import numpy as np

from blochsim._engine import dispatch as _dispatch
from blochsim._arrays import validate as V
from blochsim.estimators import _on_device
from blochsim.estimators._common import (_auto_count, _levelwise, _modelled, _signals, _simulate_table,
                                         _some_contrasts, _threads)
from blochsim.estimators.dictionary._atoms import (EXACT_MARGIN, _basis, _best, _exact, _exact_order,
                                                   _merge_best, _protocol_record, _rebuild, _unit_rows)
from blochsim.subspace import gram


class DictionaryMatcher:
    """Maximum normalised inner product against a simulated dictionary.

    Parameters
    ----------
    simulator : blochsim.Simulator or blochsim.ClosedFormSimulator
    rank : int, "auto" or None
        Compress atoms and signals onto the dictionary's ``rank`` leading
        right singular vectors before matching (SVD compression; McGivney
        et al. 2014, IEEE TMI 33:2311).  ``"auto"`` (default) compresses a
        dictionary whose full atoms would take more than
        :attr:`auto_bytes` (64 MiB), at the smallest rank that keeps all
        but :attr:`auto_tolerance` (1e-6) of the atoms' energy, learned
        from a sample of atoms; the full atoms are then never held, only
        their projections.  ``None`` never compresses.
    refine : int
        With a compressed dictionary fitted from grids, the ``refine`` best
        atoms in the subspace (at least k) are simulated again in full and
        ranked by their exact normalised inner products, so that the
        match, its score and M0 are those of the full dictionary whenever
        the best atom is among them.  0 matches in the subspace alone.
    groups : int, optional
        Group matching: cluster the atoms into ``groups`` groups around
        unit representatives; a signal is compared with the representatives
        first and then with the atoms of its ``search`` best groups only.
    search : int
        Groups searched per signal with ``groups``.
    chunk : int
        Atoms simulated at a time (and, with ``dask=True``, atoms a task).
    device : {"cpu", "cuda", "auto"}, optional
        Where the atoms live and the match runs.  ``"cuda"``: :meth:`fit`
        simulates the atoms on the GPU, normalises and projects them there
        and keeps them there (a subspace is learned from a sample of
        :attr:`auto_sample` atoms); :meth:`match` projects and matches the
        signals there by the fused kernel, and returns device arrays of the
        signals' library for device signals (NumPy signals are copied to
        the device once).  Default: the simulator's ``device``; device
        signals are matched on the GPU whatever the dictionary's home (a
        host dictionary is copied there once).

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import MRFSimulator
    >>> from blochsim.estimators import DictionaryMatcher
    >>> sim = MRFSimulator(flip=np.linspace(10, 60, 100), TR=10.0, states=16)
    >>> dm = DictionaryMatcher(sim).fit(T1=np.geomspace(300, 3000, 40), T2=np.geomspace(20, 300, 30))
    >>> maps = dm.map(2.0 * sim.simulate(T1=1000.0, T2=100.0))
    >>> sorted(maps)
    ['M0', 'T1', 'T2', 'index', 'score']
    """

    #: full dictionaries larger than this (bytes of complex64) are compressed by rank="auto"
    auto_bytes = 64 << 20
    #: energy of the atoms that rank="auto" may leave out of the subspace
    auto_tolerance = 1e-6
    #: atoms simulated to learn the subspace of an "auto" compression
    auto_sample = 4096

    def __init__(self, simulator, rank="auto", groups=None, search=2, chunk=4096, refine=4, device=None):
        self.simulator = simulator
        if device not in (None, "cpu", "cuda", "auto"):
            raise ValueError(f"device must be 'cpu', 'cuda', 'auto' or None, got {device!r}")
        self.device = device
        self._device_copy = None
        self.rank = _auto_count("rank", rank)
        if isinstance(refine, bool) or not isinstance(refine, numbers.Integral) or refine < 0:
            raise ValueError(f"refine must be a non-negative integer, got {refine!r}")
        self.refine = int(refine)
        self.groups = None if groups is None else V.positive_int("groups", groups)
        self.search = V.positive_int("search", search)
        self.chunk = V.positive_int("chunk", chunk)
        self._atoms = None
        self._lazy = None  # a Dask-fitted dictionary: its atoms, norms and store

    def fit(self, dictionary=None, dask=False, store="memory", **grids):
        """Simulate (or take) the dictionary.

        Parameters
        ----------
        dictionary : tuple (atoms, params), optional
            A given dictionary: ``atoms`` (n_atoms, contrasts) complex and
            ``params`` a dict of (n_atoms,) arrays.  Without it the atoms
            are simulated on the grids.
        dask : bool
            Simulate the atoms as a Dask graph on the active scheduler (a
            ``dask.distributed`` cluster when a Client exists), one task a
            chunk of ``chunk`` atoms; the subspace (``rank``) is learned as
            in this process, and :meth:`match` then compares voxel chunks
            with atom chunks and keeps each voxel's best by a tree
            reduction (:mod:`blochsim.distributed`).  Grids only; no
            ``groups``.
        store : "memory", str or None
            With ``dask``: where the atoms (unit atoms or their projections)
            and norms live.  ``"memory"``: a Dask array persisted on the
            workers (spilled to their disks past their memory limits).  A
            path: a Zarr store written chunk by chunk, each chunk marked
            done once written, the store marked complete last; fitting
            again with the same simulator, grids and options resumes an
            incomplete store and opens a complete one without simulating,
            and :meth:`load` reopens it.  None: never stored; every
            :meth:`match` simulates the atoms again, chunk by chunk.
        **grids
            ``name=values`` (1-D array): a grid axis (the dictionary is
            their Cartesian product); ``name=value`` (number): fixed.

        Returns
        -------
        DictionaryMatcher
            self, fitted; its ``params`` (each atom's parameters) are Dask
            arrays with ``dask=True``, computed from the grids when read, so
            that a dictionary of 1e9 atoms holds none of them in memory.
        """
        self._grids, self._fixed = None, {}
        self._lazy = None
        if dictionary is not None:
            if grids:
                raise TypeError("DictionaryMatcher.fit: give a dictionary or grids, not both")
            if dask:
                raise ValueError("DictionaryMatcher.fit: dask=True simulates the dictionary from grids; "
                                 "a given dictionary is fitted in this process")
            atoms, params = dictionary
            atoms = np.asarray(atoms)
            if atoms.ndim != 2:
                raise ValueError(f"DictionaryMatcher.fit: atoms must be (n_atoms, contrasts), got {atoms.shape}")
            params = {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in params.items()}
            for k, v in params.items():
                if len(v) != len(atoms):
                    raise ValueError(f"DictionaryMatcher.fit: params[{k!r}] has {len(v)} values for "
                                     f"{len(atoms)} atoms")
            return self._store(atoms.astype(np.complex64), params)
        axes, fixed = {}, {}
        for k, v in grids.items():
            _modelled(self.simulator, k, "DictionaryMatcher.fit")
            a = np.asarray(v, dtype=np.float64)
            if a.ndim == 0:
                fixed[k] = float(a)
            elif a.ndim == 1 and len(a) > 0 and np.all(np.isfinite(a)):
                axes[k] = a
            else:
                raise ValueError(f"DictionaryMatcher.fit: grid {k} must be a finite 1-D array or a number")
        if not axes:
            raise ValueError("DictionaryMatcher.fit: give at least one grid axis (a 1-D array)")
        self._grids, self._fixed = axes, fixed
        n = int(np.prod([len(v) for v in axes.values()]))
        first = _simulate_table(self.simulator, {k: v[:1] for k, v in axes.items()}, fixed, 1)
        contrasts = _some_contrasts(first.shape[1], "DictionaryMatcher.fit")
        if dask:
            if self.groups is not None:
                raise ValueError("DictionaryMatcher.fit: groups is not available with dask=True")
            from blochsim.estimators.dictionary import lazy
            return lazy.fit_dictionary(self, n, contrasts, store)
        if store != "memory":
            raise ValueError(f"DictionaryMatcher.fit: store={store!r} needs dask=True")
        mesh = np.meshgrid(*axes.values(), indexing="ij")
        params = {k: m.reshape(-1) for k, m in zip(axes, mesh)}
        if _on_device.wanted(self):
            return _on_device.fit(self, params, fixed, contrasts)
        if self.rank == "auto" and n * contrasts * 8 > self.auto_bytes:
            return self._fit_streamed(params, fixed, contrasts)
        atoms = _simulate_table(self.simulator, params, fixed, self.chunk)
        return self._store(atoms.astype(np.complex64), params)

    def _fit_streamed(self, params, fixed, contrasts):
        """rank="auto" on a large dictionary: the subspace from a sample of
        atoms, then every atom simulated chunk by chunk and kept only as its
        projection."""
        n = len(next(iter(params.values())))
        basis = self._sampled_basis(
            n, lambda pick: _simulate_table(self.simulator, {k: v[pick] for k, v in params.items()}, fixed, self.chunk))
        parts, norms = [], []
        for a in range(0, n, self.chunk):
            block = _simulate_table(self.simulator, {k: v[a:a + self.chunk] for k, v in params.items()},
                                    fixed, self.chunk).astype(np.complex64, copy=False)
            unit, nb = _unit_rows(block)
            parts.append(unit @ basis)
            norms.append(nb)
        unit = np.concatenate(parts)
        norms = np.concatenate(norms)
        return self._keep(unit, norms, params, contrasts, basis)

    def _store(self, atoms, params):
        """Normalise (and, for an integer rank or a large "auto", compress)
        the full atoms."""
        self.contrasts = _some_contrasts(atoms.shape[1], "DictionaryMatcher.fit")
        unit, norms = _unit_rows(atoms)
        basis = None
        if isinstance(self.rank, int) and self.rank < self.contrasts:
            basis = self._subspace(unit, rank=self.rank)
        elif self.rank == "auto" and atoms.size * 8 > self.auto_bytes:
            basis = self._subspace(unit, self.auto_tolerance)
        if basis is not None:
            unit = unit @ basis
        return self._keep(unit, norms, params, self.contrasts, basis)

    def _sampled_basis(self, n, atoms_at, rank=None):
        """The subspace of a dictionary of n atoms learned from
        :attr:`auto_sample` of them (``atoms_at(indices)`` simulates them):
        ``rank`` vectors, or by default the "auto" tolerance's."""
        pick = np.sort(np.random.default_rng(0).choice(n, min(n, self.auto_sample), replace=False))
        unit = _unit_rows(atoms_at(pick).astype(np.complex64))[0]
        return self._subspace(unit, rank=rank) if rank is not None else self._subspace(unit, self.auto_tolerance)

    def _subspace(self, unit, tolerance=None, rank=None):
        """Leading right singular vectors of the unit atoms (contrasts, r),
        from their Gram matrix (summed over chunks of ``chunk`` atoms in the
        fixed tree, as a cluster sums it): ``rank`` of them, or the fewest
        that keep all but ``tolerance`` of the energy."""
        return _basis(_levelwise(gram(unit[a:a + self.chunk]) for a in range(0, len(unit), self.chunk)),
                      tolerance, rank)

    def _keep(self, unit, norms, params, contrasts, basis):
        keep = norms > 0  # a null atom matches nothing
        self.contrasts = contrasts
        self._original = np.flatnonzero(keep)
        self.params = {k: v[keep] for k, v in params.items()}
        self._norms = norms[keep].astype(np.float64)
        self._basis = basis
        self._atoms = np.ascontiguousarray(unit[keep])
        self._device_copy = None
        self._group_of = None
        if self.groups is not None and self.groups < len(self._atoms):
            self._cluster()
        return self

    @property
    def compressed_rank(self):
        """The rank of the stored subspace, or None for full atoms."""
        return None if self._basis is None else self._basis.shape[1]

    def temporal_basis(self, rank=None, tolerance=None):
        """The dictionary's temporal subspace, for low-rank reconstruction.

        Parameters
        ----------
        rank : int, optional
            Columns to keep: at most the stored rank of a compressed
            dictionary (its leading columns), at most the contrasts of a full
            one.
        tolerance : float, optional
            For a full dictionary: the fewest columns that leave out at most
            this fraction of the unit atoms' energy (default 1e-6 without
            ``rank``).

        Returns
        -------
        blochsim.subspace.TemporalBasis
            ``basis`` (contrasts, rank), complex64, with orthonormal columns
            such that ``basis.project(signals)`` gives the coefficients this
            matcher compares (``B^H s``); ``energy``: the fraction of the unit
            atoms' energy on each column.
        """
        from blochsim.subspace import TemporalBasis

        if self._atoms is None:
            raise RuntimeError("DictionaryMatcher.temporal_basis: call fit() first")
        if self._basis is None:
            atoms = self._atoms.get() if hasattr(self._atoms, "get") else np.asarray(self._atoms)
            return TemporalBasis.learn(atoms, rank=rank, tolerance=tolerance, normalize=False)
        stored = self._basis.shape[1]
        if tolerance is not None:
            raise ValueError("DictionaryMatcher.temporal_basis: tolerance applies to a full dictionary; this one "
                             f"is compressed to rank {stored} (give rank= to keep fewer columns)")
        keep = stored if rank is None else V.positive_int("rank", rank)
        if keep > stored:
            raise ValueError(f"DictionaryMatcher.temporal_basis: rank must be at most the stored rank {stored}, "
                             f"got {keep}")
        # each column's share of the unit atoms' energy (null atoms hold none)
        atoms = self._atoms
        if hasattr(atoms, "compute"):
            power = (abs(atoms) ** 2).sum(axis=0).compute()
            count = int((self._norms > 0).sum().compute())
        else:
            host = atoms.get() if hasattr(atoms, "get") else np.asarray(atoms)
            power, count = (np.abs(host) ** 2).sum(axis=0), len(host)
        energy = np.asarray(power, np.float64)[:keep] / max(count, 1)
        return TemporalBasis(np.conj(self._basis[:, :keep]), energy)

    def _cluster(self, iterations=10):
        """Spherical k-means on |<a, c>| (phase-blind) for group matching."""
        rng = np.random.default_rng(0)
        A = self._atoms
        centers = A[rng.choice(len(A), self.groups, replace=False)].copy()
        threads = _threads(self.simulator)
        for _ in range(iterations):
            label = _best(A, centers, 1, threads)[0][:, 0]
            for g in range(self.groups):
                members = A[label == g]
                if len(members) == 0:
                    continue
                # align the members' phases to the centre before averaging
                ph = members @ centers[g].conj()
                c = (members * np.exp(-1j * np.angle(ph))[:, None]).sum(0)
                centers[g] = c / max(np.linalg.norm(c), 1e-30)
        label = _best(A, centers, 1, threads)[0][:, 0]  # members of the final centres
        self._centers = centers.astype(np.complex64)
        self._group_of = label
        self._members = [np.flatnonzero(label == g) for g in range(self.groups)]

    def match(self, signals, k=1):
        """The k best atoms of each signal.

        Parameters
        ----------
        signals : array_like, complex, shape (*voxels, contrasts)
        k : int
            Atoms kept per signal, best first.

        Returns
        -------
        dict
            Per parameter its values at the best atoms; ``"index"`` (atom
            indices), ``"score"`` (normalised inner-product magnitude
            abs(<atom, s>) / (‖atom‖ ‖s‖) against the whole signal, 1 for a
            perfect match) and ``"M0"`` (complex least-squares scale of
            the atom, ⟨atom, s⟩/‖atom‖²), each shaped ``voxels`` for k = 1
            and ``(*voxels, k)`` otherwise.  Indices count the atoms as
            fitted (a given dictionary's rows).
        """
        if self._atoms is None:
            raise RuntimeError("DictionaryMatcher.match needs a fitted matcher: call fit() first")
        k = V.positive_int("k", k)
        if k > len(self._atoms):
            raise ValueError(f"DictionaryMatcher.match: k = {k} exceeds the {len(self._atoms)} atoms")
        if self._lazy is not None or _dispatch.any_lazy({"signals": signals}):
            from blochsim.estimators.dictionary import lazy
            return lazy.match_dictionary(self, signals, k)
        refine = self._basis is not None and self._grids is not None and self.refine > 0
        m = min(max(k, self.refine), len(self._atoms)) if refine else k
        if self._group_of is None and _on_device.wanted(self, signals):
            return _on_device.match(self, signals, k, m, refine)
        s = _signals(signals, self.contrasts, "DictionaryMatcher.match")
        shape = s.shape[:-1]
        flat = s.reshape(-1, self.contrasts).astype(np.complex64)
        q = flat @ self._basis if self._basis is not None else flat
        threads = _threads(self.simulator)
        wide = min(m + EXACT_MARGIN, len(self._atoms))
        if self._group_of is None:
            idx, dots, _ = _best(q, self._atoms, wide, threads)
        else:
            idx, dots = self._search_groups(q, wide, threads)
        idx, dots = _exact_order(idx, dots, m)
        if refine:
            idx, dots = self._exact(flat, idx, k)
        # the score against the whole signal (in a subspace too: what the
        # subspace leaves out of the signal lowers it)
        qn = np.linalg.norm(flat.astype(np.complex128), axis=1)
        score = np.abs(dots) / np.where(qn > 0, qn, 1.0)[:, None]
        # <atom, s> of the raw atom = norm * <unit, s>; M0 = that / norm^2
        m0 = dots / self._norms[idx]
        out = {name: v[idx] for name, v in self.params.items()}
        out.update(index=self._original[idx], score=score, M0=m0)
        if k == 1:
            return {name: v[:, 0].reshape(shape) for name, v in out.items()}
        return {name: v.reshape(shape + (k,)) for name, v in out.items()}

    def _exact(self, flat, idx, k):
        """Re-rank each signal's candidate atoms ``idx`` (n, m) by their
        exact inner products with the full signal; the k best as
        (indices, <unit atom, s>)."""
        return _exact(self.simulator, lambda i: {name: v[i] for name, v in self.params.items()}, self._fixed,
                      flat, idx, self._norms[idx], k, self.chunk)

    def _search_groups(self, q, k, threads):
        """The k best among the atoms of each signal's ``search`` best groups
        (groups ranked by their representatives): per group, the fused
        match of the signals that search it against its members, merged by
        (power, index); (indices, inner products)."""
        ng = min(self.search, self.groups)
        top_groups = _best(q, self._centers, ng, threads)[0]
        n = len(q)
        best = (np.full((n, k), -1, np.int64), np.zeros((n, k), np.complex128), np.full((n, k), -1.0))
        for g in range(self.groups):
            rows = np.flatnonzero((top_groups == g).any(axis=1))
            members = self._members[g]
            if len(rows) and len(members):
                i, d, p = _best(q[rows], self._atoms[members], k, threads)
                i = np.where(i >= 0, members[np.maximum(i, 0)], -1)
                merged = _merge_best(k, tuple(x[rows] for x in best), (i, d, p))
                for x, y in zip(best, merged):
                    x[rows] = y
        short = np.flatnonzero((best[0] < 0).any(axis=1))
        if len(short):  # groups too small for k: search these signals everywhere
            i, d, p = _best(q[short], self._atoms, k, threads)
            best[0][short], best[1][short] = i, d
        return best[0], best[1]

    def map(self, signals):
        """Parameter maps of the best atom (:meth:`match` with k = 1); Dask
        maps of a Dask array of signals."""
        return self.match(signals, k=1)

    def save(self, path):
        """Write the fitted dictionary to one ``.npz`` file: its atoms as
        stored (unit atoms or their projections, the subspace, the norms),
        their parameters, the grids, and the simulator's class and protocol
        (so that :meth:`load` can rebuild it and refine matches).

        Parameters
        ----------
        path : str or os.PathLike
            The file (NumPy adds ``.npz`` when it is missing).
        """
        if self._atoms is None:
            raise RuntimeError("DictionaryMatcher.save needs a fitted matcher: call fit() first")
        if self._lazy is not None:
            raise ValueError("DictionaryMatcher.save: a dictionary fitted with dask=True is saved by "
                             "fit(..., dask=True, store=path) (a Zarr store), not to one file")
        sim = self.simulator
        cls = type(sim)
        protocol, given = _protocol_record(sim, "DictionaryMatcher.save", "a file")
        arrays = {"protocol:" + k: v for k, v in given.items()}
        meta = {"format": "blochsim-dictionary", "version": 1,
                "simulator": f"{cls.__module__}:{cls.__qualname__}", "protocol": protocol,
                "fixed": self._fixed, "grids": None if self._grids is None else list(self._grids),
                "rank": self.rank, "refine": self.refine, "groups": self.groups, "search": self.search,
                "chunk": self.chunk, "contrasts": self.contrasts}
        for k, v in self.params.items():
            arrays["param:" + k] = v
        for k, v in (self._grids or {}).items():
            arrays["grid:" + k] = v
        if self._basis is not None:
            arrays["basis"] = self._basis
        np.savez(path, meta=np.array(json.dumps(meta)), atoms=self._atoms, norms=self._norms,
                 original=self._original, **arrays)

    @classmethod
    def load(cls, path, simulator=None):
        """A matcher from a file written by :meth:`save`, or from a Zarr
        store written by ``fit(..., dask=True, store=path)`` (read lazily:
        its atoms stay in the store and :meth:`match` runs as a Dask graph).

        Parameters
        ----------
        path : str or os.PathLike
        simulator : blochsim.Simulator, optional
            The simulator that made the dictionary.  Default: rebuilt from
            the class and protocol in the file, for the simulators shipped
            with blochsim (a simulator defined elsewhere must be given).

        Returns
        -------
        DictionaryMatcher
        """
        if os.path.isdir(os.fspath(path)):
            from blochsim.estimators.dictionary import lazy
            return lazy.open_dictionary(cls, path, simulator)
        with np.load(path, allow_pickle=False) as f:
            if "meta" not in f.files:
                raise ValueError(f"DictionaryMatcher.load: {path} is not a blochsim dictionary (no meta)")
            meta = json.loads(str(f["meta"]))
            if meta.get("format") != "blochsim-dictionary" or meta.get("version") != 1:
                raise ValueError(f"DictionaryMatcher.load: {path} is not a version-1 blochsim dictionary")
            data = {k: f[k] for k in f.files}
        if simulator is None:
            simulator = _rebuild(meta["simulator"], meta["protocol"],
                                 {k[len("protocol:"):]: v for k, v in data.items() if k.startswith("protocol:")})
        dm = cls(simulator, rank=meta["rank"], groups=meta["groups"], search=meta["search"], chunk=meta["chunk"],
                 refine=meta["refine"])
        dm._grids = None if meta["grids"] is None else {k: data["grid:" + k] for k in meta["grids"]}
        dm._fixed = dict(meta["fixed"])
        params = {k[len("param:"):]: v for k, v in data.items() if k.startswith("param:")}
        dm.contrasts = int(meta["contrasts"])
        dm._basis = data.get("basis")
        dm._original = data["original"]
        dm.params = params
        dm._norms = data["norms"]
        dm._atoms = data["atoms"]
        dm._group_of = None
        dm._lazy = None
        if dm.groups is not None and dm.groups < len(dm._atoms):
            dm._cluster()
        return dm


