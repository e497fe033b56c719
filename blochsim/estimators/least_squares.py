"""Voxel-wise nonlinear least squares (Levenberg-Marquardt on the simulator's
Jacobian)."""
from __future__ import annotations

import numbers

import numpy as np

from blochsim._arrays import validate as V
from blochsim.estimators._common import _contrasts, _ranges, _signals, _some_contrasts


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
