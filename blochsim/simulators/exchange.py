"""Exchange: CEST saturation spectra and magnetisation transfer."""
from __future__ import annotations

import numpy as np

from blochsim._arrays import validate as V
from blochsim.sequence import GAMMA_RAD_PER_S_PER_T, Delay, Pulse, Readout, RectPulse, Sequence, Spoil
from blochsim._engine import reverse as _reverse
from blochsim.simulator import Simulator
from blochsim.simulators._common import _function_form, _need, _scalar

__all__ = ["CESTSimulator", "MTSimulator", "cest_sim", "mt_sim"]


#: largest RF offset from water the saturation kernels take, Hz (phases in single precision)
_MAX_OFFSET_HZ = 1e7


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
            g = _reverse.cotangent(cotangent, s.shape, dtype=np.complex128)
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
            cot = _reverse.cotangent(cotangent, signal.shape[:-1], dtype=np.complex128)
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
    mt_mode : {"single", "dual"}, optional
        ``"single"`` (default): the MT pulse at ``mt_offset``.  ``"dual"``:
        the same pulse (same amplitude and energy) in ``mt_segments`` equal
        parts alternating between +``mt_offset`` and -``mt_offset``, each
        played exactly, the RF phase continuous across them: the
        frequency-alternating dual saturation of inhomogeneous MT (ihMT;
        Varma et al. 2015, MRM 73:614), where a semisolid pool with dipolar
        order (``bound_T1D``) is saturated more than by the single pulse.
    mt_segments : int, optional
        Parts of a dual MT pulse (default 8, even), each a whole number of
        cycles of ``mt_offset`` (else the alternating pulse carries a
        component at the water resonance, and is refused).
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
                "exc_duration": 0.0, "n_tr": 300, "mt_mode": "single", "mt_segments": 8}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0")

    def check_protocol(self, p):
        if p["flip"] is None or p["TR"] is None:
            return p
        for k, low, strict, unit in (("flip", None, False, "deg"), ("TR", 0.0, True, "ms"),
                                     ("mt_flip", 0.0, False, "deg"), ("mt_duration", 0.0, True, "ms"),
                                     ("mt_offset", None, False, "Hz"), ("exc_duration", 0.0, False, "ms")):
            p[k] = float(V.protocol_array(k, p[k], low=low, strict=strict, unit=unit, ndim_max=0))
        p["n_tr"] = V.positive_int("n_tr", p["n_tr"])
        if p["mt_mode"] not in ("single", "dual"):
            raise ValueError(f"mt_mode must be 'single' or 'dual', got {p['mt_mode']!r}")
        p["mt_segments"] = V.positive_int("mt_segments", p["mt_segments"])
        if p["mt_segments"] % 2:
            raise ValueError(f"mt_segments must be even (as many parts at +mt_offset as at -mt_offset), got "
                             f"{p['mt_segments']}")
        cycles = p["mt_offset"] * p["mt_duration"] * 1e-3 / p["mt_segments"]
        if p["mt_mode"] == "dual" and p["mt_flip"] > 0 and abs(cycles - round(cycles)) > 1e-6:
            raise ValueError(f"a dual MT pulse's part ({p['mt_duration'] / p['mt_segments']:g} ms at mt_offset = "
                             f"{p['mt_offset']:g} Hz) must hold whole cycles of the offset, got {cycles:g}: the "
                             f"alternating pulse would carry a component at the water resonance; choose "
                             f"mt_segments, mt_duration or mt_offset to make it whole")
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
        if mt and p["mt_mode"] == "single":
            one += [RectPulse(p["mt_flip"], p["mt_duration"], offset=p["mt_offset"]), Spoil()]
        elif mt:
            n = p["mt_segments"]
            part, phase = p["mt_duration"] / n, 0.0
            for k in range(n):
                offset = p["mt_offset"] * (1 - 2 * (k % 2))
                one.append(RectPulse(p["mt_flip"] / n, part, phase=phase % 360.0, offset=offset))
                phase += 360.0 * offset * part * 1e-3
            one.append(Spoil())
        return one


cest_sim = _function_form(CESTSimulator, "cest_sim")
mt_sim = _function_form(MTSimulator, "mt_sim")
