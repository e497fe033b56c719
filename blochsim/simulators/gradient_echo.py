"""Gradient-echo simulators: spoiled gradient echoes (played and closed form),
multi-echo GRE, B1 and T1 mapping by flip angles, water-fat."""
from __future__ import annotations

import numpy as np

from blochsim._arrays import validate as V
from blochsim.sequence import (GAMMA_RAD_PER_S_PER_T, Delay, Dephase, Inversion, Pulse, Readout, SampledPulse,
                               Sequence, Spoil, hyperbolic_secant)
from blochsim.simulator import ClosedFormSimulator, Simulator
from blochsim.simulators._common import (_complex_step, _contrasts, _echo_within, _ernst, _function_form,
                                         _need, _scalar, _train)

__all__ = ["DESPOT1Simulator", "DoubleAngleSimulator", "FAT_PEAKS_PPM", "FAT_PEAK_AMPLITUDES", "FLASHSimulator",
           "MultiEchoGRESimulator", "SPGRSimulator", "WaterFatSimulator", "despot1_sim", "doubleangle_sim",
           "flash_sim", "megre_sim", "spgr_sim", "waterfat_sim"]


class SPGRSimulator(ClosedFormSimulator):
    """Ideally spoiled gradient echo in its steady state (Ernst):

        S = M0 sin α (1 - E1) / (1 - cos α E1) · e^{-TE/T2*} · e^{-2πi B0 TE},
        E1 = e^{-TR/T1}.

    Parameters
    ----------
    flip : float or array_like, degrees (one per contrast)
    TR : float or array_like, ms
    TE : float or array_like, ms (default 0)

    Tissue: T1 (ms, required), T2star (ms), M0, B0 (Hz).
    """

    protocol = {"flip": None, "TR": None, "TE": 0.0}
    tissue_properties = ("T1", "T2star", "M0", "B0")
    required = ("T1",)

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None:
            return p
        p["flip"] = V.protocol_array("flip", p["flip"])
        p["TR"] = V.protocol_array("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["TE"] = V.protocol_array("TE", p["TE"], low=0.0, unit="ms")
        _contrasts(p, ("flip", "TR", "TE"))
        return p

    def signal(self, p, t):
        _need(self, p, ("flip", "TR"))
        flip, TR, TE = _contrasts(p, ("flip", "TR", "TE"))
        a = np.radians(flip)
        s = t.get("M0", 1.0) * _ernst(a, TR, t["T1"])
        if "T2star" in t:
            s = s * np.exp(-TE / t["T2star"])
        s = s.astype(np.complex128)
        if "B0" in t:
            s = s * np.exp(-2j * np.pi * t["B0"] * TE * 1e-3)
        return s

    def derivatives(self, p, t, names, s):
        flip, TR, TE = _contrasts(p, ("flip", "TR", "TE"))
        a = np.radians(flip)
        T1 = t["T1"]
        E1 = np.exp(-TR / T1)
        # d ln[(1 - E1) / (1 - cos a E1)] / dE1 = (cos a - 1) / ((1 - E1)(1 - cos a E1))
        dlog = (np.cos(a) - 1) / ((1 - E1) * (1 - np.cos(a) * E1))
        d = {"T1": s * dlog * E1 * TR / T1 ** 2}
        if "T2star" in t:
            d["T2star"] = s * TE / t["T2star"] ** 2
        if "B0" in t:
            d["B0"] = s * (-2j * np.pi * TE * 1e-3)
        return {k: d[k] for k in names}

    def protocol_derivatives(self, p, t, names, s):
        flip, TR, TE = _contrasts(p, ("flip", "TR", "TE"))
        a = np.radians(flip)
        T1 = t["T1"]
        E1 = np.exp(-TR / T1)
        q = 1 - np.cos(a) * E1
        decay = self._decay(t, TE)
        d = {}
        if "flip" in names:
            # d/da sin a (1 - E1)/(1 - cos a E1) = (1 - E1)(cos a - E1)/(1 - cos a E1)^2
            d["flip"] = (1 - E1) * (np.cos(a) - E1) / q ** 2 * decay * (np.pi / 180)
        if "TR" in names:
            # d/dE1 of the same = sin a (cos a - 1)/(1 - cos a E1)^2, dE1/dTR = -E1/T1
            d["TR"] = np.sin(a) * (np.cos(a) - 1) / q ** 2 * (-E1 / T1) * decay
        if "TE" in names:
            rate = (1 / t["T2star"] if "T2star" in t else 0.0) + (2j * np.pi * t["B0"] * 1e-3 if "B0" in t else 0.0)
            d["TE"] = -s * rate
        return d

    @staticmethod
    def _decay(t, TE):
        """e^{-TE/T2*} e^{-2 pi i B0 TE}, the factors after the steady state."""
        out = np.exp(-TE / t["T2star"]) if "T2star" in t else np.ones_like(TE, dtype=float)
        out = out.astype(np.complex128)
        if "B0" in t:
            out = out * np.exp(-2j * np.pi * t["B0"] * TE * 1e-3)
        return out


class DoubleAngleSimulator(ClosedFormSimulator):
    """Double-angle B1 mapping (Insko & Bolinger 1993, JMR A 103:82): two
    spoiled gradient echoes at flips α and 2α (times B1),

        S_i = M0 sin(B1 α_i) (1 − E1) / (1 − cos(B1 α_i) E1) e^{−TE/T2*},

    E1 = e^{−TR/T1}, or full recovery (E1 = 0) without TR; :meth:`b1` maps
    the pair back to B1 = arccos(S_2 / (2 S_1)) / α, exact with full
    recovery.

    Parameters
    ----------
    flip : float, deg
        α (the second image uses 2α).
    TR : float, ms, optional
    TE : float, ms

    Tissue: T1 (ms, needed with TR), T2star (ms), M0, B1.

    Examples
    --------
    >>> from blochsim.simulators import DoubleAngleSimulator
    >>> da = DoubleAngleSimulator(flip=60.0)
    >>> float(da.b1(da.simulate(B1=0.83), 60.0).round(6))
    0.83
    """

    protocol = {"flip": None, "TR": None, "TE": 0.0}
    tissue_properties = ("T1", "T2star", "M0", "B1")

    def check_protocol(self, p):
        if p["flip"] is None:
            return p
        p["flip"] = _scalar("flip", p["flip"], low=0.0, strict=True, unit="deg")
        if p["TR"] is not None:
            p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["TE"] = _scalar("TE", p["TE"], low=0.0, unit="ms")
        return p

    def signal(self, p, t):
        if p["flip"] is None:
            raise TypeError("DoubleAngleSimulator needs protocol parameter 'flip'")
        a = np.radians(p["flip"]) * np.array([1.0, 2.0]) * t.get("B1", 1.0)
        if p["TR"] is None:
            s = np.sin(a)
        else:
            if "T1" not in t:
                raise TypeError("DoubleAngleSimulator needs tissue property 'T1' with a TR")
            s = _ernst(a, p["TR"], t["T1"])
        if "T2star" in t:
            s = s * np.exp(-p["TE"] / t["T2star"])
        return t.get("M0", 1.0) * s

    def derivatives(self, p, t, names, s):
        return _complex_step(self, p, t, names)

    @staticmethod
    def b1(s, flip):
        """B1 from double-angle signals: arccos(Re(S_2/(2 S_1)))/flip,
        clipped to [0, 180/flip].

        Parameters
        ----------
        s : array_like, shape (..., 2)
            The images at flips (flip, 2·flip).
        flip : float, deg

        Returns
        -------
        numpy.ndarray, shape (...)
            The transmit scale B1 (1 = nominal).
        """
        s = np.asarray(s)
        if s.shape[-1] != 2:
            raise ValueError(f"b1 needs the two images along the last axis, got shape {s.shape}")
        r = np.real(s[..., 1] / (2 * s[..., 0]))
        return np.degrees(np.arccos(np.clip(r, -1.0, 1.0))) / flip


def _despot_line(x, y):
    """Per voxel, the least-squares line y = slope x + intercept over the
    last axis (the flip angles)."""
    xm, ym = x.mean(axis=-1, keepdims=True), y.mean(axis=-1, keepdims=True)
    slope = np.sum((x - xm) * (y - ym), axis=-1) / np.sum((x - xm) ** 2, axis=-1)
    return slope, ym[..., 0] - slope * xm[..., 0]


def _despot_axes(self, signals, B1, protocol):
    p = self._protocol_values(protocol)
    _need(self, p, ("flip", "TR"))
    s = np.abs(np.asarray(signals)).astype(np.float64)
    if s.shape[-1:] != p["flip"].shape:
        raise ValueError(f"signals must end in {p['flip'].shape[0]} flip angles, got shape {s.shape}")
    a = np.radians(p["flip"]) * (1.0 if B1 is None else np.asarray(V.tissue_array("B1", B1))[..., None])
    return p, s / np.sin(a), s / np.tan(a)


class DESPOT1Simulator(ClosedFormSimulator):
    """DESPOT1 / variable flip angle T1 mapping (Deoni, Rutt & Peters
    2003, MRM 49:515): ideally spoiled gradient echoes at several flips,

        S_i = M0 sin(B1 α_i) (1 − E1) / (1 − cos(B1 α_i) E1),  E1 = e^{−TR/T1},

    (times e^{−TE/T2*} with ``TE`` and ``T2star``).  :meth:`fit` inverts
    it through the line S/sin α = E1 · S/tan α + M0 (1 − E1).

    Parameters
    ----------
    flip : array_like, deg, shape (n,)
    TR : float, ms
    TE : float, ms (default 0)

    Tissue: T1 (ms, required), M0, B1, T2star (ms).

    Examples
    --------
    >>> from blochsim.simulators import DESPOT1Simulator
    >>> sim = DESPOT1Simulator(flip=[3.0, 17.0], TR=5.0)
    >>> round(float(sim.fit(sim.simulate(T1=1100.0))["T1"]), 6)
    1100.0
    """

    protocol = {"flip": None, "TR": None, "TE": 0.0}
    tissue_properties = ("T1", "M0", "B1", "T2star")
    required = ("T1",)

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None:
            return p
        p["flip"] = np.atleast_1d(V.protocol_array("flip", p["flip"], low=0.0, strict=True, unit="deg"))
        if p["flip"].shape[0] < 2:
            raise ValueError(f"{type(self).__name__} needs at least two flip angles, got {p['flip']}")
        p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["TE"] = _scalar("TE", p["TE"], low=0.0, unit="ms")
        _echo_within(p, p["TR"])
        return p

    def signal(self, p, t):
        _need(self, p, ("flip", "TR"))
        a = np.radians(p["flip"]) * t.get("B1", 1.0)
        s = t.get("M0", 1.0) * _ernst(a, p["TR"], t["T1"])
        if "T2star" in t:
            s = s * np.exp(-p["TE"] / t["T2star"])
        return s

    def derivatives(self, p, t, names, s):
        return _complex_step(self, p, t, names)

    def fit(self, signals, B1=None, **protocol):
        """T1 and M0 from the signals (magnitudes) by the DESPOT1 line.

        Parameters
        ----------
        signals : array_like, shape (*voxels, n)
        B1 : array_like, optional
            Transmit scale per voxel (DESPOT1-HIFI); default 1.
        **protocol
            Protocol overrides.

        Returns
        -------
        dict
            ``T1`` (ms; NaN where the line gives no E1 in (0, 1)) and ``M0``
            (times e^{-TE/T2*}), shaped ``voxels``.
        """
        p, y, x = _despot_axes(self, signals, B1, protocol)
        E1, c = _despot_line(x, y)
        ok = (E1 > 0) & (E1 < 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            T1 = np.where(ok, -p["TR"] / np.log(np.where(ok, E1, 0.5)), np.nan)
            return {"T1": T1, "M0": np.where(ok, c / (1 - E1), np.nan)}


# The six-peak fat spectrum of Hamilton et al. 2011 (NMR Biomed 24:784),
# liver: chemical shifts from water (ppm) and relative amplitudes (sum 1).
#: Chemical shifts of the six fat peaks from water, ppm (Hamilton et al. 2011).
FAT_PEAKS_PPM = np.array([-3.80, -3.40, -2.60, -1.94, -0.39, 0.60])


#: Relative amplitudes of the six fat peaks (sum 1; Hamilton et al. 2011).
FAT_PEAK_AMPLITUDES = np.array([0.087, 0.693, 0.128, 0.004, 0.039, 0.048])


class WaterFatSimulator(ClosedFormSimulator):
    """Multi-echo gradient echo of water and fat (chemical-shift encoded
    water–fat imaging; Yu et al. 2008, MRM 60:1122), in proton density
    weighting:

        S(TE) = M0 [(1 − f) + f Σ_p a_p e^{−2πi Δf_p TE}] e^{−TE/T2*} e^{−2πi B0 TE},

    f the fat fraction, Δf_p = ppm_p · γ̄ · ``field_strength`` the fat peaks'
    offsets from water and a_p their amplitudes (default: the six-peak liver
    spectrum of Hamilton et al. 2011; ``fat_spectrum="single"``: one peak at
    −3.4 ppm; or a ``(ppm, amplitudes)`` pair).  Off-resonance turns as SPEC
    §2 (F+ by e^{−2πi B0 t}).

    Parameters
    ----------
    TE : array_like, ms
    field_strength : float, T
    fat_spectrum : "hamilton", "single" or (ppm, amplitudes)

    Tissue: fat_fraction (required), T2star (ms), M0, B0 (Hz).

    Examples
    --------
    >>> from blochsim.simulators import WaterFatSimulator
    >>> wf = WaterFatSimulator(TE=[1.15, 2.30], field_strength=3.0, fat_spectrum="single")
    >>> abs(wf.simulate(fat_fraction=0.3)).round(2)
    array([0.4, 1. ])
    """

    protocol = {"TE": None, "field_strength": 3.0, "fat_spectrum": "hamilton"}
    tissue_properties = ("fat_fraction", "T2star", "M0", "B0")
    required = ("fat_fraction",)

    def check_protocol(self, p):
        if p["TE"] is None:
            return p
        p["TE"] = np.atleast_1d(V.protocol_array("TE", p["TE"], low=0.0, unit="ms"))
        p["field_strength"] = float(V.protocol_array("field_strength", p["field_strength"], low=0.0, strict=True,
                                                     unit="T", ndim_max=0))
        spec = p["fat_spectrum"]
        if isinstance(spec, str):
            if spec not in ("hamilton", "single"):
                raise ValueError(f"fat_spectrum must be 'hamilton', 'single' or (ppm, amplitudes), got {spec!r}")
            ppm, amp = (FAT_PEAKS_PPM, FAT_PEAK_AMPLITUDES) if spec == "hamilton" else (np.array([-3.4]),
                                                                                        np.array([1.0]))
        else:
            try:
                ppm, amp = (np.atleast_1d(V.protocol_array(n, v)) for n, v in zip(("fat ppm", "fat amplitudes"), spec))
            except (TypeError, ValueError) as e:
                raise ValueError(f"fat_spectrum must be 'hamilton', 'single' or (ppm, amplitudes): {e}") from None
            if ppm.shape != amp.shape:
                raise ValueError(f"fat_spectrum: {len(ppm)} shifts and {len(amp)} amplitudes")
        if not np.sum(amp) > 0:
            raise ValueError(f"fat_spectrum amplitudes must have a positive sum, got {amp!r}")
        # amplitudes as shares of the fat signal (the published table sums to 0.999)
        p["_fat"] = (ppm * GAMMA_RAD_PER_S_PER_T / (2 * np.pi) * 1e-6 * p["field_strength"], amp / np.sum(amp))
        return p

    def _parts(self, p, t):
        if p["TE"] is None:
            raise TypeError("WaterFatSimulator needs protocol parameter 'TE'")
        te_s = p["TE"] * 1e-3
        hz, amp = p["_fat"]
        fat = np.sum(amp[:, None] * np.exp(-2j * np.pi * hz[:, None] * te_s), axis=0)
        decay = np.exp(-p["TE"] / t["T2star"]) if "T2star" in t else 1.0
        turn = np.exp(-2j * np.pi * t["B0"] * te_s) if "B0" in t else 1.0
        return fat, decay * turn

    def signal(self, p, t):
        fat, common = self._parts(p, t)
        f = t["fat_fraction"]
        return t.get("M0", 1.0) * ((1 - f) + f * fat) * common

    def derivatives(self, p, t, names, s):
        fat, common = self._parts(p, t)
        d = {"fat_fraction": (fat - 1) * common,
             "T2star": s * p["TE"] / t["T2star"] ** 2 if "T2star" in t else None,
             "B0": s * (-2j * np.pi * p["TE"] * 1e-3)}
        return {k: d[k] for k in names}


class FLASHSimulator(Simulator):
    """RF-spoiled gradient echo (FLASH; Haase et al. 1986, JMR 67:258)
    played through the EPG engine: per TR a pulse of flip ``flip`` at the
    RF phase φ_k, the echo ``TE`` later (the receiver following φ_k), one
    unbalanced shift and relaxation to the next pulse.  RF spoiling
    increments the phase quadratically, φ_k = ``rf_spoiling``·k(k+1)/2
    (Zur et al. 1991, MRM 21:251); 0 gives a gradient-spoiled train.  The
    samples are multiplied by i, so a phase-0 train is real.

    The excitation is a hard pulse, or with ``pulse=(shape, dwell)`` a
    shaped pulse played sample by sample (:meth:`SampledPulse.normalised`:
    relaxation and off-resonance act between the samples), and TE and TR
    are then counted from its centre.  An inversion ``TI`` before the first
    pulse (centre to centre) is ideal (Z ← −η Z), or adiabatic: a
    hyperbolic-secant pulse (:func:`blochsim.sequence.hyperbolic_secant`)
    or any :class:`SampledPulse` given, played sample by sample and followed
    by a spoiler; its result then depends on B1 and B0 as the pulse's does,
    and ``inv_efficiency`` does not apply.

    Parameters
    ----------
    flip : float or array_like, deg
        One flip angle, or one per TR.
    TR : float, ms
    TE : float, ms
        Pulse (centre) to echo; at most TR.
    n : int, optional
        Number of TRs (default: the length of ``flip``, which must then be
        an array).
    rf_spoiling : float, deg
        Quadratic phase increment.
    pulse : None or (array_like, float)
        The excitation's shape (any unit, complex samples carry phase;
        scaled so its area gives ``flip``) and its dwell, µs.
    inversion : None, "ideal", "adiabatic" or SampledPulse
    TI : float, ms
        Inversion to the first pulse.
    states, repetitions, device, threads, slice_profile
        See :class:`blochsim.Simulator`; with ``repetitions`` > 1 the
        whole train repeats, its phase schedule restarting each playing.

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), inv_efficiency, T2prime (ms: the
    echoes are multiplied by exp(-TE/T2prime), a Lorentzian spread of
    off-resonance within the voxel), D (µm²/ms), v (m/s; D and v need the
    geometry).

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import FLASHSimulator
    >>> s = FLASHSimulator(flip=10.0, TR=8.0, TE=3.0, n=200).simulate(T1=1000.0, T2=80.0)
    >>> s.shape
    (200,)
    >>> sinc = np.sinc(np.linspace(-2, 2, 200))           # a 2 ms sinc pulse, 10 us dwell
    >>> s = FLASHSimulator(flip=10.0, TR=8.0, TE=3.0, n=200, pulse=(sinc, 10.0),
    ...                    inversion="adiabatic", TI=300.0).simulate(T1=1000.0, T2=80.0)
    """

    protocol = {"flip": None, "TR": None, "TE": 0.0, "n": None, "rf_spoiling": 117.0, "pulse": None,
                "inversion": None, "TI": 0.0}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "inv_efficiency", "T2prime", "D", "v")

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None:
            return p
        flip = np.asarray(p["flip"])
        if p["n"] is None:
            if flip.ndim == 0:
                raise ValueError("FLASHSimulator needs n (the number of TRs) when flip is a scalar")
            p["flip"] = _train("flip", flip, low=0.0, unit="deg")
        else:
            p["n"] = V.positive_int("n", p["n"])
            p["flip"] = _train("flip", flip, p["n"], low=0.0, unit="deg")
        p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["TE"] = _scalar("TE", p["TE"], low=0.0, unit="ms")
        _echo_within(p, p["TR"])
        p["rf_spoiling"] = _scalar("rf_spoiling", p["rf_spoiling"])
        half = 0.0
        if p["pulse"] is not None:
            if not (isinstance(p["pulse"], tuple) and len(p["pulse"]) == 2):
                raise ValueError(f"pulse must be a (shape, dwell_us) pair, got {p['pulse']!r}")
            probe = SampledPulse.normalised(p["pulse"][0], p["pulse"][1], 1.0)
            half = 0.5 * probe.duration
            if p["TE"] < half or p["TR"] - p["TE"] < half:
                raise ValueError(f"the pulse lasts {2 * half:g} ms: TE = {p['TE']:g} ms and TR - TE = "
                                 f"{p['TR'] - p['TE']:g} ms must each be at least half of it")
        inv = p["inversion"]
        if isinstance(inv, str) and inv == "adiabatic":
            p["_inversion"] = hyperbolic_secant()
        elif isinstance(inv, SampledPulse):
            p["_inversion"] = inv
        elif inv is None or (isinstance(inv, str) and inv == "ideal"):
            p["_inversion"] = inv
        else:
            raise ValueError(f"inversion must be None, 'ideal', 'adiabatic' or a SampledPulse, got {inv!r}")
        p["TI"] = _scalar("TI", p["TI"], low=0.0, unit="ms")
        if isinstance(p["_inversion"], SampledPulse):
            need = half + 0.5 * p["_inversion"].duration
            if p["TI"] < need:
                raise ValueError(f"TI = {p['TI']:g} ms is shorter than the half-durations of the inversion and "
                                 f"the excitation ({need:g} ms)")
        return p

    def repetition(self, p):
        _need(self, p, ("flip", "TR"))
        k = np.arange(len(p["flip"]))
        phases = (p["rf_spoiling"] * k * (k + 1) / 2) % 360.0
        half = 0.0
        if p["pulse"] is not None:
            shape, dwell = p["pulse"]
            half = 0.5 * SampledPulse.normalised(shape, dwell, 1.0).duration
        ops = []
        inv = p["_inversion"]
        if isinstance(inv, SampledPulse):
            ops = [inv, Spoil(), Delay(p["TI"] - half - 0.5 * inv.duration)]
        elif inv == "ideal":
            ops = [Inversion(), Delay(p["TI"] - half)]
        for f, ph in zip(p["flip"], phases):
            exc = Pulse(f, ph) if p["pulse"] is None else SampledPulse.normalised(shape, dwell, f, ph)
            ops += [exc, Delay(p["TE"] - half), Readout(ph - 90.0, dephasing=p["TE"]), Dephase(),
                    Delay(p["TR"] - p["TE"] - half)]
        return Sequence(ops)


class MultiEchoGRESimulator(Simulator):
    """Multi-echo spoiled gradient echo for T2* mapping, played through the
    EPG engine: ``n`` TRs of a pulse at the RF-spoiling phase φ_k (as in
    :class:`FLASHSimulator`), gradient echoes at each ``TE`` (refocused
    readout lobes: no net shift between them), then one unbalanced shift,
    or an ideal spoiler with ``rf_spoiling=None``.  The echoes of the last
    TR are returned, multiplied by i (real for B0 = 0).  T2* decay comes from T2 in the
    states and from ``T2prime`` on the samples (exp(-TE/T2prime), a
    Lorentzian spread of off-resonance within the voxel: 1/T2* = 1/T2 +
    1/T2prime); B0 turns the echoes by exp(-2πi B0 TE).

    Parameters
    ----------
    flip : float, deg
    TR : float, ms
    TE : array_like, ms, shape (n_echoes,)
        Increasing echo times, from the pulse, at most TR.
    n : int
        TRs played (default 200), the last one recorded.
    rf_spoiling : float or None, deg
        Quadratic phase increment (default 117); None: ideal spoiling.
    states, repetitions, device, threads, slice_profile
        See :class:`blochsim.Simulator`; ``repetitions`` repeats the last
        TR, so it needs ``rf_spoiling=None`` (then "auto" is the exact
        steady state).

    Tissue: T1, T2, T2prime (ms), M0, B1, B0 (Hz), D (µm²/ms), v (m/s; D and v need the geometry).

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import MultiEchoGRESimulator
    >>> sim = MultiEchoGRESimulator(flip=20.0, TR=40.0, TE=np.arange(4.0, 37.0, 4.0), rf_spoiling=None)
    >>> s = sim.simulate(T1=1000.0, T2=60.0, T2prime=40.0)
    >>> s.shape
    (9,)
    """

    protocol = {"flip": None, "TR": None, "TE": None, "n": 200, "rf_spoiling": 117.0}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "T2prime", "D", "v")

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None or p["TE"] is None:
            return p
        p["flip"] = _scalar("flip", p["flip"], low=0.0, unit="deg")
        p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["TE"] = _train("TE", p["TE"], low=0.0, unit="ms")
        if np.any(np.diff(p["TE"]) <= 0):
            raise ValueError(f"TE must increase, got {p['TE']}")
        if p["TE"].size and p["TE"][-1] > p["TR"]:
            raise ValueError(f"TE = {p['TE'][-1]:g} ms must be at most TR = {p['TR']:g} ms")
        p["n"] = V.positive_int("n", p["n"])
        if p["rf_spoiling"] is not None:
            p["rf_spoiling"] = _scalar("rf_spoiling", p["rf_spoiling"])
            if p["repetitions"] != 1:
                raise ValueError(f"with RF spoiling the phase changes every TR, so the last TR cannot be repeated: "
                                 f"repetitions must be 1, got {p['repetitions']!r} (raise n, or use "
                                 "rf_spoiling=None for the ideally spoiled steady state)")
        return p

    def _tr(self, p, k, record):
        ph = 0.0 if p["rf_spoiling"] is None else (p["rf_spoiling"] * k * (k + 1) / 2) % 360.0
        ops, t = [Pulse(p["flip"], ph)], 0.0
        for te in p["TE"]:
            ops.append(Delay(te - t))
            if record:
                ops.append(Readout(ph - 90.0, dephasing=te))
            t = te
        return ops + [Spoil() if p["rf_spoiling"] is None else Dephase(), Delay(p["TR"] - t)]

    def preparation(self, p):
        _need(self, p, ("flip", "TR", "TE"))
        return Sequence([op for k in range(p["n"] - 1) for op in self._tr(p, k, False)])

    def repetition(self, p):
        _need(self, p, ("flip", "TR", "TE"))
        return Sequence(self._tr(p, p["n"] - 1, True))


spgr_sim = _function_form(SPGRSimulator, "spgr_sim")
flash_sim = _function_form(FLASHSimulator, "flash_sim")
waterfat_sim = _function_form(WaterFatSimulator, "waterfat_sim")
doubleangle_sim = _function_form(DoubleAngleSimulator, "doubleangle_sim")
megre_sim = _function_form(MultiEchoGRESimulator, "megre_sim")
despot1_sim = _function_form(DESPOT1Simulator, "despot1_sim")
