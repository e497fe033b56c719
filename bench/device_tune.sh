#!/usr/bin/env bash
# One call on the lent GPU machine (device tool): build bench/device_kernel.cu
# for a few orders-per-thread variants of the warp kernel, time each on the
# reference workload, and profile one with Nsight Compute.
# Usage there: bash bench/device_tune.sh "32 8 4 1 4" "16 8 4 1 3" ...
#   (orders per thread real, complex; events per fast run; min blocks per
#   SM real, complex; optionally one more macro to define).
#   PROFILE="32 8 4 1 4" also profiles that variant; SWEEP=1 times each
#   variant over a range of state counts; SOURCE=1 (with PROFILE)
#   writes the per-instruction stall samples to $OUT/source.csv.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=("32 8 4 1 4")
for v in "${variants[@]}"; do
  set -- $v
  nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Isrc_cpp/include -Xcompiler=-O2 \
    -DBLOCHSIM_WARP_ORDERS_REAL=$1 -DBLOCHSIM_WARP_ORDERS_COMPLEX=$2 -DBLOCHSIM_RUN=$3 \
    -DBLOCHSIM_WARP_MIN_BLOCKS_REAL=$4 -DBLOCHSIM_WARP_MIN_BLOCKS_COMPLEX=$5 ${6:+-D${6:-}} -Xptxas -v bench/device_kernel.cu -o /tmp/dk_$1_$2_$3_$4_$5${6:-} \
    > "$out/ptxas_$1_$2_$3_$4_$5${6:-}.txt" 2>&1 &
done
wait
for v in "${variants[@]}"; do
  set -- $v
  echo "== variant $v"
  grep -A2 "warp_kernel" "$out/ptxas_$1_$2_$3_$4_$5${6:-}.txt" | grep -E "Used|spill" | head -4
  /tmp/dk_$1_$2_$3_$4_$5${6:-} 100000 1000000 2>&1 | grep -v "^warp orders"
done
if [ -n "${SWEEP:-}" ]; then
  for v in "${variants[@]}"; do
    set -- $v
    echo "== states sweep, variant $v"
    /tmp/dk_$1_$2_$3_$4_$5${6:-} states
  done
fi
if [ -n "${PROFILE:-}" ] && command -v ncu > /dev/null; then
  set -- $PROFILE
  for skip in 1 7; do
    timeout 200 ncu --clock-control none -k regex:warp_kernel --launch-skip $skip --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
      --section InstructionStats --section LaunchStats --section MemoryWorkloadAnalysis \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
      /tmp/dk_$1_$2_$3_$4_$5${6:-} 100000 > "$out/ncu_skip$skip.txt" 2>&1
    grep -E "Issue Slots Busy|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Executed Instructions  |No Eligible|Duration" "$out/ncu_skip$skip.txt" | head -12
    grep -E "issue_stalled" "$out/ncu_skip$skip.txt" | sort -k3 -n -r | head -8
  done
  if [ -n "${SOURCE:-}" ]; then
    # per-instruction stall samples of the real path (SASS), for reading here
    timeout 200 ncu --clock-control none -k regex:warp_kernel --launch-skip 1 --launch-count 1 \
      --section SourceCounters --section WarpStateStats -f -o /tmp/src_rep \
      /tmp/dk_$1_$2_$3_$4_$5${6:-} 100000 > /dev/null 2>&1
    ncu -i /tmp/src_rep.ncu-rep --page source --csv --print-source sass > "$out/source.csv" 2>&1
    wc -c "$out/source.csv"
  fi
fi
