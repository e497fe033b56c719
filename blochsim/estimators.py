"""Estimators: measured signals to parameter maps (SPEC §5–6).

Each estimator is built from a simulator, learns or tabulates the signal
model in ``fit(**ranges_or_grids)`` and turns signals of shape
``(*voxels, contrasts)`` into a dict of maps of shape ``voxels`` in
``map(signals)``:

- :class:`PERK`: kernel ridge regression on random Fourier features
  (Nataraj, Fessler & Nielsen 2018, IEEE TMI 37:2103), trained on simulated
  signals; the map is a fused feature+regression kernel with its pullback.
- :class:`DictionaryMatcher`: maximum normalised inner product against a
  simulated dictionary (Ma et al. 2013, Nature 495:187), with SVD
  compression (McGivney et al. 2014, IEEE TMI 33:2311) and group matching
  (Cauley et al. 2015, MRM 74:523).
- :class:`LookupTable`: one unknown from one real feature of the signal,
  by interpolation over the longest monotonic run of a simulated table.
- :class:`NonlinearLeastSquares`: voxel-wise bounded Levenberg–Marquardt
  with the simulator's exact Jacobians, standard errors from the Fisher
  information.

Parameter values are in the simulators' public units (ms, Hz, …).
"""
from __future__ import annotations

import numbers

import numpy as np

from blochsim import _core, _dispatch
from blochsim import _validate as V

__all__ = ["PERK", "DictionaryMatcher", "LookupTable", "NonlinearLeastSquares"]


# --------------------------------------------------------------------------
# Shared checks

def _modelled(sim, name, what):
    if not isinstance(name, str):
        raise TypeError(f"{what}: parameter names are strings, got {name!r}")
    if name not in sim.tissue_properties:
        raise TypeError(f"{what}: {type(sim).__name__} does not model {name!r}; "
                        f"it models {list(sim.tissue_properties)}")


def _ranges(sim, ranges, what):
    """Split keyword ranges into {name: (low, high)} and fixed scalars."""
    spans, fixed = {}, {}
    for name, value in ranges.items():
        _modelled(sim, name, what)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            if not np.isfinite(value):
                raise ValueError(f"{what}: {name} = {value!r} is not finite")
            fixed[name] = float(value)
            continue
        try:
            low, high = (float(v) for v in value)
        except (TypeError, ValueError):
            raise TypeError(f"{what}: {name} must be a (low, high) pair or a fixed number, got {value!r}") from None
        if not (np.isfinite(low) and np.isfinite(high)):
            raise ValueError(f"{what}: range of {name} ({low}, {high}) is not finite")
        if not low < high:
            raise ValueError(f"{what}: range of {name} needs low < high, got ({low}, {high})")
        spans[name] = (low, high)
    return spans, fixed


def _signals(signals, contrasts, what):
    """Signals as a complex array (*voxels, contrasts) on the host."""
    if V.is_device_array(signals):
        raise TypeError(f"{what}: signals are a device array; the estimators take NumPy arrays "
                        f"(copy with .get() or cupy.asnumpy)")
    s = np.asarray(signals)
    if s.ndim == 0 or s.shape[-1] != contrasts:
        raise ValueError(f"{what}: signals have {s.shape[-1] if s.ndim else 0} contrasts along their last "
                         f"axis (shape {s.shape}); the fitted simulator gives {contrasts}")
    if not np.issubdtype(s.dtype, np.number) or np.issubdtype(s.dtype, np.bool_):
        raise TypeError(f"{what}: signals must be numeric, got dtype {s.dtype}")
    bad = ~np.isfinite(s).all(axis=-1)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{what}: signals are not finite at voxel {at} ({s[at]!r:.60})")
    return s


def _simulate_table(sim, params, fixed, chunk):
    """Signals (n, contrasts) of the parameter columns in ``params``."""
    n = len(next(iter(params.values())))
    parts = []
    for a in range(0, n, chunk):
        kw = {k: v[a:a + chunk] for k, v in params.items()}
        parts.append(np.asarray(sim.simulate(**kw, **fixed)).reshape(len(kw[next(iter(kw))]), -1))
    return np.concatenate(parts, axis=0)


