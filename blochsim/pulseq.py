"""Reading Pulseq sequence files (Layton et al. 2017, MRM 77:1544; the
open file format of pulseq.github.io, versions 1.3, 1.4 and 1.5, with its
"Time and Shape Specification") into blochsim operators:
:meth:`blochsim.Simulator.from_pulseq`.

What is read, and the model
---------------------------
- **Blocks** play in order for their durations (``BlockDurationRaster``).
- **RF waveforms** as the format samples them: a shape without a time shape
  holds each sample over one raster cell (samples at the cell centres);
  with a time shape the waveform is piecewise linear between its points
  (a block pulse is two points, so its area is exactly its flip).  The
  flip is 2π·|∫ amplitude dt|.
- **Phase and frequency** with the format's time reference: the RF phase
  at time t from the pulse start is ``phase + 2π·freq·t``.  A pulse in a
  block with a gradient is slice selective: the simulated spin sits at the
  slice centre, on resonance with it, and the pulse acts with the phase it
  has at its centre, ``phase + 2π·freq·t_centre`` (pypulseq's examples set
  the phase offset to cancel it).  A pulse without a gradient is played at
  its frequency: an offset of +f Hz resonates with spins at B0 = +f (SPEC's
  convention, as in :class:`CESTSimulator` and :class:`RectPulse`).
  Offsets in ppm (format 1.5) need the field strength.
- **Phase convention.**  SPEC's spins at B0 > 0 turn their transverse
  phase by -2π·B0·t, while the format's frequency +f advances the RF phase
  by +2π·f·t and excites spins at +f: the two count phase the other way
  round.  The file's RF and ADC phases therefore enter negated; samples are
  in SPEC's frame (a 90° pulse at phase 0 gives -i), the complex conjugate
  of the format's; magnitudes do not depend on it.
- **RF models** (``rf``): ``"hard"`` plays each pulse as an instantaneous
  rotation at its centre (relaxation during the pulse neglected), which is
  exact for the slice-centre spin only when the waveform has one phase (up
  to sign) and the spin is on resonance with it; other pulses (adiabatic,
  frequency or phase modulated, off resonance without a gradient) are
  refused in hard mode.  ``"shaped"`` plays every waveform: in a pulse
  without a gradient a run of equal samples as one exact rectangular pulse
  (:class:`RectPulse`: relaxation, exchange, off-resonance and the
  semisolid pool act with the RF), and every other sample as a rotation
  at its centre with free precession either side (the per-dwell
  hard-pulse approximation on the file's raster).
  ``"auto"`` (default) plays hard what hard represents and the rest
  shaped.  In shaped mode a slice-selective pulse is played in the
  slice-centre spin's frame (no frequency, its centre phase) and the
  gradient moment up to its centre is applied before it.
- **ADC** events become one :class:`Readout` each at the ADC window's
  centre (the echo of a symmetric readout), with the receiver phase of the
  ADC at that centre: one sample per ADC.
- **Gradients** decide the dephasing (``dephasing="moment"``, default).
  The gradient moment vector (x, y, z) between consecutive RF and ADC
  centres (and, wrapping round, from the last to the first, for
  repetitions) is integrated exactly (trapezoids, arbitrary waveforms on
  the gradient raster, or piecewise-linear corner points).  Every such
  moment must be a whole number of one dephasing unit vector, so that
  every pathway that refocuses in the file refocuses on order 0 of the
  EPG: the unit is found per axis as the largest moment of which every
  moment on that axis is a whole multiple (within 1e-3 of the unit or
  1e-3 cycles across the voxel, ``voxel_size_m``, 1 mm unless given: a
  remainder that leaves the signal unchanged to 1e-6), itself putting at
  least 0.1 cycles across the voxel (orders closer than that are not
  distinct pathways), and the axes are
  combined when their whole numbers are proportional (a readout on x and
  crushers on z of a CPMG train).  Moments that put well under a cycle
  across the voxel (phase encoding and EPI blips, the voxel being much
  smaller than the field of view) encode k-space and do not dephase it:
  an axis is left out whose moments all stay under 0.1 cycles across the
  voxel, or under one cycle without a common unit, or which is rewound
  between consecutive RF pulses (phase encoding, a balanced readout) and
  cannot be held with the others; the samples are then the voxel's
  signal at the k-space centre.  A pathway that passes an interval whose moment no
  combination of the others can bring back (an inversion's spoiler on
  another axis than the train's) never refocuses, and that interval spoils
  exactly; other independently dephasing axes are kept apart on one order
  by a map with large enough multipliers, within 8192 orders.  Moments with no common unit, or unbalanced axes
  that dephase independently, are refused, naming the block; ``axis`` (a
  direction to follow alone), ``unit`` (cycles/m, checked, never rounded)
  or a callable ``dephasing(block) -> shifts`` choose otherwise, and
  ``dephasing="spoil"`` spoils ideally at every block with a net moment and
  no RF or ADC.  With ``voxel_size_m`` the crusher geometry for D and v
  follows from the unit: ``crusher_dephasing_rad`` = 2π·|unit|·voxel.
- Not read: extensions (labels, triggers, rotations), soft delays, the
  gradients' effect on B0 (eddy currents, concomitant fields), slice
  profiles (``slice_profile`` gives them), ADC samples other than the
  centre.  Malformed files (unknown version, a row with missing fields, a
  shape that does not decompress to its length, an event a block names
  but no section holds, times off their raster) are refused naming the
  line, section or block.
"""
from __future__ import annotations

import itertools
import math
import os
import re
import warnings
from dataclasses import dataclass, field

import numpy as np

from blochsim.sequence import (GAMMA_RAD_PER_S_PER_T, Delay, Dephase, Pulse, Readout, RectPulse, Sequence, Spoil)
from blochsim import _validate as V
from blochsim.simulator import Simulator

_HZ_PER_UT = GAMMA_RAD_PER_S_PER_T / (2 * np.pi) * 1e-6
_AXES = {"x": 0, "y": 1, "z": 2}
#: residual moment allowed, as a fraction of the dephasing unit (or cycles across voxel_size_m)
MOMENT_TOLERANCE = 1e-3
#: the voxel the moments are measured against when voxel_size_m is not given, m
DEFAULT_VOXEL_M = 1e-3
#: an axis whose moments put less than this across the voxel (cycles) encodes and does not dephase
ENCODING_CYCLES = 0.1
#: largest number of units the smallest moment of an axis may hold
_MAX_SUBDIVISION = 64
#: most orders the map of independently dephasing axes onto one order may take
_MAX_LATTICE_ORDERS = 8192

# numbers after the id in each row, per minor version
_FIELDS = {"RF": {3: 6, 4: 7, 5: 10}, "TRAP": {3: 5, 4: 5, 5: 5}, "GRADIENTS": {3: 3, 4: 4, 5: 6},
           "ADC": {3: 5, 4: 5, 5: 8}, "DELAYS": {3: 1, 4: 1, 5: 1}}


@dataclass
class PulseqBlock:
    """One block of a Pulseq file, as a dephasing handler sees it.

    Attributes
    ----------
    index : int
        Block number in the file (from 1).
    start, duration : float, s
    rf, adc : bool
        Whether the block holds an RF or ADC event.
    moment : numpy.ndarray, shape (3,), cycles/m
        Net gradient moment (x, y, z) of the block.
    """

    index: int
    start: float
    duration: float
    rf: bool
    adc: bool
    moment: np.ndarray = field(default_factory=lambda: np.zeros(3))


class PulseqError(ValueError):
    """A Pulseq file blochsim cannot read or play exactly; the message names
    the file and the line, section or block."""


