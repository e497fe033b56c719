#!/usr/bin/env bash
# One call on the lent GPU machine (device tool): build bench/device_kernel.cu
# for a few orders-per-thread variants of the warp kernel, time each on the
# reference workload, and profile one with Nsight Compute.
# Usage there: bash bench/device_tune.sh "32 16" "16 8" ...   (real complex)
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=("32 16" "16 8" "8 4")
for v in "${variants[@]}"; do
  set -- $v
  nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Isrc_cpp/include -Xcompiler=-O2 \
    -DBLOCHSIM_WARP_ORDERS_REAL=$1 -DBLOCHSIM_WARP_ORDERS_COMPLEX=$2 -Xptxas -v \
    bench/device_kernel.cu -o /tmp/dk_$1_$2 > "$out/ptxas_$1_$2.txt" 2>&1 &
done
wait
for v in "${variants[@]}"; do
  set -- $v
  grep -A2 "warp_kernel" "$out/ptxas_$1_$2.txt" | grep Used | head -2
  /tmp/dk_$1_$2 100000 1000000
done
if [ -n "${PROFILE:-}" ] && command -v ncu > /dev/null; then
  set -- $PROFILE
  for skip in 1 7; do
    timeout 200 ncu --clock-control none -k regex:warp_kernel --launch-skip $skip --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
      --section InstructionStats --section LaunchStats --section MemoryWorkloadAnalysis \
      /tmp/dk_$1_$2 100000 > "$out/ncu_$1_$2_skip$skip.txt" 2>&1
    grep -E "Executed Ipc|Issue Slots Busy|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Executed Instructions  |No Eligible|Duration|Stall" "$out/ncu_$1_$2_skip$skip.txt" | head -20
  done
fi
