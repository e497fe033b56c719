"""Estimators: measured signals to parameter maps (SPEC §5–6).

Each estimator is built from a simulator, learns or tabulates the signal
model in ``fit(**ranges_or_grids)`` and turns signals of shape
``(*voxels, contrasts)`` into a dict of maps of shape ``voxels`` in
``map(signals)``:

- :class:`PERK`: kernel ridge regression on random Fourier features
  (Nataraj, Fessler & Nielsen 2018, IEEE TMI 37:2103), trained on simulated
  signals; the map is a fused feature+regression kernel with its pullback.
- :class:`DictionaryMatcher`: maximum normalised inner product against a
  simulated dictionary (Ma et al. 2013, Nature 495:187), with SVD
  compression (McGivney et al. 2014, IEEE TMI 33:2311) and group matching
  (Cauley et al. 2015, MRM 74:523).
- :class:`LookupTable`: one unknown from one real feature of the signal,
  by interpolation over the longest monotonic run of a simulated table.
- :class:`NonlinearLeastSquares`: voxel-wise bounded Levenberg–Marquardt
  with the simulator's exact Jacobians, standard errors from the Fisher
  information.

Parameter values are in the simulators' public units (ms, Hz, …).
"""

from blochsim.estimators.perk import PERK
from blochsim.estimators.dictionary import DictionaryMatcher
from blochsim.estimators.lookup import LookupTable
from blochsim.estimators.least_squares import NonlinearLeastSquares

__all__ = ["PERK", "DictionaryMatcher", "LookupTable", "NonlinearLeastSquares"]