def decompress_shape(values, n):
    """Samples of a Pulseq shape from its stored form.

    Stored with as many values as samples, the values are the samples;
    otherwise they are the run-length-encoded derivative: a value given
    twice in a row is followed by the count of its further repetitions,
    and the samples are the cumulative sum.

    Parameters
    ----------
    values : array_like
        The numbers stored after ``num_samples``.
    n : int
        ``num_samples``.

    Returns
    -------
    numpy.ndarray, float64, shape (n,)
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size == n:
        return v.copy()
    # the encoding is read left to right: a pair of equal values opens a run, its count follows, and
    # reading resumes after the count (so pairs inside a run's triple are not runs)
    counts = np.ones(v.size, dtype=np.int64)
    resume = 0
    for i in np.flatnonzero(v[:-1] == v[1:]).tolist():
        if i < resume:
            continue
        if i + 2 >= v.size:
            raise ValueError("a repeated value ends the shape without its count")
        counts[i], counts[i + 1], counts[i + 2] = int(round(v[i + 2])) + 2, 0, 0
        resume = i + 3
    if np.any(counts < 0):
        raise ValueError(f"a run has a negative count ({v[np.flatnonzero(counts < 0)[0] + 2]:g})")
    if int(counts.sum()) != n:
        raise ValueError(f"the shape decompresses to {int(counts.sum())} samples, not num_samples = {n}")
    return np.cumsum(np.repeat(v, counts))


_COMMENT = re.compile(r"#[^\n]*")
_USE_LETTER = re.compile(r"(?<=\s)[A-Za-z]+[ \t\r]*$", re.MULTILINE)  # a row's last word


def _lines_starting(text, word):
    """The lines of text that begin with word (after blanks), as (start,
    end) offsets, found with str.find rather than a scan of every line."""
    out, at = [], 0
    while True:
        i = text.find(word, at)
        if i < 0:
            return out
        line = text.rfind("\n", 0, i) + 1
        end = text.find("\n", i)
        end = len(text) if end < 0 else end
        if not text[line:i].strip():
            out.append((line, end))
        at = end


def _parse_numbers(text, dtype):
    """The blank-separated numbers of text in one call; where a token is not
    a number, those before it (or none): the callers then read line by line
    to name the line at fault."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.fromstring(text, dtype=dtype, sep=" ")
    except ValueError:
        return np.zeros(0, dtype)


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


