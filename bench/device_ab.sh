#!/usr/bin/env bash
# One or two calls on the lent GPU machine (device tool) for an A/B of the
# device backend: build this tree and, when base_src/ holds an earlier tree
# (git archive REV | tar -x -C base_src), that one too, side by side; then
# (STAGE=run, or STAGE=all for both in one call) the GPU tests of this tree and the device benchmarks of both,
# alternating.  Wheels for meson-python and pyproject-metadata travel in
# .whl/ (git-ignored).  Usage there: STAGE=build|run bash bench/device_ab.sh [bench -k]
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
if [ "${STAGE:-build}" != run ]; then
  nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$out/gpu.txt"
  start=$(date +%s)
  build() {  # src target
    python3 -m pip install -q --no-build-isolation --no-deps --target "$2" "$1" -Csetup-args=-Dcuda=enabled \
      -Csetup-args=-Dcuda-arch=90 -Cbuild-dir="$2.build" > "$out/$(basename "$2").log" 2>&1 \
      || { tail -30 "$out/$(basename "$2").log"; return 1; }
  }
  build "$repo" /tmp/bs & a=$!
  [ -d base_src ] && { build "$repo/base_src" /tmp/base & b=$!; }
  wait $a || exit 1
  [ -d base_src ] && { wait $b || exit 1; }
  echo "builds: $(( $(date +%s) - start )) s"
  awk -F'\t' 'NR>1 {printf "%8.1f s  %s\n", ($2-$1)/1000, $4}' /tmp/bs.build/.ninja_log | sort -rn | head -8
  [ "${STAGE:-build}" = build ] && exit 0
fi
cd /tmp
PYTHONPATH=/tmp/bs:/tmp/site python3 -c "import blochsim; print(blochsim.backends()['cuda'])"
PYTHONPATH=/tmp/bs:/tmp/site timeout ${TEST_S:-300} python3 -m pytest "$repo/tests" -q -p no:cacheprovider -m gpu 2>&1 \
  | tee "$out/tests.log" | tail -6
for round in $(seq 1 "${ROUNDS:-2}"); do
  for tree in base bs; do
    [ -d "/tmp/$tree" ] || continue
    PYTHONPATH=/tmp/$tree:/tmp/site python3 -m pytest "$repo/bench/test_bench_device.py" -q -p no:cacheprovider \
      --benchmark-only ${1:+-k "$1"} --benchmark-json="$out/bench_${tree}_$round.json" > "$out/bench_${tree}_$round.log" 2>&1
  done
done
python3 - "$out" <<'PY'
import glob, json, sys
rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/bench_*_*.json")):
    tree = f.rsplit("/", 1)[1].split("_")[1]
    for b in json.load(open(f))["benchmarks"]:
        rows.setdefault(b["name"], {}).setdefault(tree, []).append(b["extra_info"].get("atoms_per_s_median", 0) / 1e6)
print(f"{'benchmark (M atoms/s)':58s} {'base':>16s} {'this':>16s}")
for name, r in rows.items():
    fmt = lambda v: ", ".join(f"{x:.1f}" for x in v)
    print(f"{name:58s} {fmt(r.get('base', [])):>16s} {fmt(r.get('bs', [])):>16s}")
PY
