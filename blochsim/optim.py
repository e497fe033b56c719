"""Protocol design helpers: precision bounds from tissue Jacobians, a
Cramér–Rao design cost, and SequenceDesign, which optimises protocol
parameters through the pullback.

A fit of tissue properties θ to a complex signal s(θ) measured with
independent Gaussian noise of variance σ² in each real and imaginary part
has Fisher information F = Re(Jᴴ J) / σ², J = ∂s/∂θ (the real and imaginary
parts count as separate measurements), and any unbiased estimator's
covariance is at least F⁻¹ (the Cramér–Rao bound; e.g. Kay, Fundamentals of
Statistical Signal Processing: Estimation Theory, 1993, ch. 3).
"""
from __future__ import annotations

import numpy as np


def fisher_information(J, noise_variance: float = 1.0):
    """Fisher information of tissue properties from a Jacobian.

    Parameters
    ----------
    J : array_like, complex, shape (*voxels, n, samples)
        d signal / d property for n properties (``Simulator.jacobian`` with a
        sequence of names), in the properties' public units.
    noise_variance : float
        σ², the noise variance of each real and each imaginary part of a
        sample (signal units squared).

    Returns
    -------
    numpy.ndarray, float64, shape (*voxels, n, n)
        F = Re(Jᴴ J) / σ² per voxel.
    """
    J = np.asarray(J)
    if J.ndim < 2:
        raise ValueError(f"J must have shape (*voxels, n, samples), got shape {J.shape}")
    var = float(noise_variance)
    if not np.isfinite(var) or var <= 0:
        raise ValueError(f"noise_variance must be a finite number > 0, got {noise_variance!r}")
    J = J.astype(np.complex128)
    return np.real(np.einsum("...is,...js->...ij", np.conj(J), J)) / var


def crlb(J, noise_variance: float = 1.0, full: bool = False):
    """Cramér–Rao lower bounds on the variance of unbiased estimates.

    Parameters
    ----------
    J : array_like, complex, shape (*voxels, n, samples)
        d signal / d property (see :func:`fisher_information`).
    noise_variance : float
        σ² of each real and imaginary part of a sample.
    full : bool
        Return the whole bound F⁻¹ instead of its diagonal.

    Returns
    -------
    numpy.ndarray, float64
        ``(*voxels, n)`` variance bounds, in the properties' public units
        squared (ms² for T1), or ``(*voxels, n, n)`` with ``full``.  A voxel
        whose information is singular (a property the signal does not
        depend on) gets ``inf`` on the diagonal.
    """
    F = fisher_information(J, noise_variance)
    n = F.shape[-1]
    # singular information: the bound is infinite along the null directions
    cond = np.linalg.cond(F) if F.size else np.zeros(F.shape[:-2])
    bad = ~np.isfinite(cond) | (cond > 1e14)
    safe = np.where(bad[..., None, None], np.eye(n), F)
    inv = np.linalg.inv(safe)
    inv = np.where(bad[..., None, None], np.inf, inv)
    return inv if full else np.diagonal(inv, axis1=-2, axis2=-1).copy()


class CRLBCost:
    """A design cost of the Jacobian: the weighted sum, over the voxels, of
    the Cramér–Rao variance bounds of chosen tissue properties,
    C = Σ_voxels Σ_k w_k [F⁻¹]_kk with F = Re(Jᴴ J) / σ².

    Parameters
    ----------
    diff : sequence of str
        The properties of the Jacobian (estimated jointly: all of them enter
        F), in the order of ``Simulator.jacobian``.
    noise_variance : float
        σ² of each real and imaginary part of a sample.
    weights : dict, optional
        ``{name: w}``: each bound's weight (default: 1 for every property);
        a property absent from the dict gets 0 (a nuisance parameter).

    Calling it on a Jacobian J ``(*voxels, n, samples)`` returns ``(C, W)``
    with W = dC/dRe J + i dC/dIm J = (2/σ²) G J, G = -F⁻¹ diag(w) F⁻¹ (the
    cotangent for ``Simulator.jacobian_vjp``'s pullback).
    """

    def __init__(self, diff, noise_variance: float = 1.0, weights=None):
        self.diff = (diff,) if isinstance(diff, str) else tuple(diff)
        if not self.diff:
            raise ValueError("CRLBCost needs at least one property in diff")
        var = float(noise_variance)
        if not np.isfinite(var) or var <= 0:
            raise ValueError(f"noise_variance must be a finite number > 0, got {noise_variance!r}")
        self.noise_variance = var
        if weights is None:
            weights = {k: 1.0 for k in self.diff}
        for k in weights:
            if k not in self.diff:
                raise ValueError(f"weights name {k!r}, which is not in diff {list(self.diff)}")
        self.weights = np.array([float(weights.get(k, 0.0)) for k in self.diff])

    def __call__(self, J):
        J = np.asarray(J).astype(np.complex128)
        one = len(self.diff) == 1 and (J.ndim < 2 or J.shape[-2] != 1)
        if one:
            J = J[..., None, :]
        if J.shape[-2] != len(self.diff):
            raise ValueError(f"J has {J.shape[-2]} properties, CRLBCost was given {len(self.diff)}")
        F = fisher_information(J, self.noise_variance)
        Finv = np.linalg.inv(F)
        value = float(np.sum(np.diagonal(Finv, axis1=-2, axis2=-1) * self.weights))
        G = -Finv @ (self.weights[:, None] * Finv)
        W = (2.0 / self.noise_variance) * np.einsum("...ab,...bs->...as", G, J)
        return value, (W[..., 0, :] if one else W)


