#!/usr/bin/env bash
# Builds this tree on the development VM for the lent GPU machine's Python
# (3.12 there), so that a device call carries the built package
# (carry ["build-py312"]) instead of spending ~155 s of device time on the
# build.  Needs a CPython 3.12 (PY312, default pyenv's) and nvcc here.
# Usage: bash bench/device_prebuild.sh; then on the device:
#   PYTHONPATH=$(pwd)/build-py312 python3 bench/networks_timing.py device
set -euo pipefail
py=${PY312:-/root/.pyenv/versions/3.12.1/bin/python}
venv=/tmp/v312
[ -x "$venv/bin/python" ] || { "$py" -m venv "$venv" && "$venv/bin/pip" install -q numpy cython meson-python meson ninja; }
rm -rf build-py312
"$venv/bin/pip" install -q --no-build-isolation --no-deps --target build-py312 . \
  -Csetup-args=-Dcuda=enabled -Csetup-args=-Dcuda-arch=90 -Cbuild-dir=/tmp/b312
du -sh build-py312
