"""PERK: parameter estimation via regression with kernels (Nataraj, Fessler,
Nielsen 2018)."""
from __future__ import annotations

import numbers

import numpy as np

from blochsim import _core
from blochsim._engine import dispatch as _dispatch
from blochsim._arrays import noise as _noise
from blochsim._arrays import validate as V
from blochsim.estimators import _on_device
from blochsim.estimators._common import _auto_count, _levelwise, _ranges, _signals, _some_contrasts, _threads


_MODES = ("auto", "cartesian", "magnitude")


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
    length_scale : float, array_like, "std" or None
        Kernel length scale per input coordinate (one value for all, or
        one per coordinate).  ``"std"``: the training inputs' standard
        deviation per coordinate times sqrt(d), d the input length
        (Nataraj et al. 2018).  None (default): on principal coordinates
        (``subspace``) one scale for all, half their root-mean-square
        standard deviation times sqrt(d), so that weak directions are not
        stretched, their noise with them; on raw coordinates each one's
        standard deviation, at least a tenth of the root-mean-square one
        (a coordinate that holds little but noise would otherwise get the
        noise's scale), times sqrt(d).
    regularization : float
        Ridge weight λ relative to the features' mean variance: C = cov(z)
        + λ·trace(cov(z))/F·I.
    complex_mode : {"auto", "cartesian", "magnitude"}
        Inputs from the complex signal: real and imaginary parts
        interleaved (2 per contrast), or magnitudes (1 per contrast).
        ``"auto"`` (default) chooses at :meth:`fit` from noise-free
        training signals: magnitudes when the signals carry no phase
        information (every signal's samples share one phase, up to sign),
        since their other Cartesian coordinates would hold only noise;
        Cartesian parts otherwise.  :attr:`input_mode` says which.
    normalize : bool
        Divide each voxel's input by its Euclidean norm (removes M0; M0
        then cannot be estimated).
    feature_seed : int
        Seed of the feature frequencies and phases.
    subspace : "auto", int or None
        Project the inputs onto the leading principal directions of
        noise-free training inputs before the features: ``"auto"``
        (default) keeps the fewest directions that hold all but 1e-6 of
        their energy, an integer that many, None none.  The projection
        drops what only noise occupies, which helps long signals (MR
        fingerprints) most.
    device : {"cpu", "cuda", "auto"}, optional
        Where the features run.  ``"cuda"``: :meth:`fit` forms each
        training block's features and sums their moments on the GPU
        (cuda/perk.cuh; the simulation follows the simulator's device), and
        :meth:`map` forms the inputs and the fused map there, returning
        device arrays of the signals' library for device signals.  Default:
        the simulator's ``device``; device signals are mapped on the GPU.

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

    def __init__(self, simulator, n_features=2000, length_scale=None, regularization=1e-6,
                 complex_mode="auto", normalize=False, feature_seed=0, subspace="auto", device=None):
        self.simulator = simulator
        if device not in (None, "cpu", "cuda", "auto"):
            raise ValueError(f"device must be 'cpu', 'cuda', 'auto' or None, got {device!r}")
        self.device = device
        self._device_model = None
        self.n_features = V.positive_int("n_features", n_features)
        if isinstance(length_scale, str):
            if length_scale != "std":
                raise ValueError(f"length_scale must be positive numbers, 'std' or None, got {length_scale!r}")
        elif length_scale is not None:
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
        #: the inputs in use: "cartesian" or "magnitude" ("auto" resolved by fit)
        self.input_mode = None if complex_mode == "auto" else complex_mode
        self.normalize = bool(normalize)
        self.feature_seed = feature_seed
        self.subspace = _auto_count("subspace", subspace)
        self._basis = None
        self._model = None
        #: the estimated parameters regressed as their logarithms (fit's ``log``)
        self.log = ()

    def __getstate__(self):
        """Pickled (for Dask workers, or to keep) without the device copies
        of its arrays, which are made again where they are needed."""
        state = dict(self.__dict__)
        state["_device_model"] = None
        state.pop("_training_device", None)
        return state

    # -- inputs ------------------------------------------------------------

    def _inputs(self, s, known_cols):
        """x (n, d) float32 from signals s (n, contrasts), and what the
        pullback needs."""
        s = np.asarray(s)
        if self.input_mode == "cartesian":
            v = np.ascontiguousarray(s, dtype=np.complex64).view(np.float32).astype(np.float64)
        else:
            v = np.abs(s).astype(np.float64)
        r = None
        if self.normalize:
            r = np.linalg.norm(v, axis=-1, keepdims=True)
            r = np.where(r > 0, r, 1.0)
            v = v / r
        u = v @ self._basis if self._basis is not None else v
        x = np.concatenate([u] + known_cols, axis=-1) if known_cols else u
        return np.ascontiguousarray(x, dtype=np.float32), v, r

    def _pullback_inputs(self, s, v, r, xbar):
        """The cotangent of the signals (SPEC §4 convention) from that of x."""
        if self._basis is not None:
            vbar = xbar[:, :self._basis.shape[1]].astype(np.float64) @ self._basis.T
        else:
            vbar = xbar[:, :v.shape[1]].astype(np.float64)
        if self.normalize:
            vbar = (vbar - v * np.sum(v * vbar, axis=-1, keepdims=True)) / r
        if self.input_mode == "cartesian":
            return (vbar[:, 0::2] + 1j * vbar[:, 1::2]).astype(np.complex64)
        mag = np.abs(s)
        unit = np.where(mag > 0, s / np.where(mag > 0, mag, 1.0), 0.0)
        return (vbar * unit).astype(np.complex64)

    # -- training ----------------------------------------------------------

    def _thetas(self, spec, b0, b1):
        """(block, theta (m, p)) of training blocks b0 to b1 - 1: each block
        of :data:`TRAINING_BLOCK` draws its parameters from its own
        counter-based stream (NumPy's Philox keyed by the seed, the block
        index in the counter), so a draw depends on its index alone, not on
        how the blocks are grouped or where they run."""
        names = list(spec["spans"])
        logs = np.array([k in spec.get("log", ()) for k in names], dtype=bool)
        lows = np.array([spec["spans"][k][0] for k in names])
        highs = np.array([spec["spans"][k][1] for k in names])
        lows[logs], highs[logs] = np.log(lows[logs]), np.log(highs[logs])
        key = int.from_bytes(np.random.SeedSequence(spec["seed"]).generate_state(2, np.uint64).tobytes(), "little")
        out = []
        for b in range(b0, b1):
            m = min(TRAINING_BLOCK, spec["samples"] - b * TRAINING_BLOCK)
            g = np.random.Generator(np.random.Philox(key=key, counter=[0, 0, 0, b]))
            u = lows + (highs - lows) * g.random((m, len(names)))
            u[:, logs] = np.exp(u[:, logs])
            out.append((b, u))
        return out

    def _draws(self, spec, b0, b1):
        """(theta (m, p), known columns, signals (m, contrasts) complex64)
        of training blocks b0 to b1 - 1 on the host: the parameters of
        :meth:`_thetas`, their signals, and the block's noise from the
        core's counter-based generator (:mod:`blochsim._arrays.noise`, the same
        numbers as on the device)."""
        names = list(spec["spans"])
        parts = []
        for b, t in self._thetas(spec, b0, b1):
            # one call a block: a call's choices (repetitions="auto") are then the block's alone
            kw = {k: t[:, i] for i, k in enumerate(names)}
            sb = np.array(self.simulator.simulate(**kw, **spec["fixed"]), dtype=np.complex64, order="C")
            sb = sb.reshape(len(t), -1)
            if spec["noise_std"] > 0:
                _noise.add(sb, spec["noise_std"], _noise.key(spec["seed"]), b, _noise.PERK_TRAINING,
                           threads=_threads(self.simulator))
            parts.append((t, [t[:, names.index(k)][:, None] for k in spec["known"]], sb))
        return parts

    def _targets(self, spec, theta):
        """The regressed values of draws theta: the estimated parameters,
        the log-scaled ones as their logarithms."""
        t = theta[:, spec["est"]]
        if spec.get("log"):
            t = t.copy()
            t[:, spec["log_est"]] = np.log(t[:, spec["log_est"]])
        return t

    def _moments(self, spec, b0, b1, model=None, host=True):
        """Sums of z, z zᵀ, t, t zᵀ and the count over training blocks b0 to
        b1 - 1 (float64), each block's summed on its own and the blocks
        combined in the fixed tree (:func:`_common._levelwise`); t the estimated
        parameters, or with ``model`` the model's squared errors.  On the
        device (``spec["device"]``, no ``model``) the blocks are simulated,
        made noisy and summed there; ``host=False`` leaves the sums there."""
        if spec.get("device") and model is None:
            sums = _levelwise((_on_device.perk_block(self, spec, b, theta) for b, theta in
                               self._thetas(spec, b0, b1)), _add)
            return _on_device.to_host(sums) if host else sums

        def block(theta, kcols, s):
            x = self._inputs(s, kcols)[0]
            t = self._targets(spec, theta)
            if model is not None:
                e = np.empty((len(x), len(spec["est"])), np.float32)
                _core.perk(model["omega"], model["phase"], model["weight"], model["offset"], x, e,
                           threads=_threads(self.simulator))
                t = (t - e) ** 2
            z = spec["scale"] * np.cos(x.astype(np.float64) @ spec["omega"].T + spec["phase"])
            return (z.sum(0), z.T @ z, t.sum(0), t.T @ z, len(z))

        return _levelwise((block(*part) for part in self._draws(spec, b0, b1)), _add)

    def _probe(self, spans, fixed, seed, n=1024):
        """Noise-free signals (n, contrasts) of n draws from the ranges."""
        rng = np.random.default_rng([seed, 1])
        kw = {k: lo + (hi - lo) * rng.random(n) for k, (lo, hi) in spans.items()}
        return np.asarray(self.simulator.simulate(**kw, **fixed)).reshape(n, -1).astype(np.complex128)

    @staticmethod
    def _phase_free(s, tolerance=1e-6):
        """Whether the signals carry no phase information: each, turned by
        the phase that makes the sum of its squared samples real, has
        (almost) no imaginary part."""
        turn = np.exp(-0.5j * np.angle(np.sum(s * s, axis=1)))
        aligned = s * turn[:, None]
        return float(np.sum(aligned.imag ** 2)) <= tolerance * max(float(np.sum(np.abs(s) ** 2)), 1e-300)

    def _principal(self, v, noise_std, tolerance=1e-6):
        """The leading principal directions (d, r) of the noise-free inputs
        v (n, d) (uncentred), or None when they would keep every
        coordinate: with ``subspace="auto"`` those whose mean square per
        signal exceeds the noise variance (``noise_std²``), and never
        more than keep all but ``tolerance`` of the energy."""
        _, sv, vt = np.linalg.svd(v, full_matrices=False)
        if self.subspace == "auto":
            kept = np.cumsum(sv ** 2) / max(float(np.sum(sv ** 2)), 1e-300)
            r = int(np.searchsorted(kept, 1.0 - tolerance) + 1)
            if noise_std > 0:
                r = min(r, max(1, int(np.sum(sv ** 2 / len(v) > noise_std ** 2))))
        else:
            r = self.subspace
        if r >= v.shape[1]:
            return None
        return np.ascontiguousarray(vt[:r].T)

    def fit(self, noise_std=0.0, samples=20000, seed=0, known=(), chunk=4096, uncertainty=False, dask=False,
            log=(), **ranges):
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
            with ``samples``); rounded down to a power of two of training
            blocks (:data:`blochsim.estimators.perk.TRAINING_BLOCK` draws
            each).  The fit does not depend on it.
        uncertainty : bool
            Also learn each estimate's error: a second pass regresses the
            squared training errors on the same features, and
            ``map(..., uncertainty=True)`` returns their square roots.
        dask : bool
            Simulate the training blocks and sum their moments as a Dask
            graph on the active scheduler (a ``dask.distributed`` cluster
            when a Client exists); the sums are combined in the same fixed
            tree, so the fit is bitwise the one computed in this process,
            for any number of workers.
        log : sequence of str
            Parameters drawn uniformly in their logarithm (ranges spanning
            decades, as T2 from white matter to CSF) and, when estimated,
            regressed as their logarithm, the map returning its
            exponential (and a learned uncertainty as the estimate times
            that of the logarithm).
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

        probe = self._probe(spans, fixed, seed)
        if self.complex_mode == "auto":
            self.input_mode = "magnitude" if self._phase_free(probe) else "cartesian"
        self._basis = None
        if self.subspace is not None:
            self._basis = self._principal(self._inputs(probe, [])[1], noise_std)

        log = (log,) if isinstance(log, str) else tuple(log)
        for k in log:
            if k not in spans or spans[k][0] <= 0:
                raise ValueError(f"PERK.fit: log parameter {k!r} needs a (low, high) range with low > 0")
        spec = dict(spans=spans, fixed=fixed, known=known, samples=samples, seed=seed, noise_std=noise_std,
                    est=est, log=log, log_est=np.array([k in log for k in names], dtype=bool))
        first = self._draws(spec, 0, 1)[0]
        x0 = self._inputs(first[2], first[1])[0].astype(np.float64)
        d = x0.shape[1]
        if isinstance(self.length_scale, str):  # "std": each coordinate's spread (Nataraj et al.)
            sd = np.std(x0, axis=0)
            ell = np.where(sd > 0, sd, 1.0) * np.sqrt(d)
        elif self.length_scale is None:
            # the spread of each coordinate, floored at a tenth of the
            # typical spread: a coordinate that holds little but noise
            # would otherwise get a length scale of the noise and make the
            # features turn with it
            sd = np.std(x0, axis=0)
            u = d - len(known)  # signal coordinates; the known parameters follow
            typical = np.sqrt(np.mean(sd[:u] ** 2))
            if typical == 0:
                signal = np.ones(u)
            elif self._basis is not None:
                # principal coordinates: one scale for all (the distance of
                # the signals themselves), so that the weak directions are
                # not stretched to the strong ones' size, noise with them
                signal = np.full(u, 0.5 * typical)
            else:
                signal = np.maximum(sd[:u], 0.1 * typical)
            ell = np.concatenate([signal, np.where(sd[u:] > 0, sd[u:], 1.0)]) * np.sqrt(d)
        else:
            ell = np.broadcast_to(np.asarray(self.length_scale, dtype=np.float64), (d,))
        omega = frng.standard_normal((F, d)) / ell
        phase = frng.uniform(0.0, 2 * np.pi, F)
        scale = np.sqrt(2.0 / F)

        spec.update(omega=omega, phase=phase, scale=scale, device=_on_device.wanted(self), contrasts=first[2].shape[1],
                    inputs=d)
        group = 1 << max(0, (chunk // TRAINING_BLOCK).bit_length() - 1)  # blocks a task: a subtree of the sums
        n_blocks = -(-samples // TRAINING_BLOCK)

        def moments(model=None):
            """Means of z, z zᵀ, t and t zᵀ over the training draws."""
            spans_of = [(g, min(g + group, n_blocks)) for g in range(0, n_blocks, group)]
            if dask:
                from blochsim import distributed
                import dask as _dask
                parts = [_dask.delayed(PERK._moments, pure=True)(self, spec, g0, g1, model) for g0, g1 in spans_of]
                total = distributed.tree_sum(parts, _add)
                sz, szz, st, stz, m = _dask.compute(total)[0]
            else:
                sz, szz, st, stz, m = _on_device.to_host(
                    _levelwise((self._moments(spec, g0, g1, model, host=False) for g0, g1 in spans_of), _add))
            return sz / m, szz / m, st / m, stz / m

        mz, mzz, mt, mtz = moments()
        C = mzz - np.outer(mz, mz)
        C[np.diag_indices(F)] += self.regularization * np.trace(C) / F
        W = np.linalg.solve(C, (mtz - np.outer(mt, mz)).T).T  # (p, F)
        offset = mt - W @ mz
        model = {k: np.ascontiguousarray(v, dtype=np.float32)
                 for k, v in dict(omega=omega, phase=phase, weight=W * scale, offset=offset).items()}
        self._model = model
        self._device_model = None
        self.names, self.known, self.fixed = names, known, fixed
        self.log = tuple(k for k in names if k in log)
        self.contrasts = _some_contrasts(first[2].shape[1], "PERK.fit")
        self.inputs = d
        self._uncertainty = False
        if uncertainty:
            _, _, me, mez = moments(dict(model))
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
        cols = [c[:, None] for c in self._known_columns(known, shape, what)]
        flat = s.reshape(-1, self.contrasts)
        x, v, r = self._inputs(flat, cols)
        return shape, flat, x, v, r

    def _known_columns(self, known, shape, what):
        """The ``known`` maps of :meth:`map` (NumPy or device arrays), each
        broadcast to the voxel ``shape`` and flattened, float64, in
        ``self.known``'s order."""
        from blochsim._arrays.device import to_host
        known = {} if known is None else dict(known)
        missing = [k for k in self.known if k not in known]
        extra = [k for k in known if k not in self.known]
        if missing or extra:
            raise ValueError(f"{what}: known must give exactly {list(self.known)}, "
                             f"missing {missing}, unexpected {extra}")
        cols = []
        for k in self.known:
            a = known[k]
            a = np.asarray(to_host(k, a) if V.is_device_array(a) else a, dtype=np.float64)
            try:
                a = np.broadcast_to(a, shape)
            except ValueError:
                raise ValueError(f"{what}: known {k} of shape {a.shape} does not broadcast to the voxel shape "
                                 f"{shape}") from None
            cols.append(a.reshape(-1))
        return cols

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
            One map per estimated parameter (public units); Dask arrays,
            chunked along the voxels like the signals, when the signals (or
            a known map) are Dask arrays.
        """
        if uncertainty and not self._uncertainty:
            raise ValueError("PERK.map: uncertainty=True needs fit(uncertainty=True)")
        if _dispatch.any_lazy({"signals": signals, **(known if isinstance(known, dict) else {})}):
            from blochsim import distributed
            return distributed.perk_map(self, signals, known, uncertainty)
        if _on_device.wanted(self, signals):
            return _on_device.perk_map(self, signals, known, uncertainty)
        shape, flat, x, _, _ = self._prepare(signals, known, "PERK.map")
        m = self._model
        out = np.empty((len(x), len(m["offset"])), np.float32)
        _core.perk(m["omega"], m["phase"], m["weight"], m["offset"], x, out, threads=_threads(self.simulator))
        return self._maps(out, shape, uncertainty)

    def _maps(self, out, shape, uncertainty):
        p = len(self.names)
        logs = getattr(self, "log", ())
        maps = {k: (np.exp(out[:, i]) if k in logs else out[:, i]).reshape(shape) for i, k in enumerate(self.names)}
        if uncertainty:
            for i, k in enumerate(self.names):
                sd = np.sqrt(np.maximum(out[:, p + i], 0.0)).reshape(shape)
                maps[k + "_std"] = maps[k] * sd if k in logs else sd  # the log's spread, to first order
        return maps

    def vjp(self, signals, known=None):
        """Maps and their pullback to the signals (NumPy signals; with
        ``device="cuda"`` the features of both run on the GPU).

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
        if _dispatch.any_lazy({"signals": signals, **(known if isinstance(known, dict) else {})}):
            raise TypeError("PERK.vjp takes NumPy arrays, not Dask arrays (PERK.map takes Dask arrays)")
        shape, flat, x, v, r = self._prepare(signals, known, "PERK.vjp")
        m = self._model
        p = len(self.names)
        weight, offset = m["weight"][:p].copy(), m["offset"][:p].copy()
        on_device = _on_device.wanted(self)

        def run(g=None):
            """The estimates (and with g the pullback of g to x), on the
            host or the card."""
            if on_device:
                return _on_device.perk_run(self, x, g, p)
            out = np.empty((len(x), p), np.float32)
            xbar = None if g is None else np.empty_like(x)
            _core.perk(m["omega"], m["phase"], weight, offset, x, out, g=g, xbar=xbar,
                       threads=_threads(self.simulator))
            return out, xbar

        maps = self._maps(run()[0], shape, False)

        def pullback(cotangents):
            unknown = [k for k in cotangents if k not in self.names]
            if unknown:
                raise ValueError(f"PERK pullback: no map named {unknown}; maps: {self.names}")
            g = np.zeros((len(x), p), np.float32)
            for i, k in enumerate(self.names):
                if k in cotangents:
                    g[:, i] = np.broadcast_to(np.asarray(cotangents[k], dtype=np.float32), shape).reshape(-1)
                    if k in getattr(self, "log", ()):  # the map is exp of the regressed value
                        g[:, i] *= maps[k].reshape(-1)
            sbar = self._pullback_inputs(flat, v, r, run(g)[1])
            return sbar.reshape(shape + (self.contrasts,))

        return maps, pullback


#: training draws per seeded block: the unit of the draws and of the sums
TRAINING_BLOCK = 1024


def _add(a, b):
    """Elementwise sum of two tuples of moments (device arrays summed in
    place on the device)."""
    return tuple(_on_device.add(x, y) if _on_device.is_device(x) else x + y for x, y in zip(a, b))
