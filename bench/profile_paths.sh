#!/usr/bin/env bash
# Nsight Compute on each of issue 40's device paths (bench/profile_paths.py),
# on the lent GPU machine after `STAGES=build bash bench/device_ab.sh` built
# this tree into /tmp/bs.  A table of instructions per atom and TR, issue
# rate, registers, occupancy, memory traffic and the top stall reasons;
# the raw CSV under $OUT.
# Usage there: [TREE=base] bash bench/profile_paths.sh [atoms] [paths...]
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out"
n=${1:-100000}
shift || true
paths=${*:-real complex bssfp jacobian mt poolB states128}
export PYTHONPATH=/tmp/${TREE:-bs}:/tmp/site  # TREE=base: the base tree device_ab.sh built
metrics=gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg,launch__registers_per_thread
metrics+=,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
metrics+=,launch__grid_size,launch__block_size,launch__shared_mem_per_block_dynamic
metrics+=,smsp__sass_thread_inst_executed_op_ffma_pred_on.sum,smsp__sass_thread_inst_executed_op_fadd_pred_on.sum
metrics+=,smsp__sass_thread_inst_executed_op_fmul_pred_on.sum,smsp__thread_inst_executed.sum
metrics+=,dram__bytes_read.sum,dram__bytes_write.sum
metrics+=,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum
for s in long_scoreboard short_scoreboard not_selected barrier wait math_pipe_throttle mio_throttle lg_throttle \
         no_instruction dispatch_stall membar selected; do
  metrics+=,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
kernels='regex:warp_kernel|block_kernel|tail_kernel|jacobian_kernel|jacobian_block_kernel|pooled_team_kernel|pooled_kernel|pooled_jacobian_kernel'
cd /tmp
for p in $paths; do
  ncu --clock-control none --launch-skip 1 --launch-count 1 -k "$kernels" --csv --metrics "$metrics" \
    python3 "$repo/bench/profile_paths.py" "$p" "$n" > "$out/ncu_$p.csv" 2> "$out/ncu_$p.err"
  grep -h '^ok' "$out/ncu_$p.csv" || tail -5 "$out/ncu_$p.err"
done
python3 - "$out" "$n" $paths <<'PY'
import csv, io, sys
out, n, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for p in paths:
    text = open(f"{out}/ncu_{p}.csv").read()
    lines = [l for l in text.splitlines() if l.startswith('"')]
    if not lines:
        print(p, "no profile"); continue
    m, kernel = {}, ""
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        kernel = r["Kernel Name"][:60]
        v = r["Metric Value"].replace(",", "")
        try:
            m[r["Metric Name"]] = float(v)
        except ValueError:
            m[r["Metric Name"]] = v
    g = m.get
    per = n * 500.0
    stalls = {k.split("stalled_")[1].split("_per")[0]: g(k) for k in m if "stalled_" in k}
    top = sorted(stalls.items(), key=lambda kv: -(kv[1] or 0))[:5]
    fp = sum(g(f"smsp__sass_thread_inst_executed_op_{o}_pred_on.sum", 0) for o in ("ffma", "fadd", "fmul"))
    print(f"{p}: {kernel}")
    print(f"  {g('gpu__time_duration.sum', 0) / 1e6:.3f} ms = {n / (g('gpu__time_duration.sum', 1) * 1e-9) / 1e6:.1f} M atoms/s;"
          f" grid {g('launch__grid_size')} x {g('launch__block_size')}, {g('launch__registers_per_thread')} registers,"
          f" smem {g('launch__shared_mem_per_block_dynamic')}")
    print(f"  per atom and TR: {g('smsp__inst_executed.sum', 0) / per:.1f} warp instructions,"
          f" {g('smsp__thread_inst_executed.sum', 0) / per:.0f} thread instructions, {fp / per:.0f} FP32 thread ops")
    print(f"  issue active {g('smsp__issue_active.avg.pct_of_peak_sustained_active')} %, warps active"
          f" {g('sm__warps_active.avg.pct_of_peak_sustained_active')} %; DRAM r/w"
          f" {g('dram__bytes_read.sum', 0) / 1e6:.1f}/{g('dram__bytes_write.sum', 0) / 1e6:.1f} MB; local ld/st"
          f" {g('l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum', 0) / 1e6:.1f}/"
          f"{g('l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum', 0) / 1e6:.1f} MB")
    print("  stalls per issue: " + ", ".join(f"{k} {v:.2f}" for k, v in top))
PY
