"""Balanced and unbalanced steady states: TrueFISP, bSSFP and its closed form,
DESS, frequency-modulated and hybrid SSFP, DESPOT2."""
from __future__ import annotations

import numpy as np

from blochsim._arrays import validate as V
from blochsim.sequence import Delay, Dephase, Inversion, Pulse, Readout, Sequence
from blochsim.simulator import ClosedFormSimulator, Simulator
from blochsim.simulators._common import (_contrasts, _echo_within, _function_form, _need, _relaxes, _scalar,
                                         _te_of, _train)
from blochsim.simulators.gradient_echo import DESPOT1Simulator, _despot_axes, _despot_line

__all__ = ["DESPOT2Simulator", "DESSSimulator", "HSFPSimulator", "IRbSSFPSimulator", "TrueFISPSimulator",
           "bSSFPSimulator", "bssfp_sim", "despot2_sim", "dess_sim", "fmSSFPSimulator", "fmssfp_sim", "hsfp_sim",
           "irbssfp_sim", "truefisp_sim"]


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


bssfp_sim = _function_form(bSSFPSimulator, "bssfp_sim")
truefisp_sim = _function_form(TrueFISPSimulator, "truefisp_sim")
irbssfp_sim = _function_form(IRbSSFPSimulator, "irbssfp_sim")
dess_sim = _function_form(DESSSimulator, "dess_sim")
fmssfp_sim = _function_form(fmSSFPSimulator, "fmssfp_sim")
hsfp_sim = _function_form(HSFPSimulator, "hsfp_sim")
despot2_sim = _function_form(DESPOT2Simulator, "despot2_sim")
