"""The moment-keyed EPG's program (src_cpp/include/blochsim/epg/keyed.hpp):
for a packed stream whose events carry 3-D gradient moments
(``_Moment`` operators, in lattice steps), the keys of the states each
event holds and the maps that move them, decided once per sequence and
tissue range and played by the core for every voxel.

The states are keyed by their gradient moment on a lattice (the Pulseq
reader's step is :data:`blochsim.pulseq.MOMENT_TOLERANCE` cycles across the
voxel per axis): two pathways whose moments agree to a step dephase alike
across the voxel and are one state (the moments of an interval are rounded
to the lattice once; a pathway's key is the sum of its rounded moments).  Two prunings keep the
states few:

- exact: a state that can never be read again is dropped.  A backward
  pass over the stream finds, after each map, the moments from which an F
  coefficient or a Z can still reach the origin at a later readout (the
  readout's origin, moved back through every map and symmetrised at every
  pulse, which may turn a coefficient into its conjugate or store it in
  Z); a state farther from all of them than the lattice's merging can
  drift over the maps left (one cell a map) is dropped.  Where those sets
  would grow past ``READABLE_CAP`` moments (early in a long train of
  incommensurate moments) the test falls back to the moments left to play
  per axis, which the state must not exceed;
- bounded: each state's magnitude is bounded over the call's tissue (the
  largest B1 range, T1 and T2 of its voxels, the sum over the pathways that
  reach it of the products of their rotations' magnitudes), and states
  whose bound falls below ``PRUNE`` are dropped, the threshold lowered until
  the bound of what they change is at most ``ERROR_BOUND``.  The states are
  the Fourier components of the magnetisation field, and the operators
  (rotations, shifts, relaxation) never lengthen that field in L2
  (Parseval), so what one event drops moves every later sample by at most
  M0 times its L2 length, the root of the summed squares of the dropped
  states' bounds; :attr:`KeyedProgram.error_bound` sums that over the
  events.
"""
from __future__ import annotations

import math

import numpy as np

from blochsim.sequence.packing import EV_INVERSION, EV_READOUT, EV_RF, EV_SPOIL

#: states whose bound (a fraction of M0) falls below this are dropped ...
PRUNE = 1e-7
#: ... a hundredfold lower at a time (down to 1e-13, then none) until the
#: summed bound of the states dropped, the largest change of any sample, is
#: at most this (a fraction of M0)
ERROR_BOUND = 1e-5
#: a lattice cell, in lattice steps (moments within about one step of each
#: other share a cell): irrational, so that no moment a file writes (a
#: rational number of steps) sits on a cell boundary
CELL = math.e / math.sqrt(2)
_FITS = 1 << 20  # cell coordinates packed in 21 bits each
#: the most moments the backward pass holds at one map before the earlier
#: maps fall back to the per-axis test
READABLE_CAP = 200_000
#: seconds a state takes per event and voxel on one host thread (measured:
#: 3.8 ns on the 2-core CI machine, bench/NOTES.md), for the cost estimate
SECONDS_PER_STATE_EVENT = 4e-9
#: the pooled EPG on the keyed program (one voxel at a time in double
#: precision) per state-event and voxel, relative to
#: SECONDS_PER_STATE_EVENT, per three complex planes of its pools
#: (measured: 5.2 with one exchanging pool on the 2-core CI machine)
POOLED_SLOWDOWN = 5.0
#: a call expected to take longer than this (s) says so and shows its progress
LONG_CALL_S = 30.0


class SlowCallWarning(UserWarning):
    """A moment-keyed call expected to take long: its estimate, before it
    runs (progress follows on stderr)."""


