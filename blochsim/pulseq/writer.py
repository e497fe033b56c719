"""Writing a played simulator's sequence as a Pulseq file, through pypulseq
(the format's reference implementation; the optional extra ``pulseq``), so
that a train designed here (with ``vjp``, say) can go to a scanner and be
read back by :meth:`blochsim.Simulator.from_pulseq`.

The simulators' operators are instantaneous but for delays; the file's
events take time.  Each instant of the train (the operators between two
delays) becomes one RF or ADC block whose centre falls exactly on it, the
gradients of the instant before it in a block that ends where it starts,
or after it in one that starts where it ends:

- a pulse (excitation, refocusing, any flip): a block pulse of
  ``rf_duration`` at the flip and phase, read back as a rotation at its
  centre (``rf="hard"``: relaxation during it neglected, as here);
- :class:`~blochsim.sequence.Inversion`: a 180° block pulse followed by a
  spoiler (as ``Spoil``), which B1 scales like any pulse: from
  longitudinal magnetisation alone it is the simulator's ideal inversion
  of ``inv_efficiency`` -cos(B1 π) (1 at B1 = 1), what it leaves
  transverse spoiled;
- a readout: an ADC of one sample centred on the instant, at the
  receiver phase;
- :class:`~blochsim.sequence.Dephase` of n orders: a trapezoid on z of n
  cycles across ``voxel_size_m`` (read back with the same voxel, one order
  is one cycle across it);
- :class:`~blochsim.sequence.Spoil`: a trapezoid on x of ``spoil_cycles``
  cycles across the voxel, a physical spoiler: read a file with several
  back with ``dephasing="spoil"`` for the ideal model;
- delays: the time between the blocks, on the file's block raster.

The file's phases count the other way round from SPEC's (the reader's
module notes): RF and ADC phases are written negated, so that reading the
file back gives the simulator's samples.  The preparation is written once,
then the train ``repetitions`` times, with its ADCs in the last playing
only, as the simulator records them.
"""
from __future__ import annotations

import math
import os

import numpy as np

from blochsim.pulseq.dephasing import DEFAULT_VOXEL_M
from blochsim.sequence import Delay, Dephase, Inversion, Pulse, Readout, Spoil


def _pypulseq():
    try:
        import pypulseq
    except ImportError:
        raise ImportError("to_pulseq writes through pypulseq: pip install 'blochsim[pulseq]'") from None
    return pypulseq


def _instants(prep, ops, repetitions):
    """(time s, [operators]) of every instant of the preparation played
    once and the train played ``repetitions`` times, the readouts of the
    last playing only."""
    out, t = [], 0.0
    for r, playing in [(-1, prep)] + [(r, ops) for r in range(repetitions)]:
        for op in playing:
            if isinstance(op, Delay):
                t += float(op.duration) * 1e-3
                continue
            if isinstance(op, Readout) and r != repetitions - 1:
                continue
            if not isinstance(op, (Pulse, Inversion, Readout, Dephase, Spoil)):
                raise ValueError(f"to_pulseq does not write {type(op).__name__} operators (it writes pulses, "
                                 "inversions, readouts, Dephase, Spoil and delays)")
            if out and out[-1][0] == t:
                out[-1][1].append(op)
            else:
                out.append((t, [op]))
    return out, t


