"""MR fingerprinting: the FISP train and the balanced (bSSFP) train."""
from __future__ import annotations

import numpy as np

from blochsim.sequence import Delay, Dephase, Inversion, Pulse, Readout, Sequence
from blochsim.simulator import Simulator
from blochsim.simulators._common import _function_form, _need, _scalar, _train

__all__ = ["MRFSimulator", "mrf_sim"]

KINDS = ("fisp", "bssfp")


class MRFSimulator(Simulator):
    """MR fingerprinting train (SPEC §9 reference workload), FISP or bSSFP.

    An inversion, ``TI``, then one pulse per TR, each sampled ``TE`` after
    it.  ``kind="fisp"`` (Jiang et al. 2015, MRM 74:1621) closes every TR
    with one unbalanced gradient (one order of dephasing), so that B0 only
    turns the phase of what each TR carries over; ``kind="bssfp"`` (Ma et
    al. 2013, Nature 495:187) is balanced, so that B0 shapes the signal
    (the off-resonance response is part of the fingerprint) and the
    receiver follows each pulse's phase.  The samples are multiplied by i,
    so that a phase-0 train on resonance is real.

    Parameters
    ----------
    flip : array_like, degrees, shape (n_TR,)
        Flip angle per TR.
    TR : float or array_like, ms
        Repetition time, scalar or one per TR.
    TI : float, ms, optional
        Inversion time before the first pulse (default 0).
    phases : float or array_like, degrees, optional
        RF phase per TR.  Default 0 for FISP; 0°, 180°, 0°, ... for bSSFP
        (its usual alternation, which puts the on-resonance signal at the
        centre of the pass band).
    TE : float or array_like, ms, optional
        Echo time per TR, at most that TR.  Default 0 for FISP (the sample
        right after the pulse) and TR/2 for bSSFP.
    kind : {"fisp", "bssfp"}
        The train (default ``"fisp"``).
    states, repetitions, device, threads
        See :class:`blochsim.Simulator`.

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), inv_efficiency, D (µm²/ms), v (m/s;
    D and v need the geometry), and pools (see the README).

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import MRFSimulator
    >>> flips = 10 + 50 * np.sin(np.linspace(0, np.pi, 400))
    >>> TR = 10 + 2 * np.sin(np.linspace(0, 6 * np.pi, 400))
    >>> MRFSimulator(flip=flips, TR=TR, kind="bssfp").simulate(
    ...     T1=1000.0, T2=80.0, B0=np.array([0.0, 20.0])).shape
    (2, 400)
    """

    protocol = {"flip": None, "TR": None, "TI": 0.0, "phases": None, "TE": None, "kind": "fisp"}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "inv_efficiency", "D", "v")

    def check_protocol(self, p):
        if p["kind"] not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {p['kind']!r}")
        if p["flip"] is None or p["TR"] is None:
            return p
        flip = _train("flip", p["flip"])
        n = flip.shape[0]
        p["flip"] = flip
        p["TR"] = _train("TR", p["TR"], n, low=0.0, strict=True, unit="ms")
        if p["phases"] is None:
            p["phases"] = 180.0 * (np.arange(n) % 2) if p["kind"] == "bssfp" else 0.0
        p["phases"] = _train("phases", p["phases"], n)
        p["_TE_is_default"] = p["TE"] is None
        if p["TE"] is None:
            p["TE"] = p["TR"] / 2.0 if p["kind"] == "bssfp" else 0.0
        p["TE"] = _train("TE", p["TE"], n, low=0.0, unit="ms")
        past = np.flatnonzero(p["TE"] > p["TR"])
        if past.size:
            i = past[0]
            raise ValueError(f"TE[{i}] = {p['TE'][i]:g} ms must be at most TR[{i}] = {p['TR'][i]:g} ms")
        p["TI"] = _scalar("TI", p["TI"], low=0.0, unit="ms")
        return p

    def repetition(self, p):
        _need(self, p, ("flip", "TR"))
        ops = [Inversion(), Delay(p["TI"])]
        default_te = p.get("_TE_is_default", False)
        if p["kind"] == "bssfp":
            for f, tr, ph, te in zip(p["flip"], p["TR"], p["phases"], p["TE"]):
                # a default TE follows its TR (TR's gradient then carries TE's share)
                te = 0.5 * tr if default_te else te
                ops += [Pulse(f, ph), Delay(te), Readout(ph - 90.0), Delay(tr - te)]
        elif default_te:
            for f, tr, ph in zip(p["flip"], p["TR"], p["phases"]):
                ops += [Pulse(f, ph), Readout(-90.0), Dephase(), Delay(tr)]
        else:
            for f, tr, ph, te in zip(p["flip"], p["TR"], p["phases"], p["TE"]):
                ops += [Pulse(f, ph), Delay(te), Readout(-90.0), Dephase(), Delay(tr - te)]
        return Sequence(ops)


mrf_sim = _function_form(MRFSimulator, "mrf_sim")
