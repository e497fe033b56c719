"""Simulators of Pulseq files: :class:`PulseqSimulator` (any sequence file)
and :class:`PulseqCESTSimulator` (the pulseq-cest community's saturation
files)."""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from blochsim._arrays import validate as V
from blochsim._protocol import _lazy_entry, checked_key
from blochsim.pulseq.file import PulseqError, _File
from blochsim.pulseq.reader import _field_strength, _read, _Reader
from blochsim.sequence import Delay, Pulse, Readout, Sequence, Spoil, pack
from blochsim.pulseq.writer import write_pulseq
from blochsim.simulator import FILE_SIMULATORS, FILE_WRITERS, Simulator

_CACHE = {}


class PulseqSimulator(Simulator):
    """A Pulseq file played through the EPG engine: one sample per ADC
    event (:func:`read_pulseq`; :meth:`Simulator.from_pulseq` builds it).

    Parameters
    ----------
    path : str or os.PathLike
    rf : {"auto", "hard", "shaped"}, optional
    dephasing : {"moment", "spoil"} or callable, optional
    axis : {"x", "y", "z"} or array_like, optional
    unit : float, cycles/m, optional
    field_strength : float, T, optional
        See :func:`read_pulseq`.
    voxel_size_m : float, m, optional
        Sets the tolerance of the moments' unit and, with it, the crusher
        geometry for D and v (``crusher_dephasing_rad`` = 2π · abs(unit) · voxel).
    frame : {"spec", "pulseq"}, optional
        The receiver frame of the samples: SPEC's (default; spins at B0 > 0
        turn by -2π B0 t, RF phases right-handed) or the Pulseq format's
        (``"pulseq"``: their complex conjugate, as pypulseq-based
        simulators and reconstructions take them).  The Jacobian is
        conjugated with the samples, and ``vjp`` takes cotangents of the
        samples as returned; ``jacobian_vjp`` refuses ``"pulseq"``.
    states, repetitions, crusher_dephasing_rad, device, threads, ...
        See :class:`blochsim.Simulator`.

    Tissue: every property of :class:`blochsim.Simulator`.
    """

    protocol = {"path": None, "rf": "auto", "dephasing": "moment", "axis": None, "unit": None,
                "field_strength": None, "frame": "spec"}

    def check_protocol(self, p):
        if not isinstance(p["frame"], str) or p["frame"] not in ("spec", "pulseq"):
            raise ValueError(f"frame must be 'spec' or 'pulseq', got {p['frame']!r}")
        if p["path"] is None:
            return p
        path = os.fspath(p["path"])
        p["_sequence"], unit_vector = _read_cached(p, p["dephasing"])
        if np.any(np.isnan(unit_vector)):
            if p["crusher_dephasing_rad"] is not None:
                raise ValueError(f"{path}: its gradient moments dephase along independent axes, kept apart on one "
                                 "EPG order by a map that has no wavenumber per order: crusher_dephasing_rad (for D "
                                 "and v) cannot be given; read it with axis= to follow one direction")
        elif p["voxel_size_m"] is not None and p["crusher_dephasing_rad"] is None and np.any(unit_vector):
            p["crusher_dephasing_rad"] = 2 * np.pi * float(np.linalg.norm(unit_vector)) * p["voxel_size_m"]
        return p

    def repetition(self, p):
        if p["path"] is None:
            raise TypeError("PulseqSimulator needs path, the Pulseq file")
        return p["_sequence"]

    def _keyed_alternative(self, p):
        # the file read keyed by moment, where the default put it on one order
        if p["path"] is None or p["dephasing"] != "moment" or p["axis"] is not None or p["unit"] is not None:
            return None
        key = checked_key(p)
        hit = getattr(self, "_keyed_cache", None)
        if hit is None or hit[0] != key:
            sequence = _read_cached(p, "keyed")[0]
            hit = self._keyed_cache = (key, pack(self.preparation(p), sequence, p["repetitions"]))
        return hit[1]


