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
from blochsim.simulators.spin_echo import (fse_sim, FSESimulator, hyperecho_sim, HyperechoSimulator, mese_sim,
                                           MultiEchoSESimulator, se_sim, SpinEchoSimulator, ste_sim,
                                           StimulatedEchoSimulator)
from blochsim.simulators.gradient_echo import (despot1_sim, DESPOT1Simulator, doubleangle_sim,
                                               DoubleAngleSimulator, FAT_PEAK_AMPLITUDES, FAT_PEAKS_PPM,
                                               flash_sim, FLASHSimulator, megre_sim, MultiEchoGRESimulator,
                                               spgr_sim, SPGRSimulator, waterfat_sim, WaterFatSimulator)
from blochsim.simulators.steady_state import (bssfp_sim, bSSFPSimulator, despot2_sim, DESPOT2Simulator,
                                              dess_sim, DESSSimulator, fmssfp_sim, fmSSFPSimulator, hsfp_sim,
                                              HSFPSimulator, irbssfp_sim, IRbSSFPSimulator, truefisp_sim,
                                              TrueFISPSimulator)
from blochsim.simulators.fingerprinting import (mrf_sim, MRFSimulator)
from blochsim.simulators.preparations import (InversionRecoverySimulator, ir_sim, ll_sim, LookLockerSimulator,
                                              molli_sim, MOLLISimulator, mp2rage_sim, MP2RAGESimulator,
                                              mpnrage_sim, MPnRAGESimulator, mprage_sim, MPRAGESimulator)
from blochsim.simulators.diffusion import (asl_sim, ASLSimulator, DiffusionSimulator, DiffusionTensorSimulator,
                                           dti_sim, dwi_sim)
from blochsim.simulators.exchange import (cest_sim, CESTSimulator, mt_sim, MTSimulator)

__all__ = [
    "FSESimulator", "MRFSimulator", "SPGRSimulator", "bSSFPSimulator", "TrueFISPSimulator",
    "InversionRecoverySimulator", "SpinEchoSimulator", "StimulatedEchoSimulator", "CESTSimulator",
    "MTSimulator", "fse_sim", "mrf_sim", "spgr_sim", "bssfp_sim", "truefisp_sim", "ir_sim", "se_sim",
    "ste_sim", "cest_sim", "mt_sim", "MPnRAGESimulator", "MPRAGESimulator", "MP2RAGESimulator", "mpnrage_sim",
    "mprage_sim", "mp2rage_sim", "LookLockerSimulator", "ll_sim", "FLASHSimulator", "flash_sim",
    "DiffusionSimulator", "dwi_sim", "IRbSSFPSimulator", "irbssfp_sim", "DESSSimulator", "dess_sim",
    "HyperechoSimulator", "hyperecho_sim", "fmSSFPSimulator", "fmssfp_sim", "WaterFatSimulator",
    "waterfat_sim", "FAT_PEAKS_PPM", "FAT_PEAK_AMPLITUDES", "DoubleAngleSimulator", "doubleangle_sim",
    "ASLSimulator", "asl_sim", "HSFPSimulator", "hsfp_sim", "MOLLISimulator", "molli_sim",
    "MultiEchoGRESimulator", "megre_sim", "MultiEchoSESimulator", "mese_sim", "DiffusionTensorSimulator",
    "dti_sim", "DESPOT1Simulator", "despot1_sim", "DESPOT2Simulator", "despot2_sim",
]
