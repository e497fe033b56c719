"""Inversion and saturation preparations: inversion recovery, Look-Locker,
MOLLI, MPRAGE and MP2RAGE."""
from __future__ import annotations

import numpy as np

from blochsim._arrays import validate as V
from blochsim.sequence import Delay, Inversion, Pulse, Readout, Sequence, Spoil
from blochsim.simulator import ClosedFormSimulator, Simulator
from blochsim.simulators._common import _complex_step, _function_form, _need, _scalar, _train

__all__ = ["InversionRecoverySimulator", "LookLockerSimulator", "MOLLISimulator", "MP2RAGESimulator",
           "MPRAGESimulator", "MPnRAGESimulator", "ir_sim", "ll_sim", "molli_sim", "mp2rage_sim", "mpnrage_sim",
           "mprage_sim"]


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
        Re(conj(S1) S2) / (abs(S1)² + abs(S2)²), in [−0.5, 0.5] (Marques et al.
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


ir_sim = _function_form(InversionRecoverySimulator, "ir_sim")
mpnrage_sim = _function_form(MPnRAGESimulator, "mpnrage_sim")
mprage_sim = _function_form(MPRAGESimulator, "mprage_sim")
mp2rage_sim = _function_form(MP2RAGESimulator, "mp2rage_sim")
ll_sim = _function_form(LookLockerSimulator, "ll_sim")
molli_sim = _function_form(MOLLISimulator, "molli_sim")
