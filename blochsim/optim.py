"""Protocol design helpers: precision bounds from tissue Jacobians.

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