def _read_cached(p, dephasing):
    """The operators and unit vector of protocol p's file read with
    ``dephasing``, kept while the file does not change."""
    path = os.fspath(p["path"])
    stamp = os.stat(path).st_mtime_ns if os.path.isfile(path) else None
    key = (path, stamp, p["rf"], dephasing, None if p["axis"] is None else str(p["axis"]), str(p["unit"]),
           str(p["field_strength"]), p["voxel_size_m"], p["repetitions"] != 1)
    if key not in _CACHE:
        if len(_CACHE) > 16:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _read(path, p["rf"], dephasing, p["axis"], p["unit"], p["field_strength"], p["voxel_size_m"],
                            p["repetitions"] != 1)
    return _CACHE[key]


FILE_SIMULATORS["pulseq"] = PulseqSimulator
FILE_WRITERS["pulseq"] = write_pulseq


# -- pulseq-cest -------------------------------------------------------------


class _Segment(Simulator):
    """One stretch of a pulseq-cest file up to and including its ADC,
    played from equilibrium in the frame of its saturation frequency."""

    protocol = {"ops": None}

    def repetition(self, p):
        if p["ops"] is None:
            raise TypeError("internal: _Segment needs ops")
        return Sequence(list(p["ops"]))


#: offsets at least this far from water (ppm) are M0 references when the file names none
M0_THRESHOLD_PPM = 295.0


