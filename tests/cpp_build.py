"""Building the C++ tests' programs: where the headers are, and extra
compiler flags (tests/sanitize.sh passes the sanitizers through them)."""
import os
from pathlib import Path

import blochsim


def include_dir():
    """The installed headers, or the source tree's where the package is an
    editable install (whose package folder holds none)."""
    installed = blochsim.get_include()
    source = Path(__file__).resolve().parents[1] / "src_cpp" / "include"
    return installed if os.path.isdir(installed) or not source.is_dir() else str(source)


def extra_flags():
    """Compiler flags from BLOCHSIM_TEST_CXXFLAGS (tests/sanitize.sh builds
    under AddressSanitizer and UndefinedBehaviorSanitizer with it)."""
    return os.environ.get("BLOCHSIM_TEST_CXXFLAGS", "").split()