def _some_contrasts(n, what):
    """Refuse fitting a simulator that gives no samples: nothing identifies
    the parameters (its maps would be undefined)."""
    if n == 0:
        raise ValueError(f"{what}: the simulator gives no samples (zero contrasts), so there is nothing to "
                         "estimate from")
    return n


def _contrasts(sim, fixed):
    """The number of contrasts sim gives (one probe voxel)."""
    probe = {k: 1.0 for k in sim.required}
    probe.update({k: v for k, v in fixed.items()})
    return np.asarray(sim.simulate(**probe)).shape[-1]


# --------------------------------------------------------------------------
# PERK

_MODES = ("cartesian", "magnitude")


class PERK:
    """Parameter estimation via regression with kernels (SPEC §5).

    Kernel ridge regression with a Gaussian kernel approximated by random
    Fourier features, trained on signals the simulator produces for
    parameters drawn uniformly from given ranges with Gaussian noise added.

    Parameters
    ----------
    simulator : blochsim.Simulator or blochsim.ClosedFormSimulator
        The signal model; its protocol is fixed at construction.
    n_features : int
        F, the number of random features.
    length_scale : float or array_like, optional
        Kernel length scale per input coordinate (one value for all, or
        one per coordinate).  Default: the training inputs' standard
        deviation per coordinate times sqrt(d), d the input length.
    regularization : float
        Ridge weight λ relative to the features' mean variance: C = cov(z)
        + λ·trace(cov(z))/F·I.
    complex_mode : {"cartesian", "magnitude"}
        Inputs from the complex signal: real and imaginary parts
        interleaved (2 per contrast), or magnitudes (1 per contrast).
    normalize : bool
        Divide each voxel's input by its Euclidean norm (removes M0; M0
        then cannot be estimated).
    feature_seed : int
        Seed of the feature frequencies and phases.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import SpinEchoSimulator
    >>> from blochsim.estimators import PERK
    >>> perk = PERK(SpinEchoSimulator(TE=np.arange(10.0, 170.0, 10.0), TR=5000.0), n_features=400)
    >>> perk = perk.fit(noise_std=0.005, samples=20000, T1=1000.0, T2=(20.0, 200.0), M0=(0.5, 1.5))
    >>> s = SpinEchoSimulator(TE=np.arange(10.0, 170.0, 10.0), TR=5000.0).simulate(T1=1000.0, T2=80.0, M0=1.2)
    >>> maps = perk.map(s)
    >>> sorted(maps)
    ['M0', 'T2']
    """

    def __init__(self, simulator, n_features=1000, length_scale=None, regularization=1e-6,
                 complex_mode="cartesian", normalize=False, feature_seed=0):
        self.simulator = simulator
        self.n_features = V.positive_int("n_features", n_features)
        if length_scale is not None:
            ls = np.asarray(length_scale, dtype=np.float64)
            if not np.all(np.isfinite(ls)) or np.any(ls <= 0):
                raise ValueError(f"length_scale must be positive and finite, got {length_scale!r}")
        self.length_scale = length_scale
        if not (isinstance(regularization, numbers.Real) and np.isfinite(regularization) and regularization > 0):
            raise ValueError(f"regularization must be a positive number, got {regularization!r}")
        self.regularization = float(regularization)
        if complex_mode not in _MODES:
            raise ValueError(f"complex_mode must be one of {_MODES}, got {complex_mode!r}")
        self.complex_mode = complex_mode
        self.normalize = bool(normalize)
        self.feature_seed = feature_seed
        self._model = None

    # -- inputs ------------------------------------------------------------

    def _inputs(self, s, known_cols):
        """x (n, d) float32 from signals s (n, contrasts), and what the
        pullback needs."""
        s = np.asarray(s)
        if self.complex_mode == "cartesian":
            v = np.ascontiguousarray(s, dtype=np.complex64).view(np.float32).astype(np.float64)
        else:
            v = np.abs(s).astype(np.float64)
        r = None
        if self.normalize:
            r = np.linalg.norm(v, axis=-1, keepdims=True)
            r = np.where(r > 0, r, 1.0)
            v = v / r
        x = np.concatenate([v] + known_cols, axis=-1) if known_cols else v
        return np.ascontiguousarray(x, dtype=np.float32), v, r

    def _pullback_inputs(self, s, v, r, xbar):
        """The cotangent of the signals (SPEC §4 convention) from that of x."""
        vbar = xbar[:, :v.shape[1]].astype(np.float64)
        if self.normalize:
            vbar = (vbar - v * np.sum(v * vbar, axis=-1, keepdims=True)) / r
        if self.complex_mode == "cartesian":
            return (vbar[:, 0::2] + 1j * vbar[:, 1::2]).astype(np.complex64)
        mag = np.abs(s)
        unit = np.where(mag > 0, s / np.where(mag > 0, mag, 1.0), 0.0)
        return (vbar * unit).astype(np.complex64)

    # -- training ----------------------------------------------------------

    def _training(self, spans, fixed, known, samples, seed, noise_std, chunk):
        """Yields (theta (m, p), known columns, signals) chunk by chunk, the
        same sequence for the same seed."""
        rng = np.random.default_rng(seed)
        names = list(spans)
        lows = np.array([spans[k][0] for k in names])
        highs = np.array([spans[k][1] for k in names])
        draws = lows + (highs - lows) * rng.random((samples, len(names)))
        for c, a in enumerate(range(0, samples, chunk)):
            block = draws[a:a + chunk]
            kw = {k: block[:, i] for i, k in enumerate(names)}
            s = np.asarray(self.simulator.simulate(**kw, **fixed)).reshape(len(block), -1)
            if noise_std > 0:
                nrng = np.random.default_rng([seed, c])
                s = s + noise_std * (nrng.standard_normal(s.shape) + 1j * nrng.standard_normal(s.shape))
            yield block, [block[:, names.index(k)][:, None] for k in known], s

    def fit(self, noise_std=0.0, samples=20000, seed=0, known=(), chunk=4096, uncertainty=False, **ranges):
        """Train on simulated signals.

        Parameters
        ----------
        noise_std : float
            Standard deviation of the Gaussian noise added to each real and
            imaginary part of the training signals (signal units, M0 = 1
            gives unit equilibrium magnetisation).
        samples : int
            Number of training signals.
        seed : int
            Seed of the training parameters and noise.
        known : sequence of str
            Parameters that are measured separately (a B1 map, say): drawn
            from their ranges for training, appended to the inputs, and
            passed to :meth:`map` instead of estimated.
        chunk : int
            Training signals simulated at a time (memory grows with F², not
            with ``samples``).
        uncertainty : bool
            Also learn each estimate's error: a second pass regresses the
            squared training errors on the same features, and
            ``map(..., uncertainty=True)`` returns their square roots.
        **ranges
            ``name=(low, high)``: a parameter drawn uniformly (estimated,
            unless in ``known``); ``name=value``: fixed.

        Returns
        -------
        PERK
            self, fitted.
        """
        spans, fixed = _ranges(self.simulator, ranges, "PERK.fit")
        known = (known,) if isinstance(known, str) else tuple(known)
        for k in known:
            if k not in spans:
                raise ValueError(f"PERK.fit: known parameter {k!r} needs a (low, high) range")
        names = [k for k in spans if k not in known]
        if not names:
            raise ValueError("PERK.fit: no parameter to estimate; give at least one (low, high) range")
        if len(names) * (2 if uncertainty else 1) > _core.PERK_MAX_OUTPUTS:
            raise ValueError(f"PERK.fit: at most {_core.PERK_MAX_OUTPUTS} outputs, got {len(names)} estimates"
                             + (" and their uncertainties" if uncertainty else ""))
        samples = V.positive_int("samples", samples)
        chunk = V.positive_int("chunk", chunk)
        if not (isinstance(noise_std, numbers.Real) and np.isfinite(noise_std) and noise_std >= 0):
            raise ValueError(f"PERK.fit: noise_std must be >= 0 and finite, got {noise_std!r}")
        est = [list(spans).index(k) for k in names]
        F = self.n_features
        frng = np.random.default_rng(self.feature_seed)

        def chunks():
            return self._training(spans, fixed, known, samples, seed, noise_std, chunk)

        stream = chunks()
        first = next(stream)
        x0 = self._inputs(first[2], first[1])[0].astype(np.float64)
        d = x0.shape[1]
        if self.length_scale is None:
            sd = np.std(x0, axis=0)
            ell = np.where(sd > 0, sd, 1.0) * np.sqrt(d)
        else:
            ell = np.broadcast_to(np.asarray(self.length_scale, dtype=np.float64), (d,))
        omega = frng.standard_normal((F, d)) / ell
        phase = frng.uniform(0.0, 2 * np.pi, F)
        scale = np.sqrt(2.0 / F)

        def moments(data, target_of):
            """Means of z, z zᵀ, t and t zᵀ over the training chunks, in float64."""
            sz, szz, st, stz, m = np.zeros(F), np.zeros((F, F)), 0.0, 0.0, 0
            for theta, kcols, s in data:
                x = self._inputs(s, kcols)[0]
                z = scale * np.cos(x.astype(np.float64) @ omega.T + phase)
                t = target_of(theta, x)
                sz += z.sum(0)
                szz += z.T @ z
                st = st + t.sum(0)
                stz = stz + t.T @ z
                m += len(z)
            return sz / m, szz / m, st / m, stz / m

        mz, mzz, mt, mtz = moments(_chain(first, stream), lambda theta, x: theta[:, est])
        C = mzz - np.outer(mz, mz)
        C[np.diag_indices(F)] += self.regularization * np.trace(C) / F
        W = np.linalg.solve(C, (mtz - np.outer(mt, mz)).T).T  # (p, F)
        offset = mt - W @ mz
        model = {k: np.ascontiguousarray(v, dtype=np.float32)
                 for k, v in dict(omega=omega, phase=phase, weight=W * scale, offset=offset).items()}
        self._model = model
        self.names, self.known, self.fixed = names, known, fixed
        self.contrasts = _some_contrasts(first[2].shape[1], "PERK.fit")
        self.inputs = d
        self._uncertainty = False
        if uncertainty:
            def squared_error(theta, x):
                est_x = np.empty((len(x), len(names)), np.float32)
                _core.perk(model["omega"], model["phase"], model["weight"], model["offset"], x, est_x,
                           threads=_threads(self.simulator))
                return (theta[:, est] - est_x) ** 2

            _, _, me, mez = moments(chunks(), squared_error)
            W2 = np.linalg.solve(C, (mez - np.outer(me, mz)).T).T
            model["weight"] = np.ascontiguousarray(np.concatenate([model["weight"], W2 * scale]), dtype=np.float32)
            model["offset"] = np.ascontiguousarray(np.concatenate([model["offset"], me - W2 @ mz]), dtype=np.float32)
            self._uncertainty = True
        return self

    # -- estimation --------------------------------------------------------

    def _prepare(self, signals, known, what):
        if self._model is None:
            raise RuntimeError(f"{what} needs a fitted PERK: call fit() first")
        s = _signals(signals, self.contrasts, what)
        shape = s.shape[:-1]
        known = {} if known is None else dict(known)
        missing = [k for k in self.known if k not in known]
        extra = [k for k in known if k not in self.known]
        if missing or extra:
            raise ValueError(f"{what}: known must give exactly {list(self.known)}, "
                             f"missing {missing}, unexpected {extra}")
        cols = []
        for k in self.known:
            a = np.asarray(known[k], dtype=np.float64)
            try:
                a = np.broadcast_to(a, shape)
            except ValueError:
                raise ValueError(f"{what}: known {k} of shape {a.shape} does not broadcast to the voxel shape "
                                 f"{shape}") from None
            cols.append(a.reshape(-1, 1))
        flat = s.reshape(-1, self.contrasts)
        x, v, r = self._inputs(flat, cols)
        return shape, flat, x, v, r

    def map(self, signals, known=None, uncertainty=False):
        """Estimate parameter maps.

        Parameters
        ----------
        signals : array_like, complex, shape (*voxels, contrasts)
        known : dict, optional
            The ``known`` parameters of :meth:`fit`, each broadcast to the
            voxel shape.
        uncertainty : bool
            Also return ``name + "_std"``: the learned root-mean-square
            error of each estimate (needs ``fit(uncertainty=True)``).

        Returns
        -------
        dict of numpy.ndarray, float32, shape voxels
            One map per estimated parameter (public units).
        """
        shape, flat, x, _, _ = self._prepare(signals, known, "PERK.map")
        if uncertainty and not self._uncertainty:
            raise ValueError("PERK.map: uncertainty=True needs fit(uncertainty=True)")
        m = self._model
        out = np.empty((len(x), len(m["offset"])), np.float32)
        _core.perk(m["omega"], m["phase"], m["weight"], m["offset"], x, out, threads=_threads(self.simulator))
        return self._maps(out, shape, uncertainty)

    def _maps(self, out, shape, uncertainty):
        p = len(self.names)
        maps = {k: out[:, i].reshape(shape) for i, k in enumerate(self.names)}
        if uncertainty:
            for i, k in enumerate(self.names):
                maps[k + "_std"] = np.sqrt(np.maximum(out[:, p + i], 0.0)).reshape(shape)
        return maps

    def vjp(self, signals, known=None):
        """Maps and their pullback to the signals.

        Returns
        -------
        maps : dict of numpy.ndarray, float32, shape voxels
        pullback : callable
            ``pullback(cotangents)`` with ``cotangents`` a dict of arrays
            (voxel shape) per estimated parameter (missing ones are zero),
            the derivative of a real loss with respect to each map; returns
            the loss's cotangent of the signals, complex64 shaped like them
            (∂L/∂Re s + i·∂L/∂Im s, SPEC §4).
        """
        shape, flat, x, v, r = self._prepare(signals, known, "PERK.vjp")
        m = self._model
        p = len(self.names)
        weight, offset = m["weight"][:p].copy(), m["offset"][:p].copy()
        out = np.empty((len(x), p), np.float32)
        _core.perk(m["omega"], m["phase"], weight, offset, x, out, threads=_threads(self.simulator))
        maps = self._maps(out, shape, False)

        def pullback(cotangents):
            unknown = [k for k in cotangents if k not in self.names]
            if unknown:
                raise ValueError(f"PERK pullback: no map named {unknown}; maps: {self.names}")
            g = np.zeros((len(x), p), np.float32)
            for i, k in enumerate(self.names):
                if k in cotangents:
                    g[:, i] = np.broadcast_to(np.asarray(cotangents[k], dtype=np.float32), shape).reshape(-1)
            xbar = np.empty_like(x)
            scratch = np.empty((len(x), p), np.float32)
            _core.perk(m["omega"], m["phase"], weight, offset, x, scratch, g=g, xbar=xbar,
                       threads=_threads(self.simulator))
            sbar = self._pullback_inputs(flat, v, r, xbar)
            return sbar.reshape(shape + (self.contrasts,))

        return maps, pullback


