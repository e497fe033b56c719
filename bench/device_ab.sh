#!/usr/bin/env bash
# Calls on the lent GPU machine (device tool) for an A/B of the device
# backend.  Stages (STAGES, default "build test bench"):
#   build  this tree -> /tmp/bs and, when base_src/ holds an earlier tree
#          (git archive REV | tar -x -C base_src), that one -> /tmp/base, both
#          with -Dcuda-arch=90; with WHEEL=1 also this tree's wheel at the
#          default architectures -> /tmp/wh (installed from the .whl file).
#          A tree already built on this machine is kept.
#   test   the GPU tests of this tree (-m gpu), at most TEST_S seconds.
#   bench  the device benchmarks (bench -k "$1") of every built tree,
#          alternating, ROUNDS times; a table of M atoms/s last.
# Wheels for meson-python and pyproject-metadata travel in .whl/ (git-ignored).
# Usage there: STAGES="build test" bash bench/device_ab.sh [bench -k]
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
stages=${STAGES:-build test bench}
has() { [[ " $stages " == *" $1 "* ]]; }
if has build; then
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$out/gpu.txt"
  start=$(date +%s)
  build() {  # src target
    [ -d "$2/blochsim" ] && return 0
    python3 -m pip install -q --no-build-isolation --no-deps --target "$2" "$1" -Csetup-args=-Dcuda=enabled \
      -Csetup-args=-Dcuda-arch=90 -Cbuild-dir="$2.build" > "$out/$(basename "$2").log" 2>&1 \
      || { tail -30 "$out/$(basename "$2").log"; return 1; }
  }
  wheel() {  # the default architectures, as a user's wheel
    [ -d /tmp/wh/blochsim ] && return 0
    { python3 -m pip wheel -q --no-build-isolation --no-deps -w /tmp/wheel "$repo" -Csetup-args=-Dcuda=enabled \
        -Cbuild-dir=/tmp/wh.build \
      && python3 -m pip install -q --no-deps --no-index --target /tmp/wh /tmp/wheel/blochsim-*.whl; } \
      > "$out/wh.log" 2>&1 || { tail -30 "$out/wh.log"; return 1; }
  }
  pids=()
  build "$repo" /tmp/bs & pids+=($!)
  [ -d base_src ] && { build "$repo/base_src" /tmp/base & pids+=($!); }
  [ "${WHEEL:-0}" = 1 ] && { wheel & pids+=($!); }
  for p in "${pids[@]}"; do wait "$p" || exit 1; done
  echo "builds: $(( $(date +%s) - start )) s"
  awk -F'\t' 'NR>1 {printf "%8.1f s  %s\n", ($2-$1)/1000, $4}' /tmp/bs.build/.ninja_log | sort -rn | head -5
  if [ -d /tmp/wh ]; then
    ls -l /tmp/wheel
    for so in /tmp/wh/blochsim/_device*.so /tmp/wh/blochsim/_core*.so; do
      [ -f "$so" ] && cuobjdump --list-elf --list-ptx "$so" 2>&1 | sed 's/^/  /' | head -6
    done
  fi
fi
cd /tmp
if has test; then
  PYTHONPATH=/tmp/bs:/tmp/site python3 -c "import blochsim; print(blochsim.backends()['cuda'])"
  PYTHONPATH=/tmp/bs:/tmp/site timeout ${TEST_S:-300} python3 -m pytest "$repo/tests" -q -p no:cacheprovider -m gpu \
    -rfE 2>&1 | tee "$out/tests.log" | tail -15
  if [ -d /tmp/wh ]; then  # the wheel's build: import, the backend, one check against the closed form
    PYTHONPATH=/tmp/wh python3 - <<'PY'
import numpy as np, blochsim
from blochsim.simulators import FSESimulator
print("wheel:", blochsim.__version__, blochsim.backends()["cuda"])
s = FSESimulator(ESP=5.0, flip=np.full(32, 180.0), device="cuda").simulate(T1=1e9, T2=np.array([50.0, 100.0]))
ref = np.exp(-np.arange(1, 33)[None, :] * 5.0 / np.array([[50.0], [100.0]]))
print("wheel on the device, max |error| against exp(-t/T2):", float(np.max(np.abs(np.abs(s) - ref))))
PY
  fi
fi
if has bench; then
  for round in $(seq 1 "${ROUNDS:-1}"); do
    for tree in ${TREES:-base bs wh}; do
      [ -d "/tmp/$tree" ] || continue
      PYTHONPATH=/tmp/$tree:/tmp/site python3 -m pytest "$repo/bench/test_bench_device.py" -q -p no:cacheprovider \
        --benchmark-only ${1:+-k "$1"} --benchmark-json="$out/bench_${tree}_$round.json" > "$out/bench_${tree}_$round.log" 2>&1
      tail -1 "$out/bench_${tree}_$round.log"
    done
  done
  python3 - "$out" <<'PY'
import glob, json, sys
rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/bench_*_*.json")):
    tree = f.rsplit("/", 1)[1].split("_")[1]
    for b in json.load(open(f))["benchmarks"]:
        rows.setdefault(b["name"], {}).setdefault(tree, []).append(b["extra_info"].get("atoms_per_s_median", 0) / 1e6)
print(f"{'benchmark (M atoms/s)':52s} {'base':>12s} {'this':>12s} {'wheel':>12s}")
for name, r in rows.items():
    fmt = lambda v: ", ".join(f"{x:.1f}" for x in v)
    print(f"{name[5:]:52s} {fmt(r.get('base', [])):>12s} {fmt(r.get('bs', [])):>12s} {fmt(r.get('wh', [])):>12s}")
PY
fi