class SequenceDesign:
    """Optimise bounded protocol parameters of a played simulator with SciPy's
    L-BFGS-B, the cost's gradient coming from the simulator's pullback.

    Parameters
    ----------
    simulator : blochsim.Simulator
        A played simulator; its protocol (constructor values) is the start.
    bounds : dict
        ``{name: (low, high)}`` for each float protocol parameter to
        optimise, in its public unit; low and high are scalars or arrays
        shaped like the parameter.
    cost : callable or CRLBCost
        ``cost(signal) -> (value, cotangent)``: a real loss of the signal
        (complex64, ``(*voxels, samples)``) and its cotangent dL/dRe s +
        i dL/dIm s, shaped like the signal.  A :class:`CRLBCost` is a cost
        of the tissue Jacobian instead, differentiated through
        ``Simulator.jacobian_vjp`` (second order).
    tissue : dict
        Tissue properties to simulate (NumPy arrays, or device arrays to run
        on the GPU).
    penalty : callable, optional
        ``penalty(protocol) -> (value, {name: gradient})``: a term on the
        protocol values themselves (say an RF power budget), added to the
        cost.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import FSESimulator
    >>> from blochsim.optim import SequenceDesign
    >>> fse = FSESimulator(ESP=8.0, flip=np.full(8, 120.0))
    >>> brighter = lambda s: (-float(np.sum(np.abs(s) ** 2)), -2 * s)
    >>> d = SequenceDesign(fse, {"flip": (60.0, 180.0)}, brighter, {"T1": 1000.0, "T2": 80.0})
    >>> r = d.run(maxiter=20)
    >>> bool(np.all(r["protocol"]["flip"] > 170.0))
    True
    """

    def __init__(self, simulator, bounds, cost, tissue, penalty=None):
        if not bounds:
            raise ValueError("SequenceDesign needs at least one protocol parameter in bounds")
        self.simulator = simulator
        self.cost = cost
        self.tissue = dict(tissue)
        self.penalty = penalty
        start = simulator._protocol_values({})
        self.names = tuple(bounds)
        self._shapes, self._low, self._high, self._x0 = {}, [], [], []
        for k in self.names:
            if k not in start:
                raise TypeError(f"{type(simulator).__name__} has no protocol parameter {k!r}")
            v = np.asarray(start[k], dtype=np.float64)
            lo, hi = bounds[k]
            lo = np.broadcast_to(np.asarray(lo, np.float64), v.shape)
            hi = np.broadcast_to(np.asarray(hi, np.float64), v.shape)
            if np.any(~(lo < hi)):
                raise ValueError(f"bounds of {k!r} need low < high, got ({bounds[k][0]!r}, {bounds[k][1]!r})")
            self._shapes[k] = v.shape
            self._low.append(lo.reshape(-1))
            self._high.append(hi.reshape(-1))
            self._x0.append(np.clip(v, lo, hi).reshape(-1))
        self.history = []

    def protocol(self, x):
        """The protocol values of the flat parameter vector x."""
        out, i = {}, 0
        for k in self.names:
            size = int(np.prod(self._shapes[k], dtype=np.int64))
            out[k] = np.asarray(x[i:i + size], dtype=np.float64).reshape(self._shapes[k])
            i += size
        return out

    def value_and_gradient(self, x):
        """Cost and its gradient with respect to the flat vector x."""
        proto = self.protocol(x)
        if isinstance(self.cost, CRLBCost):
            _, J, pullback = self.simulator.jacobian_vjp(self.cost.diff, self.names, **proto, **self.tissue)
            value, cot = self.cost(J)
        else:
            signal, pullback = self.simulator.vjp(self.names, **proto, **self.tissue)
            value, cot = self.cost(signal)
        grads = pullback(cot)
        value = float(value)
        if self.penalty is not None:
            pv, pg = self.penalty(proto)
            value += float(pv)
            grads = {k: grads[k] + np.asarray(pg.get(k, 0.0), np.float64) for k in self.names}
        g = np.concatenate([np.broadcast_to(grads[k], self._shapes[k]).reshape(-1) for k in self.names])
        self.history.append(value)
        return value, g

    def run(self, maxiter: int = 100, **options):
        """Run L-BFGS-B from the simulator's protocol.

        Parameters
        ----------
        maxiter : int
            Iteration limit.
        **options
            Further ``scipy.optimize.minimize`` options for L-BFGS-B
            (``ftol``, ``gtol``, ...).

        Returns
        -------
        dict
            ``protocol`` (the optimised values, by name), ``cost`` (its
            final value), ``history`` (the cost at every evaluation) and
            ``result`` (SciPy's OptimizeResult).
        """
        try:
            from scipy.optimize import minimize
        except ImportError:  # pragma: no cover - SciPy is a test dependency
            raise ImportError("SequenceDesign needs SciPy: pip install scipy") from None
        x0 = np.concatenate(self._x0)
        bounds = list(zip(np.concatenate(self._low), np.concatenate(self._high)))
        res = minimize(self.value_and_gradient, x0, jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": int(maxiter), **options})
        return {"protocol": self.protocol(res.x), "cost": float(res.fun), "history": list(self.history),
                "result": res}