def _chain(first, rest):
    yield first
    yield from rest


def _threads(sim):
    t = getattr(sim, "threads", None)
    return t if t else _dispatch.default_threads()


# --------------------------------------------------------------------------
# Dictionary matching

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


# --------------------------------------------------------------------------
# Lookup table

class LookupTable:
    """One unknown from one real feature of the signal, by interpolation.

    Parameters
    ----------
    simulator : blochsim.Simulator or blochsim.ClosedFormSimulator
    feature : callable, optional
        ``feature(signals)`` maps signals (n, contrasts) to one real value
        each (n,).  Default: the real part of a one-contrast signal.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import InversionRecoverySimulator
    >>> from blochsim.estimators import LookupTable
    >>> sim = InversionRecoverySimulator(TI=[400.0])
    >>> lut = LookupTable(sim).fit(T1=np.linspace(100.0, 3000.0, 500))
    >>> float(np.round(lut.map(sim.simulate(T1=900.0))["T1"], 1))
    900.0
    """

    def __init__(self, simulator, feature=None):
        self.simulator = simulator
        if feature is not None and not callable(feature):
            raise TypeError(f"feature must be callable, got {type(feature).__name__}")
        self.feature = feature
        self._table = None

    def _feature(self, s, what):
        if self.feature is not None:
            f = np.asarray(self.feature(s), dtype=np.float64)
            if f.shape != s.shape[:1]:
                raise ValueError(f"{what}: feature must give one value per signal, got shape {f.shape} for "
                                 f"{s.shape[0]} signals")
            return f
        if s.shape[1] != 1:
            raise ValueError(f"{what}: the signal has {s.shape[1]} contrasts; give a feature that reduces them "
                             f"to one real value")
        return np.real(s[:, 0]).astype(np.float64)

    def fit(self, **grid):
        """Tabulate the feature over one parameter's grid.

        Parameters
        ----------
        **grid
            Exactly one ``name=values`` (1-D array, the unknown) and any
            number of fixed ``name=value``.

        Returns
        -------
        LookupTable
            self, fitted.  The table keeps the longest run of the grid over
            which the feature is strictly monotonic; signals whose feature
            falls outside that run map to NaN.
        """
        axes, fixed = {}, {}
        for k, v in grid.items():
            _modelled(self.simulator, k, "LookupTable.fit")
            a = np.asarray(v, dtype=np.float64)
            if a.ndim == 0:
                fixed[k] = float(a)
            elif a.ndim == 1 and len(a) >= 2 and np.all(np.isfinite(a)):
                axes[k] = np.sort(a)
            else:
                raise ValueError(f"LookupTable.fit: {k} must be a finite 1-D array of at least 2 values "
                                 f"or a number")
        if len(axes) != 1:
            raise ValueError(f"LookupTable.fit: exactly one unknown (a 1-D array) is needed, got "
                             f"{list(axes) or 'none'}")
        (name, values), = axes.items()
        s = _simulate_table(self.simulator, {name: values}, fixed, 65536)
        self.contrasts = _some_contrasts(s.shape[1], "LookupTable.fit")
        f = self._feature(s, "LookupTable.fit")
        if not np.all(np.isfinite(f)):
            bad = int(np.flatnonzero(~np.isfinite(f))[0])
            raise ValueError(f"LookupTable.fit: the feature is not finite at {name} = {float(values[bad])!r}")
        # the longest strictly monotonic run
        step = np.sign(np.diff(f))
        best, start = (0, 0), 0
        for i in range(1, len(step) + 1):
            if i == len(step) or step[i] != step[start] or step[i] == 0:
                if step[start] != 0 and i - start > best[1] - best[0]:
                    best = (start, i)
                start = i
        if best[1] == best[0]:
            raise ValueError(f"LookupTable.fit: the feature is not monotonic anywhere over the {name} grid")
        run = slice(best[0], best[1] + 1)
        fv, pv = f[run], values[run]
        if fv[0] > fv[-1]:
            fv, pv = fv[::-1], pv[::-1]
        self.name, self.fixed, self._table = name, fixed, (fv, pv)
        self.valid = (float(pv.min()), float(pv.max()))
        return self

    def map(self, signals):
        """The unknown of each signal.

        Parameters
        ----------
        signals : array_like, shape (*voxels, contrasts)

        Returns
        -------
        dict
            ``{name: values}`` shaped ``voxels`` (float64; NaN outside the
            table's monotonic run).
        """
        if self._table is None:
            raise RuntimeError("LookupTable.map needs a fitted table: call fit() first")
        s = _signals(signals, self.contrasts, "LookupTable.map")
        shape = s.shape[:-1]
        f = self._feature(s.reshape(-1, self.contrasts), "LookupTable.map")
        fv, pv = self._table
        out = np.interp(f, fv, pv, left=np.nan, right=np.nan)
        return {self.name: out.reshape(shape)}


