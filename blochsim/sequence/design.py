"""Pulse design: adiabatic pulses and slice profiles integrated ahead of
time."""
from __future__ import annotations

import numpy as np

from blochsim._arrays import validate as V
from blochsim.sequence.operators import SampledPulse, _dwell_us, _waveform_values


def hyperbolic_secant(duration: float = 10.24, peak_B1: float = 13.5, mu: float = 5.0, beta: float = 800.0,
                      dwell: float = 10.0) -> SampledPulse:
    """The hyperbolic-secant adiabatic inversion pulse (Silver, Joseph and
    Hoult 1985, Phys Rev A 31:2753), played sample by sample.

    B1(t) = peak_B1 sech(beta t) with the frequency sweep
    -mu beta tanh(beta t) (rad/s), i.e. the RF phase -mu ln cosh(beta t),
    t from -duration/2 to duration/2.  It inverts every spin whose offset
    lies well inside the sweep (+- mu beta / 2 pi Hz) once the adiabatic
    condition gamma peak_B1 >> sqrt(mu) beta holds, nearly independent of
    B1 above that threshold.

    Parameters
    ----------
    duration : float, ms
    peak_B1 : float, µT
    mu : float
        Dimensionless sweep factor.
    beta : float, rad/s
        Modulation rate.
    dwell : float, µs
        Sample spacing.

    Returns
    -------
    SampledPulse

    Examples
    --------
    >>> from blochsim.sequence import hyperbolic_secant
    >>> hyperbolic_secant().waveform.shape
    (1024,)
    """
    for name, v in (("duration", duration), ("peak_B1", peak_B1), ("mu", mu), ("beta", beta)):
        V.protocol_array(name, v, low=0.0, strict=True, ndim_max=0)
    d = _dwell_us(dwell)
    n = int(round(float(duration) * 1e3 / d))
    if n < 1:
        raise ValueError(f"duration = {duration} ms is shorter than one dwell of {d} us")
    t_s = (np.arange(n) + 0.5 - n / 2) * d * 1e-6
    bt = float(beta) * t_s
    return SampledPulse(float(peak_B1) / np.cosh(bt) * np.exp(-1j * float(mu) * np.log(np.cosh(bt))), d)


def slice_profile(shape, dwell: float, flip: float, offsets=None, n: int = 64, extent: float = 1.5):
    """The slice profile of a shaped excitation, integrated ahead of time:
    the effective flip angle at each slice position, as ``slice_profile=``
    of the played simulators takes it.

    Across the slice the select gradient puts spin z at the offset
    Δf(z) = γ G z from the pulse.  Each offset's rotation is the product
    of the samples' exact rotations about the effective field (B1 sample,
    Δf), as Cayley–Klein pairs (Pauly et al. 1991, IEEE TMI 10:53); its
    effective flip is arccos Mz from equilibrium (the rephasing lobe
    assumed to undo the phase across the slice).

    Parameters
    ----------
    shape : array_like, shape (m,)
        The pulse envelope (any unit, complex allowed), scaled to ``flip``
        as :meth:`SampledPulse.normalised` does.
    dwell : float, µs
    flip : float, deg
        Nominal flip angle (at the slice centre, on resonance).
    offsets : array_like, Hz, optional
        The slice positions as pulse offsets, evenly spaced.  Default:
        ``n`` offsets across ``extent`` times the full width at half
        maximum of the pulse's small-tip profile.
    n : int
        Positions of the default offsets.
    extent : float
        Span of the default offsets, in full widths at half maximum.

    Returns
    -------
    scales : numpy.ndarray, shape (positions,)
        Effective flip over nominal flip at each position.
    weights : numpy.ndarray, shape (positions,)
        Equal weights (the positions are even), summing to 1.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.sequence import slice_profile
    >>> scales, weights = slice_profile(np.sinc(np.linspace(-3, 3, 300)) * np.hanning(300), dwell=10.0, flip=30.0)
    >>> scales.shape, round(float(scales.max()), 1)
    ((64,), 1.0)
    """
    values = _waveform_values("shape", np.asarray(shape))
    area = abs(np.sum(values))
    if area == 0:
        raise ValueError("shape has zero area: it cannot be scaled to a flip angle")
    d = _dwell_us(dwell) * 1e-6
    flip = float(V.protocol_array("flip", flip, low=0.0, strict=True, unit="deg", ndim_max=0))
    w1 = np.radians(flip) * values / area / d  # rad/s per sample, complex: its phase the RF phase
    if offsets is None:
        n = V.positive_int("n", n, minimum=2)
        if not (np.isfinite(extent) and extent > 0):
            raise ValueError(f"extent must be > 0, got {extent!r}")
        # the small-tip profile is the pulse's Fourier transform: its FWHM sets the slice
        pad = 64 * values.size
        spec = np.abs(np.fft.fftshift(np.fft.fft(values, pad)))
        freq = np.fft.fftshift(np.fft.fftfreq(pad, d))
        inside = freq[spec >= 0.5 * spec.max()]
        fwhm = float(inside.max() - inside.min()) + 1.0 / (pad * d)
        offsets = np.linspace(-0.5, 0.5, n) * extent * fwhm
    offsets = np.atleast_1d(V.protocol_array("offsets", offsets))
    dw = 2 * np.pi * offsets
    a = np.ones(offsets.shape, dtype=np.complex128)
    b = np.zeros(offsets.shape, dtype=np.complex128)
    for x in w1:
        wx, wy = x.real, x.imag
        rate = np.sqrt(wx * wx + wy * wy + dw * dw)
        phi = rate * d
        with np.errstate(invalid="ignore", divide="ignore"):
            nx, ny, nz = (np.where(rate > 0, c / rate, 0.0) for c in (wx, wy, dw))
        aj = np.cos(phi / 2) - 1j * nz * np.sin(phi / 2)
        bj = -1j * (nx + 1j * ny) * np.sin(phi / 2)
        a, b = aj * a - np.conj(bj) * b, bj * a + np.conj(aj) * b
    mz = np.clip(np.abs(a) ** 2 - np.abs(b) ** 2, -1.0, 1.0)
    scales = np.arccos(mz) / np.radians(flip)
    return scales, np.full(scales.shape, 1.0 / scales.size)