class KeyedProgram:
    """The maps of a keyed stream, as the core's KeyedProgram reads them.

    Attributes
    ----------
    slots : ndarray, int32, (2 n_events,)
    first : ndarray, int64, (2 n_events + 1,)
    dst, src : ndarray, int32, (entries,)
        Per map: the entries that write a component (its first source; the
        destination + 1), then those that add to it
        (src_cpp/include/blochsim/epg/keyed.hpp).
    reach : ndarray, uint8, (slots summed over the maps,)
        Per map, per slot: the components it reaches (F+ 1, F- 2, Z 4); the
        others are zero.
    max_slots : int
        The most states any event holds.
    error_bound : float
        Largest change of any sample (a fraction of M0) the bounded pruning
        can cause.
    cost : int
        States summed over the events: the work of one voxel.
    k2 : ndarray, float64
        Each map's states' squared wavenumber |2π k|² ((rad/m)², for
        diffusion), map m's at [k2_first[m], k2_first[m] + slots[m]).
    k2_first : ndarray, int64, (2 n_events,)
    """

    def __init__(self, slots, first, dst, src, max_slots, error_bound, cost, k2, k2_first, reach):
        self.slots, self.first, self.dst, self.src, self.reach = slots, first, dst, src, reach
        self.max_slots, self.error_bound, self.cost = max_slots, error_bound, cost
        self.k2, self.k2_first = k2, k2_first

    def seconds(self, voxels, threads):
        """The expected time (s) of ``voxels`` voxels on ``threads`` threads."""
        return self.cost * voxels * SECONDS_PER_STATE_EVENT / max(1, min(threads, voxels))


def _canonical(K):
    """Whether each key (rows of K) is in the half-space: its first
    non-zero coordinate positive, or all zero."""
    nz = K != 0
    first = np.argmax(nz, axis=1)
    lead = K[np.arange(K.shape[0]), first]
    return lead >= 0


