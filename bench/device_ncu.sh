#!/usr/bin/env bash
# Nsight Compute on the decode kernels of one batch-1 step (GPU machine, from the repo root, with
# build/cli/mxserve carried). Kernels run one at a time under ncu, so each duration is the kernel
# alone (no launch gap, no PDL overlap); the gap to the graph step time is the boundaries' cost.
# Usage: OUT=dir bash bench/device_ncu.sh [preset] [layers-to-profile]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mxserve-ncu}
P=${1:-120b}
N=${2:-2}
L=36; [ "$P" = 20b ] && L=24
mkdir -p "$OUT"
source scripts/device-env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
# The depth fill and pp16 (3 prefill steps) each end in final_norm + lm_head + argmax; then 2 decode
# steps of L layers x 6 kernels + 3 are skipped (warm-up), and N layers are profiled.
timeout 300 "$NCU" --clock-control none --cache-control none \
  --kernel-name regex:'qkv_rope_kv_k|attn_decode_k|gemv_k|router_k|fc1_k|fc2_k|argmax_k|final_norm_k' \
  --launch-skip $((9 + 2 * (L * 6 + 3))) --launch-count $((N * 6 + 2)) \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --metrics dram__bytes_read.sum,lts__t_bytes.sum,gpu__time_duration.sum \
  --csv --page raw \
  build/cli/mxserve bench --preset "$P" --pp 16 --tg 4 --depth 2048 --batch 1 --reps 1 --no-graphs \
  > "$OUT/ncu_$P.csv" 2> "$OUT/ncu_$P.err"
echo "ncu rc=$? lines=$(wc -l < "$OUT/ncu_$P.csv")"
tail -3 "$OUT/ncu_$P.err"
