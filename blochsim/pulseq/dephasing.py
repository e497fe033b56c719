"""How a Pulseq file's gradients dephase: the gradient moments between RF
and ADC centres as whole numbers of a common dephasing unit, the axes that
encode rather than dephase, spoiling intervals, and the map of
independently dephasing axes onto one EPG order (the model:
:mod:`blochsim.pulseq`)."""
from __future__ import annotations

import itertools
import math

import numpy as np

from blochsim.pulseq.file import PulseqError

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


class _Dephasing:
    """The dephasing analysis of a :class:`blochsim.pulseq.reader._Reader`
    (mixed into it): the shifts each interval between RF and ADC centres
    puts on the EPG order."""

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
        if self.dephasing == "keyed":
            return self._keyed(inc, pts, tol_abs)
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
        try:
            return self._combined(inc, pts, blocks, tol_abs)
        except PulseqError:
            found = self._generators(inc, blocks)
            if found is None:
                return self._keyed(inc, pts, tol_abs)  # one order cannot hold them: states keyed by moment
            return found

    def _axes(self, inc, pts, tol_abs):
        """Per axis: its largest moment, whether it is rewound between
        consecutive RF pulses (it encodes and does not dephase), and whether
        its moments put at least ENCODING_CYCLES across the voxel."""
        rf_at = [i for i, kind in enumerate(self.ev_kind) if kind == "rf"]
        balanced = np.zeros(3, dtype=bool)
        peak = np.max(np.abs(inc), axis=0).tolist()
        if len(rf_at) >= 2 or (rf_at and self.periodic):
            cyc = np.concatenate([pts[rf_at], [pts[rf_at[0]] + self.end_moment]]) if self.periodic else pts[rf_at]
            between = np.diff(cyc, axis=0)
            balanced = np.all(np.abs(between) <= 1e-6 * np.maximum(peak, 1e-30) + tol_abs, axis=0)
        # a unit must itself dephase the voxel: distinct orders closer than that are not distinct pathways
        strong = [p * self.voxel >= ENCODING_CYCLES for p in peak]
        return peak, balanced, strong

    def _keyed(self, inc, pts, tol_abs):
        """The moments of the axes that dephase, as 3-D vectors (cycles/m)
        for the moment-keyed EPG (blochsim/sequence/keyed.py), on a lattice
        of MOMENT_TOLERANCE cycles across the voxel: shifts before each
        event (0 for none) and after the last, and a NaN unit vector (no
        one order)."""
        _, balanced, strong = self._axes(inc, pts, tol_abs)
        use = np.array(strong) & ~np.asarray(balanced)
        self.keyed_axes = use
        m = np.where(use[None, :], inc, 0.0)
        self.keyed_step = tol_abs  # MOMENT_TOLERANCE cycles across the voxel
        shifts = [tuple(v) if np.any(v) else 0 for v in m.tolist()]
        return [0] + shifts[1:], shifts[0], np.full(3, np.nan)

    def _combined(self, inc, pts, blocks, tol_abs):
        """Shifts of the axes that dephase, combined on one order (the
        default analysis); PulseqError where it cannot hold them."""
        n = len(inc)
        peak, balanced, strong = self._axes(inc, pts, tol_abs)
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
                                  f"{MOMENT_TOLERANCE:g}; one EPG order cannot hold it without rounding (give "
                                  f"axis='{'xyz'[a]}' and a unit that divides its moments, or dephasing= a callable)")
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

    def _along_one(self, inc, axes):
        """The moments on ``axes`` (V, n × 3) against their most common
        direction g (unit vector) and its unit u (cycles/m, the common
        unit of the moments parallel to g): (V, g, u, k, off, parallel),
        k each moment's whole number of u along g, off the nonzero moments
        not on that lattice; None without moments or a unit."""
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
        tol_abs = MOMENT_TOLERANCE / self.voxel
        parallel = np.linalg.norm(V - np.outer(along, g), axis=1) <= np.maximum(MOMENT_TOLERANCE * norm, tol_abs)
        u = _common_unit(along[parallel & (norm > 0)], MOMENT_TOLERANCE, tol_abs, ENCODING_CYCLES / self.voxel)
        if not u:
            return None
        k = np.round(along / u)
        off = (norm > 0) & ~(parallel & (np.abs(along - k * u) <= max(MOMENT_TOLERANCE * u, tol_abs)))
        return V, g, u, k, off, parallel

    def _generators(self, inc, blocks):
        """Shifts when the moments run along one direction g in whole
        numbers of a unit u but for a few intervals (E: the spoilers
        between the shots of a turbo spin echo) whose moment vectors, each
        taken as a generator of its own, no small combination of each
        other can bring onto g's lattice; or None.

        A pathway's moment is then n u g + Σ_j n_j G_j, n_j the signed
        count of its transverse passes through generator j's intervals
        (|n_j| at most their number), and n and the n_j determine it
        uniquely; the order k = n + Σ_j M_j n_j with multipliers M_j larger
        than twice the reach of everything before keeps every such moment
        on an order of its own, and only the moment 0 on order 0: exact.
        """
        if self.periodic:
            return None
        peak = np.max(np.abs(inc), axis=0)
        axes = np.flatnonzero(peak * self.voxel >= ENCODING_CYCLES)
        found = self._along_one(inc, axes)
        if found is None:
            return None
        V, g, u, k, off, _ = found
        tol_abs = MOMENT_TOLERANCE / self.voxel
        tol = max(MOMENT_TOLERANCE * u, tol_abs)
        on = ~off
        E = np.flatnonzero(off)
        if not 0 < E.size <= 64:
            return None
        def on_lattice(w):
            """w's whole number of u along g, or None when w is off g's lattice."""
            a = w @ g
            if np.linalg.norm(w - a * g) <= tol_abs and abs(a - round(a / u) * u) <= tol:
                return int(round(a / u))
            return None

        # each E interval as ±(a generator) plus a whole number of u along g
        gens, which = [], []
        for i in E:
            for j, G in enumerate(gens):
                found = [(sign, m) for sign in (1, -1) if (m := on_lattice(V[i] - sign * G)) is not None]
                if found:
                    which.append((j,) + found[0])
                    break
            else:
                gens.append(V[i])
                which.append((len(gens) - 1, 1, 0))
        count = np.bincount([j for j, _, _ in which], minlength=len(gens))
        if math.prod(4 * int(c) + 1 for c in count) > 100_000:
            return None
        # no two pathways with other counts may share a moment: no difference
        # of counts (each within twice its reach) lands on g's lattice
        G = np.array(gens)
        for e in itertools.product(*[range(-2 * int(c), 2 * int(c) + 1) for c in count]):
            if any(e) and on_lattice(np.asarray(e, dtype=np.float64) @ G) is not None:
                return None
        reach = int(np.sum(np.abs(k[on]))) + sum(abs(m) for _, _, m in which)
        mult, span = [], reach
        for c in count:
            m = 2 * span + 1
            mult.append(m)
            span += m * int(c)
        if span > _MAX_LATTICE_ORDERS:
            return None
        key = k.astype(np.int64)
        for i, (j, sign, m) in zip(E, which):
            key[i] = sign * mult[j] + m
        return [0] + key[1:].tolist(), int(key[0]), np.full(3, np.nan)

    def _spoiling(self, inc, axes, units, blocks):
        """Shifts when the moments run along one direction g in whole
        numbers of a unit u but for a few intervals that no combination of
        each other (each once) can bring onto that lattice: a pathway
        transverse during such an interval can never refocus, so the
        interval spoils exactly ('spoil'), and the rest shift along g.  An
        inversion's spoiler that the train's moments cannot undo is such an
        interval.  None where the moments are not of that form."""
        found = self._along_one(inc, axes)
        if found is None:
            return None
        V, g, u, k, off, parallel = found
        tol = max(MOMENT_TOLERANCE * u, MOMENT_TOLERANCE / self.voxel)
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
