"""The Pulseq file itself: its sections, rows, shapes and blocks, parsed and
checked against the format (versions 1.3, 1.4 and 1.5), with the line,
section or block named in every refusal."""
from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass, field

import numpy as np

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


class PulseqWarning(UserWarning):
    """A Pulseq file that plays but departs from the format's rules (a time
    off its declared raster, read as written, as pypulseq reads it); the
    message names the file and the line."""


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
                # the scanner's interpreter and pypulseq take the value as written; so does the reader
                label = f"RF {i}" if section == "RF" else str(i)
                warnings.warn(f"{self.path}, line {self.line_of(section, i)}: {what.format(label)} raster "
                              f"({raster:g} s); read as written", PulseqWarning, stacklevel=2)

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