class PulseqCESTSimulator:
    """A CEST or MT saturation protocol in the pulseq-cest form (the CEST
    community's ``.seq`` files, e.g. the pulseq-cest library's APTw, WASABI
    and MT protocols) played with pools, so that a published protocol runs
    unchanged.

    The file is read as BMCTool (Schuenke et al.; the pulseq-cest
    project) plays it: RF events are saturation pulses, played shaped
    without a gradient at their frequency (:mod:`blochsim.pulseq`; RF and
    the semisolid pool's saturation act together in exact rectangles where
    the waveform is constant); a block with a gradient and no RF or ADC
    spoils ideally; an ADC records the liquid pools' Mz (Σ over water and
    the exchanging pools, SPEC's readout) without disturbing it.  The
    offsets are the file's ``offsets_ppm`` definition, one per ADC.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.seq`` file (format 1.4 or 1.5).
    normalize : bool, optional
        Z as the field reports it (default True): each sample over the mean
        of the M0 reference samples (the offsets equal to the file's
        ``M0_offset`` definition, or those at least 295 ppm from water),
        which are left out of the spectrum.  False: every sample, the
        liquid Mz times M0.
    reset : bool, optional
        Start every offset from equilibrium (default True, as BMCTool's
        ``reset_init_mag``); False plays the file straight through, the
        recovery delays it holds included.
    max_pulse_samples : int, optional
        Play a shaped pulse of more samples than this as that many exact
        rectangles, each the mean of its group of raster samples (the
        pulse's area kept): the cost falls in proportion, at an error that
        grows with the group's duration (BMCTool's option of the same name
        keeps every k-th sample instead).  Default: every sample of the
        file's raster.
    lineshape, states, threads, device
        As :class:`blochsim.Simulator`.

    Attributes
    ----------
    offsets_ppm : numpy.ndarray
        The offset of every ADC.
    z_offsets_ppm : numpy.ndarray
        The offsets of the returned Z-spectrum (normalize=True).

    Tissue: T1, T2, M0, B1, B0 and the pools (``bound_*``, ``poolB_*``, ...),
    as any played simulator; ``poolB_shift`` in Hz.
    """

    def __init__(self, path, normalize=True, reset=True, max_pulse_samples=None, **options):
        for k, v in (("normalize", normalize), ("reset", reset)):
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError(f"{k} must be True or False, got {v!r}")
        if max_pulse_samples is not None:
            max_pulse_samples = V.positive_int("max_pulse_samples", max_pulse_samples)
        self.path = os.fspath(path)
        self.normalize, self.reset = bool(normalize), bool(reset)
        f = _File(self.path)
        if "offsets_ppm" not in f.defs:
            raise PulseqError(f"{self.path}: no offsets_ppm definition: not a pulseq-cest file (read it with "
                              "Simulator.from_pulseq)")
        try:
            self.offsets_ppm = np.array([float(v) for v in f.defs["offsets_ppm"]])
        except ValueError:
            raise PulseqError(f"{self.path}: [DEFINITIONS] offsets_ppm is not a list of numbers") from None
        reader = _Reader(f, "shaped", "spoil", None, None, _field_strength(f, None))
        reader.max_samples = max_pulse_samples
        self._segments = self._split(reader)
        if len(self._segments) != self.offsets_ppm.size:
            raise PulseqError(f"{self.path}: {len(self._segments)} ADC events but {self.offsets_ppm.size} "
                              "offsets_ppm")
        if "M0_offset" in f.defs:
            m0 = float(f.defs["M0_offset"][0])
            self._m0 = np.flatnonzero(np.abs(self.offsets_ppm - m0) <= 1e-6 * max(1.0, abs(m0)))
        else:
            self._m0 = np.flatnonzero(np.abs(self.offsets_ppm) >= M0_THRESHOLD_PPM)
        if self.normalize and self._m0.size == 0:
            raise PulseqError(f"{self.path}: no M0 reference offset (no M0_offset definition and no offset "
                              f"{M0_THRESHOLD_PPM:g} ppm or more from water) to normalise by: pass normalize=False")
        self._keep = np.setdiff1d(np.arange(self.offsets_ppm.size), self._m0)
        self.z_offsets_ppm = self.offsets_ppm[self._keep]
        self._options = options
        self._groups = {}
        for i, (ops, freq) in enumerate(self._segments):
            key = repr(ops)
            self._groups.setdefault(key, (ops, []))[1].append((i, freq))
        self._sims = {key: _Segment(ops=tuple(ops), **options) for key, (ops, _) in self._groups.items()}
        if not self.reset:
            whole = []
            for ops, freq in self._split(reader, frame=False):
                whole += ops
            self._whole = _Segment(ops=tuple(whole), **options)

    def _split(self, reader, frame=True):
        """[(ops, frequency)] per ADC: the operators from after the previous
        ADC, RF in the frame of its frequency (frame) or at it.

        Each pulse's phase is referenced to its own start, as the format
        defines it (and BMCTool plays it).  An ADC records at its start (the
        imaging readout the placeholder stands for begins there)."""
        out, ops, freq, clock = [], [], None, 0.0
        for b, evs in zip(reader.blocks, reader.events):
            cursor = 0.0
            for when, kind, payload in evs:
                if kind == "adc":
                    ops += [Pulse(90.0, 0.0), Readout(-90.0), Pulse(90.0, 180.0)]
                    out.append(([op for op in ops if not (isinstance(op, Delay) and op.duration == 0.0)],
                                0.0 if freq is None else freq))
                    ops, freq, clock = [], None, -cursor
                    continue
                rf, _ = payload
                phase = rf.phase
                at = rf.delay + (rf.times[0] - 0.5 * rf.raster if not rf.linear else rf.times[0])
                if frame:
                    if freq is not None and rf.freq != freq:
                        raise PulseqError(f"{self.path}: block {b.index}: RF at {rf.freq:g} Hz after one at "
                                          f"{freq:g} Hz before the same ADC; read with reset=False")
                    freq = rf.freq
                    # the frame turns with the frequency from the segment's start
                    phase -= 2 * np.pi * rf.freq * (clock + at)
                    rf = dataclasses.replace(rf, freq=0.0, phase=phase)
                else:
                    rf = dataclasses.replace(rf, phase=phase)
                pulse, begin, length = reader._rf_ops(rf, False, b.index)
                at = rf.delay + begin
                ops += [Delay(1e3 * max(at - cursor, 0.0))] + pulse
                cursor = max(at, cursor) + length
            ops.append(Delay(1e3 * max(b.duration - cursor, 0.0)))
            clock += b.duration
            if not b.rf and not b.adc and np.any(b.moment != 0):
                ops.append(Spoil())
        return out

    @property
    def tissue_properties(self):
        """The tissue properties its segments model (those of every played
        simulator, pools included)."""
        return _Segment.tissue_properties

    def simulate(self, **tissue):
        """The Z-spectrum, complex64, shape (*voxels, len(z_offsets_ppm)),
        or every ADC's sample, (*voxels, len(offsets_ppm)) with
        normalize=False."""
        s = self._samples(tissue)
        if not self.normalize:
            return s
        return (s[..., self._keep] / np.mean(s[..., self._m0], axis=-1, keepdims=True)).astype(np.complex64)

    def jacobian(self, diff, **tissue):
        """The Z-spectrum (or the samples, normalize=False) and its exact
        derivatives with respect to the tissue properties ``diff`` (a name
        or a sequence of names, per public unit), as
        :meth:`blochsim.Simulator.jacobian`: J is (*voxels, len(diff),
        offsets), or (*voxels, offsets) for one name.  The normalisation's
        quotient is differentiated too."""
        names = (diff,) if isinstance(diff, str) else tuple(diff)
        s, J = self._samples(tissue, names)
        if self.normalize:
            ref = np.mean(s[..., self._m0], axis=-1, keepdims=True)  # (*voxels, 1)
            dref = np.mean(J[..., self._m0], axis=-1, keepdims=True)  # (*voxels, names, 1)
            J = J[..., self._keep] / ref[..., None, :] - (s[..., self._keep] / ref ** 2)[..., None, :] * dref
            s = s[..., self._keep] / ref
        s, J = s.astype(np.complex64), J.astype(np.complex64)
        return s, (J[..., 0, :] if isinstance(diff, str) else J)

    def _samples(self, tissue, names=None):
        """Every ADC's sample (*voxels, adc), and with names their
        Jacobian (*voxels, names, adc)."""
        if not self.reset:
            return self._whole.simulate(**tissue) if names is None else self._whole.jacobian(names, **tissue)
        parts, jparts = {}, {}
        for key, (_, members) in self._groups.items():
            idx = [i for i, _ in members]
            freqs = np.array([f for _, f in members])
            expanded = {}
            for k, v in tissue.items():
                if V.is_device_array(v):
                    raise ValueError(f"PulseqCESTSimulator takes NumPy tissue arrays; {k} is a device array")
                expanded[k] = np.asarray(v)[..., None]
            b0 = np.asarray(tissue.get("B0", 0.0), dtype=np.float64)
            expanded["B0"] = b0[..., None] - freqs  # each segment in its RF's frame
            if names is None:
                s = self._sims[key].simulate(**expanded)[..., 0]  # (*voxels, members)
            else:
                s, J = self._sims[key].jacobian(names, **expanded)  # (*voxels, members, 1), (..., names, 1)
                s = s[..., 0]
            for j, i in enumerate(idx):
                parts[i] = s[..., j]
                if names is not None:
                    jparts[i] = J[..., j, :, 0]
        order = range(len(self._segments))
        out = np.stack([parts[i] for i in order], axis=-1).astype(np.complex64)
        if names is None:
            return out
        return out, np.stack([jparts[i] for i in order], axis=-1)


# Dask arrays among the tissue values: lazy, as for every simulator
PulseqCESTSimulator.simulate = _lazy_entry("simulate", PulseqCESTSimulator.simulate)
PulseqCESTSimulator.jacobian = _lazy_entry("jacobian", PulseqCESTSimulator.jacobian)
