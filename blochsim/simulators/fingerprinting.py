"""MR fingerprinting."""
from __future__ import annotations


from blochsim.sequence import Delay, Dephase, Inversion, Pulse, Readout, Sequence
from blochsim.simulator import Simulator
from blochsim.simulators._common import _function_form, _need, _scalar, _train

__all__ = ["MRFSimulator", "mrf_sim"]


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


mrf_sim = _function_form(MRFSimulator, "mrf_sim")