# --------------------------------------------------------------------------
# Non-linear least squares

class NonlinearLeastSquares:
    """Voxel-wise bounded least squares with exact Jacobians.

    Minimises Σ|s(θ) − y|² over the real and imaginary parts of every
    contrast by Levenberg–Marquardt (Marquardt 1963, SIAM J Appl Math
    11:431), every voxel a problem in one batch: each iteration is one
    Jacobian call and one signal call of the simulator for all voxels.
    Steps are projected onto the bounds.  Standard errors come from the
    Fisher information at the solution, σ²(JᵀJ)⁻¹.

    Parameters
    ----------
    simulator : blochsim.Simulator or blochsim.ClosedFormSimulator
        A simulator with ``jacobian``.
    max_iterations : int
    tolerance : float
        Stop a voxel when its cost falls by less than this fraction.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import SpinEchoSimulator
    >>> from blochsim.estimators import NonlinearLeastSquares
    >>> sim = SpinEchoSimulator(TE=np.arange(10.0, 170.0, 20.0), TR=5000.0)
    >>> nls = NonlinearLeastSquares(sim).fit(T1=1000.0, T2=(10.0, 300.0), M0=(0.1, 3.0))
    >>> maps = nls.map(sim.simulate(T1=1000.0, T2=[60.0, 120.0], M0=1.5))
    >>> np.round(maps["T2"], 2)
    array([ 60., 120.])
    """

    def __init__(self, simulator, max_iterations=50, tolerance=1e-10):
        self.simulator = simulator
        self.max_iterations = V.positive_int("max_iterations", max_iterations)
        if not (isinstance(tolerance, numbers.Real) and tolerance > 0):
            raise ValueError(f"tolerance must be a positive number, got {tolerance!r}")
        self.tolerance = float(tolerance)
        self._bounds = None

    def fit(self, noise_std=None, init=None, **bounds):
        """Set what is estimated.

        Parameters
        ----------
        noise_std : float, optional
            Noise standard deviation of each real and imaginary part, for
            the standard errors; default: estimated per voxel from the
            residual (cost / (2·contrasts − parameters)).
        init : dict, optional
            Starting values (number or voxel-shaped array per estimated
            parameter); default the middle of each range.
        **bounds
            ``name=(low, high)``: estimated within the bounds;
            ``name=value``: fixed.

        Returns
        -------
        NonlinearLeastSquares
            self.
        """
        spans, fixed = _ranges(self.simulator, bounds, "NonlinearLeastSquares.fit")
        if not spans:
            raise ValueError("NonlinearLeastSquares.fit: give at least one (low, high) range to estimate")
        if noise_std is not None and not (isinstance(noise_std, numbers.Real) and noise_std > 0):
            raise ValueError(f"NonlinearLeastSquares.fit: noise_std must be positive, got {noise_std!r}")
        init = {} if init is None else dict(init)
        for k in init:
            if k not in spans:
                raise ValueError(f"NonlinearLeastSquares.fit: init names {k!r}, which is not estimated")
        self._bounds, self.fixed, self.noise_std, self.init = spans, fixed, noise_std, init
        self.names = list(spans)
        self.contrasts = _some_contrasts(
            _contrasts(self.simulator, {**fixed, **{k: np.mean(v) for k, v in spans.items()}}), "NonlinearLeastSquares.fit")
        return self

    def map(self, signals):
        """Fit every voxel.

        Parameters
        ----------
        signals : array_like, complex, shape (*voxels, contrasts)

        Returns
        -------
        dict of numpy.ndarray, float64, shape voxels
            One map per estimated parameter, ``name + "_se"`` its standard
            error, ``"cost"`` the final Σ|s(θ) − y|² and ``"iterations"``.
        """
        if self._bounds is None:
            raise RuntimeError("NonlinearLeastSquares.map needs fit() first (it sets the bounds)")
        y = _signals(signals, self.contrasts, "NonlinearLeastSquares.map")
        shape = y.shape[:-1]
        y = y.reshape(-1, self.contrasts).astype(np.complex128)
        n, p = len(y), len(self.names)
        lo = np.array([self._bounds[k][0] for k in self.names])
        hi = np.array([self._bounds[k][1] for k in self.names])
        theta = np.empty((n, p))
        for i, k in enumerate(self.names):
            v = self.init.get(k, 0.5 * (lo[i] + hi[i]))
            theta[:, i] = np.clip(np.broadcast_to(np.asarray(v, dtype=np.float64), shape).reshape(-1), lo[i], hi[i])
        sim = self.simulator

        def kw(t):
            return {**{k: t[:, i] for i, k in enumerate(self.names)}, **self.fixed}

        def signal(t):
            return np.asarray(sim.simulate(**kw(t))).reshape(n, self.contrasts).astype(np.complex128)

        mu = np.full(n, 1e-3)
        active = np.ones(n, bool)
        iterations = np.zeros(n, np.int64)
        s, J = sim.jacobian(tuple(self.names), **kw(theta))
        s = np.asarray(s).reshape(n, self.contrasts).astype(np.complex128)
        J = np.asarray(J).reshape(n, p, self.contrasts).astype(np.complex128)
        cost = np.sum(np.abs(s - y) ** 2, axis=1)
        for _ in range(self.max_iterations):
            if not active.any():
                break
            r = s - y
            H = np.real(np.einsum("nis,njs->nij", J.conj(), J))
            g = np.real(np.einsum("nis,ns->ni", J.conj(), r))
            D = np.maximum(np.diagonal(H, axis1=1, axis2=2), 1e-30)
            A = H + mu[:, None, None] * (D[:, :, None] * np.eye(p))
            step = -np.linalg.solve(A, g[..., None])[..., 0]
            trial = np.clip(theta + step, lo, hi)
            trial[~active] = theta[~active]
            s_t = signal(trial)
            cost_t = np.sum(np.abs(s_t - y) ** 2, axis=1)
            better = (cost_t < cost) & active
            gain = np.where(better, (cost - cost_t) / np.maximum(cost, 1e-300), 0.0)
            theta[better] = trial[better]
            mu = np.where(better, mu / 3.0, mu * 4.0)
            iterations[active] += 1
            # a voxel stops when an accepted step gains little, or when no
            # step is accepted even with a very short one
            done = (better & (gain < self.tolerance)) | (mu > 1e12) | (cost_t == 0)
            cost = np.where(better, cost_t, cost)
            active &= ~done
            if better.any():
                s_new, J_new = sim.jacobian(tuple(self.names), **kw(theta))
                s = np.asarray(s_new).reshape(n, self.contrasts).astype(np.complex128)
                J = np.asarray(J_new).reshape(n, p, self.contrasts).astype(np.complex128)
        H = np.real(np.einsum("nis,njs->nij", J.conj(), J))
        dof = max(2 * self.contrasts - p, 1)
        sigma2 = (self.noise_std ** 2) if self.noise_std is not None else cost / dof
        cov = np.linalg.pinv(H) * np.reshape(sigma2, (-1, 1, 1)) if np.ndim(sigma2) else np.linalg.pinv(H) * sigma2
        se = np.sqrt(np.maximum(np.diagonal(cov, axis1=1, axis2=2), 0.0))
        out = {k: theta[:, i].reshape(shape) for i, k in enumerate(self.names)}
        out.update({k + "_se": se[:, i].reshape(shape) for i, k in enumerate(self.names)})
        out["cost"] = cost.reshape(shape)
        out["iterations"] = iterations.reshape(shape)
        return out
