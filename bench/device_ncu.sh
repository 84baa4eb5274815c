#!/usr/bin/env bash
# Nsight Compute on the kernels of one batch-1 decode step (GPU machine, from the repo root).
# Kernels run one at a time under ncu, so each duration is the kernel alone (no launch gap, no PDL
# overlap); the gap to the graph step time is what the kernel boundaries cost.
# Usage: OUT=dir [MXSERVE=build/cli/mxserve] bash bench/device_ncu.sh MODEL_DIR
# MODEL_DIR is a checkpoint with few layers (e.g. `mxserve fixture --preset 120b --layers 2 DIR`):
# ncu saves and restores the memory a kernel can reach, which takes too long on a full-size model.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mxserve-ncu}
BIN=${MXSERVE:-build/cli/mxserve}
M=$1
L=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]+'/config.json'))['num_hidden_layers'])" "$M")
mkdir -p "$OUT"
source scripts/device-env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
# The depth fill and pp16 (3 prefill steps) each end in final_norm + lm_head + argmax; then 2 decode
# steps of L layers x 6 kernels + 3 are skipped (warm-up), and one whole step is profiled.
timeout 240 "$NCU" --clock-control none --cache-control none \
  --kernel-name regex:'qkv_rope_kv_k|attn_decode_k|gemv_k|router_k|fc1_k|fc2_k|argmax_k|final_norm_k' \
  --launch-skip $((9 + 2 * (L * 6 + 3))) --launch-count $((L * 6 + 3)) \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section ComputeWorkloadAnalysis --section InstructionStats --metrics dram__bytes_read.sum \
  "$BIN" bench --model "$M" --gpu-memory-utilization 0.14 --pp 16 --tg 4 --depth 2048 --batch 1 --reps 1 \
  --no-graphs > "$OUT/ncu.txt" 2> "$OUT/ncu.err"
echo "ncu rc=$? lines=$(wc -l < "$OUT/ncu.txt")"
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Grid Size|No Eligible" "$OUT/ncu.txt" | head -150
