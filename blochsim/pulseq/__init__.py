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
  of the format's; magnitudes do not depend on it.  ``frame="pulseq"``
  returns them in the format's frame (conjugated, with the Jacobian), as
  pypulseq-based simulators and reconstructions take them::

      spec = Simulator.from_pulseq("se.seq").simulate(T1=800.0, T2=60.0, B0=7.0)
      fmt = Simulator.from_pulseq("se.seq", frame="pulseq").simulate(T1=800.0, T2=60.0, B0=7.0)
      # fmt == spec.conj(): compare fmt with the other simulator's samples
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
  by a map with large enough multipliers, within 8192 orders.  Where they
  cannot be, but the moments run along one direction on one lattice
  except in a few intervals (the spoilers between the shots of a turbo
  spin echo, whose moments leave the train's proportion of readout to
  crusher), each such interval's moment is a generator of its own and
  the order counts the lattice steps plus multiples of the generators,
  again with multipliers that keep every reachable moment apart: exact,
  provided no small combination of the generators falls back on the
  lattice (checked).  Moments one order cannot hold (no common unit,
  unbalanced axes that dephase independently) are played by the
  **moment-keyed EPG** (also ``dephasing="keyed"``): each state keyed by
  its exact 3-D moment on the axes that dephase, the pathways whose moments
  agree within about 1e-3 cycles across the voxel merged into one state (a
  cell of the lattice), so that exact coincidences of the file's moments
  are never rounded apart; states that no later readout can bring back
  to the origin are dropped (exactly: a backward pass over the file finds
  the moments each event's states may hold and still be read), and states whose magnitude
  bound over the call's B1, T1 and T2 falls below 1e-7 of M0 are dropped,
  the threshold lowered until the largest change of any sample they can
  cause is at most 1e-5 of M0 (rotations, shifts and relaxation never
  lengthen the magnetisation in L2, so what an event drops moves later
  samples by at most its L2 length; the lengths add over the events).  As
  on one order, every state off the origin's cell counts as dephased
  across the voxel.  It plays ``simulate`` on the host and the GPU,
  ``jacobian`` on the host (dual numbers through the same maps; device
  arrays go through the host and come back as device arrays) and ``vjp``
  with respect to tissue properties (the pullback of that Jacobian), with
  relaxation, B0, B1, shaped pulses and D (each state diffusing with its
  exact moment, the moment of an interval applied at its gradients'
  centroid: within 3 % of the waveform's b for lobes short beside their
  gap), and pools (on the host, one voxel at a time in double precision);
  ``jacobian_vjp``, ``vjp`` with respect to protocol parameters and v are
  refused by name.  A call
  expected to take over 30 s says so with its estimate (states x events
  x voxels) and shows its progress.  A file one order holds plays
  ``simulate`` and ``jacobian`` on the host on the moment-keyed EPG too
  where its program does under half the one-order kernel's work (a turbo
  spin echo whose refocusing leaves most orders of its band empty, or
  whose spoilers push the states hundreds of orders out; not with D or v):
  the same samples to float32 rounding, faster; ``vjp`` and the GPU stay
  on one order.  ``axis`` (a direction to follow
  alone), ``unit`` (cycles/m, checked, never rounded) or a callable
  ``dephasing(block) -> shifts`` choose otherwise, and ``dephasing="spoil"``
  spoils ideally at every block with a net moment and no RF or ADC.  With
  ``voxel_size_m`` the crusher geometry for D and v follows from the unit:
  ``crusher_dephasing_rad`` = 2π·|unit|·voxel.
- Not read: extensions (labels, triggers, rotations), soft delays, the
  gradients' effect on B0 (eddy currents, concomitant fields), slice
  profiles (``slice_profile`` gives them), ADC samples other than the
  centre.  Malformed files (unknown version, a row with missing fields, a
  shape that does not decompress to its length, an event a block names
  but no section holds) are refused naming the line, section or block.
  Times off their declared raster (an ADC dwell of 31.25 us on a 100 ns
  raster, an RF delay of half a raster cell) are read as written, as
  pypulseq reads them, with a :class:`PulseqWarning` naming the line.
"""
from blochsim.pulseq.dephasing import DEFAULT_VOXEL_M, ENCODING_CYCLES, MOMENT_TOLERANCE
from blochsim.pulseq.file import PulseqBlock, PulseqError, PulseqWarning, decompress_shape
from blochsim.pulseq.reader import read_pulseq
from blochsim.pulseq.simulators import PulseqCESTSimulator, PulseqSimulator

__all__ = ["DEFAULT_VOXEL_M", "ENCODING_CYCLES", "MOMENT_TOLERANCE", "PulseqBlock", "PulseqCESTSimulator",
           "PulseqError", "PulseqSimulator", "PulseqWarning", "decompress_shape", "read_pulseq"]
