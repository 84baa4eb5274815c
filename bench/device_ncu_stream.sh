#!/usr/bin/env bash
# Nsight Compute on the one-token stream kernel (decode_stream.h) of a 2-layer 20b-width fixture,
# plus its SASS. Run on the GPU machine from the repo root with the binaries in BIN (.devrun, as
# bench/device_stream.sh). Writes $OUT/stream.ncu-rep, details.txt, source.csv (per-SASS-line
# stall samples), sass_stream.txt.
set -u
cd "$(dirname "$0")/.."
source bench/device_run_env.sh /tmp/mxserve-ncu
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
"$CUOBJ" -sass "$BIN/mxserve" 2>/dev/null |
  awk '/Function : /{f = ($0 ~ /decode_stream|dot8_mxfp4|dot2_bf16|fc1_unit|fc2_unit|qkv_unit|rows_unit|producer|consumers/)} f' \
  > "$OUT/sass_stream.txt"
echo "sass lines $(wc -l < "$OUT/sass_stream.txt")"
"$BIN/mxserve" fixture --preset 20b --layers 2 /tmp/fx20 > /dev/null 2>&1
timeout 300 "$NCU" --clock-control none --kernel-name regex:decode_stream_k --launch-skip 3 --launch-count 1 \
  --section WarpStateStats --section SchedulerStats --section SourceCounters --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section SpeedOfLight --section InstructionStats -o "$OUT/stream" -f \
  "$BIN/mxserve" bench --model /tmp/fx20 --gpu-memory-utilization 0.3 --pp 16 --tg 4 --depth 512 --batch 1 \
  --reps 1 --decode-stream 1 ${BENCH_ARGS:-} > "$OUT/ncu.log" 2>&1
echo "ncu rc=$?"
tail -3 "$OUT/ncu.log"
"$NCU" -i "$OUT/stream.ncu-rep" --page details > "$OUT/details.txt" 2>&1
"$NCU" -i "$OUT/stream.ncu-rep" --page source --print-source sass --csv > "$OUT/source.csv" 2>&1
grep -E "Duration|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Executed Ipc" \
  "$OUT/details.txt" | head -20
