"""The shipped simulators (SPEC §6), each a class and a function form.

Played simulators run through the EPG kernels (complex64 output); closed
forms are NumPy expressions in the precision of their inputs.
"""
from __future__ import annotations

import numpy as np

from blochsim import _validate as V
from blochsim.sequence import (GAMMA_RAD_PER_S_PER_T, Delay, Dephase, Excitation, Inversion, Pulse, Readout,
                               RectPulse, Refocusing, SampledPulse, Sequence, Spoil, hyperbolic_secant)
from blochsim.simulator import ClosedFormSimulator, Simulator, _cotangent

__all__ = [
    "FSESimulator", "MRFSimulator", "SPGRSimulator", "bSSFPSimulator", "TrueFISPSimulator",
    "InversionRecoverySimulator", "SpinEchoSimulator", "StimulatedEchoSimulator", "CESTSimulator", "MTSimulator",
    "fse_sim", "mrf_sim", "spgr_sim", "bssfp_sim", "truefisp_sim", "ir_sim", "se_sim", "ste_sim", "cest_sim",
    "mt_sim", "MPnRAGESimulator", "MPRAGESimulator", "MP2RAGESimulator", "mpnrage_sim", "mprage_sim",
    "mp2rage_sim", "LookLockerSimulator", "ll_sim", "FLASHSimulator", "flash_sim",
    "DiffusionSimulator", "dwi_sim", "IRbSSFPSimulator", "irbssfp_sim",
    "DESSSimulator", "dess_sim", "HyperechoSimulator", "hyperecho_sim",
    "fmSSFPSimulator", "fmssfp_sim", "WaterFatSimulator", "waterfat_sim", "FAT_PEAKS_PPM", "FAT_PEAK_AMPLITUDES",
    "DoubleAngleSimulator", "doubleangle_sim", "ASLSimulator", "asl_sim",
    "HSFPSimulator", "hsfp_sim", "MOLLISimulator", "molli_sim",
    "MultiEchoGRESimulator", "megre_sim", "MultiEchoSESimulator", "mese_sim",
    "DiffusionTensorSimulator", "dti_sim", "DESPOT1Simulator", "despot1_sim", "DESPOT2Simulator", "despot2_sim",
]


def _train(name, value, n=None, *, low=None, strict=False, unit=""):
    """A per-event protocol array: scalar broadcast to n, or exactly n entries."""
    arr = V.protocol_array(name, value, low=low, strict=strict, unit=unit, length=n)
    if n is None:
        return np.atleast_1d(arr)
    return np.broadcast_to(arr, (n,)).astype(np.float64)


def _scalar(name, value, **bounds):
    """A scalar protocol parameter as a float (bounds as V.protocol_array)."""
    return float(V.protocol_array(name, value, ndim_max=0, **bounds))


#: largest RF offset from water the saturation kernels take, Hz (phases in single precision)
_MAX_OFFSET_HZ = 1e7


def _ernst(a, TR, T1):
    """sin a (1 - E1) / (1 - cos a E1), E1 = e^{-TR/T1}: the spoiled steady
    state over M0, with 1 - E1 by expm1 so that it stays exact where E1
    rounds to 1 (T1 far longer than TR, a flip of 0)."""
    u = -np.expm1(-TR / T1)
    return np.sin(a) * u / (u + 2 * np.sin(a / 2) ** 2 * (1 - u))


def _relaxes(TR, T1, T2=None):
    """Refuse a steady state whose TR is so short against T1 (and T2) that
    no relaxation happens in double precision: the closed form is then
    0/0 (and without relaxation no steady state exists)."""
    times = [("T1", T1)] + ([] if T2 is None else [("T2", T2)])
    for name, T in times:
        ratio = np.asarray(TR, dtype=np.float64) / np.asarray(T, dtype=np.float64)
        if np.any(ratio < _MIN_RELAXATION):
            raise ValueError(f"TR = {float(np.min(TR)):g} ms against {name} = {float(np.max(T)):g} ms relaxes "
                             f"nothing in double precision (TR/{name} < {_MIN_RELAXATION:g}): the steady state "
                             "is not defined")


#: smallest TR/T1 (TR/T2) a closed-form steady state resolves
_MIN_RELAXATION = 1e-9


def _need(sim, p, keys):
    """Refuse a call whose protocol lacks any of ``keys``."""
    for k in keys:
        if p[k] is None:
            raise TypeError(f"{type(sim).__name__} needs protocol parameter {k!r}")


def _te_of(p):
    """TE for the operators: a TE that defaults to TR/2 follows TR, so that
    TR's gradient (vjp) includes TE's share; the value is unchanged."""
    te = p["TE"]
    if p.get("_TE_is_half_TR"):
        te = te + 0.5 * (p["TR"] - float(p["TR"]))
    return te


def _echo_within(p, limit, what="TR"):
    """Refuse an echo time TE past ``limit`` (ms)."""
    if p["TE"] > limit:
        raise ValueError(f"TE = {p['TE']:g} ms must be at most {what} = {limit:g} ms")


class FSESimulator(Simulator):
    """Fast (turbo) spin echo / CPMG train.

    An excitation ``exc_flip`` at ``exc_phase``, then one refocusing pulse per
    echo, crushed by one shift on each side, with the echo sampled midway
    between refocusing pulses (ESP/2 after each).  With ``repetitions`` > 1
    the train repeats every ``TR`` (transverse states spoiled at its end) and
    the last train is recorded.

    Parameters
    ----------
    flip : array_like, degrees, shape (n_echoes,)
        Refocusing flip angles.
    ESP : float, ms
        Echo spacing.
    phases : float or array_like, degrees, optional
        Refocusing phases (default 0: CPMG with ``exc_phase=90``).
    exc_flip, exc_phase : float, degrees, optional
        Excitation flip (90) and phase (90).
    TR : float, ms, optional
        Repetition time (default 1e6: full recovery).
    states, crusher_dephasing_rad, voxel_size_m, repetitions, device, threads
        See :class:`blochsim.Simulator`.

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), D (µm²/ms), v (m/s); D and v need the geometry.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import FSESimulator
    >>> fse = FSESimulator(ESP=5.0)
    >>> s = fse.simulate(flip=np.full(48, 180.0), T1=1000.0, T2=np.array([80.0, 110.0]))
    >>> s.shape, s.dtype
    ((2, 48), dtype('complex64'))
    """

    protocol = {"flip": None, "ESP": None, "phases": 0.0, "exc_flip": 90.0, "exc_phase": 90.0, "TR": 1e6}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "D", "v")

    def check_protocol(self, p):
        if p["ESP"] is not None:
            p["ESP"] = _scalar("ESP", p["ESP"], low=0.0, strict=True, unit="ms")
        if p["flip"] is None or p["ESP"] is None:
            return p
        flip = _train("flip", p["flip"])
        n = flip.shape[0]
        p["flip"] = flip
        p["phases"] = _train("phases", p["phases"], n)
        p["exc_flip"] = _scalar("exc_flip", p["exc_flip"])
        p["exc_phase"] = _scalar("exc_phase", p["exc_phase"])
        p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        if p["TR"] < n * p["ESP"]:
            raise ValueError(f"TR must be >= n_echoes * ESP = {n * p['ESP']:g} ms, got {p['TR']:g}")
        return p

    def _need(self, p):
        _need(self, p, ("flip", "ESP"))

    def repetition(self, p):
        self._need(p)
        half = Delay(p["ESP"] / 2.0)
        ops = [Excitation(p["exc_flip"], p["exc_phase"])]
        for f, ph in zip(p["flip"], p["phases"]):
            ops += [half, Dephase(), Refocusing(f, ph), Dephase(), half, Readout()]
        ops += [Delay(p["TR"] - len(p["flip"]) * p["ESP"]), Spoil()]
        return Sequence(ops)


class HyperechoSimulator(FSESimulator):
    """Hyperecho train (Hennig & Scheffler 2001, MRM 46:6): a refocusing
    train of any flips ``flip`` at phases ``phases``, a 180° pulse at phase
    0, then the same flips in reverse order at the mirrored phases 180° − φ
    (the paper's inverted phases, in SPEC §2's convention), all crushed as in
    :class:`FSESimulator`.  The last echo (the hyperecho) refocuses every
    coherence pathway: without relaxation it holds the whole excited
    magnetisation whatever the flips.  Returns all 2n + 1 echoes.

    Parameters
    ----------
    flip : array_like, degrees, shape (n,)
        The first half's refocusing flips.
    phases : float or array_like, degrees
        Their phases (the second half uses 180° − φ, in reverse).
    ESP, exc_flip, exc_phase, TR, states, ...
        As :class:`FSESimulator`.

    Tissue: as :class:`FSESimulator`.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import HyperechoSimulator
    >>> s = HyperechoSimulator(flip=[30.0, 70.0, 110.0], phases=[0.0, 40.0, 10.0], ESP=5.0).simulate(
    ...     T1=1e9, T2=1e9)
    >>> round(float(abs(s[-1])), 4)
    1.0
    """

    def check_protocol(self, p):
        if p["flip"] is None or p["ESP"] is None:
            return super().check_protocol(p)
        p["flip"] = _train("flip", p["flip"])
        p["phases"] = _train("phases", p["phases"], p["flip"].shape[0])
        super().check_protocol(self._whole(dict(p)))  # the whole train's checks (TR against its length)
        return p

    @staticmethod
    def _whole(p):
        """p with the whole train: the first half, 180° at phase 0, the
        first half reversed at phases mirrored about the axis at 90° to the
        central pulse's, so that the second half undoes the first (SPEC §2's
        pulse convention).  Traced protocol entries stay traced."""
        flip, phases = list(p["flip"]), list(p["phases"])
        p["flip"] = flip + [180.0] + flip[::-1]
        p["phases"] = phases + [0.0] + [180.0 - ph for ph in phases[::-1]]
        return p

    def repetition(self, p):
        self._need(p)
        return super().repetition(self._whole(dict(p)))


class MRFSimulator(Simulator):
    """MR fingerprinting train (SPEC §9 reference workload).

    Inversion, ``TI``, then per TR: pulse, sample right after it, one
    unbalanced shift, relaxation over TR.  The samples are returned
    multiplied by i, so a phase-0 train is real.

    Parameters
    ----------
    flip : array_like, degrees, shape (n_TR,)
        Flip angle per TR.
    TR : float or array_like, ms
        Repetition time, scalar or one per TR.
    TI : float, ms, optional
        Inversion time (default 0).
    phases : float or array_like, degrees, optional
        RF phase per TR (default 0).
    states, repetitions, device, threads
        See :class:`blochsim.Simulator`.

    Tissue: T1, T2 (ms), M0, B1, inv_efficiency, D (µm²/ms), v (m/s; D and v need the geometry).
    """

    protocol = {"flip": None, "TR": None, "TI": 0.0, "phases": 0.0}
    tissue_properties = ("T1", "T2", "M0", "B1", "inv_efficiency", "D", "v")

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None:
            return p
        flip = _train("flip", p["flip"])
        n = flip.shape[0]
        p["flip"] = flip
        p["TR"] = _train("TR", p["TR"], n, low=0.0, strict=True, unit="ms")
        p["phases"] = _train("phases", p["phases"], n)
        p["TI"] = _scalar("TI", p["TI"], low=0.0, unit="ms")
        return p

    def repetition(self, p):
        _need(self, p, ("flip", "TR"))
        ops = [Inversion(), Delay(p["TI"])]
        for f, tr, ph in zip(p["flip"], p["TR"], p["phases"]):
            ops += [Pulse(f, ph), Readout(-90.0), Dephase(), Delay(tr)]
        return Sequence(ops)


