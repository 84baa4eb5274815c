#!/usr/bin/env bash
# The FP8 KV cache against bf16 (issue 28) on the GPU machine: `mxserve bench` decode (tg) at several
# depths, each depth with the bf16 cache then the fp8 cache, one build. Logs go to $OUT/kv_P.log.
#   BIN (device_run_env.sh), MXSERVE (default $BIN/new/mxserve, optionally gzipped), MODELS (120b 20b),
#   RUNS: "depth:batches" items (default "2048:1,64 8192:1,16 32768:1"), TG (128), PP (pp lengths, at
#   the depth; default none), GPU_MEM (0.9)
set -u
cd "$(dirname "$0")/.."
source bench/device_run_env.sh /tmp/mxserve-kv
MXSERVE=${MXSERVE:-$BIN/new/mxserve}
[ -e "$MXSERVE.gz" ] && gunzip -f "$MXSERVE.gz"
chmod +x "$MXSERVE"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
for m in ${MODELS:-120b 20b}; do
  log="$OUT/kv_$m.log"
  for run in ${RUNS:-2048:1,64 8192:1,16 32768:1}; do
    depth=${run%%:*} batches=${run#*:}
    for dt in bf16 fp8; do
      echo "== $m $dt: bench --tg ${TG:-128} --depth $depth --batch $batches ${PP:+--pp $PP}" >> "$log"
      n=$(wc -l < "$log")
      timeout 300 "$MXSERVE" bench --preset "$m" --kv-cache-dtype $dt --tg "${TG:-128}" --depth "$depth" \
        --batch "$batches" ${PP:+--pp $PP} --reps 2 --gpu-memory-utilization "${GPU_MEM:-0.9}" >> "$log" 2>&1
      echo "== $m $dt depth $depth (exit $?)"
      tail -n +"$((n + 1))" "$log" | grep -E "^\| (pp|tg)|rror|KV .* GB|cannot hold"
    done
  done
done
