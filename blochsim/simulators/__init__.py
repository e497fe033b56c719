"""The shipped simulators (SPEC §6), each a class and a function form,
one module per family:

- :mod:`~blochsim.simulators.spin_echo`: fast spin echo, hyperecho, multi-echo
  spin echo, stimulated echo, the spin-echo closed form;
- :mod:`~blochsim.simulators.gradient_echo`: FLASH, multi-echo GRE, SPGR,
  double angle, DESPOT1, water-fat;
- :mod:`~blochsim.simulators.steady_state`: TrueFISP, IR-bSSFP, bSSFP, DESS,
  fmSSFP, HSFP, DESPOT2;
- :mod:`~blochsim.simulators.fingerprinting`: MR fingerprinting;
- :mod:`~blochsim.simulators.preparations`: inversion recovery, Look-Locker,
  MOLLI, MPnRAGE, MPRAGE, MP2RAGE;
- :mod:`~blochsim.simulators.diffusion`: diffusion, the diffusion tensor,
  arterial spin labelling;
- :mod:`~blochsim.simulators.exchange`: CEST and magnetisation transfer.

Played simulators run through the EPG kernels (complex64 output); closed
forms are NumPy expressions in the precision of their inputs.
"""
from blochsim.simulators.spin_echo import *  # noqa: F401,F403 (the family's __all__)
from blochsim.simulators.gradient_echo import *  # noqa: F401,F403 (the family's __all__)
from blochsim.simulators.steady_state import *  # noqa: F401,F403 (the family's __all__)
from blochsim.simulators.fingerprinting import *  # noqa: F401,F403 (the family's __all__)
from blochsim.simulators.preparations import *  # noqa: F401,F403 (the family's __all__)
from blochsim.simulators.diffusion import *  # noqa: F401,F403 (the family's __all__)
from blochsim.simulators.exchange import *  # noqa: F401,F403 (the family's __all__)
from blochsim.simulators import diffusion, exchange, fingerprinting, gradient_echo, preparations, spin_echo, steady_state

#: the family modules, in the order the documentation lists them (its API
#: pages are made from each module's docstring and ``__all__``)
FAMILIES = (spin_echo, gradient_echo, steady_state, fingerprinting, preparations, diffusion, exchange)

#: every public name of the families
__all__ = [name for family in FAMILIES for name in family.__all__]