class _File:
    """The sections of a Pulseq file, parsed and checked."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.defs = {}
        self.blocks = []
        self.rows = {"RF": {}, "TRAP": {}, "GRADIENTS": {}, "ADC": {}, "DELAYS": {}}
        self._bodies = {}  # section -> (line of its header, its text)
        self.shapes = {}
        try:
            with open(self.path) as f:
                text = f.read()
        except (FileNotFoundError, IsADirectoryError):
            raise FileNotFoundError(f"no Pulseq file at {self.path!r}") from None
        ver = {}
        # the sections by their headers; [BLOCKS] and [SHAPES] (the bulk of a file) are parsed in one call each
        heads, line, at = [], 1, 0
        for a, b in _lines_starting(text, "["):
            line += text.count("\n", at, a)  # counted from the previous header on
            at = a
            heads.append((a, b, line))
        block_parts = []
        for i, (start, stop, line_no) in enumerate(heads):
            header = text[start:stop].split("#", 1)[0].strip()
            if not header.endswith("]"):
                raise PulseqError(f"{self.path}, line {line_no}: malformed section header {text[start:stop].strip()!r}")
            section = header[1:-1].strip().upper()
            body = text[stop + 1:heads[i + 1][0] if i + 1 < len(heads) else len(text)]
            first = line_no  # the body's lines are first + 1, first + 2, ...
            if section == "BLOCKS":
                block_parts.append((first, body.split("\n")))
            elif section == "SHAPES":
                self._parse_shapes(body, first)
            elif section in self.rows:
                self._bodies[section] = (first, body)
                self._parse_rows(section, body, first)
            elif section in ("VERSION", "DEFINITIONS"):
                for k, raw in enumerate(body.split("\n")):
                    line = raw.split("#", 1)[0].strip()
                    if not line:
                        continue
                    tok = line.split()
                    try:
                        if section == "VERSION":
                            if tok[0] in ("major", "minor"):  # a revision may read "1post1"
                                ver[tok[0]] = int(tok[1])
                        else:
                            self.defs[tok[0]] = tok[1:]
                    except (ValueError, IndexError):
                        raise PulseqError(f"{self.path}, line {first + k + 1}: cannot read {raw.strip()!r} in "
                                          f"[{section}]") from None
        self.blocks = self._parse_blocks(block_parts)
        if "major" not in ver or "minor" not in ver:
            raise PulseqError(f"{self.path}: no [VERSION] section with major and minor")
        self.version = (ver["major"], ver["minor"])
        if self.version[0] != 1 or self.version[1] not in (3, 4, 5):
            raise PulseqError(f"{self.path}: Pulseq version {ver['major']}.{ver['minor']} is not read "
                              "(versions 1.3, 1.4 and 1.5 are)")
        if not len(self.blocks):
            raise PulseqError(f"{self.path}: no [BLOCKS]")
        self.block_raster = self._def("BlockDurationRaster", 1e-5)
        self.grad_raster = self._def("GradientRasterTime", 1e-5)
        self.rf_raster = self._def("RadiofrequencyRasterTime", 1e-6)
        self.adc_raster = self._def("AdcRasterTime", 1e-7)
        minor = self.version[1]
        for section, rows in self.rows.items():
            want = _FIELDS[section][minor]
            for i, r in rows.items():
                if len(r) != want:
                    raise PulseqError(f"{self.path}, line {self.line_of(section, i)}: [{section}] row {i} has "
                                      f"{len(r)} numbers after its id, version 1.{minor} has {want}")
        self._check_rasters()
        self.durations = self._durations_1_3() if minor == 3 else self.blocks[:, 1] * self.block_raster

    def _durations_1_3(self):
        """Block durations of a format 1.3 file, whose blocks name a delay
        ([DELAYS], µs) in place of a duration: the longest of the delay and
        the block's events (RF: delay + samples; trapezoid: delay + rise +
        flat + fall; arbitrary gradient: delay + samples; ADC: delay + samples
        x dwell)."""
        def table(rows, length):
            top = max([0, *rows])
            out = np.zeros(top + 1)
            for i, r in rows.items():
                out[i] = length(r)
            return out

        B = self.blocks
        delays = table(self.rows["DELAYS"], lambda r: r[0] * 1e-6)
        rf = table(self.rows["RF"], lambda r: r[3] * 1e-6 + self.shape(int(r[1]), "an RF event").size * self.rf_raster)
        trap = table(self.rows["TRAP"], lambda r: sum(r[1:5]) * 1e-6)
        grad = table(self.rows["GRADIENTS"],
                     lambda r: r[2] * 1e-6 + self.shape(int(r[1]), "a gradient").size * self.grad_raster)
        adc = table(self.rows["ADC"], lambda r: r[2] * 1e-6 + r[0] * r[1] * 1e-9)
        lengths = []
        for col, tab, what in ((1, delays, "DELAYS"), (2, rf, "RF"), (6, adc, "ADC")):
            ids = B[:, col]
            bad = (ids < 0) | (ids >= tab.size)
            if np.any(bad & (ids != 0)):
                j = int(np.argmax(bad & (ids != 0)))
                raise PulseqError(f"{self.path}: block {B[j, 0]} names {what} event {ids[j]}, which [{what}] does "
                                  "not hold")
            lengths.append(np.where(ids == 0, 0.0, tab[np.clip(ids, 0, tab.size - 1)]))
        for col in (3, 4, 5):
            ids = B[:, col]
            g = np.zeros(ids.size)
            for k, i in enumerate(ids):
                if i:
                    g[k] = trap[i] if i in self.rows["TRAP"] else grad[i] if i in self.rows["GRADIENTS"] else 0.0
            lengths.append(g)
        return np.max(np.stack(lengths), axis=0)

    def _parse_shapes(self, body, first):
        """The shapes of a [SHAPES] section: ``shape_id N``, ``num_samples
        M``, then the stored values (one a line), each shape's values read
        in one call."""
        if "#" in body:
            body = _COMMENT.sub("", body)
        starts = [a for a, _ in _lines_starting(body, "shape_id")]
        lead = body[:starts[0]] if starts else body
        if lead.strip():
            k = body.count("\n", 0, body.index(lead.strip()))
            raise PulseqError(f"{self.path}, line {first + k + 1}: cannot read {lead.strip().splitlines()[0]!r} in "
                              "[SHAPES]: values before a shape_id")
        for i, at in enumerate(starts):
            chunk = body[at:starts[i + 1] if i + 1 < len(starts) else len(body)]
            line = first + body.count("\n", 0, at) + 1
            head, _, rest = chunk.partition("\n")
            count_line, _, values = rest.partition("\n")
            try:
                sid = int(head.split()[1])
            except (ValueError, IndexError):
                raise PulseqError(f"{self.path}, line {line}: cannot read {head.strip()!r} in [SHAPES]") from None
            count = count_line.split()
            if len(count) != 2 or count[0] != "num_samples":
                raise PulseqError(f"{self.path}, line {line}: shape {sid} has no num_samples")
            try:
                n = int(count[1])
            except ValueError:
                raise PulseqError(f"{self.path}, line {line + 1}: cannot read {count_line.strip()!r} in "
                                  "[SHAPES]") from None
            stripped = values.strip()
            vals = _parse_numbers(stripped, np.float64) if stripped else np.zeros(0)
            if not np.all(np.isfinite(vals)):
                k = int(np.argmax(~np.isfinite(vals)))
                raise PulseqError(f"{self.path}, line {line + 2 + k}: shape {sid} holds a number that is not "
                                  f"finite ({vals[k]:g})")
            # one value a line: fewer values than lines means a line that is not a number (or a blank one)
            if stripped and vals.size != stripped.count("\n") + 1:
                for k, ln in enumerate(values.split("\n")):  # name the line at fault
                    if ln.strip() and not all(_is_number(t) for t in ln.split()):
                        raise PulseqError(f"{self.path}, line {line + 2 + k}: cannot read {ln.strip()!r} in "
                                          "[SHAPES]")
                vals = np.array([float(t) for t in values.split()])
            self._end_shape(sid, n, vals, line)

    def _parse_rows(self, section, body, first):
        """The rows of an event section ([RF], [TRAP], ...) as lists of
        numbers after their id.  A long section is parsed in one call; a
        short one, or one with a line that is not numbers, line by line
        (which names the line at fault)."""
        if body.count("\n") > 64:
            if self._parse_table(section, body):
                return
        for k, raw in enumerate(body.split("\n")):
            line = raw.split("#", 1)[0]
            tok = line.split()
            if not tok:
                continue
            try:
                # version 1.5 ends an RF row with a letter (the pulse's use)
                row = [float(t) for t in tok[1:-1 if tok[-1].isalpha() else None]]
                if not all(math.isfinite(x) for x in row):
                    raise ValueError("not finite")
                self.rows[section][int(tok[0])] = row
            except (ValueError, IndexError):
                raise PulseqError(f"{self.path}, line {first + k + 1}: cannot read {raw.strip()!r} in "
                                  f"[{section}]") from None

    def _parse_table(self, section, body):
        """Rows of equal length parsed in one call; False where the
        section is not such a table."""
        text = _COMMENT.sub("", body) if "#" in body else body
        text = _USE_LETTER.sub(" ", text)
        lines = [ln for ln in text.split("\n") if ln.strip()]
        if not lines:
            return True
        values = _parse_numbers(text, np.float64)
        widths = {len(ln.split()) for ln in lines}
        if len(widths) == 1 and values.size == len(lines) * min(widths) and np.all(np.isfinite(values)):
            table = values.reshape(len(lines), -1)
            ids = table[:, 0]
            if np.array_equal(ids, np.round(ids)):
                self.rows[section].update(zip(ids.astype(np.int64).tolist(), table[:, 1:].tolist()))
                return True
        return False

    def line_of(self, section, rid):
        """The line number of row rid of an event section."""
        first, body = self._bodies[section]
        for k, raw in enumerate(body.split("\n")):
            tok = raw.split("#", 1)[0].split()
            if tok and _is_number(tok[0]) and float(tok[0]) == rid:
                return first + k + 1
        return first

    def _parse_blocks(self, parts):
        """The [BLOCKS] rows as an int64 array (n, 8): NUM DUR RF GX GY GZ
        ADC EXT.  A long file's rows are parsed in one call; a section with
        a row out of shape is read row by row to name it."""
        rows = []
        for first, body in parts:
            text = "\n".join(body)
            if "#" in text:
                text = _COMMENT.sub("", text)
                body = text.split("\n")
            count = sum(1 for ln in body if ln.strip())
            values = _parse_numbers(text, np.int64) if count else np.zeros(0, np.int64)
            if values.size == 8 * count:
                table = values.reshape(-1, 8)
                # rows out of shape would shift the columns: the numbers then do not count up by one
                if count == 0 or np.array_equal(table[:, 0], table[0, 0] + np.arange(count)):
                    rows.append(table)
                    continue
            checked = []
            for i, ln in enumerate(body):  # find the row at fault
                tok = ln.split()
                if not tok:
                    continue
                try:
                    checked.append([int(t) for t in tok])
                except ValueError:
                    raise PulseqError(f"{self.path}, line {first + i + 1}: cannot read {ln.strip()!r} in "
                                      "[BLOCKS]") from None
                if len(tok) != 8:
                    raise PulseqError(f"{self.path}, line {first + i + 1}: a block has {len(tok)} fields, "
                                      "expected 8 (NUM DUR RF GX GY GZ ADC EXT)")
            rows.append(np.asarray(checked, dtype=np.int64).reshape(-1, 8))
        return np.concatenate(rows) if rows else np.zeros((0, 8), np.int64)

    def _def(self, name, default):
        if name not in self.defs:
            return default
        try:
            value = float(self.defs[name][0])
        except (ValueError, IndexError):
            raise PulseqError(f"{self.path}: [DEFINITIONS] {name} is not a number") from None
        if not 0 < value < math.inf:
            raise PulseqError(f"{self.path}: [DEFINITIONS] {name} must be > 0 and finite, got {value:g}")
        return value

    def _check_rasters(self):
        minor = self.version[1]
        # section, the columns (after the id) that hold times, their unit (s), the raster, what they are
        checks = (("RF", [{3: 3, 4: 4, 5: 5}[minor]], 1e-6, self.rf_raster, "{}'s delay is not on the RF"),
                  ("TRAP", [1, 2, 3, 4], 1e-6, self.grad_raster, "trapezoid {}'s times are not on the gradient"),
                  ("GRADIENTS", [-1], 1e-6, self.grad_raster, "gradient {}'s delay is not on the gradient"),
                  ("ADC", [1], 1e-9, self.adc_raster, "ADC {}'s dwell is not on the ADC"))
        for section, cols, unit, raster, what in checks:
            rows = self.rows[section]
            if not rows:
                continue
            scale = unit / raster
            if len(rows) > 32:
                t = np.array(list(rows.values()))[:, cols] * scale
                off = np.any(np.abs(t - np.round(t)) > 1e-6 * np.maximum(1.0, np.abs(t)), axis=1)
                bad = [list(rows)[int(np.argmax(off))]] if np.any(off) else []
            else:  # a few rows: plain Python is quicker than arrays
                bad = [i for i, r in rows.items()
                       if any(abs(r[c] * scale - round(r[c] * scale)) > 1e-6 * max(1.0, abs(r[c] * scale)) for c in cols)]
            for i in bad[:1]:
                label = f"RF {i}" if section == "RF" else str(i)
                raise PulseqError(f"{self.path}, line {self.line_of(section, i)}: {what.format(label)} raster "
                                  f"({raster:g} s)")

    def _end_shape(self, sid, n, vals, number):
        if n is None:
            raise PulseqError(f"{self.path}, line {number}: shape {sid} has no num_samples")
        try:
            self.shapes[sid] = decompress_shape(vals, n)
        except ValueError as e:
            raise PulseqError(f"{self.path}, line {number}: shape {sid}: {e}") from None

    def shape(self, sid, what):
        if sid not in self.shapes:
            raise PulseqError(f"{self.path}: {what} names shape {sid}, which [SHAPES] does not hold")
        return self.shapes[sid]

    def row(self, section, rid, block):
        if rid not in self.rows[section]:
            raise PulseqError(f"{self.path}: block {block} names {section} event {rid}, which [{section}] "
                              "does not hold")
        return self.rows[section][rid]


def _trap_moments(amp, rise, flat, fall, delay, t):
    """Moments (cycles/m) of trapezoids [amplitude Hz/m, rise, flat, fall,
    delay, all s] from the block start to times t (s), over arrays."""
    x = t - delay
    r = np.clip(x, 0.0, rise)
    d = np.clip(x - rise - flat, 0.0, fall)
    # a ramp of zero length contributes nothing (and is not divided by)
    m = amp * np.divide(r * r, 2 * rise, out=np.zeros_like(r), where=rise > 0)
    m += amp * np.clip(x - rise, 0.0, flat)
    m += amp * (d - np.divide(d * d, 2 * fall, out=np.zeros_like(d), where=fall > 0))
    return m


@dataclass
class _RF:
    """An RF event: the waveform (Hz, gamma B1 / 2π) at its sample times
    (s from the pulse start), held over raster cells or piecewise linear
    between time points; where it sits in its block; its centre (s from the
    pulse start), frequency (Hz) and phase (rad)."""

    rid: int
    wave: np.ndarray
    times: np.ndarray
    linear: bool
    raster: float
    delay: float
    centre: float
    freq: float
    phase: float
    known: dict = field(default_factory=dict, repr=False)  # what is derived from the waveform, shared

    @property
    def duration(self):
        return float(self.times[-1]) if self.linear else self.wave.size * self.raster

    def _derived(self, name, compute):
        if name not in self.known:
            self.known[name] = compute()
        return self.known[name]

    def area(self):
        """∫ wave dt, cycles (complex)."""
        if self.linear:
            return self._derived("area", lambda: complex(np.sum(0.5 * (self.wave[1:] + self.wave[:-1])
                                                               * np.diff(self.times))))
        return self._derived("area", lambda: complex(np.sum(self.wave) * self.raster))

    def energy(self):
        """∫ |wave|² dt, Hz² s."""
        def compute():
            if self.linear:
                a, b = self.wave[:-1], self.wave[1:]
                return float(np.sum(np.diff(self.times) * (np.abs(a) ** 2 + np.abs(b) ** 2
                                                           + np.real(a * np.conj(b))) / 3))
            return float(np.sum(np.abs(self.wave) ** 2) * self.raster)
        return self._derived("energy", compute)

    def one_phase(self):
        """Whether every non-zero sample has the same phase up to sign."""
        def compute():
            w = self.wave[np.abs(self.wave) > 0]
            if w.size == 0:
                return True
            ref = w[np.argmax(np.abs(w))] / abs(w[np.argmax(np.abs(w))])
            return bool(np.all(np.abs(np.imag(w * np.conj(ref))) <= 1e-9 * np.abs(w)))
        return self._derived("one_phase", compute)

    def cells(self):
        """The waveform on the raster: samples at the cell centres (s from
        the pulse start) and their values."""
        if not self.linear:
            return self.times, self.wave

        def compute():
            n = int(round(self.duration / self.raster))
            t = (np.arange(n) + 0.5) * self.raster
            w = np.interp(t, self.times, self.wave.real, left=0.0, right=0.0) + 1j * np.interp(
                t, self.times, self.wave.imag, left=0.0, right=0.0)
            return t, w
        return self._derived("cells", compute)


def _common_unit(values, tol_rel, tol_abs, min_unit=0.0):
    """The largest u >= min_unit of which every value is a whole multiple
    (0 included) within max(tol_rel u, tol_abs), or None; 0 when every
    value is 0.  Candidates are the smallest value above a fraction of the
    largest, divided by 1 to 64: the smallest values may be the remainders
    of rounding in the file (a rephaser written to six digits)."""
    a = np.abs(np.asarray(values, dtype=np.float64))
    top = float(a.max()) if a.size else 0.0
    if top == 0:
        return 0.0
    n = np.arange(1, _MAX_SUBDIVISION + 1, dtype=np.float64)
    for floor in (0.0, 1e-6, 1e-4, 1e-3):
        u = float(a[a > floor * top].min()) / n  # the candidates, largest first
        u = u[u >= min_unit]
        if u.size == 0:
            continue
        r = a[None, :] / u[:, None]
        fits = np.all(np.abs(r - np.round(r)) * u[:, None] <= np.maximum(tol_rel * u, tol_abs)[:, None], axis=1)
        if np.any(fits):
            return float(u[np.argmax(fits)])
    return None


class _Reader:
    """Builds the operators of a parsed file."""

    def __init__(self, f: _File, rf_mode, dephasing, axis, unit, field_strength, voxel_size_m=None, periodic=False):
        self.f = f
        self.periodic = periodic
        self.field_strength = None if field_strength is None else float(
            V.protocol_array("field_strength", field_strength, low=0.0, strict=True, unit="T", ndim_max=0))
        if rf_mode not in ("auto", "hard", "shaped"):
            raise ValueError(f"rf must be 'auto', 'hard' or 'shaped', got {rf_mode!r}")
        if not (callable(dephasing) or dephasing in ("moment", "spoil")):
            raise ValueError(f"dephasing must be 'moment', 'spoil' or a callable, got {dephasing!r}")
        self.rf_mode, self.dephasing = rf_mode, dephasing
        if isinstance(axis, str):
            if axis not in _AXES:
                raise ValueError(f"axis must be 'x', 'y', 'z' or a 3-vector, got {axis!r}")
            axis = np.eye(3)[_AXES[axis]]
        if axis is not None:
            axis = np.asarray(axis, dtype=np.float64)
            if axis.shape != (3,) or not np.all(np.isfinite(axis)) or np.linalg.norm(axis) == 0:
                raise ValueError(f"axis must be 'x', 'y', 'z' or a non-zero 3-vector, got {axis!r}")
            axis = axis / np.linalg.norm(axis)
        self.axis = axis
        self.unit = None if unit is None else float(
            V.protocol_array("unit", unit, low=0.0, strict=True, unit="cycles/m", ndim_max=0))
        self.voxel = DEFAULT_VOXEL_M if voxel_size_m is None else voxel_size_m
        self.max_samples = None  # shaped pulses on their raster, unless a caller coarsens them
        self._rfs, self._waves = {}, {}
        self._timeline()

    # -- events ------------------------------------------------------------

    def _moment(self, grads, t):
        """Moment vector (cycles/m) of a block's gradients from its start to t (s)."""
        m = np.zeros(3)
        for i, g in enumerate(grads):
            if g is None:
                continue
            _, row = g  # an arbitrary gradient (trapezoids: _trap_moments)
            # 1.3: amp shape delay; 1.4: amp shape time delay; 1.5: amp first last shape time delay
            minor = self.f.version[1]
            amp, sid, tid, delay = ((row[0], int(row[3]), int(row[4]), row[5] * 1e-6) if minor >= 5
                                    else (row[0], int(row[1]), int(row[2]), row[3] * 1e-6) if minor == 4
                                    else (row[0], int(row[1]), 0, row[2] * 1e-6))
            wave = amp * self.f.shape(sid, "a gradient")
            if tid:  # corner points, linear between them
                times = delay + self.f.shape(tid, "a gradient") * self.f.grad_raster
                if t <= times[0]:
                    continue
                xs = np.concatenate([times[times < t], [min(t, times[-1])]])
                ys = np.interp(xs, times, wave)
                m[i] = float(np.sum(0.5 * (ys[1:] + ys[:-1]) * np.diff(xs)))
            else:  # samples held over each raster cell
                r = self.f.grad_raster
                cover = np.clip((t - delay - np.arange(wave.size) * r) / r, 0.0, 1.0)
                m[i] = float(np.sum(wave * r * cover))
        return m

    def _rf(self, rid, block):
        if rid not in self._rfs:
            self._rfs[rid] = self._read_rf(rid, block)
        return self._rfs[rid]

    def _read_rf(self, rid, block):
        r = self.f.row("RF", rid, block)
        raster = self.f.rf_raster
        if self.f.version[1] >= 5:  # amp mag phase time center delay freqPPM phasePPM freq phase
            amp, mag_id, ph_id, time_id, center, delay, freq, phase = (r[0], int(r[1]), int(r[2]), int(r[3]),
                                                                       r[4] * 1e-6, r[5], r[8], r[9])
            if r[7] != 0.0:
                raise PulseqError(f"{self.f.path}: RF {rid} has a phase offset in ppm, which is not read")
            if r[6] != 0.0:  # an offset that scales with the field: fat saturation and the like
                if self.field_strength is None:
                    raise PulseqError(f"{self.f.path}: RF {rid} has a frequency offset of {r[6]:g} ppm: give "
                                      "field_strength (T) to read it")
                freq = freq + r[6] * self.field_strength * _HZ_PER_UT * 1e6 * 1e-6
        elif self.f.version[1] == 4:  # amp mag phase time delay freq phase
            amp, mag_id, ph_id, time_id, delay, freq, phase = r[0], int(r[1]), int(r[2]), int(r[3]), r[4], r[5], r[6]
            center = None
        else:  # 1.3: amp mag phase delay freq phase
            amp, mag_id, ph_id, delay, freq, phase = r[0], int(r[1]), int(r[2]), r[3], r[4], r[5]
            time_id, center = 0, None
        key = (amp, mag_id, ph_id, time_id)
        if key in self._waves:
            wave, times, known = self._waves[key]
            return _RF(rid, wave, times, bool(time_id), raster, delay * 1e-6,
                       self._peak_centre(wave, times, known) if center is None else center, freq, phase, known)
        mag = self.f.shape(mag_id, f"RF {rid}")
        known = {}
        if ph_id:
            ph = self.f.shape(ph_id, f"RF {rid}")
            if ph.size != mag.size:
                raise PulseqError(f"{self.f.path}: RF {rid}: magnitude and phase shapes differ in length")
            # one phase up to sign: the non-zero samples' phases (cycles) differ by multiples of 1/2
            on = mag != 0
            p0 = ph[np.argmax(on)]
            half = 2.0 * (ph - p0)
            whole = np.round(half)
            known["one_phase"] = bool(np.all(np.abs(half - whole)[on] <= 1e-9))
            if known["one_phase"]:
                sign = 1.0 - 2.0 * (whole.astype(np.int64) & 1)
                wave = (amp * sign * mag) * np.exp(2j * np.pi * p0)
            else:
                wave = amp * mag * np.exp(2j * np.pi * ph)
        else:
            wave = (amp * mag).astype(np.complex128)
            known["one_phase"] = True  # real samples: one phase up to sign
        if time_id < 0:
            raise PulseqError(f"{self.f.path}: RF {rid} has time shape {time_id} (oversampled regular sampling), "
                              "which is not read")
        if time_id:
            times = self.f.shape(time_id, f"RF {rid}") * raster
            if times.size != mag.size or np.any(np.diff(times) < 0):
                raise PulseqError(f"{self.f.path}: RF {rid}: its time shape is not {mag.size} increasing times")
        else:
            times = (np.arange(mag.size) + 0.5) * raster
        self._waves[key] = (wave, times, known)
        return _RF(rid, wave, times, bool(time_id), raster, delay * 1e-6,
                   self._peak_centre(wave, times, known) if center is None else center, freq, phase, known)

    @staticmethod
    def _peak_centre(wave, times, known):
        """The centre of a version 1.4 pulse, which the file does not give:
        the peak of the magnitude (the middle of a plateau)."""
        if "peak_centre" not in known:
            a = np.abs(wave)
            peak = a >= np.max(a) * (1 - 1e-5)
            known["peak_centre"] = 0.5 * float(times[peak][0] + times[peak][-1])
        return known["peak_centre"]

    def _timeline(self):
        """Blocks, the RF and ADC events in time order, and the cumulative
        gradient moment at each event's centre (vectorised over blocks)."""
        f = self.f
        B = f.blocks
        n = B.shape[0]
        self.num = B[:, 0]
        self.dur = f.durations
        self.start = np.concatenate([[0.0], np.cumsum(self.dur)[:-1]])
        self.total = float(np.sum(self.dur))
        self.has_rf, self.has_adc = B[:, 2] != 0, B[:, 6] != 0
        self.has_grad = np.any(B[:, 3:6] != 0, axis=1)
        traps, arbs = f.rows["TRAP"], f.rows["GRADIENTS"]
        top = int(max([0, *traps, *arbs]))
        trap_tab = np.zeros((top + 1, 5))
        kind = np.zeros(top + 1, np.int8)  # 0 none, 1 trapezoid, 2 arbitrary
        for i, r in traps.items():
            trap_tab[i], kind[i] = r, 1
        for i in arbs:
            kind[i] = 2
        ids = B[:, 3:6]
        bad = (ids < 0) | (ids > top)
        bad[~bad] = (ids[~bad] != 0) & (kind[ids[~bad]] == 0)
        if np.any(bad):
            j = int(np.argmax(np.any(bad, axis=1)))
            raise PulseqError(f"{f.path}: block {B[j, 0]} names gradient {ids[j][bad[j]][0]}, which neither [TRAP] "
                              "nor [GRADIENTS] holds")
        self._trap_tab, self._gkind = trap_tab, kind
        area = trap_tab[:, 0] * 1e-6 * (trap_tab[:, 2] + 0.5 * (trap_tab[:, 1] + trap_tab[:, 3]))
        for i, r in arbs.items():
            area[i] = self._moment([("arb", r), None, None], math.inf)[0]
        self.net = area[ids]  # (n, 3)
        # events: RF centres and ADC centres, each (block, time in block)
        ev_b, ev_when, ev_kind, ev_pay = [], [], [], []
        for j in np.flatnonzero(self.has_rf):
            rf = self._rf(int(B[j, 2]), int(B[j, 0]))
            ev_b.append(j)
            ev_when.append(rf.delay + rf.centre)
            ev_kind.append("rf")
            ev_pay.append((rf, bool(self.has_grad[j])))
        adc_cache = {}
        for j in np.flatnonzero(self.has_adc):
            aid = int(B[j, 6])
            if aid not in adc_cache:
                a = f.row("ADC", aid, int(B[j, 0]))
                # 1.4: num dwell delay freq phase; 1.5: num dwell delay freqPPM phasePPM freq phase phase_id
                if f.version[1] >= 5:
                    if a[3] != 0.0 or a[4] != 0.0:
                        raise PulseqError(f"{f.path}: ADC {aid} has an offset in ppm, which is not read")
                    num, dwell, delay, freq, phase = a[0], a[1] * 1e-9, a[2] * 1e-6, a[5], a[6]
                else:
                    num, dwell, delay, freq, phase = a[0], a[1] * 1e-9, a[2] * 1e-6, a[3], a[4]
                half = 0.5 * num * dwell
                adc_cache[aid] = (delay, delay + half, phase + 2 * np.pi * freq * half)
            delay, centre, phase = adc_cache[aid]
            ev_b.append(j)
            ev_when.append(centre)
            ev_kind.append("adc")
            ev_pay.append((phase, delay))
        ev_b = np.asarray(ev_b, dtype=np.int64)
        ev_when = np.asarray(ev_when, dtype=np.float64)
        order = np.lexsort((ev_when, ev_b)) if ev_b.size else np.zeros(0, np.int64)
        self.ev_b, self.ev_when = ev_b[order], ev_when[order]
        self.ev_kind = [ev_kind[i] for i in order]
        self.ev_pay = [ev_pay[i] for i in order]
        late = self.ev_when > self.dur[self.ev_b] + 1e-9
        if np.any(late):
            raise PulseqError(f"{f.path}: block {B[self.ev_b[np.argmax(late)], 0]}: an event's centre lies past the "
                              f"block's end ({self.dur[self.ev_b[np.argmax(late)]] * 1e3:g} ms)")
        cum = np.concatenate([np.zeros((1, 3)), np.cumsum(self.net, axis=0)])
        self.end_moment = cum[-1]
        partial = np.zeros((self.ev_b.size, 3))
        G = ids[self.ev_b]  # (events, 3): each event's block's gradients
        K = kind[G]
        tr = K == 1
        if np.any(tr):
            amp, rise, flat, fall, delay = (trap_tab[G[tr]] * np.array([1, 1e-6, 1e-6, 1e-6, 1e-6])).T
            t = self.ev_when[np.nonzero(tr)[0]]
            partial[tr] = _trap_moments(amp, rise, flat, fall, delay, t)
        for e, ax in zip(*np.nonzero(K == 2)):
            row = [None, None, None]
            row[ax] = ("arb", arbs[int(G[e, ax])])
            partial[e, ax] = self._moment(row, float(self.ev_when[e]))[ax]
        self.points = cum[self.ev_b] + partial
        self.point_block = self.num[self.ev_b]

    @property
    def blocks(self):
        """The blocks as a dephasing handler sees them."""
        return [PulseqBlock(int(self.num[j]), float(self.start[j]), float(self.dur[j]), bool(self.has_rf[j]),
                            bool(self.has_adc[j]), self.net[j].copy()) for j in range(self.num.size)]

    @property
    def events(self):
        """Per block, its events: (time in block, kind, payload)."""
        out = [[] for _ in range(self.num.size)]
        for j, w, k, pay in zip(self.ev_b, self.ev_when, self.ev_kind, self.ev_pay):
            out[j].append((float(w), k, pay if k == "rf" else pay[0]))
        return out

    # -- dephasing ----------------------------------------------------------

    def _shifts(self):
        """Integer shifts before each event (the first: 0) and after the
        last (wrapping round to the first), and the unit vector (cycles/m)."""
        n = len(self.points)
        if n == 0:
            return [], 0, np.zeros(3)
        pts = np.array(self.points)
        inc = np.zeros((n, 3))
        if self.periodic:  # from the last event round to the first of the next playing
            inc[0] = self.end_moment - pts[-1] + pts[0]
        inc[1:] = np.diff(pts, axis=0)
        blocks = [int(b) for b in self.point_block]
        # what is left of rewound moments by the file's rounding of amplitudes
        inc[np.abs(inc) <= 1e-6 * np.max(np.abs(inc), initial=0.0)] = 0.0
        tol_abs = MOMENT_TOLERANCE / self.voxel
        if self.axis is not None or self.unit is not None:
            axis = self.axis if self.axis is not None else self._dominant_axis(inc)
            c = inc @ axis
            u = self.unit if self.unit is not None else _common_unit(c, MOMENT_TOLERANCE, tol_abs)
            if u is None:
                raise PulseqError(f"{self.f.path}: the gradient moments along {np.round(axis, 6).tolist()} have no "
                                  f"common unit (within {MOMENT_TOLERANCE:g} of it): give unit (cycles/m), or "
                                  "dephasing= a callable")
            if u == 0:
                return [0] * n, 0, np.zeros(3)
            k = np.round(c / u)
            bad = np.flatnonzero(np.abs(c - k * u) > max(MOMENT_TOLERANCE * u, tol_abs))
            if bad.size:
                j = bad[0]
                raise PulseqError(f"{self.f.path}: block {blocks[j]}: the gradient moment since the previous RF or "
                                  f"ADC event, {c[j]:.6g} cycles/m along {np.round(axis, 6).tolist()}, is not a whole "
                                  f"number of unit = {u:.6g} cycles/m: it would be rounded")
            k = k.astype(np.int64)
            return [0] + k[1:].tolist(), int(k[0]), axis * u
        # which axes dephase: those not rewound between consecutive RF pulses
        rf_at = [i for i, kind in enumerate(self.ev_kind) if kind == "rf"]
        balanced = np.zeros(3, dtype=bool)
        peak = np.max(np.abs(inc), axis=0).tolist()
        if len(rf_at) >= 2 or (rf_at and self.periodic):
            cyc = np.concatenate([pts[rf_at], [pts[rf_at[0]] + self.end_moment]]) if self.periodic else pts[rf_at]
            between = np.diff(cyc, axis=0)
            balanced = np.all(np.abs(between) <= 1e-6 * np.maximum(peak, 1e-30) + tol_abs, axis=0)
        # a unit must itself dephase the voxel: distinct orders closer than that are not distinct pathways
        strong = [p * self.voxel >= ENCODING_CYCLES for p in peak]
        units = [_common_unit(inc[:, a], MOMENT_TOLERANCE, tol_abs, ENCODING_CYCLES / self.voxel) if strong[a] else 0.0
                 for a in range(3)]
        chosen, g_all, independent = [], None, []
        order = sorted(range(3), key=lambda a: (bool(balanced[a]), -peak[a]))
        for a in order:
            if units[a] == 0 or not strong[a]:
                continue  # no moment, or one well under a cycle across the voxel (phase encoding)
            if units[a] is None:
                if balanced[a] or peak[a] * self.voxel < 1.0:
                    continue  # encodes k-space (phase encoding, EPI blips): left out
                found = self._spoiling(inc, np.flatnonzero(strong).tolist(), units, blocks)
                if found is not None:
                    return found
                j = self._first_bad(inc[:, a])
                raise PulseqError(f"{self.f.path}: the gradient moments on the {'xyz'[a]} axis have no common unit: "
                                  f"block {blocks[j]}'s moment since the previous RF or ADC event, "
                                  f"{inc[j, a]:.6g} cycles/m, is not a whole multiple of the others within "
                                  f"{MOMENT_TOLERANCE:g}; one EPG order cannot hold it without rounding (give axis and "
                                  "unit, or dephasing= a callable)")
            trial = chosen + [a]
            N = np.round(inc[:, trial] / np.array([units[b] for b in trial])).astype(np.int64)
            g = self._direction(N)
            if g is None:
                if balanced[a]:
                    continue
                independent.append(a)
                continue
            chosen, g_all = trial, g
        if independent:
            axes = chosen + independent
            return self._spoiling(inc, axes, units, blocks) or self._lattice(inc, axes, units, blocks)
        if not chosen:
            return [0] * n, 0, np.zeros(3)
        N = np.round(inc[:, chosen] / np.array([units[b] for b in chosen])).astype(np.int64)
        i0 = int(np.flatnonzero(g_all)[0])
        q = (N[:, i0] // g_all[i0]).tolist()
        vec = np.zeros(3)
        for i, a in enumerate(chosen):
            vec[a] = g_all[i] * units[a]
        return [0] + q[1:], q[0], vec

    def _spoiling(self, inc, axes, units, blocks):
        """Shifts when the moments run along one direction g in whole
        numbers of a unit u but for a few intervals that no combination of
        each other (each once) can bring onto that lattice: a pathway
        transverse during such an interval can never refocus, so the
        interval spoils exactly ('spoil'), and the rest shift along g.  An
        inversion's spoiler that the train's moments cannot undo is such an
        interval.  None where the moments are not of that form."""
        V = np.zeros_like(inc)
        V[:, axes] = inc[:, axes]
        norm = np.linalg.norm(V, axis=1)
        rows = np.flatnonzero(norm > 0)
        if rows.size == 0:
            return None
        dirs = V[rows] / norm[rows, None]
        dirs *= np.where(dirs[np.arange(rows.size), np.argmax(np.abs(dirs), axis=1)] < 0, -1.0, 1.0)[:, None]
        keys, counts = np.unique(np.round(dirs, 6), axis=0, return_counts=True)
        g = keys[np.argmax(counts)]
        g = g / np.linalg.norm(g)
        along = V @ g
        across = np.linalg.norm(V - np.outer(along, g), axis=1)
        tol_abs = MOMENT_TOLERANCE / self.voxel
        parallel = across <= np.maximum(MOMENT_TOLERANCE * norm, tol_abs)
        u = _common_unit(along[parallel & (norm > 0)], MOMENT_TOLERANCE, tol_abs, ENCODING_CYCLES / self.voxel)
        if not u:
            return None
        tol = max(MOMENT_TOLERANCE * u, tol_abs)
        k = np.round(along / u)
        off = (norm > 0) & ~(parallel & (np.abs(along - k * u) <= tol))
        S = V[off]
        if not 0 < len(S) <= 10 or (self.periodic and (len(S) > 1 or np.any(parallel[off]))):
            return None
        for signs in itertools.product((-1, 0, 1), repeat=len(S)):
            if any(signs):
                w = np.asarray(signs, dtype=np.float64) @ S
                a = w @ g
                if np.linalg.norm(w - a * g) <= tol and abs(a - round(a / u) * u) <= tol:
                    return None  # these intervals could undo each other: not spoils
        shifts = ["spoil" if o else int(q) for o, q in zip(off, k.astype(np.int64))]
        return [0] + shifts[1:], shifts[0], g * u

    def _lattice(self, inc, axes, units, blocks):
        """Shifts for axes that dephase independently: whole numbers n_a
        of each axis's unit, mapped to one order k = sum_a M_a n_a with the
        multipliers M_a large enough that no moment the file can reach
        (|n_a| at most the sum of |n_a| over its intervals) maps onto
        another: every pathway keeps an order of its own, and only those
        that refocus on every axis land on order 0."""
        N = np.round(inc[:, axes] / np.array([units[b] for b in axes])).astype(np.int64)
        reach = np.sum(np.abs(N), axis=0)
        first = np.argsort(reach, kind="stable")  # the smaller reach takes the unit multiplier
        axes, N, reach = [axes[i] for i in first], N[:, first], reach[first]
        mult, span = [], 0
        for r in reach:
            m = 2 * span + 1
            mult.append(m)
            span += m * int(r)
        names = "/".join("xyz"[b] for b in axes)
        if self.periodic or span > _MAX_LATTICE_ORDERS:
            why = ("the file is played again (repetitions), so the moments it reaches have no bound"
                   if self.periodic else f"it would take {span} orders (more than {_MAX_LATTICE_ORDERS})")
            raise PulseqError(f"{self.f.path}: the gradient moments on the {names} axes dephase independently "
                              f"(e.g. block {blocks[int(np.argmax(np.any(N != 0, axis=1)))]}) and one EPG order "
                              f"cannot keep them apart: {why}; give axis= to follow one, or dephasing= a callable")
        k = N @ np.array(mult, dtype=np.int64)
        return [0] + k[1:].tolist(), int(k[0]), np.full(3, np.nan)

    @staticmethod
    def _dominant_axis(inc):
        return np.eye(3)[int(np.argmax(np.sum(np.abs(inc), axis=0)))]

    @staticmethod
    def _first_bad(c):
        """The first moment that is not a whole multiple of the smallest."""
        a = np.abs(c)
        base = a[a > 0].min()
        r = a / base
        bad = (a > 0) & (np.abs(r - np.round(r)) > MOMENT_TOLERANCE)
        return int(np.argmax(bad)) if np.any(bad) else int(np.argmax(a > 0))

    @staticmethod
    def _direction(N):
        """The primitive integer vector g with every row of N a multiple of
        it, or None (rows not proportional)."""
        if N.shape[0] > 64:  # long files: the same test over arrays
            nz = np.any(N != 0, axis=1)
            if not np.any(nz):
                return np.zeros(N.shape[1], dtype=np.int64)
            first = N[int(np.argmax(nz))]
            g = first // np.gcd.reduce(np.abs(first))
            i0 = int(np.flatnonzero(g)[0])
            g = -g if g[i0] < 0 else g
            return g if np.array_equal(N, np.outer(N[:, i0] // g[i0], g)) else None
        rows = [r for r in N.tolist() if any(r)]
        if not rows:
            return np.zeros(N.shape[1], dtype=np.int64)
        d = math.gcd(*rows[0])
        g = [x // d for x in rows[0]]
        i0 = next(i for i, x in enumerate(g) if x)
        if g[i0] < 0:
            g = [-x for x in g]
        for r in rows:
            q = r[i0] // g[i0]
            if any(x != q * y for x, y in zip(r, g)):
                return None
        return np.array(g, dtype=np.int64)

    # -- operators ----------------------------------------------------------

    def _hard_ok(self, rf, selective):
        return rf.one_phase() and (selective or rf.freq == 0.0)

    def _rf_ops(self, rf, selective, block):
        """(operators, time from the pulse start at which they begin, their
        duration): the pulse as the RF model plays it."""
        hard = self.rf_mode == "hard" or (self.rf_mode == "auto" and self._hard_ok(rf, selective))
        if hard and not self._hard_ok(rf, selective):
            why = ("its waveform's phase varies (adiabatic, frequency or phase modulated)" if not rf.one_phase()
                   else f"it is {rf.freq:g} Hz off resonance without a gradient")
            raise PulseqError(f"{self.f.path}: block {block}: RF {rf.rid} cannot be played as a hard pulse: {why}; "
                              "read with rf='shaped' or 'auto'")
        # the file's phase at time t from the pulse start: phase + 2 pi freq t; SPEC's is its negative
        centre_phase = rf.phase + 2 * np.pi * rf.freq * rf.centre
        if hard:
            area = rf.area()
            flip = np.degrees(2 * np.pi * abs(area))
            energy = rf.energy()
            power = energy * rf.duration / abs(area) ** 2 if area != 0 else 1.0
            ph = -np.degrees(centre_phase + np.angle(area))
            return [Pulse(flip, ph, rf.duration * 1e3, 0.0 if selective else rf.freq, power)], rf.centre, 0.0
        t, w = rf.cells()
        dwell = rf.raster
        coarse = bool(self.max_samples and w.size > self.max_samples) and not selective
        if coarse:
            # averaged over groups of k cells, each group then an exact rectangle (RF, off-resonance and
            # relaxation together): each group's area kept, its samples' detail not
            k = -(-w.size // self.max_samples)
            pad = (-w.size) % k
            w = np.concatenate([w, np.zeros(pad, w.dtype)]).reshape(-1, k).mean(axis=1)
            t = t[0] - 0.5 * dwell + (np.arange(w.size) + 0.5) * k * dwell
            dwell = k * dwell
        freq = 0.0 if selective else rf.freq
        ops = []
        # runs of equal samples (a pulse without a gradient plays each run as one exact rectangle)
        edges = np.arange(w.size + 1) if selective else np.concatenate(
            [[0], np.flatnonzero(w[1:] != w[:-1]) + 1, [w.size]])
        for i, j in zip(edges[:-1].tolist(), edges[1:].tolist()):
            # the file's phase at the start of the run (a RectPulse) or at the sample's centre (a rotation)
            if selective:
                base = centre_phase
            else:
                base = rf.phase + 2 * np.pi * rf.freq * (t[i] - (0.5 * dwell if j - i > 1 or coarse else 0.0))
            ph = -math.degrees(base + np.angle(w[i]))
            if j - i > 1 or coarse:
                d = (j - i) * dwell
                ops.append(RectPulse(360.0 * abs(w[i]) * d, d * 1e3, ph, freq) if w[i] != 0 else Delay(d * 1e3))
            else:
                half = Delay(0.5 * dwell * 1e3)
                ops += [half, Pulse(360.0 * abs(w[i]) * dwell, ph, dwell * 1e3, freq, 1.0), half]
        start = float(t[0] - 0.5 * dwell)
        return ops, start, w.size * dwell

    def ops(self):
        if self.dephasing == "moment":
            return self._moment_ops()
        self.unit_vector = np.zeros(3)
        ops, e, before, wrap = [], 0, None, 0
        for b, evs in zip(self.blocks, self.events):
            cursor = 0.0  # time in the block the operators have reached
            for when, kind, payload in evs:
                shift = [] if before is None or not before[e] else (
                    [Spoil()] if before[e] == "spoil" else [Dephase(int(before[e]))])
                e += 1
                if kind == "adc":
                    ops += [Delay(1e3 * (when - cursor))] + shift + [Readout(-np.degrees(payload))]
                    cursor = when
                    continue
                rf, selective = payload
                pulse, begin, length = self._rf_ops(rf, selective, b.index)
                at = rf.delay + begin
                if at < cursor - 1e-9:
                    raise PulseqError(f"{self.f.path}: block {b.index}: RF {rf.rid} overlaps the block's ADC "
                                      "centre, which blochsim cannot play")
                ops += [Delay(1e3 * max(at - cursor, 0.0))] + shift + pulse
                cursor = max(at, cursor) + length
            rest = b.duration - cursor
            if rest < -1e-9:
                raise PulseqError(f"{self.f.path}: block {b.index}: its events run past its duration "
                                  f"({b.duration * 1e3:g} ms)")
            ops.append(Delay(1e3 * max(rest, 0.0)))
            if self.dephasing == "spoil":
                if not b.rf and not b.adc and np.any(np.abs(b.moment) > 0):
                    ops.append(Spoil())
            elif callable(self.dephasing):
                k = self.dephasing(b)
                if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
                    raise TypeError(f"the dephasing handler must return an int for block {b.index}, got {k!r}")
                if k:
                    ops.append(Dephase(int(k)))
        if wrap:
            ops.append(Spoil() if wrap == "spoil" else Dephase(int(wrap)))
        return [op for op in ops if not (isinstance(op, Delay) and op.duration == 0.0)]


    def _shift_times(self):
        """For each event, the time (s) at which the moment since the
        previous event is applied: the centroid of that moment's magnitude
        along the dephasing direction over the blocks (or parts of blocks)
        that carry it, so that the shift sits on the crusher or spoiler
        that makes it.  (The EPG's gradients are instantaneous; D and v act
        on each order for the time it holds.)"""
        n = len(self.ev_kind)
        at = self.start[self.ev_b] + self.ev_when if n else np.zeros(0)
        u = self.unit_vector
        norm = math.hypot(*u.tolist())
        if n < 2 or not (0.0 < norm < math.inf):
            return at
        d = u / norm
        # per block: its moment along d and where it sits (the trapezoids' centroids)
        parts = np.abs(self.net * d)  # (blocks, 3)
        w = parts.sum(axis=1)
        ids = self.f.blocks[:, 3:6]
        r, f, fa, dl = (self._trap_tab[:, i] * 1e-6 for i in (1, 2, 3, 4))
        with np.errstate(divide="ignore", invalid="ignore"):
            centroid = dl + (r * r / 3 + f * (r + 0.5 * f) + 0.5 * fa * (r + f + fa / 3)) / (
                0.5 * r + f + 0.5 * fa)
        centroid = np.where(self._gkind == 1, np.where(np.isfinite(centroid), centroid, 0.0), np.nan)
        c = centroid[ids]  # (blocks, 3), nan for arbitrary gradients and none
        c = np.where(np.isnan(c), 0.5 * self.dur[:, None], c)
        with np.errstate(divide="ignore", invalid="ignore"):
            inside = np.where(w > 0, np.sum(parts * c, axis=1) / w, 0.5 * self.dur)
        mid = self.start + inside
        W = np.concatenate([[0.0], np.cumsum(w)])
        WT = np.concatenate([[0.0], np.cumsum(w * mid)])
        part = self.points - (np.concatenate([np.zeros((1, 3)), np.cumsum(self.net, axis=0)])[self.ev_b])
        before = np.abs(part @ d)  # from the event's block start to the event
        after = np.abs((self.net[self.ev_b] - part) @ d)  # from the event to its block's end
        end = self.start[self.ev_b] + self.dur[self.ev_b]
        j0, j1 = self.ev_b[:-1], self.ev_b[1:]
        wt = (after[:-1] * 0.5 * (at[:-1] + end[:-1]) + before[1:] * 0.5 * (self.start[j1] + at[1:])
              + WT[j1] - WT[np.minimum(j0 + 1, j1)])
        ws = after[:-1] + before[1:] + W[j1] - W[np.minimum(j0 + 1, j1)]
        out = at.copy()
        # within one block, or no moment: at the event
        use = (j0 != j1) & (ws > 0)
        out[1:][use] = wt[use] / ws[use]
        return out

    def _moment_ops(self):
        """The operators with shifts from the moments: one pass over the
        events in time order (delays between them merge, as the event
        stream would merge them)."""
        before, wrap, self.unit_vector = self._shifts()
        when = self._shift_times()
        ops, cursor = [], 0.0  # the time the operators have reached, s from the file's start
        pulses = {}
        blocks = self.ev_b.tolist()
        starts = self.start[self.ev_b].tolist()
        event_at = (self.start[self.ev_b] + self.ev_when).tolist()
        ends = (self.start + self.dur)[self.ev_b].tolist()
        when = when.tolist()
        for e, kind in enumerate(self.ev_kind):
            j, t0 = blocks[e], starts[e]
            k = before[e]
            shift = []
            if k:
                # the shift where the interval's gradients are (what D and v see), at latest the event
                t_shift = min(max(when[e], cursor), event_at[e])
                ops.append(Delay(1e3 * (t_shift - cursor)))
                cursor = t_shift
                shift = [Spoil()] if k == "spoil" else [Dephase(int(k))]
            if kind == "adc":
                at = event_at[e]
                if at < cursor - 1e-9:
                    raise PulseqError(f"{self.f.path}: block {self.num[j]}: its ADC centre falls inside an RF "
                                      "pulse, which blochsim cannot play")
                ops += shift + [Delay(1e3 * max(at - cursor, 0.0)), Readout(-math.degrees(self.ev_pay[e][0]))]
                cursor = max(at, cursor)
                continue
            rf, selective = self.ev_pay[e]
            key = (rf.rid, selective)
            if key not in pulses:
                pulses[key] = self._rf_ops(rf, selective, int(self.num[j]))
            pulse, begin, length = pulses[key]
            at = t0 + rf.delay + begin
            if at < cursor - 1e-9:
                raise PulseqError(f"{self.f.path}: block {self.num[j]}: RF {rf.rid} overlaps the block's ADC "
                                  "centre, which blochsim cannot play")
            ops += shift + [Delay(1e3 * max(at - cursor, 0.0))] + pulse
            cursor = max(at, cursor) + length
            if cursor > ends[e] + 1e-9:
                raise PulseqError(f"{self.f.path}: block {self.num[j]}: its events run past its duration "
                                  f"({self.dur[j] * 1e3:g} ms)")
        ops.append(Delay(1e3 * max(self.total - cursor, 0.0)))
        if wrap:
            ops.append(Spoil() if wrap == "spoil" else Dephase(int(wrap)))
        return [op for op in ops if not (isinstance(op, Delay) and op.duration == 0.0)]


def _field_strength(f, field_strength):
    if field_strength is None and "B0" in f.defs:
        try:
            return float(f.defs["B0"][0])
        except (ValueError, IndexError):
            raise PulseqError(f"{f.path}: [DEFINITIONS] B0 is not a number") from None
    return field_strength


def read_pulseq(path, rf="auto", dephasing="moment", axis=None, unit=None, field_strength=None,
                voxel_size_m=None, periodic=False) -> Sequence:
    """The operators of a Pulseq file (see the module's notes for what is
    read and how).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.seq`` file (format 1.4 or 1.5).
    rf : {"auto", "hard", "shaped"}
        Each RF event as a hard pulse at its centre, played from its
        waveform, or hard where that is exact for the slice-centre spin and
        shaped otherwise (default).
    dephasing : {"moment", "spoil"} or callable
        How gradients become EPG shifts: whole numbers of the moments'
        common unit (default); ideal spoiling by blocks with a net moment
        and no RF or ADC; or ``dephasing(block) -> int`` shifts at the end
        of each :class:`PulseqBlock`.
    axis : {"x", "y", "z"} or array_like, shape (3,), optional
        Follow the moment along this direction alone.
    unit : float, cycles/m, optional
        Moment of one shift (checked: a moment that is not a whole number
        of it is refused).
    field_strength : float, T, optional
        Needed for RF frequency offsets given in ppm (format 1.5; default:
        the file's ``B0`` definition if it has one).
    voxel_size_m : float, m, optional
        The voxel the moments dephase: a moment is a whole number of the
        unit when its remainder puts under 1e-3 cycles across it.
    periodic : bool, optional
        The file is played again after its end (``repetitions``): the
        moment from its last RF or ADC event round to its first counts too.

    Returns
    -------
    Sequence
    """
    return _read(path, rf, dephasing, axis, unit, field_strength, voxel_size_m, periodic)[0]


def _read(path, rf, dephasing, axis, unit, field_strength, voxel_size_m, periodic):
    f = _File(path)
    reader = _Reader(f, rf, dephasing, axis, unit, _field_strength(f, field_strength), voxel_size_m, periodic)
    return Sequence(reader.ops()), reader.unit_vector


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
        geometry for D and v (``crusher_dephasing_rad`` = 2π |unit| voxel).
    states, repetitions, crusher_dephasing_rad, device, threads, ...
        See :class:`blochsim.Simulator`.

    Tissue: every property of :class:`blochsim.Simulator`.
    """

    protocol = {"path": None, "rf": "auto", "dephasing": "moment", "axis": None, "unit": None,
                "field_strength": None}

    def check_protocol(self, p):
        if p["path"] is None:
            return p
        path = os.fspath(p["path"])
        stamp = os.stat(path).st_mtime_ns if os.path.isfile(path) else None
        key = (path, stamp, p["rf"], p["dephasing"], None if p["axis"] is None else str(p["axis"]), str(p["unit"]),
               str(p["field_strength"]), p["voxel_size_m"], p["repetitions"] != 1)
        if key not in _CACHE:
            if len(_CACHE) > 16:
                _CACHE.pop(next(iter(_CACHE)))
            _CACHE[key] = _read(path, p["rf"], p["dephasing"], p["axis"], p["unit"], p["field_strength"],
                                p["voxel_size_m"], p["repetitions"] != 1)
        p["_sequence"], unit_vector = _CACHE[key]
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
                    rf = _RF(rf.rid, rf.wave, rf.times, rf.linear, rf.raster, rf.delay, rf.centre, 0.0, phase)
                else:
                    rf = _RF(rf.rid, rf.wave, rf.times, rf.linear, rf.raster, rf.delay, rf.centre, rf.freq, phase)
                pulse, begin, length = reader._rf_ops(rf, False, b.index)
                at = rf.delay + begin
                ops += [Delay(1e3 * max(at - cursor, 0.0))] + pulse
                cursor = max(at, cursor) + length
            ops.append(Delay(1e3 * max(b.duration - cursor, 0.0)))
            clock += b.duration
            if not b.rf and not b.adc and np.any(b.moment != 0):
                ops.append(Spoil())
        return out

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
