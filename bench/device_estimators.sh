#!/usr/bin/env bash
# One call on the lent GPU machine (device tool) for the estimators on the
# card: build this tree (-Dcuda-arch=90), the GPU tests of the estimators
# (and, with ALL_GPU_TESTS=1, the whole GPU suite), the device estimator
# benchmarks (bench/test_bench_device_estimators.py) and the main job at
# --size 256 on the card and on the CPU, each timed; a table last.
# Wheels for meson-python, pyproject-metadata, tqdm and pytest-benchmark
# travel in .whl/ (git-ignored).  Usage there: bash bench/device_estimators.sh
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$out/gpu.txt"
if [ -n "${VARIANTS:-}" ]; then  # the kernel alone (bench/device_match.cu), one build a -D variant
  for v in $VARIANTS; do
    flags=${v//,/ }
    name=$(echo "$v" | tr -c 'A-Za-z0-9_\n' '_')  # a file name nvcc's tools accept
    nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Isrc_cpp/include ${flags//:/=} bench/device_match.cu \
      -o "/tmp/dm_$name" > "$out/dm_$name.log" 2>&1 || { tail -5 "$out/dm_$name.log"; continue; }
    echo "variant $v:"
    "/tmp/dm_$name" ${MATCH_SIZES:-1000000 12 1 1000000 12 7 100000 500 1} 2>&1 | sed 's/^/  /'
  done
fi
start=$(date +%s)
if [ ! -d /tmp/bs/blochsim ]; then
  python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/bs "$repo" -Csetup-args=-Dcuda=enabled \
    -Csetup-args=-Dcuda-arch=90 -Cbuild-dir=/tmp/bs.build > "$out/build.log" 2>&1 \
    || { tail -40 "$out/build.log"; exit 1; }
fi
echo "build: $(( $(date +%s) - start )) s"
export PYTHONPATH=/tmp/bs:/tmp/site
cd /tmp
python3 -c "import blochsim; print(blochsim.backends()['cuda'])"
tests=${TESTS:-"$repo/tests/test_gpu_estimators.py"}
[ "${ALL_GPU_TESTS:-0}" = 1 ] && tests="$repo/tests -m gpu"
timeout "${TEST_S:-240}" python3 -m pytest $tests -q -p no:cacheprovider -rfE 2>&1 | tee "$out/tests.log" | tail -15
if [ "${BENCH:-1}" = 1 ]; then
  timeout "${BENCH_S:-300}" python3 -m pytest "$repo/bench/test_bench_device_estimators.py" -q -p no:cacheprovider \
    --benchmark-only --benchmark-json="$out/bench.json" -k "${BENCH_K:-}" > "$out/bench.log" 2>&1
  tail -3 "$out/bench.log"
  python3 - "$out/bench.json" <<'PY'
import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    e = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in b["extra_info"].items()}
    print(f"{b['name']:<52} median {b['stats']['median']:8.4f} s  min {b['stats']['min']:8.4f} s  {e}")
PY
fi
if [ "${MAIN_JOB:-1}" = 1 ]; then
  for dev in cuda cpu; do
    s=$(date +%s%N)
    timeout 300 python3 -m blochsim --size 256 --device "$dev" --maps "" --quiet > "$out/main_$dev.log" 2>&1
    rc=$?
    echo "main job --device $dev: rc $rc in $(( ($(date +%s%N) - s) / 1000000 )) ms"
    [ "$rc" = 0 ] || tail -25 "$out/main_$dev.log"
    grep -E "stage|s$|matched|dictionary of|fat|CSF|matter|PERK  |dictionary  " "$out/main_$dev.log" | head -24
  done
fi