class TrueFISPSimulator(Simulator):
    """Balanced SSFP played through the EPG engine from equilibrium.

    A -α/2 preparation TR/2 before the first pulse, then ``nshots`` pulses of
    alternating phase (0°, 180°, ...) every TR, each sampled TE after it with
    the receiver following the RF phase.  Returned multiplied by i, like
    :class:`bSSFPSimulator` (whose steady state it approaches).

    Parameters
    ----------
    flip : float, degrees
        Flip angle of every pulse (the preparation is half of it).
    TR : float, ms
        Pulse spacing.
    nshots : int
        Pulses (and samples) per playing.
    TE : float, ms, optional
        Pulse to sample (default TR/2).
    states, repetitions, device, threads, ...
        See :class:`blochsim.Simulator`.

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), D (µm²/ms), v (m/s; D and v need the geometry).
    """

    protocol = {"flip": None, "TR": None, "nshots": None, "TE": None}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "D", "v")

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None or p["nshots"] is None:
            return p
        p["flip"] = _scalar("flip", p["flip"])
        p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["nshots"] = V.positive_int("nshots", p["nshots"])
        p["_TE_is_half_TR"] = p["TE"] is None
        te = p["TR"] / 2.0 if p["TE"] is None else p["TE"]
        p["TE"] = _scalar("TE", te, low=0.0, unit="ms")
        if p["TE"] > p["TR"]:
            raise ValueError(f"TE must be <= TR = {p['TR']:g} ms, got {p['TE']:g}")
        return p

    def preparation(self, p):
        return Delay(p["TR"] / 2.0) @ Pulse(p["flip"] / 2.0, 180.0)

    def repetition(self, p):
        _need(self, p, ("flip", "TR", "nshots"))
        te = _te_of(p)
        ops = []
        for n in range(p["nshots"]):
            ph = 180.0 * (n % 2)
            ops += [Pulse(p["flip"], ph), Delay(te), Readout(ph - 90.0), Delay(p["TR"] - te)]
        return Sequence(ops)


class DESSSimulator(Simulator):
    """Dual-echo steady state (Bruder et al. 1988, MRM 7:35) played through
    the EPG engine: per TR a pulse of flip ``flip``, the FISP echo (S+) TE
    after it, one unbalanced shift, and the PSIF echo (S−) TE before the
    next pulse.  ``repetitions`` TRs are played from equilibrium and the
    last TR's two echoes returned (multiplied by i, as
    :class:`MRFSimulator`), shape ``(*voxels, 2)``.

    Parameters
    ----------
    flip : float, deg
    TR : float, ms
    TE : float, ms
        Pulse to the first echo, and the second echo to the next pulse
        (at most TR/2).
    repetitions : int
        TRs played (default 300: the steady state for T1 up to about
        TR·repetitions/5).
    states, device, threads
        See :class:`blochsim.Simulator`; ``states`` defaults to 64 here (the
        orders a steady state needs while T2 decay has not removed them).

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), D (µm²/ms), v (m/s; D and v need the geometry).
    """

    protocol = {"flip": None, "TR": None, "TE": 0.0, "repetitions": 300, "states": 64}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "D", "v")

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None:
            return p
        p["flip"] = _scalar("flip", p["flip"], low=0.0, unit="deg")
        p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["TE"] = _scalar("TE", p["TE"], low=0.0, unit="ms")
        _echo_within(p, p["TR"] / 2, "TR/2")
        return p

    def repetition(self, p):
        _need(self, p, ("flip", "TR"))
        return Sequence([Pulse(p["flip"]), Delay(p["TE"]), Readout(-90.0), Dephase(),
                         Delay(p["TR"] - 2 * p["TE"]), Readout(-90.0), Delay(p["TE"])])


class fmSSFPSimulator(Simulator):
    """Frequency-modulated balanced SSFP (Foxall 2002, MRM 48:502) played
    through the EPG engine from equilibrium: ``n`` pulses every TR whose RF
    phase increment sweeps linearly, φ_k = φ_{k−1} + ``phase_inc`` + k ·
    ``sweep`` (so the bSSFP off-resonance profile moves by sweep/360/TR Hz
    per TR), each sampled TE after it with the receiver following the RF
    phase, times i.

    Parameters
    ----------
    flip : float, deg
    TR : float, ms
    n : int
    TE : float, ms, optional (default TR/2)
    phase_inc : float, deg
        The first phase increment (180: alternating).
    sweep : float, deg
        Change of the increment per TR.

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), D (µm²/ms), v (m/s; D and v need the geometry).

    Examples
    --------
    >>> from blochsim.simulators import fmSSFPSimulator
    >>> fmSSFPSimulator(flip=40.0, TR=5.0, n=400, sweep=0.9).simulate(T1=1000.0, T2=100.0).shape
    (400,)
    """

    protocol = {"flip": None, "TR": None, "n": None, "TE": None, "phase_inc": 180.0, "sweep": 0.0}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "D", "v")

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None or p["n"] is None:
            return p
        p["flip"] = _scalar("flip", p["flip"], low=0.0, unit="deg")
        p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["n"] = V.positive_int("n", p["n"])
        p["_TE_is_half_TR"] = p["TE"] is None
        te = p["TR"] / 2.0 if p["TE"] is None else p["TE"]
        p["TE"] = _scalar("TE", te, low=0.0, unit="ms")
        _echo_within(p, p["TR"])
        p["phase_inc"] = _scalar("phase_inc", p["phase_inc"])
        p["sweep"] = _scalar("sweep", p["sweep"])
        return p

    def repetition(self, p):
        _need(self, p, ("flip", "TR", "n"))
        k = np.arange(p["n"])
        phases = (k * p["phase_inc"] + p["sweep"] * k * (k + 1) / 2) % 360.0
        te, ops = _te_of(p), []
        for ph in phases:
            ops += [Pulse(p["flip"], ph), Delay(te), Readout(ph - 90.0), Delay(p["TR"] - te)]
        return Sequence(ops)


class HSFPSimulator(Simulator):
    """Hybrid-state free precession (Assländer et al. 2019, Commun Phys
    2:73) played through the EPG engine: a balanced train whose flip angle
    varies smoothly from pulse to pulse (``flip``, one per TR), RF phases
    alternating by ``phase_inc``, optionally after an inversion ``TI``
    before the first pulse; each pulse sampled TE after it with the
    receiver following, times i.  The flips' variation steers the
    magnetisation between the transient and the steady state.

    Parameters
    ----------
    flip : array_like, deg
        One flip per TR.
    TR : float, ms
    TE : float, ms, optional (default TR/2)
    phase_inc : float, deg
    inversion : bool
    TI : float, ms

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), inv_efficiency, D (µm²/ms), v (m/s; D and v need the geometry).

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import HSFPSimulator
    >>> flips = 10 + 50 * np.sin(np.linspace(0, np.pi, 200)) ** 2
    >>> HSFPSimulator(flip=flips, TR=4.5).simulate(T1=1000.0, T2=80.0).shape
    (200,)
    """

    protocol = {"flip": None, "TR": None, "TE": None, "phase_inc": 180.0, "inversion": True, "TI": 0.0}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "inv_efficiency", "D", "v")

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None:
            return p
        p["flip"] = _train("flip", p["flip"], low=0.0, unit="deg")
        p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["_TE_is_half_TR"] = p["TE"] is None
        te = p["TR"] / 2.0 if p["TE"] is None else p["TE"]
        p["TE"] = _scalar("TE", te, low=0.0, unit="ms")
        _echo_within(p, p["TR"])
        p["phase_inc"] = _scalar("phase_inc", p["phase_inc"])
        if not isinstance(p["inversion"], (bool, np.bool_)):
            raise TypeError(f"inversion must be True or False, got {p['inversion']!r}")
        p["TI"] = _scalar("TI", p["TI"], low=0.0, unit="ms")
        return p

    def repetition(self, p):
        _need(self, p, ("flip", "TR"))
        ops = [Inversion(), Delay(p["TI"])] if p["inversion"] else []
        te = _te_of(p)
        for k, f in enumerate(p["flip"]):
            ph = (k * p["phase_inc"]) % 360.0
            ops += [Pulse(f, ph), Delay(te), Readout(ph - 90.0), Delay(p["TR"] - te)]
        return Sequence(ops)


