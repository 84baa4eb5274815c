#!/usr/bin/env bash
# `mxserve bench` of one build under each of several flag sets in turn, per model, on the same machine: the
# quantized dense layers (the default sets), or e.g. SETTINGS="--tensor-parallel-size 1;--tensor-parallel-size 2".
# Logs go to $OUT (one file a model).
#   BIN       mxserve in $BIN/new/ (optionally gzipped) and lib/ (default .devrun), as device_ab.sh
#   MODELS    presets (default: 120b 20b)
#   SETTINGS  ;-separated flag sets (default: none, qkv,o, lm_head and all, MXFP4 then FP8)
#   BENCH     bench arguments (default: --pp 2048 --tg 128 --depth 2048 --batch 1,8,64 --reps 2)
set -u
cd "$(dirname "$0")/.."
source bench/device_run_env.sh /tmp/mxserve-device
for f in "$BIN"/new/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x "$BIN"/new/mxserve
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
DEFAULT="--mxfp4-layers none;--mxfp4-layers qkv,o;--mxfp4-layers lm_head;--mxfp4-layers all;--fp8-layers qkv,o;--fp8-layers lm_head;--fp8-layers all"
IFS=';' read -r -a sets <<< "${SETTINGS:-$DEFAULT}"
for m in ${MODELS:-120b 20b}; do
  log="$OUT/settings_$m.log"
  for s in "${sets[@]}"; do
    echo "== $m $s" | tee -a "$log"
    n=$(wc -l < "$log")
    # shellcheck disable=SC2086  # the flag set splits into arguments
    timeout 300 "$BIN/new/mxserve" bench --preset "$m" ${BENCH:---pp 2048 --tg 128 --depth 2048 --batch 1,8,64 --reps 2} $s >> "$log" 2>&1
    echo "   (exit $?)"
    tail -n +"$((n + 1))" "$log" | grep -E "^\| (pp|tg)|rror|loaded"
  done
done
