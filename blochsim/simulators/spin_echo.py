"""Spin-echo simulators: fast spin echo and its variants, stimulated echoes,
the spin-echo closed form."""
from __future__ import annotations

import numpy as np

from blochsim._arrays import validate as V
from blochsim.sequence import Delay, Dephase, Excitation, Pulse, Readout, Refocusing, Sequence, Spoil
from blochsim.simulator import ClosedFormSimulator, Simulator
from blochsim.simulators._common import _function_form, _need, _scalar, _train

__all__ = ["FSESimulator", "HyperechoSimulator", "MultiEchoSESimulator", "SpinEchoSimulator",
           "StimulatedEchoSimulator", "fse_sim", "hyperecho_sim", "mese_sim", "se_sim", "ste_sim"]


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


fse_sim = _function_form(FSESimulator, "fse_sim")
se_sim = _function_form(SpinEchoSimulator, "se_sim")
ste_sim = _function_form(StimulatedEchoSimulator, "ste_sim")
hyperecho_sim = _function_form(HyperechoSimulator, "hyperecho_sim")
mese_sim = _function_form(MultiEchoSESimulator, "mese_sim")
