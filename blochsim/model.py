"""The signal model as an operator: parameter maps to images, with its
derivatives, for fits and model-based reconstruction.

:class:`ModelOperator` wraps a simulator as the map ``x -> A(x)`` from
free variables (one per unknown per voxel, unbounded) to signals, with
``jvp``, ``vjp`` and per-voxel Jacobian blocks, so that an optimiser or a
reconstruction framework sees a smooth unconstrained problem.  Bounds are
met through the free variable: a two-sided bound through a logistic, a
one-sided bound through a softplus, none through a scale.
"""
from __future__ import annotations

import numbers

import numpy as np

from blochsim._arrays.device import array_module, astype

__all__ = ["ModelOperator"]

#: softplus^-1(1): the free value of a one-sided unknown one scale from its bound
_SOFTPLUS_ONE = float(np.log(np.expm1(1.0)))


def _sigmoid(xp, z):
    e = xp.exp(-abs(z))
    return (z >= 0) * (1.0 / (1.0 + e)) + (z < 0) * (e / (1.0 + e))


def _softplus(xp, z):
    return xp.log1p(xp.exp(-abs(z))) + (z + abs(z)) / 2


class ModelOperator:
    """A simulator as an operator from free variables to signals.

    Parameters
    ----------
    simulator : blochsim.Simulator
        Its protocol is fixed; its tissue properties are the unknowns and
        the known maps.
    unknowns : sequence of str
        Tissue properties to solve for (e.g. ``("T1", "T2")``), each one
        the simulator models (public units).
    bounds : dict, optional
        Per unknown ``(low, high)``: both finite -> ``low + (high - low) *
        sigmoid(z)``; ``(low, None)`` -> ``low + scale * softplus(z)``;
        ``(None, high)`` -> ``high - scale * softplus(z)``; absent or
        ``(None, None)`` -> ``scale * z``.
    scale : dict, optional
        Per unknown the scale of its one-sided or free transform, in its
        public unit (default 1): the change of value one unit of ``z``
        makes far from a bound (e.g. ``{"T1": 1000.0}``).
    amplitude : bool
        Solve for a complex amplitude per voxel (proton density times
        receive phase) as two more free variables (its real and imaginary
        parts, unbounded): the signal is ``amplitude * s(theta)`` with M0 = 1.
    known : dict, optional
        Fixed tissue properties (scalars or maps broadcast to ``shape``), e.g.
        ``{"B1": b1_map}``.
    subspace : blochsim.subspace.TemporalBasis, optional
        Return the signals' coefficients ``B^H s`` (rank on the last axis)
        instead of the samples.
    shape : tuple of int, optional
        The maps' shape; default: the broadcast shape of the known maps
        (``()`` with none).

    Notes
    -----
    ``x`` holds the free variables with the unknowns on its last axis,
    shape ``(*shape, n)``, ``n = len(unknowns) (+ 2 with amplitude)``, in
    the order of ``unknowns`` then the amplitude's real and imaginary
    parts.  Signals have shape ``(*shape, samples)`` (or ``(*shape, rank)``
    with a subspace).  Every method takes NumPy or device arrays (CuPy,
    PyTorch) and returns arrays of ``x``'s library; the simulator runs
    where they live.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim import ModelOperator
    >>> from blochsim.simulators import FSESimulator
    >>> sim = FSESimulator(ESP=10.0, flip=np.full(16, 160.0))
    >>> A = ModelOperator(sim, ("T2",), bounds={"T2": (5.0, 500.0)}, amplitude=True, known={"T1": 1000.0},
    ...                   shape=(4,))
    >>> x = A.to_free({"T2": np.array([40.0, 60.0, 80.0, 100.0]), "amplitude": np.full(4, 2.0 + 0.5j)})
    >>> x.shape, A.forward(x).shape
    ((4, 3), (4, 16))
    >>> values = A.to_values(x)
    >>> np.round(values["T2"], 6).tolist()
    [40.0, 60.0, 80.0, 100.0]
    """

    def __init__(self, simulator, unknowns, bounds=None, scale=None, amplitude=False, known=None, subspace=None,
                 shape=None):
        from blochsim._arrays import validate as V

        self.simulator = simulator
        if isinstance(unknowns, str):
            unknowns = (unknowns,)
        self.unknowns = tuple(unknowns)
        modelled = tuple(getattr(simulator, "tissue_properties", ()))
        if not self.unknowns and not amplitude:
            raise ValueError("ModelOperator: unknowns must name at least one tissue property (or amplitude=True)")
        for k in self.unknowns:
            if k not in modelled:
                raise ValueError(f"ModelOperator: unknown {k!r} is not a tissue property of "
                                 f"{type(simulator).__name__} (it models {list(modelled)})")
        if len(set(self.unknowns)) != len(self.unknowns):
            raise ValueError(f"ModelOperator: unknowns repeat a name: {list(self.unknowns)}")
        self.amplitude = bool(amplitude)
        if self.amplitude and "M0" in self.unknowns:
            raise ValueError("ModelOperator: amplitude=True solves for the proton density as the complex amplitude; "
                             "M0 cannot also be an unknown")
        self.known = dict(known or {})
        for k in self.known:
            if k in self.unknowns:
                raise ValueError(f"ModelOperator: {k!r} is both an unknown and known")
            if k not in modelled:
                raise ValueError(f"ModelOperator: known {k!r} is not a tissue property of "
                                 f"{type(simulator).__name__} (it models {list(modelled)})")
        if self.amplitude and "M0" in self.known:
            raise ValueError("ModelOperator: with amplitude=True the proton density is the amplitude; do not pass M0 "
                             "in known")
        bounds = dict(bounds or {})
        scale = dict(scale or {})
        for k in list(bounds) + list(scale):
            if k not in self.unknowns:
                raise ValueError(f"ModelOperator: bounds and scale name unknowns; {k!r} is not one of "
                                 f"{list(self.unknowns)}")
        self._kinds = []
        for k in self.unknowns:
            lo, hi = bounds.get(k, (None, None)) or (None, None)
            lo = None if lo is None or lo == -np.inf else float(lo)
            hi = None if hi is None or hi == np.inf else float(hi)
            if (lo is not None and not np.isfinite(lo)) or (hi is not None and not np.isfinite(hi)):
                raise ValueError(f"ModelOperator: bounds of {k} must be finite numbers or None, got {bounds[k]!r}")
            if lo is not None and hi is not None and not lo < hi:
                raise ValueError(f"ModelOperator: bounds of {k} must have low < high, got ({lo}, {hi})")
            s = scale.get(k, 1.0)
            if isinstance(s, bool) or not isinstance(s, numbers.Real) or not np.isfinite(s) or s <= 0:
                raise ValueError(f"ModelOperator: scale of {k} must be a positive number, got {s!r}")
            self._kinds.append((lo, hi, float(s)))
        self.subspace = subspace
        if subspace is not None and not hasattr(subspace, "project"):
            raise TypeError(f"ModelOperator: subspace must be a blochsim.subspace.TemporalBasis, got "
                            f"{type(subspace).__name__}")
        if shape is None:
            shapes = [np.shape(v) for v in self.known.values() if not V.is_device_array(v)]
            shapes += [tuple(v.shape) for v in self.known.values() if V.is_device_array(v)]
            shape = np.broadcast_shapes(*shapes) if shapes else ()
        self.shape = tuple(int(d) for d in shape)
        self.n = len(self.unknowns) + (2 if self.amplitude else 0)

    def __repr__(self):
        amp = ", amplitude" if self.amplitude else ""
        return (f"ModelOperator({type(self.simulator).__name__}, unknowns={list(self.unknowns)}{amp}, "
                f"shape={self.shape})")

    # -- the transforms --------------------------------------------------------

    def _check_x(self, x, name="x"):
        shape = tuple(getattr(x, "shape", np.shape(x)))
        if shape != self.shape + (self.n,):
            raise ValueError(f"ModelOperator: {name} must have shape {self.shape + (self.n,)} (the maps' shape, then "
                             f"the {self.n} free variables), got {shape}")
        if array_module(x) is np:
            x = np.asarray(x, np.float64)
            if not np.all(np.isfinite(x)):
                raise ValueError(f"ModelOperator: {name} must be finite")
        return x

    def _value(self, xp, z, j):
        lo, hi, s = self._kinds[j]
        if lo is not None and hi is not None:
            return lo + (hi - lo) * _sigmoid(xp, z)
        if lo is not None:
            return lo + s * _softplus(xp, z)
        if hi is not None:
            return hi - s * _softplus(xp, z)
        return s * z

    def _slope(self, xp, z, j):
        """d value / d z."""
        lo, hi, s = self._kinds[j]
        if lo is not None and hi is not None:
            g = _sigmoid(xp, z)
            return (hi - lo) * g * (1.0 - g)
        if lo is not None:
            return s * _sigmoid(xp, z)
        if hi is not None:
            return -s * _sigmoid(xp, z)
        return s + 0.0 * z

    def to_values(self, x):
        """The bounded values of free variables ``x``.

        Returns
        -------
        dict
            Each unknown's map (public units), and ``"amplitude"`` (complex)
            with ``amplitude=True``; arrays of ``x``'s library.
        """
        x = self._check_x(x)
        xp = array_module(x)
        out = {k: self._value(xp, x[..., j], j) for j, k in enumerate(self.unknowns)}
        if self.amplitude:
            m = len(self.unknowns)
            out["amplitude"] = x[..., m] + 1j * x[..., m + 1]
        return out

    def to_free(self, values):
        """Free variables ``x`` of bounded values (the inverse of
        :meth:`to_values`).

        Parameters
        ----------
        values : dict
            Each unknown's value or map (broadcast to ``shape``) and, with
            ``amplitude=True``, ``"amplitude"`` (complex; default 1).

        Returns
        -------
        numpy.ndarray, float64, shape (*shape, n)
        """
        parts = []
        for j, k in enumerate(self.unknowns):
            if k not in values:
                raise ValueError(f"ModelOperator.to_free: values must hold {k}")
            p = np.broadcast_to(np.asarray(values[k], np.float64), self.shape)
            lo, hi, s = self._kinds[j]
            inside = np.isfinite(p) & (p > (-np.inf if lo is None else lo)) & (p < (np.inf if hi is None else hi))
            if not np.all(inside):
                bad = p[~inside].flat[0]
                raise ValueError(f"ModelOperator.to_free: {k} must lie strictly inside its bounds "
                                 f"({lo}, {hi}), got {bad}")
            if lo is not None and hi is not None:
                u = (p - lo) / (hi - lo)
                z = np.log(u) - np.log1p(-u)
            elif lo is not None or hi is not None:
                t = (p - lo) / s if lo is not None else (hi - p) / s
                # softplus^-1(t) = log(expm1(t)), written to stay finite for large t
                z = t + np.log(-np.expm1(-t))
            else:
                z = p / s
            parts.append(z)
        if self.amplitude:
            a = np.broadcast_to(np.asarray(values.get("amplitude", 1.0), np.complex128), self.shape)
            parts += [a.real, a.imag]
        return np.stack(parts, -1)

    def initial(self, values=None, signals=None):
        """Free variables to start from: ``values`` where given (as
        :meth:`to_free`), else each unknown at the middle of a two-sided
        bound, one scale inside a one-sided bound, or 0 when free, and the
        amplitude 1.

        Parameters
        ----------
        values : dict, optional
            Starting values of some unknowns (and ``"amplitude"``).
        signals : array_like, complex, shape (*shape, samples), optional
            Measured signals (coefficients with a subspace): with
            ``amplitude=True`` and no amplitude in ``values``, each voxel's
            amplitude starts at its least-squares value ``<s, y> / <s, s>``
            for the other unknowns' starting values.

        Returns
        -------
        numpy.ndarray, float64, shape (*shape, n)
        """
        values = dict(values or {})
        x = np.zeros(self.shape + (self.n,))
        for j, (lo, hi, _) in enumerate(self._kinds):
            x[..., j] = 0.0 if (lo is None) == (hi is None) else _SOFTPLUS_ONE
        if self.amplitude:
            x[..., -2] = 1.0
        given = {k: v for k, v in values.items() if k in self.unknowns or k == "amplitude"}
        if given:
            full = self.to_values(x)
            full.update(given)
            x = self.to_free(full)
        if signals is not None and self.amplitude and "amplitude" not in values:
            y = np.asarray(signals)
            model = self.forward(x)  # at amplitude 1
            if y.shape != model.shape:
                raise ValueError(f"ModelOperator.initial: signals must have the signals' shape {model.shape}, got "
                                 f"{y.shape}")
            a = np.sum(np.conj(model) * y, -1) / np.maximum(np.sum(np.abs(model) ** 2, -1), 1e-300)
            x[..., -2], x[..., -1] = a.real, a.imag
        return x

    def temporal_basis(self, rank=None, tolerance=None, ranges=None, samples=4096, seed=0):
        """A temporal subspace learned from the model's own evolutions.

        Draws ``samples`` sets of unknowns (log-uniformly within positive
        ranges, uniformly otherwise) and of known maps (their values at
        random voxels), simulates them and keeps the leading singular
        vectors (:meth:`blochsim.subspace.TemporalBasis.learn`, on unit
        evolutions: the amplitude does not enter).

        Parameters
        ----------
        rank, tolerance
            As :meth:`TemporalBasis.learn` (default: all but 1e-6 of the
            energy).
        ranges : dict, optional
            Per unknown ``(low, high)`` to draw from; default the unknown's
            two-sided bounds (an unknown without them must be given).
        samples : int
            Evolutions simulated.
        seed : int
            Seed of the draws.

        Returns
        -------
        blochsim.subspace.TemporalBasis
            Of the samples (not of a subspace this operator projects onto).
        """
        from blochsim._arrays import validate as V
        from blochsim.subspace import TemporalBasis

        ranges = dict(ranges or {})
        n = V.positive_int("samples", samples)
        rng = np.random.default_rng(seed)
        tissue = {}
        for j, k in enumerate(self.unknowns):
            lo, hi, _ = self._kinds[j]
            lo, hi = ranges.get(k, (lo, hi))
            if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
                raise ValueError(f"ModelOperator.temporal_basis: {k} needs a range (low < high, finite) to draw "
                                 f"from: give ranges={{{k!r}: (low, high)}} (its bounds are ({lo}, {hi}))")
            u = rng.random(n)
            tissue[k] = np.exp(np.log(lo) + u * np.log(hi / lo)) if lo > 0 else lo + u * (hi - lo)
        for k, v in self.known.items():
            if V.is_device_array(v):
                raise ValueError(f"ModelOperator.temporal_basis draws known maps on the host; {k} is a device array")
            flat = np.broadcast_to(np.asarray(v, np.float64), self.shape).reshape(-1) if self.shape else \
                np.atleast_1d(np.asarray(v, np.float64))
            tissue[k] = flat[rng.integers(0, flat.size, n)]
        if self.amplitude:
            tissue["M0"] = 1.0
        return TemporalBasis.learn(self.simulator.simulate(**tissue), rank=rank, tolerance=tolerance)

    # -- the operator ----------------------------------------------------------

    def _tissue(self, values):
        tissue = {k: v for k, v in self.known.items()}
        tissue.update({k: values[k] for k in self.unknowns})
        if self.amplitude:
            tissue["M0"] = 1.0
        return tissue

    def _out(self, s):
        return s if self.subspace is None else self.subspace.project(s)

    def forward(self, x):
        """Signals ``A(x)``, shape ``(*shape, samples)`` (``rank`` with a
        subspace), complex, in ``x``'s library."""
        values = self.to_values(x)
        s = self.simulator.simulate(**self._tissue(values))
        s = self._full(s)
        if self.amplitude:
            s = values["amplitude"][..., None] * s
        return self._out(s)

    def _full(self, a):
        """``a`` (..., samples) broadcast to the maps' shape (known maps of
        fewer dimensions simulate fewer voxels)."""
        if tuple(a.shape[:-1]) == self.shape:
            return a
        return array_module(a).broadcast_to(a, self.shape + tuple(a.shape[-1:]))

    def jacobian(self, x):
        """Signals and their derivatives with respect to the free variables.

        Returns
        -------
        signal : array, complex, shape (*shape, samples)
        J : array, complex, shape (*shape, n, samples)
            Per-voxel Jacobian blocks d signal / d x (``rank`` in place of
            ``samples`` with a subspace).
        """
        x = self._check_x(x)
        xp = array_module(x)
        values = self.to_values(x)
        tissue = self._tissue(values)
        cols = []
        if self.unknowns:
            s, J = self.simulator.jacobian(self.unknowns, **tissue)
            J = J.reshape(tuple(J.shape[:-2]) + (len(self.unknowns), J.shape[-1]))
            s = self._full(s)
            for j in range(len(self.unknowns)):
                col = self._full(J[..., j, :]) * self._slope(xp, x[..., j], j)[..., None]
                cols.append(col)
        else:
            s = self._full(self.simulator.simulate(**tissue))
        if self.amplitude:
            a = values["amplitude"][..., None]
            cols = [a * c for c in cols] + [s + 0j, 1j * s]
            s = a * s
        J = xp.stack(cols, -2)
        return self._out(s), self._out(J)

    def jvp(self, x, dx):
        """``J dx``: the signals' change along ``dx`` (shaped as ``x``).

        Returns
        -------
        array, complex, shape (*shape, samples) (``rank`` with a subspace)
        """
        dx = self._check_x(dx, "dx")
        _, J = self.jacobian(x)
        return (J * dx[..., :, None]).sum(-2)

    def vjp(self, x, v):
        """``Re(J^H v)``: the gradient with respect to ``x`` of a real loss
        whose cotangent on the signals is ``v = dL/dRe s + i dL/dIm s``
        (shaped as the signals), by the simulator's adjoint (one reverse
        sweep, no Jacobian held).

        Returns
        -------
        array, float, shape (*shape, n)
        """
        got = tuple(getattr(v, "shape", np.shape(v)))
        if got[:-1] != self.shape or len(got) != len(self.shape) + 1:
            raise ValueError(f"ModelOperator.vjp: v must have the signals' shape {self.shape} + (samples,), got {got}")
        x = self._check_x(x)
        xp = array_module(x)
        if xp is np:
            v = np.asarray(v)
        # a cotangent on the coefficients B^H s is B v on the samples
        v = v if self.subspace is None else self.subspace.expand(v)
        values = self.to_values(x)
        tissue = self._tissue(values)
        if self.unknowns:
            s0, pull = self.simulator.vjp(self.unknowns, **tissue)
        else:
            s0 = self.simulator.simulate(**tissue)
        s0 = self._full(s0)
        if v.shape[-1] != s0.shape[-1]:
            raise ValueError(f"ModelOperator.vjp: v must have the signals' shape {self.shape + (s0.shape[-1],)}, "
                             f"got {got}")
        parts = []
        if self.unknowns:
            # s = a s0: the cotangent of s0 is conj(a) v
            cot = values["amplitude"].conj()[..., None] * v if self.amplitude else v
            # a device pullback takes a complex64 cotangent (its adjoint runs in single precision there)
            g = pull(cot if xp is np else astype(cot, np.complex64))
            parts = [xp.broadcast_to(g[k], self.shape) * self._slope(xp, x[..., j], j)
                     for j, k in enumerate(self.unknowns)]
        if self.amplitude:
            w = (v.conj() * s0).sum(-1)  # d L / d Re a = Re w, d L / d Im a = Re(i w) = -Im w
            parts += [w.real, -w.imag]
        return xp.stack(parts, -1)
