"""blochsim: fast MR signal simulation through extended phase graphs.

NumPy inputs run on the host backend; the C++ core is also usable from C++
(:func:`get_include`, :func:`get_pkgconfig_dir`).

Examples
--------
>>> import numpy as np
>>> import blochsim
>>> s = blochsim.fse_sim(flip=np.full(8, 180.0), ESP=10.0, T1=1000.0, T2=100.0)
>>> print(np.round(abs(s), 3))
[0.905 0.819 0.741 0.67  0.607 0.549 0.497 0.449]
"""
from __future__ import annotations

import os as _os
from importlib import metadata as _metadata


def _compiled_package():
    """The installed blochsim folder where this one is a source folder that
    shadows it (``python -m blochsim`` run from a checkout puts the
    checkout first on sys.path, and its blochsim/ has no compiled
    extension); None where this folder has the extension (an installed or
    an editable package)."""
    import importlib.machinery
    import importlib.util
    import sys

    if importlib.util.find_spec("blochsim._core") is not None:
        return None
    here = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    others = [p for p in sys.path if _os.path.abspath(p or _os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("blochsim", others)
    return None if spec is None or not spec.submodule_search_locations else list(spec.submodule_search_locations)


_installed = _compiled_package()
if _installed:
    # every submodule, the headers and the pkg-config file from the
    # installed package (this file is its copy)
    __path__[:] = _installed
    __file__ = _os.path.join(_installed[0], "__init__.py")

from blochsim._core import CudaError
from blochsim._arrays.device import DeviceArray
from blochsim._engine.dispatch import backends
from blochsim._engine.pools import POOL_PROPERTIES, lineshape
from blochsim.sequence import (Delay, Dephase, Excitation, Inversion, Operator, Pulse, Readout,
                               RectPulse, Refocusing, SampledPulse, Saturation, Sequence, Spoil, hyperbolic_secant,
                               power_factor, slice_profile)
from blochsim.simulator import ClosedFormSimulator, Simulator
from blochsim.model import ModelOperator
from blochsim import pulseq  # registers the format of Simulator.from_pulseq
from blochsim.simulators import (bssfp_sim, fse_sim, ir_sim, mrf_sim, se_sim, spgr_sim, ste_sim,
                                 truefisp_sim)

try:
    #: The installed distribution's version (meson.build's project version).
    __version__ = _metadata.version("blochsim")
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "backends", "CudaError", "DeviceArray", "get_include", "get_pkgconfig_dir", "Simulator", "ClosedFormSimulator",
    "ModelOperator",
    "Operator", "Sequence", "Pulse", "Excitation", "Refocusing", "Inversion", "Delay", "Dephase",
    "Spoil", "Readout", "SampledPulse", "hyperbolic_secant", "slice_profile", "Saturation", "RectPulse", "power_factor", "lineshape", "POOL_PROPERTIES", "fse_sim", "mrf_sim", "spgr_sim", "bssfp_sim",
    "truefisp_sim", "ir_sim", "se_sim", "ste_sim",
]


def get_include() -> str:
    """Directory of the C++ headers (``#include <blochsim/blochsim.hpp>``)."""
    return _os.path.join(_os.path.dirname(__file__), "include")


def get_pkgconfig_dir() -> str:
    """Directory holding ``blochsim.pc`` (for ``PKG_CONFIG_PATH``)."""
    return _os.path.join(_os.path.dirname(__file__), "lib", "pkgconfig")
