"""Sequence operators and their packing into the kernels' event stream.

Operators compose with ``@`` as operators on a state do: ``B @ A`` plays A
first, then B (so a written product reads right to left in time)::

    echo = Readout() @ Delay(5.0) @ Dephase() @ Refocusing(180.0) @ Dephase() @ Delay(5.0)
    cpmg = echo @ echo @ Excitation(90.0, phase=90.0)

Units are the console's: ms for durations, degrees for flips and phases,
µT and µs for sampled pulses.

The package by concern: ``operators`` (the operators and sampled pulses),
``traced`` (values carrying their derivative for reverse mode), ``design``
(pulse design) and ``packing`` (the event stream the kernels play).
"""
from blochsim.sequence.design import hyperbolic_secant, slice_profile
from blochsim.sequence.operators import (GAMMA_RAD_PER_S_PER_T, Delay, Dephase, Excitation, Inversion, Operator,
                                         Pulse, Readout, RectPulse, Refocusing, SampledPulse, Saturation, Sequence,
                                         Spoil, power_factor)
from blochsim.sequence.packing import EventStream, pack, pack_with_provenance
from blochsim.sequence.traced import Traced, TracedComplex, trace

__all__ = ["Delay", "Dephase", "EventStream", "Excitation", "GAMMA_RAD_PER_S_PER_T", "Inversion", "Operator", "Pulse",
           "Readout", "RectPulse", "Refocusing", "SampledPulse", "Saturation", "Sequence", "Spoil", "Traced",
           "TracedComplex", "hyperbolic_secant", "pack", "pack_with_provenance", "power_factor", "slice_profile",
           "trace"]
