#!/usr/bin/env bash
# One call on the lent GPU machine (device tool): build bench/device_kernel.cu
# for a few layouts of the Jacobian kernel and time each on the reference
# workload (forward for the ratio, then the Jacobian in three direction sets).
# Usage there: bash bench/device_tune_jacobian.sh "2 8 4" "1 32 8" ...
#   (dual directions a team, orders a lane real, complex[, min blocks per SM
#   [, staged paths (1 real, 2 complex, 3 both)]]).
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=("2 8 4")
for v in "${variants[@]}"; do
  set -- $v
  nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Isrc_cpp/include -Xcompiler=-O2 \
    -DBLOCHSIM_JACOBIAN_DIRS=$1 -DBLOCHSIM_JACOBIAN_ORDERS_REAL=$2 -DBLOCHSIM_JACOBIAN_ORDERS_COMPLEX=$3 -DBLOCHSIM_JACOBIAN_MIN_BLOCKS=${4:-1} \
    -DBLOCHSIM_JACOBIAN_STAGED=${5:-1} \
    -Xptxas -v bench/device_kernel.cu -o /tmp/dj_$1_$2_$3_${4:-1}_${5:-1} > "$out/ptxas_jac_$1_$2_$3_${4:-1}_${5:-1}.txt" 2>&1 &
done
wait
for v in "${variants[@]}"; do
  set -- $v
  echo "== variant $v"
  grep -A2 "jacobian_kernel" "$out/ptxas_jac_$1_$2_$3_${4:-1}_${5:-1}.txt" | grep -E "Used|spill" | head -6
  /tmp/dj_$1_$2_$3_${4:-1}_${5:-1} jacobian ${SIZES:-100000 1000000}
done
