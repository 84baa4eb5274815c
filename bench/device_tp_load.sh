#!/usr/bin/env bash
# Issue 30's maximum-load ratio in one device call on a two-GPU machine: the 1k/1k load (bench/device_load.sh)
# at TP=2 with N2 streams, then at TP=1 on GPU 0 with N1 streams (each cache's limit without preemption on
# H200s), 120b, fp8 KV cache, prefill steps apart from decodes; prints both output rates and TP=2 over TP=1.
# About 265 s at TP=2 and 180 s at TP=1 on 2x H200 (docs/perf.md session 47: 1.81x).
# Environment: OUT, MXSERVE (default .devrun/new/mxserve), N2 (4800), N1 (1792), BATCHED2 / BATCHED1
# (--max-num-batched-tokens of each, 16384), LIMIT2 / LIMIT1 (the client's seconds, 400 / 300), MODEL (120b).
# Run from the repo root: OUT=$OUT bash bench/device_tp_load.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mxserve-tp-load}
MXSERVE=${MXSERVE:-.devrun/new/mxserve}
MODEL=${MODEL:-120b}
N2=${N2:-4800} N1=${N1:-1792}
run() {  # tag, streams, batched, client limit, extra environment (CUDA_VISIBLE_DEVICES) and engine flags
  local tag=$1 n=$2 batched=$3 limit=$4 gpus=$5 flags=$6
  env $gpus OUT="$OUT" MXSERVE="$MXSERVE" MODELS="$MODEL" CONCURRENCY="$n" MAX_NUM_SEQS="$n" KV_DTYPE=fp8 \
    GPU_MEM=0.95 MAX_BATCHED="$batched" TAG="$tag" ENGINE=0 LIMIT_S="$limit" \
    SERVE_ARGS="--max-prefill-tokens-with-decodes 0" ENGINE_ARGS="$flags" bash bench/device_load.sh 2>&1 |
    grep -E "server CPU|client exit|client:|exited|^ *$n "
}
rate() {  # output tok/s of a load's JSON, or 0
  python3 -c 'import json, sys
try: print(json.load(open(sys.argv[1]))["results"][0]["output_tok_s"])
except Exception: print(0)' "$1"
}
echo "== TP=2, $N2 streams, --max-num-batched-tokens ${BATCHED2:-16384}"
run _tp2_$N2 "$N2" "${BATCHED2:-16384}" "${LIMIT2:-400}" "" "--tensor-parallel-size 2"
echo "== TP=1 (GPU 0), $N1 streams, --max-num-batched-tokens ${BATCHED1:-16384}"
run _tp1_$N1 "$N1" "${BATCHED1:-16384}" "${LIMIT1:-300}" "CUDA_VISIBLE_DEVICES=0" ""
r2=$(rate "$OUT/load_${MODEL}_tp2_$N2.json") r1=$(rate "$OUT/load_${MODEL}_tp1_$N1.json")
python3 -c 'import sys; a, b = map(float, sys.argv[1:]); print(f"== TP=2 {a:,.1f} / TP=1 {b:,.1f} output tok/s: " + (f"{a / b:.3f}x" if b else "n/a"))' "$r2" "$r1"
