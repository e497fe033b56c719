#!/usr/bin/env bash
# One call on the lent GPU machine (device tool): build blochsim with CUDA,
# run the tests (GPU ones included) and the device benchmarks.  Wheels for
# meson-python and pyproject-metadata travel in .whl/ (git-ignored).
# Usage there: bash bench/device_run.sh [tests -k expression] [benchmarks -k expression]
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
start=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/bs . \
  -Csetup-args=-Dcuda=enabled -Csetup-args=-Dcuda-arch=90 -Cbuild-dir=/tmp/bsbuild > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
export PYTHONPATH=/tmp/bs:/tmp/site
cd /tmp
python3 -c "import blochsim; print(blochsim.backends())"
python3 -m pytest "$repo/tests" -q -p no:cacheprovider -x ${1:+-k "$1"} 2>&1 | tee "$out/tests.log" | tail -15
python3 -m pytest "$repo/bench/test_bench_device.py" -q -p no:cacheprovider --benchmark-only ${2:+-k "$2"} \
  --benchmark-json="$out/bench_device.json" --benchmark-columns=median,min,max 2>&1 | tail -14
python3 - "$out/bench_device.json" <<'PY'
import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    print(f"{b['name']:55s} {b['extra_info']['atoms_per_s_median']:>16,.0f} atoms/s")
PY