def write_pulseq(sim, path, system=None, rf_duration=0.1, voxel_size_m=None, spoil_cycles=4.0, **values):
    """Write the sequence ``sim`` plays (with protocol ``values``) as a
    Pulseq file: :meth:`blochsim.Simulator.to_pulseq`."""
    pp = _pypulseq()
    voxel_size_m = DEFAULT_VOXEL_M if voxel_size_m is None else voxel_size_m
    if not hasattr(sim, "repetition"):
        raise TypeError(f"{type(sim).__name__} has no played sequence to write (a closed form): to_pulseq writes "
                        "the simulators that play operators")
    proto, tissue = sim._split(values)
    if tissue:
        raise ValueError(f"to_pulseq takes protocol values, not tissue ({', '.join(tissue)})")
    for name, v in (("rf_duration", rf_duration), ("voxel_size_m", voxel_size_m), ("spoil_cycles", spoil_cycles)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"to_pulseq: {name} must be > 0 and finite, got {v!r}")
    p = sim._protocol_values(proto)
    reps = p.get("repetitions", 1)
    if not isinstance(reps, (int, np.integer)):
        raise ValueError(f"to_pulseq needs a whole number of repetitions, got {reps!r}: give repetitions=N")
    sysopt = system if system is not None else pp.Opts()
    raster = sysopt.block_duration_raster
    seq = pp.Sequence(sysopt)
    prep = sim.preparation(p)
    instants, total = _instants(prep.ops() if prep is not None else [], sim.repetition(p).ops(), int(reps))
    unit = 1.0 / voxel_size_m  # cycles/m: one order is one cycle across the voxel

    def on_raster(t, what):
        n = round(t / raster)
        if abs(t - n * raster) > 1e-9:
            raise ValueError(f"to_pulseq: {what} at {t * 1e3:.6g} ms is not on the block raster "
                             f"({raster * 1e6:g} us): give times on it, or a system with a finer raster")
        return n * raster

    def padded(events):
        """The block duration of events, up to the raster."""
        return math.ceil(pp.calc_duration(*events) / raster - 1e-9) * raster

    def gradients(group, spoil=0):
        orders = sum(op.orders for op in group if isinstance(op, Dephase))
        spoils = spoil + sum(1 for op in group if isinstance(op, Spoil))
        g = []
        if orders:
            g.append(pp.make_trapezoid("z", area=orders * unit, system=sysopt))
        if spoils:
            g.append(pp.make_trapezoid("x", area=spoils * spoil_cycles * unit, system=sysopt))
        return g

    cursor, blocks = 0.0, []
    for t, group in instants:
        anchors = [i for i, op in enumerate(group) if isinstance(op, (Pulse, Inversion, Readout))]
        if len(anchors) > 1:
            raise ValueError(f"to_pulseq: {type(group[anchors[0]]).__name__} and {type(group[anchors[1]]).__name__} "
                             f"at the same instant ({t * 1e3:.6g} ms) cannot both be written: the file's RF and ADC "
                             "take time (a readout at TE = 0: give TE > 0)")
        if not anchors:
            events = gradients(group)
            if events:
                blocks.append((t, events))
            continue
        a = anchors[0]
        op = group[a]
        if isinstance(op, Readout):
            dwell = 2 * raster
            ev = pp.make_adc(num_samples=1, dwell=dwell, delay=sysopt.adc_dead_time,
                             phase_offset=-math.radians(float(op.phase)), system=sysopt)
            centre = ev.delay + dwell / 2
        else:
            flip, phase = (180.0, 0.0) if isinstance(op, Inversion) else (float(op.flip), float(op.phase))
            ev = pp.make_block_pulse(flip_angle=math.radians(flip), duration=rf_duration * 1e-3,
                                     delay=sysopt.rf_dead_time, phase_offset=-math.radians(phase), system=sysopt,
                                     use="excitation")
            centre = ev.delay + rf_duration * 1e-3 / 2
        start = t - centre
        # an inversion's spoiler removes what its pulse leaves transverse where B1 is not 1
        pre, post = gradients(group[:a]), gradients(group[a + 1:], spoil=int(isinstance(op, Inversion)))
        if pre:
            blocks.append((start - padded(pre), pre))
        blocks.append((start, [ev]))
        if post:
            blocks.append((start + padded([ev]), post))
    shift = max(0.0, -min((b[0] for b in blocks), default=0.0))  # room before the first instant
    shift = math.ceil(shift / raster - 1e-9) * raster
    for start, events in blocks:
        start = on_raster(start + shift, "an event's block")
        if start < cursor - 1e-9:
            raise ValueError(f"to_pulseq: the events at {(start - shift) * 1e3:.6g} ms overlap the block before "
                             f"(ending at {(cursor - shift) * 1e3:.6g} ms): longer delays, a shorter rf_duration or "
                             "a system with shorter dead times")
        if start - cursor > 1e-9:
            seq.add_block(pp.make_delay(start - cursor))
        dur = padded(events)
        seq.add_block(*events, pp.make_delay(dur))
        cursor = start + dur
    end = on_raster(total + shift, "the train's end")
    if end - cursor > 1e-9:
        seq.add_block(pp.make_delay(end - cursor))
    seq.set_definition("Name", type(sim).__name__)
    seq.write(os.fspath(path))
    return os.fspath(path)