def _codes(K):
    """One int64 code per row of the cell array K, equal for equal rows."""
    if K.size == 0 or np.abs(K).max() < _FITS:
        return (K[:, 0] + _FITS) * (1 << 42) + (K[:, 1] + _FITS) * (1 << 21) + (K[:, 2] + _FITS)
    return np.unique(K, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _sup_terms(lo, hi):
    """Suprema over flips in [lo, hi] (rad) of cos²(a/2), sin²(a/2), |sin a|,
    |cos a|."""
    def hits(period, offset):
        return math.floor((hi - offset) / period) >= math.ceil((lo - offset) / period)

    ends = np.array([lo, hi])
    c2 = 1.0 if hits(2 * math.pi, 0.0) else float(np.max(np.cos(ends / 2) ** 2))
    s2 = 1.0 if hits(2 * math.pi, math.pi) else float(np.max(np.sin(ends / 2) ** 2))
    sa = 1.0 if hits(math.pi, math.pi / 2) else float(np.max(np.abs(np.sin(ends))))
    ca = 1.0 if hits(math.pi, 0.0) else float(np.max(np.abs(np.cos(ends))))
    return c2, s2, sa, ca


def _cells(K):
    """The lattice cell of each moment (rows of K, lattice steps): the
    nearest multiple of CELL, symmetric in sign (cell(-k) = -cell(k))."""
    return np.round(K / CELL).astype(np.int64)


def _unique_rows(X):
    """Rows of X (lattice steps) with duplicates (to 1e-6 of a step) removed."""
    if X.shape[0] < 2:
        return X
    R = np.ascontiguousarray(np.round(X * 1e6).astype(np.int64))
    _, i = np.unique(R.view(np.dtype((np.void, 24))).reshape(-1), return_index=True)
    return X[i]


def _readable(d_all, flags, spoil):
    """For each map m (the order of ``build``), the moments (lattice steps)
    an F coefficient and a Z may hold after it and still be read at a later
    readout, as a pair of arrays (F, Z); None for the maps before the first
    whose sets exceed READABLE_CAP.

    Backwards from the end: a map of moment d takes an F coefficient at k to
    k + d and leaves a Z in place (a spoil keeps only Z), a readout reads
    the F coefficient at 0, and a pulse or inversion mixes a slot's f(k),
    conj f(-k) and Z(k), so that before it every component is readable at
    ±k wherever any one is after it."""
    n = d_all.shape[0]
    out = [None] * (2 * n)
    BF = np.zeros((0, 3))
    BZ = np.zeros((0, 3))
    for e in range(n - 1, -1, -1):
        out[2 * e + 1] = (BF, BZ)
        if spoil[e]:
            BF = BF[:0]
        elif np.any(d_all[e, 1]):
            BF = BF - d_all[e, 1]
        if flags[e] & EV_READOUT:
            BF = _unique_rows(np.concatenate([BF, np.zeros((1, 3))]))
        if flags[e] & (EV_RF | EV_INVERSION):
            both = np.concatenate([BF, BZ])
            BF = BZ = _unique_rows(np.concatenate([both, -both]))
        out[2 * e] = (BF, BZ)
        if np.any(d_all[e, 0]):
            BF = BF - d_all[e, 0]
        if BF.shape[0] + BZ.shape[0] > READABLE_CAP:
            out[:2 * e] = [None] * (2 * e)
            break
    return out


_NEIGHBOURS = np.stack(np.meshgrid([-1, 0, 1], [-1, 0, 1], [-1, 0, 1]), axis=-1).reshape(-1, 3)


def _near(P, B, tol):
    """Whether each row of P lies within ``tol`` of some row of B on every
    axis (or, for large sets, a little farther: rows in neighbouring cells
    of a grid of side ``tol`` pass)."""
    if P.shape[0] == 0 or B.shape[0] == 0:
        return np.zeros(P.shape[0], bool)
    if P.shape[0] * B.shape[0] <= 65536:
        return np.any(np.all(np.abs(P[:, None, :] - B[None, :, :]) <= tol, axis=2), axis=1)
    cells_b = np.floor(B / tol).astype(np.int64)
    cp = np.floor(P / tol).astype(np.int64)
    if max(np.abs(cells_b).max(), np.abs(cp).max()) >= _FITS - 1:
        return np.ones(P.shape[0], bool)
    cb = np.unique(_codes(cells_b))
    c = _codes((cp[:, None, :] + _NEIGHBOURS[None, :, :]).reshape(-1, 3))
    i = np.minimum(np.searchsorted(cb, c), cb.size - 1)
    return np.any((cb[i] == c).reshape(P.shape[0], -1), axis=1)


def build(stream, b1=(1.0, 1.0), t1_max=math.inf, t2_max=math.inf, prune=PRUNE):
    """The keyed program of a packed stream with ``stream.moments``
    ((n_events, 2, 3) cycles/m: each event's moment before its pulse and
    after its readout) on a lattice of ``stream.moment_step`` cycles/m.

    Each slot keeps the exact moment of the first pathway that reached its
    cell; the pathways that reach a cell are summed there (merged), and a
    moment moves by the exact moment of each interval, so that pathways
    whose moments agree exactly meet in one cell whatever the order of
    their intervals.

    Parameters
    ----------
    stream : blochsim.sequence.packing.EventStream
    b1 : (float, float)
        Smallest and largest relative B1 of the call's voxels.
    t1_max, t2_max : float, s
        Largest T1 and T2 of the call's voxels.
    prune : float
        Bound (fraction of M0) below which a state is dropped; 0 keeps every
        state that can still be read.
    """
    n = stream.n_events
    step = float(stream.moment_step)
    d_all = np.array(stream.moments, dtype=np.float64) / step  # (n, 2, 3) lattice steps
    flags = np.asarray(stream.flags)
    spoil = (flags & EV_SPOIL) != 0
    d_all[spoil, 1] = 0.0
    # the moment left to play after each map (per axis), for the exact pruning
    steps = np.abs(d_all).reshape(2 * n, 3)
    left = np.cumsum(steps[::-1], axis=0)[::-1] - steps + CELL  # after map m: the maps m+1 ...
    readable = _readable(d_all, flags, spoil)
    # the drift of a state's cell from its pathways' exact moments: under a
    # cell for every map left that moves it (and one to spare)
    moves = np.any(steps != 0, axis=1)
    drift = (np.cumsum(moves[::-1])[::-1] - moves + 2) * CELL
    dur = np.asarray(stream.duration_s, dtype=np.float64)
    iv = np.asarray(stream.interval)
    flips = np.asarray(stream.flip_rad, dtype=np.float64)

    K = np.zeros((1, 3))  # each slot's exact moment (canonical cell), row 0 the origin's
    bP, bM, bZ = np.zeros(1), np.zeros(1), np.ones(1)
    slots = np.full(2 * n, -1, dtype=np.int32)
    first = np.zeros(2 * n + 1, dtype=np.int64)
    dsts, srcs, k2s, reaches = [], [], [], []
    k2_first = np.zeros(2 * n, dtype=np.int64)
    entries, error, max_slots, cost, k2_count = 0, 0.0, 1, 0, 0

    def remap(m, d, spoil_now):
        nonlocal K, bP, bM, bZ, entries, error, max_slots, k2_count
        S0 = K.shape[0]
        old = np.arange(S0)
        # the coefficients that move: f(k) from each F+ and f(-k) from each
        # F- but the origin's (the same coefficient as its F+)
        fp = old[bP > 0] if not spoil_now else old[:0]
        fm = old[(bM > 0) & (old > 0)] if not spoil_now else old[:0]
        moved = np.concatenate([K[fp] + d, -K[fm] + d])
        src_slot = np.concatenate([fp, fm])
        src_part = np.concatenate([np.zeros(fp.size, np.int64), np.full(fm.size, 2)])
        src_b = np.concatenate([bP[fp], bM[fm]])
        # F- holds conj f(-k): a coefficient from an F- comes conjugated
        src_conj = src_part == 2
        # the exact pruning: moments the rest of the sequence cannot bring back
        reach = left[m]
        live = np.all(np.abs(moved) <= reach, axis=1)
        if readable[m] is not None:
            live &= _near(moved, readable[m][0], drift[m])
        moved, src_slot, src_part, src_b, src_conj = (x[live] for x in (moved, src_slot, src_part, src_b, src_conj))
        zs = old[(bZ > 0) | (old == 0)]  # the origin's Z always (the recovery joins it)
        zs = zs[np.all(np.abs(K[zs]) <= reach, axis=1) | (zs == 0)]
        if readable[m] is not None:
            zs = zs[_near(K[zs], readable[m][1], drift[m]) | (zs == 0)]
        cell_m = _cells(moved)
        canon = _canonical(cell_m)
        at = np.where(canon[:, None], moved, -moved)  # canonical exact moment
        cell_c = np.where(canon[:, None], cell_m, -cell_m)
        # the new slots: the origin, the Z kept, the cells the coefficients reach
        allk = np.concatenate([np.zeros((1, 3)), K[zs], at])
        allc = np.concatenate([np.zeros((1, 3), np.int64), _cells(K[zs]), cell_c])
        code = _codes(allc)
        _, firsts, inverse = np.unique(code, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        rank = np.empty(firsts.size, np.int64)  # slot numbers in order of first appearance
        rank[np.argsort(firsts, kind="stable")] = np.arange(firsts.size)
        slot_of = rank[inverse]
        S = firsts.size
        newK = allk[np.sort(firsts)]
        z_dst = slot_of[1:1 + zs.size]
        f_dst = slot_of[1 + zs.size:]
        is0 = np.all(cell_m == 0, axis=1)
        # entries: Z to its slot; a coefficient f at cell c to the F+ of c
        # (canonical), the F- of -c (conjugated) or, at the origin, both
        d_list = [6 * z_dst + 4]
        s_list = [6 * zs + 4]
        c_list = [np.zeros(zs.size, bool)]
        to_p = canon | is0
        d_list.append(6 * f_dst[to_p])
        s_list.append(6 * src_slot[to_p] + src_part[to_p])
        c_list.append(src_conj[to_p])
        to_m = ~canon | is0
        d_list.append(6 * f_dst[to_m] + 2)
        s_list.append(6 * src_slot[to_m] + src_part[to_m])
        c_list.append(~src_conj[to_m])
        dst = np.concatenate(d_list)
        src = np.concatenate(s_list)
        cj = np.concatenate(c_list)
        # bounds: the sum of what each component receives
        nP = np.bincount(f_dst[to_p], weights=src_b[to_p], minlength=S)
        nM = np.bincount(f_dst[to_m], weights=src_b[to_m], minlength=S)
        nZ = np.bincount(z_dst, weights=bZ[zs], minlength=S)
        nP, nM, nZ = np.minimum(nP, 1.0), np.minimum(nM, 1.0), np.minimum(nZ, 1.0)
        # the bounded pruning (never the origin)
        norm = np.sqrt(nP ** 2 + nM ** 2 + 2 * nZ ** 2)
        keep = norm >= prune
        keep[0] = True
        if not keep.all():
            error += float(np.sqrt(np.sum(norm[~keep] ** 2)))
            renum = np.cumsum(keep) - 1
            ok = keep[dst // 6]
            dst = 6 * renum[dst[ok] // 6] + dst[ok] % 6
            src, cj = src[ok], cj[ok]
            newK, nP, nM, nZ = newK[keep], nP[keep], nM[keep], nZ[keep]
            S = int(keep.sum())
        # each component's first entry writes it (the destination's lowest
        # bit), the rest add: every component's second entry, then every
        # third, ..., so that consecutive additions rarely wait on each
        # other's stores; components no entry reaches are not written
        order = np.argsort(dst, kind="stable")
        dst, src = dst[order], np.where(cj, -1 - src, src)[order]
        lead = np.ones(dst.size, bool)
        lead[1:] = dst[1:] != dst[:-1]
        rank = np.arange(dst.size) - np.maximum.accumulate(np.where(lead, np.arange(dst.size), 0))
        later = np.flatnonzero(~lead)
        later = later[np.lexsort((dst[later], rank[later]))]
        # which components of each slot the map reaches (F+ 1, F- 2, Z 4):
        # the others are zero, and are not stored
        reached = np.zeros(3 * S, np.uint8)
        reached[dst // 2] = 1
        reaches.append((reached.reshape(S, 3) @ np.array([1, 2, 4], np.uint8)).astype(np.uint8))
        dst, src = np.concatenate([dst[lead] + 1, dst[later]]), np.concatenate([src[lead], src[later]])
        dsts.append(dst.astype(np.int32))
        srcs.append(src.astype(np.int32))
        entries += dst.size
        first[m + 1] = entries
        slots[m] = S
        max_slots = max(max_slots, S)
        K, bP, bM, bZ = newK, nP, nM, nZ
        k2s.append(np.sum((2 * math.pi * step * K) ** 2, axis=1))
        k2_first[m] = k2_count
        k2_count += S

    b1lo, b1hi = float(b1[0]), float(b1[1])
    for e in range(n):
        if iv[e] >= 0:
            tau = float(dur[iv[e]])
            bP = bP * math.exp(-tau / t2_max)
            bM = bM * math.exp(-tau / t2_max)
            bZ = bZ * math.exp(-tau / t1_max)
            bZ[0] = 1.0
        for side in (0, 1):
            m = 2 * e + side
            d = d_all[e, side]
            if side == 0:
                if np.any(d):
                    remap(m, d, False)
                else:
                    first[m + 1] = entries
                f = int(flags[e])
                if f & EV_RF:
                    lo, hi = sorted((abs(flips[e]) * b1lo, abs(flips[e]) * b1hi))
                    c2, s2, sa, ca = _sup_terms(lo, hi)
                    nP = np.minimum(1.0, c2 * bP + s2 * bM + sa * bZ)
                    nM = np.minimum(1.0, s2 * bP + c2 * bM + sa * bZ)
                    bZ = np.minimum(1.0, 0.5 * sa * (bP + bM) + ca * bZ)
                    bP, bM = nP, nM
                cost += K.shape[0]
            else:
                if spoil[e]:
                    remap(m, np.zeros(3), True)
                elif np.any(d):
                    remap(m, d, False)
                else:
                    first[m + 1] = entries
    dst = np.concatenate(dsts) if dsts else np.zeros(0, np.int32)
    src = np.concatenate(srcs) if srcs else np.zeros(0, np.int32)
    k2 = np.concatenate(k2s) if k2s else np.zeros(0)
    reach = np.concatenate(reaches) if reaches else np.zeros(0, np.uint8)
    return KeyedProgram(slots, first, np.ascontiguousarray(dst), np.ascontiguousarray(src), max_slots, error, cost,
                        np.ascontiguousarray(k2, dtype=np.float64), k2_first, np.ascontiguousarray(reach))


#: a host call on one EPG order plays the moment-keyed program instead when
#: this many times its states summed over events is still under the
#: orders the one-order kernel plays (its band summed over events): the
#: keyed executor's per-state cost is about the one-order kernel's per
#: order, and this keeps a margin for its maps
PREFER_MARGIN = 2.0


def one_order_work(stream, states):
    """The orders the one-order kernel plays for one voxel of ``stream``
    (its band, the orders its shifts so far can have reached, at most
    ``states``, summed over events)."""
    hit = _WORK.get((id(stream), states))
    if hit is not None and hit[0] is stream:
        return hit[1]
    sh = np.abs(np.asarray(stream.shift_before, dtype=np.int64)) + np.abs(np.asarray(stream.shift_after, dtype=np.int64))
    work = int(np.minimum(states, 1 + np.cumsum(sh)).sum())
    if len(_WORK) >= 16:
        _WORK.pop(next(iter(_WORK)))
    _WORK[(id(stream), states)] = (stream, work)
    return work


_WORK: dict = {}


def may_prefer(stream, states):
    """Whether the one-order work of ``stream`` is wide enough for a keyed
    program (at least one state an event) to beat it by PREFER_MARGIN."""
    return one_order_work(stream, states) > 2 * PREFER_MARGIN * stream.n_events


def prefer(program, stream, states):
    """Whether ``program`` does under 1 / PREFER_MARGIN of the one-order
    work of ``stream``."""
    return PREFER_MARGIN * program.cost < one_order_work(stream, states)


def _widened(lo, hi, t1, t2):
    """The tissue range a program is built for: the call's, widened to a
    grid (B1 to 1/32, T1 and T2 to quarter octaves) so that calls over
    nearby ranges share one program (a wider range only keeps more states)."""
    def up(t):
        return t if not math.isfinite(t) or t <= 0 else 2.0 ** (math.ceil(math.log2(t) * 4) / 4)

    return (math.floor(lo * 32) / 32, math.ceil(hi * 32) / 32), up(t1), up(t2)


_PROGRAMS: dict = {}


def program_for(owner, stream, si, names, prune=PRUNE, target=ERROR_BOUND):
    """The program of ``stream`` for the call's SI tissue planes ``si``
    (TISSUE_FIELDS order, ``names``; only B1, T1, T2 and v are read),
    cached per stream and tissue range; v is refused by name."""
    if si[names.index("v_m_s")] is not None:
        raise TypeError(f"{owner}: the moment-keyed EPG plays no flow (v) yet: this sequence's gradient moments "
                        "dephase along several axes, so v has no one direction: leave it out")

    def span(name, default):
        a = si[names.index(name)]
        return (default, default) if a is None or a.size == 0 else (float(a.min()), float(a.max()))

    b1, t1, t2 = _widened(*span("B1", 1.0), span("T1_s", math.inf)[1], span("T2_s", math.inf)[1])
    key = (id(stream), b1, t1, t2, prune)
    hit = _PROGRAMS.get(key)
    if hit is not None and hit[0] is stream:
        return hit[1]
    program = build(stream, b1, t1, t2, prune)
    while program.error_bound > target:
        prune = prune / 100 if prune > 1e-13 else 0.0
        program = build(stream, b1, t1, t2, prune)
    if len(_PROGRAMS) >= 16:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[key] = (stream, program)
    return program
