"""Dictionary matching: simulated atoms, optionally compressed, matched by the
normalised inner product."""
from __future__ import annotations

import numpy as np

from blochsim import _validate as V
from blochsim.estimators._common import _modelled, _signals, _simulate_table, _some_contrasts


class DictionaryMatcher:
    """Maximum normalised inner product against a simulated dictionary.

    Parameters
    ----------
    simulator : blochsim.Simulator or blochsim.ClosedFormSimulator
    rank : int, optional
        Compress atoms and signals onto the dictionary's ``rank`` leading
        right singular vectors before matching (SVD compression).
    groups : int, optional
        Group matching: cluster the atoms into ``groups`` groups around
        unit representatives; a signal is compared with the representatives
        first and then with the atoms of its ``search`` best groups only.
    search : int
        Groups searched per signal with ``groups``.
    chunk : int
        Signals (and atoms) compared at a time.

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

    def __init__(self, simulator, rank=None, groups=None, search=2, chunk=4096):
        self.simulator = simulator
        self.rank = None if rank is None else V.positive_int("rank", rank)
        self.groups = None if groups is None else V.positive_int("groups", groups)
        self.search = V.positive_int("search", search)
        self.chunk = V.positive_int("chunk", chunk)
        self._atoms = None

    def fit(self, dictionary=None, **grids):
        """Simulate (or take) the dictionary.

        Parameters
        ----------
        dictionary : tuple (atoms, params), optional
            A given dictionary: ``atoms`` (n_atoms, contrasts) complex and
            ``params`` a dict of (n_atoms,) arrays.  Without it the atoms
            are simulated on the grids.
        **grids
            ``name=values`` (1-D array): a grid axis (the dictionary is
            their Cartesian product); ``name=value`` (number): fixed.

        Returns
        -------
        DictionaryMatcher
            self, fitted.
        """
        if dictionary is not None:
            if grids:
                raise TypeError("DictionaryMatcher.fit: give a dictionary or grids, not both")
            atoms, params = dictionary
            atoms = np.asarray(atoms)
            if atoms.ndim != 2:
                raise ValueError(f"DictionaryMatcher.fit: atoms must be (n_atoms, contrasts), got {atoms.shape}")
            params = {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in params.items()}
            for k, v in params.items():
                if len(v) != len(atoms):
                    raise ValueError(f"DictionaryMatcher.fit: params[{k!r}] has {len(v)} values for "
                                     f"{len(atoms)} atoms")
        else:
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
            mesh = np.meshgrid(*axes.values(), indexing="ij")
            params = {k: m.reshape(-1) for k, m in zip(axes, mesh)}
            atoms = _simulate_table(self.simulator, params, fixed, self.chunk)
        atoms = atoms.astype(np.complex64)
        norms = np.linalg.norm(atoms, axis=1)
        keep = norms > 0  # a null atom matches nothing
        self._original = np.flatnonzero(keep)
        self.params = {k: v[keep] for k, v in params.items()}
        self._norms = norms[keep].astype(np.float64)
        unit = atoms[keep] / self._norms[:, None].astype(np.float32)
        self.contrasts = _some_contrasts(atoms.shape[1], "DictionaryMatcher.fit")
        self._basis = None
        if self.rank is not None and self.rank < self.contrasts:
            # right singular vectors from the Gram matrix (contrasts × contrasts)
            G = unit.conj().T.astype(np.complex128) @ unit.astype(np.complex128)
            w, U = np.linalg.eigh(G)
            self._basis = np.ascontiguousarray(U[:, ::-1][:, :self.rank].astype(np.complex64))
            unit = unit @ self._basis
        self._atoms = np.ascontiguousarray(unit)
        self._raw_norm2 = self._norms ** 2
        self._group_of = None
        if self.groups is not None and self.groups < len(unit):
            self._cluster()
        return self

    def _cluster(self, iterations=10):
        """Spherical k-means on |<a, c>| (phase-blind) for group matching."""
        rng = np.random.default_rng(0)
        A = self._atoms
        centers = A[rng.choice(len(A), self.groups, replace=False)].copy()
        for _ in range(iterations):
            sim = np.abs(A @ centers.conj().T)
            label = np.argmax(sim, axis=1)
            for g in range(self.groups):
                members = A[label == g]
                if len(members) == 0:
                    continue
                # align the members' phases to the centre before averaging
                ph = members @ centers[g].conj()
                c = (members * np.exp(-1j * np.angle(ph))[:, None]).sum(0)
                centers[g] = c / max(np.linalg.norm(c), 1e-30)
        label = np.argmax(np.abs(A @ centers.conj().T), axis=1)  # members of the final centres
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
            indices), ``"score"`` (normalised inner-product magnitude, 1 for
            a perfect match) and ``"M0"`` (complex least-squares scale of
            the atom, ⟨atom, s⟩/‖atom‖²), each shaped ``voxels`` for k = 1
            and ``(*voxels, k)`` otherwise.  Indices count the atoms as
            fitted (a given dictionary's rows).
        """
        if self._atoms is None:
            raise RuntimeError("DictionaryMatcher.match needs a fitted matcher: call fit() first")
        k = V.positive_int("k", k)
        if k > len(self._atoms):
            raise ValueError(f"DictionaryMatcher.match: k = {k} exceeds the {len(self._atoms)} atoms")
        s = _signals(signals, self.contrasts, "DictionaryMatcher.match")
        shape = s.shape[:-1]
        flat = s.reshape(-1, self.contrasts).astype(np.complex64)
        q = flat @ self._basis if self._basis is not None else flat
        n = len(q)
        idx = np.empty((n, k), np.int64)
        score = np.empty((n, k), np.float64)
        dots = np.empty((n, k), np.complex128)
        qn = np.linalg.norm(q, axis=1)
        for a in range(0, n, self.chunk):
            qc = q[a:a + self.chunk]
            if self._group_of is None:
                i, d = self._search_all(qc, k)
            else:
                i, d = self._search_groups(qc, k)
            idx[a:a + len(qc)] = i
            dots[a:a + len(qc)] = d
        score = np.abs(dots) / np.where(qn > 0, qn, 1.0)[:, None]
        # <atom, s> of the raw atom = norm * <unit, s>; M0 = that / norm^2
        m0 = dots / self._norms[idx]
        out = {name: v[idx] for name, v in self.params.items()}
        out.update(index=self._original[idx], score=score, M0=m0)
        if k == 1:
            return {name: v[:, 0].reshape(shape) for name, v in out.items()}
        return {name: v.reshape(shape + (k,)) for name, v in out.items()}

    def _search_all(self, qc, k):
        """Top-k over every atom, atoms in chunks; (indices, inner products)."""
        top = _TopK(len(qc), k)
        rows = np.arange(len(qc))
        for b in range(0, len(self._atoms), self.chunk):
            top.update(rows, qc @ self._atoms[b:b + self.chunk].conj().T, b)
        return top.result()

    def _search_groups(self, qc, k):
        """Top-k over the atoms of each signal's ``search`` best groups: per
        group, one product with the signals that search it."""
        gs = np.abs(qc @ self._centers.conj().T)
        ng = min(self.search, self.groups)
        top_groups = np.argsort(-gs, axis=1)[:, :ng]
        top = _TopK(len(qc), k)
        for g in range(self.groups):
            rows = np.flatnonzero((top_groups == g).any(axis=1))
            members = self._members[g]
            if len(rows) and len(members):
                top.update(rows, qc[rows] @ self._atoms[members].conj().T, members)
        short = np.flatnonzero(top.count < k)
        if len(short):  # groups too small for k: search these signals everywhere
            return_all = self._search_all(qc[short], k)
            idx, dot = top.result()
            idx[short], dot[short] = return_all
            return idx, dot
        return top.result()

    def map(self, signals):
        """Parameter maps of the best atom (:meth:`match` with k = 1)."""
        return self.match(signals, k=1)