class MOLLISimulator(Simulator):
    """Modified Look-Locker inversion recovery (MOLLI; Messroghli et al.
    2004, MRM 52:141) played through the EPG engine.  Inversion sets follow
    ``scheme`` ((images, pause beats) per set; the default (5, 3), (3, 0) is
    5(3)3): set j is inverted (Z ← −η Z) at the start of its first beat and
    images at ``TI[j]`` after each beat's start, one image per heartbeat
    ``RR``.  Each image is a single-shot balanced SSFP block: an α/2
    preparation TR/2 before the first of ``n_readouts`` pulses of
    alternating phase every ``TR``, sampled TE = TR/2 after the centre
    pulse (number ``n_readouts // 2``, at the image time), then a spoiler.
    One sample per image, in acquisition order, times i.

    Parameters
    ----------
    TI : array_like, ms
        Inversion to the first image's centre, one per set.
    RR : float, ms
    flip : float, deg
    TR : float, ms
    n_readouts : int
    scheme : sequence of (images, pause beats)

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), inv_efficiency, D (µm²/ms), v (m/s; D and v need the geometry).

    Examples
    --------
    >>> from blochsim.simulators import MOLLISimulator
    >>> molli = MOLLISimulator(TI=[120.0, 200.0], RR=1000.0, flip=35.0, TR=2.5, n_readouts=40)
    >>> molli.simulate(T1=1100.0, T2=50.0).shape, molli.inversion_times()
    ((8,), array([ 120., 1120., 2120., 3120., 4120.,  200., 1200., 2200.]))
    """

    protocol = {"TI": None, "RR": None, "flip": None, "TR": None, "n_readouts": None,
                "scheme": ((5, 3), (3, 0))}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "inv_efficiency", "D", "v")

    def check_protocol(self, p):
        if any(p[k] is None for k in ("TI", "RR", "flip", "TR", "n_readouts")):
            return p
        try:
            scheme = tuple((int(a), int(b)) for a, b in p["scheme"])
        except (TypeError, ValueError):
            raise ValueError(f"scheme must be (images, pause beats) pairs, got {p['scheme']!r}") from None
        if not scheme or any(a < 1 or b < 0 for a, b in scheme):
            raise ValueError(f"scheme needs sets of >= 1 image and >= 0 pause beats, got {p['scheme']!r}")
        p["scheme"] = scheme
        p["TI"] = _train("TI", p["TI"], len(scheme), low=0.0, unit="ms")
        p["RR"] = _scalar("RR", p["RR"], low=0.0, strict=True, unit="ms")
        p["flip"] = _scalar("flip", p["flip"], low=0.0, unit="deg")
        p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["n_readouts"] = V.positive_int("n_readouts", p["n_readouts"])
        before = (p["n_readouts"] // 2 + 0.5) * p["TR"]
        after = (p["n_readouts"] - p["n_readouts"] // 2 - 0.5) * p["TR"]
        for j, TI in enumerate(p["TI"]):
            if TI < before:
                raise ValueError(f"TI[{j}] = {TI:g} ms leaves no room for the {before:g} ms of readout before "
                                 f"the image centre")
            if TI + after > p["RR"]:
                raise ValueError(f"TI[{j}] = {TI:g} ms: the readout runs past the heartbeat (RR = {p['RR']:g} ms)")
        return p

    def inversion_times(self, **protocol):
        """Each image's time after its set's inversion, in acquisition order.

        Parameters
        ----------
        **protocol
            Protocol overrides.

        Returns
        -------
        numpy.ndarray, ms, shape (images,)
        """
        p = self._protocol_values(protocol)
        return np.concatenate([TI + p["RR"] * np.arange(n) for TI, (n, _) in zip(p["TI"], p["scheme"])])

    def repetition(self, p):
        _need(self, p, ("TI", "RR", "flip", "TR", "n_readouts"))
        n, c, tr = p["n_readouts"], p["n_readouts"] // 2, p["TR"]
        ops = []
        for TI, (images, pause) in zip(p["TI"], p["scheme"]):
            ops.append(Inversion())
            now = 0.0  # time since this set's inversion
            for i in range(images):
                start = TI + i * p["RR"] - (c + 0.5) * tr  # the alpha/2 preparation
                ops += [Delay(start - now), Pulse(p["flip"] / 2.0, 180.0), Delay(tr / 2.0)]
                for k in range(n):
                    ph = 180.0 * (k % 2)
                    ops += [Pulse(p["flip"], ph), Delay(tr / 2.0)]
                    if k == c:
                        ops.append(Readout(ph - 90.0))
                    ops.append(Delay(tr / 2.0))
                ops.append(Spoil())
                now = start + (n + 0.5) * tr
            ops.append(Delay((images + pause) * p["RR"] - now))
        return Sequence(ops)


class IRbSSFPSimulator(TrueFISPSimulator):
    """Inversion-recovery balanced SSFP (IR TrueFISP; Scheffler & Hennig
    2001, MRM 45:720; Schmitt et al. 2004, MRM 51:661): an inversion (Z ←
    −η Z), ``TI`` to the −α/2 preparation, then the train of
    :class:`TrueFISPSimulator`; its samples recover from the inversion
    towards the balanced steady state.

    Parameters
    ----------
    flip, TR, nshots, TE
        As :class:`TrueFISPSimulator`.
    TI : float, ms
        Inversion to the α/2 preparation.

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), inv_efficiency, D (µm²/ms), v (m/s; D and v need the geometry).

    Examples
    --------
    >>> from blochsim.simulators import IRbSSFPSimulator
    >>> s = IRbSSFPSimulator(flip=50.0, TR=4.0, nshots=300, TI=10.0).simulate(T1=1200.0, T2=90.0)
    >>> s.shape
    (300,)
    """

    protocol = {**TrueFISPSimulator.protocol, "TI": 0.0}
    tissue_properties = TrueFISPSimulator.tissue_properties + ("inv_efficiency",)

    def check_protocol(self, p):
        p = super().check_protocol(p)
        p["TI"] = _scalar("TI", p["TI"], low=0.0, unit="ms")
        return p

    def preparation(self, p):
        return super().preparation(p) @ Delay(p["TI"]) @ Inversion()


class StimulatedEchoSimulator(Simulator):
    """Three-pulse experiment: the spin echo of pulses 1-2 and the stimulated
    echo of pulses 1-2-3.

    α1 — TE/2 — α2 — TE/2 — [spin echo] — (TM - TE/2, spoiled) — α3 — TE/2 —
    [stimulated echo]; one crusher shift after each pulse.  All pulses at
    phase 90°.  Samples: (spin echo, stimulated echo), magnitudes
    sin α1 sin²(α2/2) e^{-TE/T2} and ½ sin α1 sin α2 sin α3 e^{-TE/T2} e^{-TM/T1}.

    Parameters
    ----------
    flip : float or array_like of 3, degrees (default 90)
    TE : float, ms
    TM : float, ms (time between the second and third pulse, >= TE/2)

    Tissue: T1, T2 (ms), M0, B1, D (µm²/ms), v (m/s; D and v need the geometry).
    """

    protocol = {"flip": 90.0, "TE": None, "TM": None}
    tissue_properties = ("T1", "T2", "M0", "B1", "D", "v")

    def check_protocol(self, p):
        p["flip"] = _train("flip", p["flip"], 3)
        if p["TE"] is None or p["TM"] is None:
            return p
        p["TE"] = _scalar("TE", p["TE"], low=0.0, unit="ms")
        p["TM"] = _scalar("TM", p["TM"], low=0.0, unit="ms")
        if p["TM"] < p["TE"] / 2.0:
            raise ValueError(f"TM must be >= TE/2 = {p['TE'] / 2:g} ms, got {p['TM']:g}")
        return p

    def repetition(self, p):
        _need(self, p, ("TE", "TM"))
        a1, a2, a3 = p["flip"]
        h = Delay(p["TE"] / 2.0)
        return Sequence([Pulse(a1, 90.0), Dephase(), h, Pulse(a2, 90.0), Dephase(), h, Readout(),
                         Delay(p["TM"] - p["TE"] / 2.0), Spoil(), Pulse(a3, 90.0), Dephase(), h,
                         Readout()])


# --------------------------------------------------------------------------
# Closed forms

def _contrasts(p, names):
    """Broadcast scalar-or-per-contrast protocol arrays to one contrast axis."""
    arrs = [np.atleast_1d(p[k]) for k in names]
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrs))
    except ValueError:
        raise ValueError("protocol arrays do not broadcast to one contrast count: " +
                         ", ".join(f"{k} {a.shape}" for k, a in zip(names, arrs))) from None
    return [np.broadcast_to(a, shape) for a in arrs]


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


class DESPOT2Simulator(DESPOT1Simulator):
    """DESPOT2 T2 mapping (Deoni, Rutt & Peters 2003, MRM 49:515): balanced
    SSFP on resonance with the RF phase alternated, at several flips,

        S_i = M0 (1 − E1) sin(B1 α_i) / (1 − (E1 − E2) cos(B1 α_i) − E1 E2) · e^{−TE/T2},

    E1 = e^{−TR/T1}, E2 = e^{−TR/T2} (the exact on-resonance steady state
    of :class:`bSSFPSimulator`).  With T1 known (from DESPOT1), :meth:`fit`
    inverts it through the line S/sin α = m · S/tan α + c,
    m = (E1 − E2)/(1 − E1 E2).

    Parameters
    ----------
    flip : array_like, deg, shape (n,)
    TR : float, ms
    TE : float, ms (default TR/2)

    Tissue: T1, T2 (ms, required), M0, B1.

    Examples
    --------
    >>> from blochsim.simulators import DESPOT2Simulator
    >>> sim = DESPOT2Simulator(flip=[15.0, 60.0], TR=5.0)
    >>> round(float(sim.fit(sim.simulate(T1=1100.0, T2=70.0), T1=1100.0)["T2"]), 6)
    70.0
    """

    protocol = {"flip": None, "TR": None, "TE": None}
    tissue_properties = ("T1", "T2", "M0", "B1")
    required = ("T1", "T2")

    def check_protocol(self, p):
        if p["TR"] is not None and p["TE"] is None:
            p["TE"] = 0.5 * _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        return super().check_protocol(p)

    def signal(self, p, t):
        _need(self, p, ("flip", "TR"))
        _relaxes(p["TR"], t["T1"], t["T2"])
        a = np.radians(p["flip"]) * t.get("B1", 1.0)
        E1, E2 = np.exp(-p["TR"] / t["T1"]), np.exp(-p["TR"] / t["T2"])
        s = t.get("M0", 1.0) * (1 - E1) * np.sin(a) / (1 - (E1 - E2) * np.cos(a) - E1 * E2)
        return s * np.exp(-p["TE"] / t["T2"])

    def fit(self, signals, T1, B1=None, **protocol):
        """T2 and M0 from the signals (magnitudes) and a known T1.

        Parameters
        ----------
        signals : array_like, shape (*voxels, n)
        T1 : array_like, ms
            Per voxel (e.g. from :meth:`DESPOT1Simulator.fit`).
        B1 : array_like, optional
        **protocol
            Protocol overrides.

        Returns
        -------
        dict
            ``T2`` (ms; NaN where the line gives no E2 in (0, 1)) and ``M0``
            (times e^{-TE/T2}), shaped ``voxels``.
        """
        p, y, x = _despot_axes(self, signals, B1, protocol)
        E1 = np.exp(-p["TR"] / np.asarray(V.tissue_array("T1", T1)))
        m, c = _despot_line(x, y)
        with np.errstate(divide="ignore", invalid="ignore"):
            E2 = (E1 - m) / (1 - m * E1)
            ok = (E2 > 0) & (E2 < 1)
            T2 = np.where(ok, -p["TR"] / np.log(np.where(ok, E2, 0.5)), np.nan)
            return {"T2": T2, "M0": np.where(ok, c * (1 - E1 * E2) / (1 - E1), np.nan)}