class _TopK:
    """The k largest |<atom, s>| per signal, merged chunk by chunk: atom
    indices and inner products, best first from :meth:`result`; ``count``
    says how many of the k are filled."""

    def __init__(self, n, k):
        self.k = k
        self.idx = np.zeros((n, k), np.int64)
        self.dot = np.zeros((n, k), np.complex128)
        self.power = np.full((n, k), -1.0)
        self.count = np.zeros(n, np.int64)

    def update(self, rows, d, atoms):
        """Merge d (len(rows), m), the <atom, s> of signals ``rows`` with m
        atoms: ``atoms`` their indices, or the first index of a run."""
        power = d.real.astype(np.float64) ** 2 + d.imag.astype(np.float64) ** 2
        if np.ndim(atoms) == 0:
            atoms = np.arange(atoms, atoms + d.shape[1])
        if self.k == 1:
            j = np.argmax(power, axis=1)
            r = np.arange(len(rows))
            pj = power[r, j]
            better = pj > self.power[rows, 0]
            sel = rows[better]
            self.power[sel, 0] = pj[better]
            self.idx[sel, 0] = atoms[j[better]]
            self.dot[sel, 0] = d[r[better], j[better]]
        else:
            cand_p = np.concatenate([self.power[rows], power], axis=1)
            cand_i = np.concatenate([self.idx[rows], np.broadcast_to(atoms, power.shape)], axis=1)
            cand_d = np.concatenate([self.dot[rows], d], axis=1)
            top = np.argpartition(-cand_p, self.k - 1, axis=1)[:, :self.k]
            self.power[rows] = np.take_along_axis(cand_p, top, 1)
            self.idx[rows] = np.take_along_axis(cand_i, top, 1)
            self.dot[rows] = np.take_along_axis(cand_d, top, 1)
        self.count[rows] = np.minimum(self.count[rows] + d.shape[1], self.k)

    def result(self):
        order = np.argsort(-self.power, axis=1, kind="stable")
        return np.take_along_axis(self.idx, order, 1), np.take_along_axis(self.dot, order, 1)