class bSSFPSimulator(ClosedFormSimulator):
    """Balanced SSFP steady state, exact.

    The steady state just after a pulse solves M = R (E M + b) for the
    Bloch equations (R: the pulse; E: relaxation with E1 = e^{-TR/T1},
    E2 = e^{-TR/T2}, and precession by 2π B0 TR + phase_inc per TR in the
    frame that follows the RF phase; b: recovery), solved as a 3×3 linear
    system per voxel.  The echo is that transverse magnetisation decayed by
    e^{-TE/T2} and precessed by 2π B0 TE, with the receiver following the RF
    phase, multiplied by i (real and positive on resonance).

    Parameters
    ----------
    flip : float or array_like, degrees
    TR : float or array_like, ms
    TE : float or array_like, ms (default TR/2)
    phase_inc : float or array_like, degrees (default 180)

    Tissue: T1, T2 (ms, required), M0, B0 (Hz).
    """

    protocol = {"flip": None, "TR": None, "TE": None, "phase_inc": 180.0}
    tissue_properties = ("T1", "T2", "M0", "B0")
    required = ("T1", "T2")

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None:
            return p
        p["flip"] = V.protocol_array("flip", p["flip"])
        p["TR"] = V.protocol_array("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["_TE_is_half_TR"] = p["TE"] is None
        p["TE"] = p["TR"] / 2.0 if p["TE"] is None else V.protocol_array("TE", p["TE"], low=0.0, unit="ms")
        p["phase_inc"] = V.protocol_array("phase_inc", p["phase_inc"])
        flip, TR, TE, _ = _contrasts(p, ("flip", "TR", "TE", "phase_inc"))
        if np.any(TE > TR):
            raise ValueError(f"TE must be <= TR, got TE={p['TE']!r}, TR={p['TR']!r}")
        return p

    def signal(self, p, t):
        return self._steady(p, t)["s"]

    def _steady(self, p, t):
        """The signal and the pieces of its linear system (for derivatives)."""
        _need(self, p, ("flip", "TR"))
        flip, TR, TE, inc = _contrasts(p, ("flip", "TR", "TE", "phase_inc"))
        T1, T2 = t["T1"], t["T2"]
        _relaxes(TR, T1, T2)
        B0 = t.get("B0", 0.0)
        shape = np.broadcast_shapes(np.shape(T1), np.shape(T2), np.shape(B0), flip.shape)
        a = np.broadcast_to(np.radians(flip), shape)
        E1 = np.broadcast_to(np.exp(-TR / T1), shape)
        E2 = np.broadcast_to(np.exp(-TR / T2), shape)
        beta = np.broadcast_to(2 * np.pi * B0 * TR * 1e-3 + np.radians(inc), shape)
        ca, sa, cb, sb = np.cos(a), np.sin(a), np.cos(beta), np.sin(beta)
        # (Mx, My, Mz) with F+ = Mx + i My; the pulse (phase 0) is
        # R = [[1, 0, 0], [0, ca, -sa], [0, sa, ca]] (Z tips to -y);
        # precession F+ -> F+ e^{-i beta}: Mx' = cb Mx + sb My, My' = -sb Mx + cb My.
        z = np.zeros(shape)
        o = np.ones(shape)
        R = np.stack([np.stack([o, z, z], -1), np.stack([z, ca, -sa], -1), np.stack([z, sa, ca], -1)], -2)
        E = np.stack([np.stack([E2 * cb, E2 * sb, z], -1), np.stack([-E2 * sb, E2 * cb, z], -1),
                      np.stack([z, z, E1], -1)], -2)
        b = np.stack([z, z, 1 - E1], -1)
        A = np.eye(3) - R @ E
        M = np.linalg.solve(A, (R @ b[..., None]))[..., 0]
        echo = np.exp(-TE / T2) * np.exp(-2j * np.pi * B0 * TE * 1e-3)
        F = (M[..., 0] + 1j * M[..., 1]) * echo
        return {"s": 1j * t.get("M0", 1.0) * F, "R": R, "E1": E1, "E2": E2, "cb": cb, "sb": sb, "TR": TR,
                "TE": TE, "A": A, "M": M, "echo": echo, "z": z}

    def derivatives(self, p, t, names, s):
        q = self._steady(p, t)
        R, E1, E2, cb, sb, TR, TE, A, M, echo, z = (q[k] for k in (
            "R", "E1", "E2", "cb", "sb", "TR", "TE", "A", "M", "echo", "z"))
        T1, T2 = t["T1"], t["T2"]

        def through(dE, db):
            # M = A^{-1} R b with A = I - R E: dM = A^{-1} (R db + R dE M)
            rhs = R @ (db[..., None] + dE @ M[..., None])
            dM = np.linalg.solve(A, rhs)[..., 0]
            return 1j * (dM[..., 0] + 1j * dM[..., 1]) * echo

        def e_matrix(e2_cb, e2_sb, e1):
            return np.stack([np.stack([e2_cb, e2_sb, z], -1), np.stack([-e2_sb, e2_cb, z], -1),
                             np.stack([z, z, e1], -1)], -2)

        d = {}
        if "T1" in names:
            dE1 = E1 * TR / T1 ** 2
            d["T1"] = through(e_matrix(z, z, dE1), np.stack([z, z, -dE1], -1))
        if "T2" in names:
            dE2 = E2 * TR / T2 ** 2
            d["T2"] = through(e_matrix(dE2 * cb, dE2 * sb, z), np.stack([z, z, z], -1)) + s * TE / T2 ** 2
        if "B0" in names:
            dbeta = 2 * np.pi * TR * 1e-3
            d["B0"] = (through(e_matrix(-E2 * sb * dbeta, E2 * cb * dbeta, z), np.stack([z, z, z], -1))
                       + s * (-2j * np.pi * TE * 1e-3))
        return d

    def protocol_derivatives(self, p, t, names, s):
        q = self._steady(p, t)
        R, E1, E2, cb, sb, TR, TE, A, M, echo, z = (q[k] for k in (
            "R", "E1", "E2", "cb", "sb", "TR", "TE", "A", "M", "echo", "z"))
        E = np.stack([np.stack([E2 * cb, E2 * sb, z], -1), np.stack([-E2 * sb, E2 * cb, z], -1),
                      np.stack([z, z, E1], -1)], -2)
        b = np.stack([z, z, 1 - E1], -1)
        T1, T2 = t["T1"], t["T2"]
        B0 = t.get("B0", 0.0)
        echo_rate = -1 / T2 - 2j * np.pi * B0 * 1e-3  # d ln(echo) / dTE

        def through(dR, dE, db):
            # M = R (E M + b): (I - R E) dM = dR (E M + b) + R (dE M + db)
            rhs = dR @ (E @ M[..., None] + b[..., None]) + R @ (dE @ M[..., None] + db[..., None])
            dM = np.linalg.solve(A, rhs)[..., 0]
            return 1j * (dM[..., 0] + 1j * dM[..., 1]) * echo

        def rot(e2c, e2s, e1):
            return np.stack([np.stack([e2c, e2s, z], -1), np.stack([-e2s, e2c, z], -1),
                             np.stack([z, z, e1], -1)], -2)

        zero3 = np.zeros(R.shape)
        d = {}
        if "flip" in names:
            # R = [[1, 0, 0], [0, ca, -sa], [0, sa, ca]]
            ca, sa = R[..., 1, 1], R[..., 2, 1]
            dR = np.stack([np.stack([z, z, z], -1), np.stack([z, -sa, -ca], -1), np.stack([z, ca, -sa], -1)], -2)
            d["flip"] = through(dR, zero3, np.stack([z, z, z], -1)) * (np.pi / 180)
        if "phase_inc" in names:
            dbeta = np.pi / 180
            d["phase_inc"] = through(zero3, rot(-E2 * sb * dbeta, E2 * cb * dbeta, z), np.stack([z, z, z], -1))
        if "TR" in names:
            dE1, dE2 = -E1 / T1, -E2 / T2
            dbeta = 2 * np.pi * B0 * 1e-3
            dE = rot(dE2 * cb - E2 * sb * dbeta, dE2 * sb + E2 * cb * dbeta, dE1)
            d["TR"] = through(zero3, dE, np.stack([z, z, -dE1], -1))
            if p.get("_TE_is_half_TR"):
                d["TR"] = d["TR"] + 0.5 * s * echo_rate  # the default TE = TR/2 follows TR
        if "TE" in names:
            d["TE"] = s * echo_rate
        return d


class InversionRecoverySimulator(ClosedFormSimulator):
    """Inversion recovery: S = M0 (1 - (1 + η) e^{-TI/T1} + η e^{-TR/T1}),
    the last term only with a finite TR (a 90° readout at TI saturates Z, and
    the magnetisation recovers for TR - TI before the next inversion).

    Parameters
    ----------
    TI : array_like, ms
    TR : float, ms, optional (None: full recovery)

    Tissue: T1 (ms, required), M0, inv_efficiency (η, default 1).
    """

    protocol = {"TI": None, "TR": None}
    tissue_properties = ("T1", "M0", "inv_efficiency")
    required = ("T1",)

    def check_protocol(self, p):
        if p["TI"] is None:
            return p
        p["TI"] = np.atleast_1d(V.protocol_array("TI", p["TI"], low=0.0, unit="ms"))
        if p["TR"] is not None:
            p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
            if np.any(p["TI"] > p["TR"]):
                raise ValueError(f"TI must be <= TR = {p['TR']:g} ms, got {p['TI']!r}")
        return p

    def signal(self, p, t):
        if p["TI"] is None:
            raise TypeError("InversionRecoverySimulator needs protocol parameter 'TI'")
        eta = t.get("inv_efficiency", 1.0)
        s = 1 - (1 + eta) * np.exp(-p["TI"] / t["T1"])
        if p["TR"] is not None:
            s = s + eta * np.exp(-p["TR"] / t["T1"])
        return t.get("M0", 1.0) * s

    def derivatives(self, p, t, names, s):
        eta, T1, TI = t.get("inv_efficiency", 1.0), t["T1"], p["TI"]
        eI = np.exp(-TI / T1)
        eR = np.exp(-p["TR"] / T1) if p["TR"] is not None else 0.0
        TR = p["TR"] if p["TR"] is not None else 0.0
        d = {"T1": (-(1 + eta) * eI * TI + eta * eR * TR) / T1 ** 2, "inv_efficiency": eR - eI}
        return {k: d[k] for k in names}

    def protocol_derivatives(self, p, t, names, s):
        eta, T1, TI = t.get("inv_efficiency", 1.0), t["T1"], p["TI"]
        d = {}
        if "TI" in names:
            d["TI"] = (1 + eta) / T1 * np.exp(-TI / T1)
        if "TR" in names:
            d["TR"] = -eta / T1 * np.exp(-p["TR"] / T1) * np.ones_like(TI)
        return d


class SpinEchoSimulator(ClosedFormSimulator):
    """Spin echo with repetition: S = M0 (1 - 2e^{-(TR-TE/2)/T1} + e^{-TR/T1}) e^{-TE/T2}.

    Parameters
    ----------
    TE : array_like, ms
    TR : float, ms

    Tissue: T1, T2 (ms, required), M0.
    """

    protocol = {"TE": None, "TR": None}
    tissue_properties = ("T1", "T2", "M0")
    required = ("T1", "T2")

    def check_protocol(self, p):
        if p["TE"] is None or p["TR"] is None:
            return p
        p["TE"] = np.atleast_1d(V.protocol_array("TE", p["TE"], low=0.0, unit="ms"))
        p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        if np.any(p["TE"] > p["TR"]):
            raise ValueError(f"TE must be <= TR = {p['TR']:g} ms, got {p['TE']!r}")
        return p

    def signal(self, p, t):
        _need(self, p, ("TE", "TR"))
        TE, TR, T1 = p["TE"], p["TR"], t["T1"]
        s = (1 - 2 * np.exp(-(TR - TE / 2) / T1) + np.exp(-TR / T1)) * np.exp(-TE / t["T2"])
        return t.get("M0", 1.0) * s

    def derivatives(self, p, t, names, s):
        TE, TR, T1, T2 = p["TE"], p["TR"], t["T1"], t["T2"]
        a = TR - TE / 2
        d = {"T1": (-2 * np.exp(-a / T1) * a + np.exp(-TR / T1) * TR) / T1 ** 2 * np.exp(-TE / T2),
             "T2": s * TE / T2 ** 2}
        return {k: d[k] for k in names}

    def protocol_derivatives(self, p, t, names, s):
        TE, TR, T1, T2 = p["TE"], p["TR"], t["T1"], t["T2"]
        ea, eR, e2 = np.exp(-(TR - TE / 2) / T1), np.exp(-TR / T1), np.exp(-TE / T2)
        d = {}
        if "TE" in names:
            # A = 1 - 2 e^{-(TR - TE/2)/T1} + e^{-TR/T1}: dA/dTE = -e^{-(TR - TE/2)/T1}/T1
            d["TE"] = -ea / T1 * e2 - s / T2
        if "TR" in names:
            d["TR"] = (2 * ea - eR) / T1 * e2
        return d


class DiffusionSimulator(ClosedFormSimulator):
    """Diffusion-weighted spin echo (Stejskal & Tanner 1965, J Chem Phys
    42:288): S = M0 · A · e^{−b·D}, with A the spin echo's weighting,
    e^{−TE/T2} for one shot (TR None) or (1 − 2e^{−(TR−TE/2)/T1} +
    e^{−TR/T1}) e^{−TE/T2} with repetition.  ``b`` is in s/mm² and D in
    µm²/ms (b·D = b·D·1e-3).

    Parameters
    ----------
    b : array_like, s/mm²
        b-value per contrast.
    TE : float, ms
    TR : float, ms, optional

    Tissue: T2, D (µm²/ms, required), T1 (ms, needed with TR), M0.

    Examples
    --------
    >>> from blochsim.simulators import DiffusionSimulator
    >>> DiffusionSimulator(b=[0.0, 1000.0], TE=80.0).simulate(T2=80.0, D=0.7).real.round(4)
    array([0.3679, 0.1827])
    """

    protocol = {"b": None, "TE": None, "TR": None}
    tissue_properties = ("T1", "T2", "M0", "D")
    required = ("T2", "D")

    def check_protocol(self, p):
        if p["b"] is None or p["TE"] is None:
            return p
        p["b"] = np.atleast_1d(V.protocol_array("b", p["b"], low=0.0, unit="s/mm^2"))
        p["TE"] = _scalar("TE", p["TE"], low=0.0, unit="ms")
        if p["TR"] is not None:
            p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
            _echo_within(p, p["TR"])
        return p

    def signal(self, p, t):
        _need(self, p, ("b", "TE"))
        a = np.exp(-p["TE"] / t["T2"])
        if p["TR"] is not None:
            if "T1" not in t:
                raise TypeError("DiffusionSimulator needs tissue property 'T1' with a TR")
            T1 = t["T1"]
            a = a * (1 - 2 * np.exp(-(p["TR"] - p["TE"] / 2) / T1) + np.exp(-p["TR"] / T1))
        return t.get("M0", 1.0) * a * np.exp(-1e-3 * p["b"] * t["D"])

    def derivatives(self, p, t, names, s):
        return _complex_step(self, p, t, names)


TENSOR = ("Dxx", "Dyy", "Dzz", "Dxy", "Dxz", "Dyz")


class DiffusionTensorSimulator(DiffusionSimulator):
    """Diffusion tensor imaging (Basser, Mattiello & LeBihan 1994, Biophys
    J 66:259): the spin echo of :class:`DiffusionSimulator` with the
    diffusion weighting of gradient direction g,

        S = M0 · A · e^{−b gᵀ D g},

    D the symmetric tensor (Dxx, Dyy, Dzz, Dxy, Dxz, Dyz; µm²/ms, the
    scanner frame).  :meth:`fit_tensor` inverts it (log-linear least
    squares).

    Parameters
    ----------
    b : array_like, s/mm², shape (n,)
    directions : array_like, shape (n, 3)
        Gradient direction per contrast (normalised here; any row for b = 0).
    TE : float, ms
    TR : float, ms, optional

    Tissue: T2 (ms), Dxx, Dyy, Dzz (µm²/ms, required), Dxy, Dxz, Dyz
    (default 0), T1 (ms, needed with TR), M0.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import DiffusionTensorSimulator
    >>> g = np.array([[0, 0, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1]])
    >>> sim = DiffusionTensorSimulator(b=[0.0] + [1000.0] * 6, directions=g, TE=80.0)
    >>> s = sim.simulate(T2=80.0, Dxx=1.7, Dyy=0.3, Dzz=0.3)
    >>> {k: round(float(v), 3) for k, v in sim.fit_tensor(s).items() if k in ("Dxx", "Dyy")}
    {'Dxx': 1.7, 'Dyy': 0.3}
    """

    protocol = {"b": None, "directions": None, "TE": None, "TR": None}
    tissue_properties = ("T1", "T2", "M0") + TENSOR
    required = ("T2", "Dxx", "Dyy", "Dzz")

    def check_protocol(self, p):
        p = super().check_protocol(p)
        if p["b"] is None or p["TE"] is None:
            return p
        if p["directions"] is None:
            raise ValueError("DiffusionTensorSimulator needs directions, one (x, y, z) per b-value")
        g = np.asarray(p["directions"])
        # integer directions ((1, 0, 0), ...) are exact and common: take them as floats
        g = V.protocol_array("directions", g.astype(np.float64) if g.dtype.kind in "iu" else g, ndim_max=2)
        if g.shape != (p["b"].shape[0], 3):
            raise ValueError(f"directions must have shape ({p['b'].shape[0]}, 3), one per b-value, got {g.shape}")
        norm = np.linalg.norm(g, axis=1)
        if np.any((norm == 0) & (p["b"] > 0)):
            raise ValueError(f"directions has a zero row at b > 0 (row {int(np.argmax((norm == 0) & (p['b'] > 0)))})")
        p["directions"] = g / np.where(norm > 0, norm, 1.0)[:, None]
        return p

    @staticmethod
    def _design(g):
        """Rows (gx², gy², gz², 2gxgy, 2gxgz, 2gygz): gᵀDg = row · tensor."""
        x, y, z = g.T
        return np.stack([x * x, y * y, z * z, 2 * x * y, 2 * x * z, 2 * y * z], axis=1)

    def signal(self, p, t):
        _need(self, p, ("b", "TE", "directions"))
        adc = sum(t.get(k, 0.0) * c for k, c in zip(TENSOR, self._design(p["directions"]).T))
        flat = {k: v for k, v in t.items() if k not in TENSOR}
        return DiffusionSimulator.signal(self, p, {**flat, "D": adc})

    def fit_tensor(self, signals, **protocol):
        """The tensor and the b = 0 signal from signals by log-linear least
        squares (Basser 1994).

        Parameters
        ----------
        signals : array_like, shape (*voxels, n)
            Magnitudes are used; the design needs at least six
            non-collinear directions at b > 0 and one b = 0 or a seventh
            measurement.
        **protocol
            Protocol overrides, as for :meth:`simulate`.

        Returns
        -------
        dict
            ``Dxx`` … ``Dyz`` (µm²/ms) and ``S0`` (the signal at b = 0),
            each shaped ``voxels``.
        """
        p = self._protocol_values(protocol)
        _need(self, p, ("b", "TE", "directions"))
        s = np.abs(np.asarray(signals))
        if s.shape[-1:] != p["b"].shape:
            raise ValueError(f"signals must end in {p['b'].shape[0]} contrasts, got shape {s.shape}")
        A = np.concatenate([np.ones((p["b"].shape[0], 1)), -1e-3 * p["b"][:, None] * self._design(p["directions"])],
                           axis=1)
        if np.linalg.matrix_rank(A) < 7:
            raise ValueError("the b-values and directions do not determine the tensor (fewer than six "
                             "independent directions, or no b = 0)")
        y = np.log(np.maximum(s, np.finfo(float).tiny)).reshape(-1, s.shape[-1])
        x = np.linalg.lstsq(A, y.T, rcond=None)[0]
        out = {k: x[i + 1].reshape(s.shape[:-1]) for i, k in enumerate(TENSOR)}
        out["S0"] = np.exp(x[0]).reshape(s.shape[:-1])
        return out


# The six-peak fat spectrum of Hamilton et al. 2011 (NMR Biomed 24:784),
# liver: chemical shifts from water (ppm) and relative amplitudes (sum 1).
FAT_PEAKS_PPM = np.array([-3.80, -3.40, -2.60, -1.94, -0.39, 0.60])
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


class ASLSimulator(ClosedFormSimulator):
    """Arterial spin labelling difference signal by the general kinetic
    model (Buxton et al. 1998, MRM 40:383): labelled blood arrives after
    the transit time ATT, exchanges into tissue (single compartment, blood
    –tissue partition λ) and relaxes there with the apparent T1app =
    1/(1/T1 + f/λ):

        ΔM(t) = 2 M0b f ∫ c(t') e^{−(t − t')/T1app} dt',

    f = CBF/6000 (ml/g/s), M0b = M0/λ, and the delivery c(t') = α e^{−ATT/T1b}
    (pCASL, a label of duration τ leaving the labelling plane from 0 to τ)
    or α e^{−t'/T1b} (PASL, a bolus of duration τ), for ATT ≤ t' ≤ ATT + τ.

    Parameters
    ----------
    times : array_like, ms
        pCASL: post-labelling delays (readout at τ + PLD); PASL: inversion
        times (readout at TI).
    labeling : "pcasl" or "pasl"
    tau : float, ms
        Label (or bolus) duration.
    alpha : float
        Labelling efficiency.
    T1blood : float, ms
        Arterial blood T1 (1650 ms at 3 T).
    partition : float, ml/g
        λ.

    Tissue: CBF (ml/100 g/min, required), ATT (ms), T1 (ms, default
    T1blood), M0.

    Examples
    --------
    >>> from blochsim.simulators import ASLSimulator
    >>> asl = ASLSimulator(times=[1800.0], tau=1800.0)
    >>> float(asl.simulate(CBF=60.0, ATT=1000.0, M0=1.0).real[0].round(5))
    0.00683
    """

    protocol = {"times": None, "labeling": "pcasl", "tau": 1800.0, "alpha": 0.85, "T1blood": 1650.0,
                "partition": 0.9}
    tissue_properties = ("CBF", "ATT", "T1", "M0")
    required = ("CBF",)

    def check_protocol(self, p):
        if p["times"] is None:
            return p
        p["times"] = np.atleast_1d(V.protocol_array("times", p["times"], low=0.0, unit="ms"))
        if p["labeling"] not in ("pcasl", "pasl"):
            raise ValueError(f"labeling must be 'pcasl' or 'pasl', got {p['labeling']!r}")
        p["tau"] = _scalar("tau", p["tau"], low=0.0, strict=True, unit="ms")
        p["alpha"] = _scalar("alpha", p["alpha"], low=0.0)
        if p["alpha"] > 1.0:
            raise ValueError(f"alpha (the labelling efficiency) must be <= 1, got {p['alpha']:g}")
        p["T1blood"] = _scalar("T1blood", p["T1blood"], low=0.0, strict=True, unit="ms")
        p["partition"] = _scalar("partition", p["partition"], low=0.0, strict=True)
        return p

    def signal(self, p, t):
        if p["times"] is None:
            raise TypeError("ASLSimulator needs protocol parameter 'times'")
        lam, tau, T1b = p["partition"], p["tau"] * 1e-3, p["T1blood"] * 1e-3
        f = t["CBF"] / 6000.0
        att = t.get("ATT", 0.0) * 1e-3
        T1 = t.get("T1", p["T1blood"]) * 1e-3
        k_app = 1 / T1 + f / lam
        tt = (p["times"] + (p["tau"] if p["labeling"] == "pcasl" else 0.0)) * 1e-3
        # the arrived part of the label: [att, min(t, att + tau)], as a span
        # (real parts decide the branches, so that a complex step passes)
        d = tt - att
        inside = (np.real(d) > 0) & (np.real(d) < tau)
        span = np.where(inside, d, np.clip(np.real(d), 0.0, tau))
        arrived = np.real(d) > 0
        # time since the first arrival (0 before it), so that no exponent is positive
        lead = np.where(arrived, tt - att, 0.0)
        if p["labeling"] == "pcasl":
            # ∫_att^end e^{-att/T1b} e^{-(t - t')k} dt' = e^{-att/T1b} e^{-(t - end)k} (1 - e^{-span k})/k
            integral = np.exp(-att / T1b) * np.exp(-(lead - span) * k_app) * -np.expm1(-span * k_app) / k_app
        else:
            # ∫_att^end e^{-t'/T1b} e^{-(t - t')k} dt' = e^{-att/T1b} [e^{-(t - att)k} - e^{-(t - end)k - span/T1b}] / kd
            # with kd = 1/T1b - k (its limit span e^{-(t - att)k} as kd -> 0)
            kd = 1 / T1b - k_app
            small = np.abs(kd) * tau < 1e-8
            kd_safe = np.where(small, 1.0, kd)
            first = np.exp(-lead * k_app)
            last = np.exp(-(lead - span) * k_app - span / T1b)
            integral = np.exp(-att / T1b) * np.where(small, span * first, (first - last) / kd_safe)
        return 2 * t.get("M0", 1.0) / lam * f * p["alpha"] * integral

    def derivatives(self, p, t, names, s):
        return _complex_step(self, p, t, names)


# --------------------------------------------------------------------------
# Pools: CEST and MT

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


class MultiEchoSESimulator(FSESimulator):
    """Multi-echo spin echo (CPMG) for T2 mapping: :class:`FSESimulator`
    with ``n_echoes`` refocusing pulses of one flip ``refocusing``.  With
    ideal 180° pulses the echoes are M0 e^{-TE/T2} at TE = ESP, 2 ESP, ...;
    below 180° (B1) stimulated pathways add to them (Lebel & Wilman 2010,
    MRM 64:1005, fit T2 with this model).

    Parameters
    ----------
    n_echoes : int
    ESP : float, ms
    refocusing : float, deg (default 180)
    exc_flip, exc_phase, TR, states, ...
        As for :class:`FSESimulator`.

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), D (µm²/ms), v (m/s; D and v need the geometry).

    Examples
    --------
    >>> from blochsim.simulators import MultiEchoSESimulator
    >>> s = MultiEchoSESimulator(n_echoes=32, ESP=10.0).simulate(T1=1000.0, T2=80.0, B1=0.9)
    >>> s.shape
    (32,)
    """

    protocol = {**FSESimulator.protocol, "n_echoes": None, "refocusing": 180.0}

    def check_protocol(self, p):
        if p["n_echoes"] is not None:
            if p["flip"] is not None:
                raise ValueError("give n_echoes (with refocusing) or a flip train, not both")
            p["n_echoes"] = V.positive_int("n_echoes", p["n_echoes"])
            p["refocusing"] = _scalar("refocusing", p["refocusing"], low=0.0, unit="deg")
            p["flip"] = np.full(p["n_echoes"], p["refocusing"])
        return super().check_protocol(p)

    def repetition(self, p):
        if p["n_echoes"] is not None:  # the train from refocusing, which a vjp may trace
            p = {**p, "flip": [p["refocusing"]] * p["n_echoes"]}
        return super().repetition(p)


def _complex_step(sim, p, t, names):
    """Derivatives of a real closed form by the complex step (Squire &
    Trapp 1998, SIAM Rev 40:110): for a signal real-analytic in each tissue
    value x, Im f(x + i h) / h is its derivative to round-off."""
    out = {}
    for k in names:
        x = t.get(k, np.ones((1, 1)))
        h = 1e-30 * np.maximum(np.abs(x), 1.0)
        out[k] = np.imag(sim.signal(p, {**t, k: x + 1j * h})) / h
    return out


class LookLockerSimulator(ClosedFormSimulator):
    """Look-Locker inversion recovery (Look & Locker 1970, Rev Sci Instrum
    41:250; Deichmann & Haase 1992, JMR 96:608): an inversion (Z ← −η Z),
    then ``n`` pulses of flip ``flip`` (times B1) spaced ``spacing``, the
    first at ``TI``, each sampled just after it with ideal spoiling; with
    ``TR`` the experiment repeats every TR and is returned in its periodic
    steady state, without it from equilibrium.

    Sample k is M0 · sin(B1·flip) · Z_k with Z_k just before pulse k:
    Z_k = Z∞ + (Z_0 − Z∞)(cos(B1·flip) E)^k, E = e^{−spacing/T1}, Z∞ =
    (1 − E)/(1 − cos(B1·flip) E): a recovery with the apparent T1* =
    1/(1/T1 − ln cos(B1·flip)/spacing).

    Parameters
    ----------
    flip : float, deg
    spacing : float, ms
    n : int
    TI : float, ms
        Inversion to the first pulse.
    TR : float, ms, optional
        Inversion repetition time (at least TI + (n − 1)·spacing).

    Tissue: T1 (ms, required), M0, B1, inv_efficiency (η, default 1).

    Examples
    --------
    >>> from blochsim.simulators import LookLockerSimulator
    >>> ll = LookLockerSimulator(flip=8.0, spacing=100.0, n=30, TI=50.0)
    >>> ll.simulate(T1=1000.0).real[[0, 10, 29]].round(4)
    array([-0.1256,  0.043 ,  0.1169])
    """

    protocol = {"flip": None, "spacing": None, "n": None, "TI": None, "TR": None}
    tissue_properties = ("T1", "M0", "B1", "inv_efficiency")
    required = ("T1",)

    def check_protocol(self, p):
        if any(p[k] is None for k in ("flip", "spacing", "n", "TI")):
            return p
        p["flip"] = _scalar("flip", p["flip"], low=0.0, unit="deg")
        p["spacing"] = _scalar("spacing", p["spacing"], low=0.0, strict=True, unit="ms")
        p["n"] = V.positive_int("n", p["n"])
        p["TI"] = _scalar("TI", p["TI"], low=0.0, unit="ms")
        if p["TR"] is not None:
            p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
            last = p["TI"] + (p["n"] - 1) * p["spacing"]
            if p["TR"] < last:
                raise ValueError(f"TR = {p['TR']:g} ms is shorter than the last pulse's time {last:g} ms")
        return p

    def signal(self, p, t):
        _need(self, p, ("flip", "spacing", "n", "TI"))
        T1 = t["T1"]
        B1 = t.get("B1", 1.0)
        eta = t.get("inv_efficiency", 1.0)
        a = B1 * np.radians(p["flip"])
        ca = np.cos(a)
        E = np.exp(-p["spacing"] / T1)
        # (1 - E) / (1 - cos a E) with 1 - E by expm1 (exact where E rounds to 1)
        u = -np.expm1(-p["spacing"] / T1)
        z_inf = u / (u + 2 * np.sin(a / 2) ** 2 * (1 - u))
        k = np.arange(p["n"])
        EI = np.exp(-p["TI"] / T1)
        if p["TR"] is None:
            z0 = 1 - (1 + eta) * EI
        else:
            # Z before the inversion maps affinely onto itself over one TR:
            # z0 = 1 + (-eta z - 1) EI; the last pulse leaves ca z_last,
            # which recovers over TR - TI - (n - 1) spacing back to z
            Er = np.exp(-(p["TR"] - p["TI"] - (p["n"] - 1) * p["spacing"]) / T1)
            q = (ca * E) ** (p["n"] - 1)
            # z_last = z_inf + (z0 - z_inf) q; z = 1 + (ca z_last - 1) Er
            #   = 1 - Er + ca Er (z_inf (1 - q) + q (1 - EI - eta EI z))
            const = 1 - Er + ca * Er * (z_inf * (1 - q) + q * (1 - EI))
            z = const / (1 + ca * Er * q * eta * EI)
            z0 = 1 - EI - eta * EI * z
        zk = z_inf + (z0 - z_inf) * (ca * E) ** k
        return t.get("M0", 1.0) * np.sin(a) * zk

    def derivatives(self, p, t, names, s):
        return _complex_step(self, p, t, names)


class MPnRAGESimulator(ClosedFormSimulator):
    """Magnetisation-prepared rapid gradient echoes with n readout blocks
    per inversion (MPRAGE: one block; MP2RAGE: two; Mugler & Brookeman
    1990, MRM 15:152; Marques et al. 2010, NeuroImage 49:1271), in the
    periodic steady state of the inversions, with ideal spoiling.

    Per repetition TR: an inversion (Z ← −η Z) at t = 0; then for each
    block i, ``n_readouts`` pulses of flip ``flip[i]`` (times B1) spaced
    ``TR_gre``, the first at ``TI[i] − (n_readouts // 2)·TR_gre``, so that
    pulse ``n_readouts // 2`` (the k-space centre) falls at ``TI[i]``; the
    longitudinal magnetisation relaxes between events and the transverse
    is spoiled after each pulse.  Sample i is the centre readout, M0 ·
    sin(B1·flip[i]) · Z just before that pulse (real: the phase of the
    played sequence's -i is removed).  The steady state is solved exactly
    (an affine map of Z over one TR and its fixed point).

    Parameters
    ----------
    TI : array_like, ms
        Inversion time of each block's centre, increasing.
    flip : float or array_like, deg
        Flip angle per block.
    TR : float, ms
        Inversion repetition time.
    TR_gre : float, ms
        Spacing of the readout pulses.
    n_readouts : int
        Pulses per block.

    Tissue: T1 (ms, required), M0, B1, inv_efficiency (η, default 1).

    Examples
    --------
    >>> from blochsim.simulators import MP2RAGESimulator
    >>> mp2 = MP2RAGESimulator(TI=[700.0, 2500.0], flip=[4.0, 5.0], TR=5000.0, TR_gre=7.0, n_readouts=160)
    >>> s = mp2.simulate(T1=[800.0, 1400.0])          # (2 voxels, 2 inversion times)
    >>> mp2.uni(s).round(3)
    array([ 0.202, -0.128])
    """

    protocol = {"TI": None, "flip": None, "TR": None, "TR_gre": None, "n_readouts": None}
    tissue_properties = ("T1", "M0", "B1", "inv_efficiency")
    required = ("T1",)
    blocks = None  # a fixed number of blocks (MPRAGE 1, MP2RAGE 2), None for any

    def check_protocol(self, p):
        if any(p[k] is None for k in ("TI", "flip", "TR", "TR_gre", "n_readouts")):
            return p
        name = type(self).__name__
        p["TI"] = np.atleast_1d(V.protocol_array("TI", p["TI"], low=0.0, unit="ms"))
        nb = len(p["TI"])
        if self.blocks is not None and nb != self.blocks:
            raise ValueError(f"{name} takes {self.blocks} inversion time(s) TI, got {nb}")
        if np.any(np.diff(p["TI"]) <= 0):
            raise ValueError(f"TI must increase from block to block, got {p['TI']!r}")
        p["flip"] = _train("flip", p["flip"], nb, low=0.0, unit="deg")
        p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
        p["TR_gre"] = _scalar("TR_gre", p["TR_gre"], low=0.0, strict=True, unit="ms")
        p["n_readouts"] = V.positive_int("n_readouts", p["n_readouts"])
        n, c = p["n_readouts"], p["n_readouts"] // 2
        starts = p["TI"] - c * p["TR_gre"]
        ends = starts + n * p["TR_gre"]
        if starts[0] < 0:
            raise ValueError(f"TI[0] = {p['TI'][0]:g} ms leaves no room for the {c} readouts before the "
                             f"centre ({c * p['TR_gre']:g} ms)")
        overlap = np.flatnonzero(starts[1:] < ends[:-1])
        if len(overlap):
            i = int(overlap[0])
            raise ValueError(f"readout blocks {i} and {i + 1} overlap: block {i} ends at {ends[i]:g} ms, "
                             f"block {i + 1} starts at {starts[i + 1]:g} ms")
        if ends[-1] > p["TR"]:
            raise ValueError(f"the last readout block ends at {ends[-1]:g} ms, after TR = {p['TR']:g} ms")
        return p

    def signal(self, p, t):
        name = type(self).__name__
        for k in ("TI", "flip", "TR", "TR_gre", "n_readouts"):
            if p[k] is None:
                raise TypeError(f"{name} needs protocol parameter {k!r}")
        T1 = t["T1"][..., 0]
        B1 = t.get("B1", np.ones(1))[..., 0]
        eta = t.get("inv_efficiency", np.ones(1))[..., 0]
        n, c, tr = p["n_readouts"], p["n_readouts"] // 2, p["TR_gre"]
        starts = p["TI"] - c * tr
        alpha = np.radians(p["flip"])

        def relax(a, b, tau):
            # compose the affine map (a, b) of Z with relaxation over tau
            E = np.exp(-tau / T1)
            return a * E, b * E + (1 - E)

        def play(a, b, record=None):
            """Compose one TR onto (a, b); record[i] = sin * Z before block
            i's centre pulse, given Z = a x + b at the start."""
            a, b = -eta * a, -eta * b
            now = 0.0
            for i, s0 in enumerate(starts):
                a, b = relax(a, b, s0 - now)
                ca = np.cos(B1 * alpha[i])
                for k in range(n):
                    if k == c and record is not None:
                        record.append((a, b, np.sin(B1 * alpha[i])))
                    a, b = relax(a * ca, b * ca, tr)
                now = s0 + n * tr
            return relax(a, b, p["TR"] - now)

        one = np.ones_like(T1 * B1 * eta)
        A, B = play(one, 0 * one)
        z = B / (1 - A)  # Z before the inversion, in the steady state
        rec = []
        play(one, 0 * one, rec)
        return t.get("M0", 1.0) * np.stack([sn * (a * z + b) for a, b, sn in rec], axis=-1)

    def derivatives(self, p, t, names, s):
        return _complex_step(self, p, t, names)

    @staticmethod
    def uni(s):
        """The uniform (M0- and receive-free) MP2RAGE image
        Re(conj(S1) S2) / (|S1|² + |S2|²), in [−0.5, 0.5] (Marques et al.
        2010).

        Parameters
        ----------
        s : array_like, complex, shape (..., 2)
            The two blocks' signals.

        Returns
        -------
        numpy.ndarray, shape (...)
        """
        s = np.asarray(s)
        if s.shape[-1] != 2:
            raise ValueError(f"uni needs two inversion times along the last axis, got shape {s.shape}")
        s1, s2 = s[..., 0], s[..., 1]
        return np.real(np.conj(s1) * s2) / (np.abs(s1) ** 2 + np.abs(s2) ** 2)


class MPRAGESimulator(MPnRAGESimulator):
    """:class:`MPnRAGESimulator` with one readout block (MPRAGE; Mugler &
    Brookeman 1990): ``TI`` one inversion time (ms)."""

    blocks = 1


class MP2RAGESimulator(MPnRAGESimulator):
    """:class:`MPnRAGESimulator` with two readout blocks (MP2RAGE; Marques et
    al. 2010): ``TI`` two inversion times, ``flip`` one or two angles;
    :meth:`uni` combines the two images."""

    blocks = 2


class CESTSimulator(Simulator):
    """CEST Z-spectrum: a train of saturation pulses (rectangular, or of a
    given shape) at each offset, then the liquid pools' longitudinal
    magnetisation read by a 90° pulse after a spoiler (returned as M0·Z, real
    up to round-off).

    Every pulse is played exactly (:class:`blochsim.RectPulse`: the
    Bloch–McConnell equations with the RF field, per voxel; a shaped pulse
    as one RectPulse per sample of its shape).  All offsets run
    in one call: each (voxel, offset) is one problem, played in the frame of
    its saturation pulse, where every pool is off resonance by B0 + shift -
    offset; the pulses of a train are phase-coherent with one oscillator at
    the offset, and the readout, after the spoiler, does not depend on the
    frame.

    Parameters
    ----------
    offsets : array_like, ppm, shape (n_offsets,)
        Saturation frequencies relative to water.
    field_strength : float, T, optional
        B0 field (default 3.0); one ppm is 42.577 Hz/T times it.
    B1sat : float, µT, optional
        Root-mean-square amplitude of each saturation pulse over its
        duration (default 1.0): the amplitude of a rectangular pulse, the
        continuous-wave power equivalent of a shaped one.
    n_pulses : int, optional
        Pulses in the train (default 1).
    pulse_duration : float, ms, optional
        Duration of each pulse (default 100).
    pulse_delay : float, ms, optional
        Free evolution between pulses (default 0: continuous wave for one
        pulse).
    spoil_between : bool, optional
        Spoil the transverse magnetisation after each pulse of the train
        (default True, as pulsed CEST sequences do).
    normalize : bool, optional
        Report Z as the field does (default True): the sample after
        saturation over the sample of the same acquisition without it (the
        same sequence at B1sat = 0, per voxel), so Z -> 1 far from every
        resonance and M0 cancels.  False: the liquid pools' Mz, times M0
        (far off resonance 1 - bound_fraction), as read by a 90° pulse that
        B1 scales like every other (so times sin(90° B1)).
    pulse_shape : array_like, shape (n_samples,), optional
        The pulse's envelope sampled evenly over its duration (any unit,
        real or complex: a complex sample's angle is its RF phase), scaled
        to B1sat root-mean-square; each sample is played as a rectangular
        segment of duration pulse_duration / n_samples.  None (default):
        rectangular.
    states, repetitions, lineshape, device, threads
        See :class:`blochsim.Simulator` (``repetitions`` plays the whole
        saturation-readout block again, for a steady state).

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), and the pools (``poolB_*`` with
    ``poolB_shift`` in Hz: shift_ppm × 42.577 × field_strength; ``bound_*``).

    Returns
    -------
    complex64, shape (*voxels, n_offsets)
    """

    protocol = {"offsets": None, "field_strength": 3.0, "B1sat": 1.0, "n_pulses": 1, "pulse_duration": 100.0,
                "pulse_delay": 0.0, "spoil_between": True, "pulse_shape": None, "normalize": True}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0")

    def check_protocol(self, p):
        if p["offsets"] is None:
            return p
        p["offsets"] = np.atleast_1d(V.protocol_array("offsets", p["offsets"]))
        p["field_strength"] = float(V.protocol_array("field_strength", p["field_strength"], low=0.0, strict=True,
                                                     unit="T", ndim_max=0))
        far = np.abs(p["offsets"]) * self.hz_per_ppm(p) > _MAX_OFFSET_HZ
        if np.any(far):
            raise ValueError(f"offsets must be within +-{_MAX_OFFSET_HZ:g} Hz of water ("
                             f"{_MAX_OFFSET_HZ / self.hz_per_ppm(p):g} ppm at {p['field_strength']:g} T; single "
                             f"precision carries no more), got {p['offsets'][np.argmax(far)]:g} ppm")
        p["B1sat"] = _scalar("B1sat", p["B1sat"], low=0.0, unit="uT")
        p["n_pulses"] = V.positive_int("n_pulses", p["n_pulses"])
        p["pulse_duration"] = float(V.protocol_array("pulse_duration", p["pulse_duration"], low=0.0, strict=True,
                                                     unit="ms", ndim_max=0))
        p["pulse_delay"] = _scalar("pulse_delay", p["pulse_delay"], low=0.0, unit="ms")
        for k in ("spoil_between", "normalize"):
            if not isinstance(p[k], (bool, np.bool_)):
                raise TypeError(f"{k} must be True or False, got {p[k]!r}")
        if p["pulse_shape"] is not None:
            b = np.asarray(p["pulse_shape"])
            if b.dtype.kind not in "fiuc" or b.ndim != 1 or b.size == 0:
                raise ValueError(f"pulse_shape must be a non-empty 1-D array of numbers, got "
                                 f"{b.dtype} of shape {b.shape}")
            if not np.all(np.isfinite(b)) or not np.any(b != 0):
                raise ValueError("pulse_shape must be finite and not zero everywhere")
            p["pulse_shape"] = b.astype(np.complex128 if b.dtype.kind == "c" else np.float64)
        return p

    def hz_per_ppm(self, p):
        """One ppm in Hz at the field strength of ``p`` (a protocol dict,
        as :meth:`repetition` gets it).

        Returns
        -------
        float, Hz
        """
        return p["field_strength"] * GAMMA_RAD_PER_S_PER_T / (2 * np.pi) * 1e-6

    def offsets_hz(self, p):
        """The saturation offsets of ``p`` (a protocol dict) in Hz.

        Returns
        -------
        numpy.ndarray, Hz, shape (offsets,)
        """
        return p["offsets"] * self.hz_per_ppm(p)

    def repetition(self, p):
        # the flip of a rectangle: gamma B1sat duration (degrees)
        flip = (GAMMA_RAD_PER_S_PER_T * 1e-9 * 180.0 / np.pi) * p["B1sat"] * p["pulse_duration"]
        if p["pulse_shape"] is None:
            pulse = [RectPulse(flip, p["pulse_duration"])]
        else:
            # one segment per sample, the samples scaled to B1sat rms
            b = p["pulse_shape"]
            if b.dtype == object:
                raise TypeError("CESTSimulator cannot differentiate with respect to 'pulse_shape'")
            rel = np.abs(b) / np.sqrt(np.mean(np.abs(b) ** 2)) / b.size
            phase = np.degrees(np.angle(b))
            pulse = [RectPulse(flip * float(r), p["pulse_duration"] / b.size, phase=float(ph))
                     for r, ph in zip(rel, phase)]
        ops = []
        for i in range(p["n_pulses"]):
            if i > 0 and p["pulse_delay"] > 0:
                ops.append(Delay(p["pulse_delay"]))
            ops.extend(pulse)
            if p["spoil_between"] and i + 1 < p["n_pulses"]:
                ops.append(Spoil())
        # F+ = -i Z after the 90° pulse; the receiver at -90° returns Z
        return Readout(-90.0) @ Pulse(90.0) @ Spoil() @ Sequence(ops)

    def _expanded(self, values):
        """Tissue values with a trailing offsets axis (B0 shifted by -offset)
        and the protocol of the call."""
        proto = {k: v for k, v in values.items() if k in self._defaults}
        tissue = {k: v for k, v in values.items() if k not in self._defaults}
        self._check_names(proto)
        p = self._protocol_values(proto)
        if p["offsets"] is None:
            raise TypeError("CESTSimulator needs protocol parameter 'offsets'")
        df = self.offsets_hz(p)
        out = dict(proto)
        for k, v in tissue.items():
            if V.is_device_array(v):
                raise ValueError(f"CESTSimulator takes NumPy tissue arrays (it adds an offsets axis to them); {k} "
                                 f"is a device array (device='cuda' with NumPy arrays runs on the GPU)")
            if k in self.tissue_properties:
                v = V.tissue_array(k, v)[..., None]
            out[k] = v
        b0 = out.get("B0", np.zeros(1))
        out["B0"] = np.asarray(b0) - df
        return out, p

    def _reference_values(self, values):
        """The call's values for the acquisition without saturation: B1sat
        0 at one offset."""
        return {**values, "B1sat": 0.0, "offsets": np.zeros(1)}

    def _normalizes(self, values):
        """Whether the call returns Z; refuses tissue whose unsaturated
        reference reads nothing (Z would be 0/0): M0 = 0, or a B1 at which
        the readout's 90° (scaled by B1) tips nothing, sin(90° B1) ~ 0."""
        if not self._protocol_values({k: v for k, v in values.items() if k in self._defaults})["normalize"]:
            return False
        for name, silent in (("M0", lambda a: a == 0),
                             ("B1", lambda a: np.abs(np.sin(np.pi / 2 * a)) < 1e-3)):
            if name in values and not V.is_device_array(values[name]):
                a = np.asarray(V.tissue_array(name, values[name]), dtype=np.float64)
                if np.any(silent(a)):
                    raise ValueError(f"{name} = {a[silent(a)].flat[0]:g} reads no signal without saturation, so "
                                     "Z = M_sat / M_0 (normalize=True) is 0/0; use normalize=False for the raw "
                                     "liquid Mz")
        return True

    def simulate(self, out=None, **values):
        """The Z-spectrum, complex64, shape (*voxels, n_offsets); see the class."""
        if out is not None:
            raise TypeError("CESTSimulator.simulate does not take out=")
        normalize = self._normalizes(values)
        expanded, _ = self._expanded(values)
        s = super().simulate(**expanded)[..., 0]
        if not normalize:
            return s
        ref, _ = self._expanded(self._reference_values(values))
        return (s / super().simulate(**ref)[..., 0]).astype(np.complex64)

    def jacobian(self, diff, order=1, out=None, **values):
        """Z-spectrum and its tissue Jacobian, as :meth:`Simulator.jacobian`:
        J (*voxels, len(diff), n_offsets), or (*voxels, n_offsets) for one name."""
        if out is not None:
            raise TypeError("CESTSimulator.jacobian does not take out=")
        names = (diff,) if isinstance(diff, str) else tuple(diff)
        if "B0" in names and "B0" not in values:
            raise ValueError("jacobian with respect to 'B0' needs B0 passed as a tissue value")

        def spectrum(vals):
            expanded, _ = self._expanded(vals)
            signal, J = Simulator.jacobian(self, names, order, **expanded)
            return signal[..., 0], np.moveaxis(J[..., 0], -1, -2)  # (*voxels, n), (*voxels, names, n)

        normalize = self._normalizes(values)
        s, J = spectrum(values)
        if normalize:
            r, Jr = spectrum(self._reference_values(values))  # (*voxels, 1), (*voxels, names, 1)
            J = J / r[..., None, :] - (s / r ** 2)[..., None, :] * Jr
            s = s / r
        s, J = s.astype(np.complex64), J.astype(np.complex64)
        return s, (J[..., 0, :] if isinstance(diff, str) else J)

    def vjp(self, wrt, **values):
        """Z-spectrum and its pullback, as :meth:`Simulator.vjp`: gradients
        with respect to the protocol (``B1sat`` per µT, ``pulse_duration``
        and ``pulse_delay`` per ms, ``offsets`` per ppm, each shaped like the
        parameter) and to the tissue (shaped as passed).  With ``normalize``
        the reference acquisition (no saturation) contributes through the
        timing and the tissue."""
        names = (wrt,) if isinstance(wrt, str) else tuple(wrt)
        if any(not isinstance(k, str) for k in names):
            raise TypeError(f"wrt names parameters by str, got {list(names)!r}")
        if "B0" in names and "B0" not in values:
            raise ValueError("vjp with respect to 'B0' needs B0 passed as a tissue value")
        if len(set(names)) != len(names):
            raise ValueError(f"wrt names a parameter twice: {list(names)}")
        normalize = self._normalizes(values)
        s, pull_s = self._vjp_spectrum(names, values)
        if not normalize:
            return s, pull_s
        # the reference does not depend on the saturation's amplitude or offsets
        ref_names = tuple(k for k in names if k not in ("B1sat", "offsets"))
        if ref_names:
            r, pull_r = self._vjp_spectrum(ref_names, self._reference_values(values))
        else:
            expanded, _ = self._expanded(self._reference_values(values))
            r = Simulator.simulate(self, **expanded)[..., 0]
        z = s / r

        def pullback(cotangent):
            g = _cotangent(cotangent, s.shape, dtype=np.complex128)
            out = pull_s(g / np.conj(r))
            if ref_names:
                gr = pull_r(np.sum(-g * np.conj(z / r), axis=-1, keepdims=True))
                for k in ref_names:
                    out[k] = np.asarray(out[k]) + np.asarray(gr[k])
            return out

        return z.astype(np.complex64), pullback

    def _vjp_spectrum(self, names, values):
        """The unnormalised spectrum and its pullback."""
        expanded, p = self._expanded(values)
        # the offsets move each problem's B0 (B0 - offset): their gradient is
        # -(Hz per ppm) times B0's, summed over the voxels
        inner = tuple(k for k in names if k != "offsets")
        if "offsets" in names and "B0" not in inner:
            inner = inner + ("B0",)
        signal, inner_pullback = Simulator.vjp(self, inner, **expanded)
        b0_shape = np.shape(values["B0"]) if "B0" in values else None
        hz_per_ppm = self.hz_per_ppm(p)

        def pullback(cotangent):
            cot = _cotangent(cotangent, signal.shape[:-1], dtype=np.complex128)
            g = inner_pullback(cot[..., None])
            out = {}
            for k in names:
                if k == "offsets":
                    gb = np.asarray(g["B0"])
                    out[k] = -hz_per_ppm * gb.reshape(-1, gb.shape[-1]).sum(axis=0)
                elif k == "B0":
                    out[k] = np.asarray(g["B0"]).sum(axis=-1).reshape(b0_shape)
                elif k in self.tissue_properties:
                    out[k] = np.asarray(g[k])[..., 0]
                else:
                    out[k] = g[k]
            return out

        return signal[..., 0], pullback


class MTSimulator(Simulator):
    """Magnetisation-transfer-weighted spoiled gradient echo: per TR an
    off-resonance MT pulse, played exactly (:class:`blochsim.RectPulse`),
    then the excitation, sampled right after it, and ideal spoiling; the
    last of ``n_tr`` TRs is returned (multiplied by i, so it is real).

    Parameters
    ----------
    flip : float, degrees
        Excitation flip angle.
    TR : float, ms
        Repetition time (holds the MT pulse).
    mt_flip : float, degrees, optional
        Flip angle of the MT pulse, gamma B1 times its duration (default
        500; 0 gives the reference without MT).
    mt_duration : float, ms, optional
        Duration of the MT pulse (default 8).
    mt_offset : float, Hz, optional
        Frequency of the MT pulse relative to water (default 1500).
    exc_duration : float, ms, optional
        Duration of the excitation, through which it saturates the
        semisolid pool too (default 0: no saturation by the excitation).
    n_tr : int, optional
        TRs played (default 300), enough to reach the steady state at
        common T1 and TR.
    states, lineshape, device, threads
        See :class:`blochsim.Simulator`.

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz) and the pools (``bound_*``,
    ``poolB_*``, ...).

    Returns
    -------
    complex64, shape (*voxels, 1)
    """

    protocol = {"flip": None, "TR": None, "mt_flip": 500.0, "mt_duration": 8.0, "mt_offset": 1500.0,
                "exc_duration": 0.0, "n_tr": 300}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0")

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None:
            return p
        for k, low, strict, unit in (("flip", None, False, "deg"), ("TR", 0.0, True, "ms"),
                                     ("mt_flip", 0.0, False, "deg"), ("mt_duration", 0.0, True, "ms"),
                                     ("mt_offset", None, False, "Hz"), ("exc_duration", 0.0, False, "ms")):
            p[k] = float(V.protocol_array(k, p[k], low=low, strict=strict, unit=unit, ndim_max=0))
        p["n_tr"] = V.positive_int("n_tr", p["n_tr"])
        if p["mt_flip"] > 0 and p["mt_duration"] >= p["TR"]:
            raise ValueError(f"mt_duration must be < TR = {p['TR']:g} ms, got {p['mt_duration']:g}")
        if p["repetitions"] != 1:
            raise ValueError(f"MTSimulator plays n_tr TRs and records the last: repetitions must be 1, got "
                             f"{p['repetitions']!r} (raise n_tr to approach the steady state)")
        return p

    def repetition(self, p):
        _need(self, p, ("flip", "TR"))
        return Sequence(self._tr(p)[:2])

    def preparation(self, p):
        # the TRs before the last, whose samples are not recorded
        return Sequence(self._tr(p) * (p["n_tr"] - 1)) if p["n_tr"] > 1 else None

    def _tr(self, p):
        """One TR: excitation, sample, spoiler, the rest of TR, the MT pulse
        and its spoiler."""
        mt = p["mt_flip"] > 0
        one = [Pulse(p["flip"], duration=p["exc_duration"]), Readout(-90.0), Spoil(),
               Delay(p["TR"] - (p["mt_duration"] if mt else 0.0))]
        if mt:
            one += [RectPulse(p["mt_flip"], p["mt_duration"], offset=p["mt_offset"]), Spoil()]
        return one


# --------------------------------------------------------------------------
# Function forms

def _function_form(cls, name):
    def f(**kwargs):
        proto = {k: v for k, v in kwargs.items() if k in cls._common or k in cls.protocol
                 or k in ("device", "threads")}
        rest = {k: v for k, v in kwargs.items() if k not in proto and k not in ("diff", "order")}
        if "diff" in kwargs:
            return cls(**proto).jacobian(kwargs["diff"], kwargs.get("order", 1), **rest)
        return cls(**proto).simulate(**rest)

    f.__name__ = name
    f.__qualname__ = name
    f.__doc__ = (f"Function form of :class:`{cls.__name__}`: protocol and tissue as keywords.\n\n"
                 f"``{name}(**kw)`` is ``{cls.__name__}(**protocol).simulate(**tissue)``; see the class "
                 f"for the parameters, units and the returned array.  With ``diff=`` (a tissue "
                 f"property or a sequence of them) it returns ``(signal, J)``, as "
                 f":meth:`{cls.__name__}.jacobian`.\n")
    return f


fse_sim = _function_form(FSESimulator, "fse_sim")
mrf_sim = _function_form(MRFSimulator, "mrf_sim")
spgr_sim = _function_form(SPGRSimulator, "spgr_sim")
bssfp_sim = _function_form(bSSFPSimulator, "bssfp_sim")
truefisp_sim = _function_form(TrueFISPSimulator, "truefisp_sim")
ir_sim = _function_form(InversionRecoverySimulator, "ir_sim")
se_sim = _function_form(SpinEchoSimulator, "se_sim")
ste_sim = _function_form(StimulatedEchoSimulator, "ste_sim")
cest_sim = _function_form(CESTSimulator, "cest_sim")
mt_sim = _function_form(MTSimulator, "mt_sim")
mpnrage_sim = _function_form(MPnRAGESimulator, "mpnrage_sim")
mprage_sim = _function_form(MPRAGESimulator, "mprage_sim")
mp2rage_sim = _function_form(MP2RAGESimulator, "mp2rage_sim")
ll_sim = _function_form(LookLockerSimulator, "ll_sim")
flash_sim = _function_form(FLASHSimulator, "flash_sim")
dwi_sim = _function_form(DiffusionSimulator, "dwi_sim")
irbssfp_sim = _function_form(IRbSSFPSimulator, "irbssfp_sim")
dess_sim = _function_form(DESSSimulator, "dess_sim")
hyperecho_sim = _function_form(HyperechoSimulator, "hyperecho_sim")
fmssfp_sim = _function_form(fmSSFPSimulator, "fmssfp_sim")
waterfat_sim = _function_form(WaterFatSimulator, "waterfat_sim")
doubleangle_sim = _function_form(DoubleAngleSimulator, "doubleangle_sim")
asl_sim = _function_form(ASLSimulator, "asl_sim")
hsfp_sim = _function_form(HSFPSimulator, "hsfp_sim")
molli_sim = _function_form(MOLLISimulator, "molli_sim")
megre_sim = _function_form(MultiEchoGRESimulator, "megre_sim")
mese_sim = _function_form(MultiEchoSESimulator, "mese_sim")
dti_sim = _function_form(DiffusionTensorSimulator, "dti_sim")
despot1_sim = _function_form(DESPOT1Simulator, "despot1_sim")
despot2_sim = _function_form(DESPOT2Simulator, "despot2_sim")
