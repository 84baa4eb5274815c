#!/usr/bin/env bash
# The load benchmark (issue 27) on the GPU machine, one model after another:
#  1. `mxserve bench --json` of distinct batches at the serving depth (prompt + half the output) for the
#     concurrency levels that fit the engine's KV cache (larger ones are dropped until it fits);
#  2. `mxserve serve --dummy-weights P` with the serving flags, until /ready;
#  3. bench/bench_serving.py: per level, CONC streams of unique random token-id prompts, all at once
#     (REQS requests a stream), ignore_eos, temperature 0: output tok/s, TTFT p50/p99, TPOT mean/p99,
#     preemptions and KV use after the level, and beside it the engine's step at that batch.
# Results go to $OUT: engine_PTAG.json, load_PTAG.txt / .json, serve_PTAG.log, metrics_PTAG.txt.
# Environment: OUT, MXSERVE (default build/cli/mxserve), BIN (libraries: device_run_env.sh), MODELS
# ("20b 120b"), CONCURRENCY ("64,128,256"), PROMPT_TOKENS (1024), MAX_TOKENS (1024), REQS (1),
# MAX_MODEL_LEN (4096), MAX_NUM_SEQS (0: the server's, by GPU), MAX_BATCHED (8192), GPU_MEM (0.9), LIMIT_S (per model, 400),
# SERVE_ARGS (extra serve flags), CLIENT_ARGS (sampling flags of the client, default "--temperature 0";
# e.g. "--temperature 0.8 --top-p 0.9"; "--temperature 0 --max-tokens-min 256" with REQS > 1: requests end
# at different steps, so the batch changes as a real load's does), PROMPT_IDS (0: word prompts instead of
# token ids), TAG (suffix of the file names), ENGINE (0: skip step 1 and use the engine_PTAG.json already in $OUT, if any),
# KV_DTYPE (--kv-cache-dtype of bench and serve, default auto), ENGINE_ARGS (flags of bench and serve alike,
# e.g. "--mxfp4-layers all" or "--tensor-parallel-size 2").
# Run from the repo root: OUT=$OUT MXSERVE=.devrun/new/mxserve bash bench/device_load.sh
set -u
cd "$(dirname "$0")/.."
source bench/device_run_env.sh /tmp/mxserve-load
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"  # a build made on the device
MXSERVE=${MXSERVE:-build/cli/mxserve}
[ -e "$MXSERVE.gz" ] && gunzip -f "$MXSERVE.gz"
chmod +x "$MXSERVE"
MODELS=${MODELS:-"20b 120b"}
CONCURRENCY=${CONCURRENCY:-64,128,256}
PROMPT_TOKENS=${PROMPT_TOKENS:-1024}
MAX_TOKENS=${MAX_TOKENS:-1024}
GPU_MEM=${GPU_MEM:-0.9}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
for P in $MODELS; do
  N=$P${TAG:-}
  # 1. The engine's distinct batches at the depth the streams average.
  depth=$((PROMPT_TOKENS + MAX_TOKENS / 2))
  batches=$CONCURRENCY
  [ "${ENGINE:-1}" = 0 ] && batches=
  while [ -n "$batches" ]; do
    if timeout 300 "$MXSERVE" bench --preset "$P" --pp 16 --tg 32 --depth $depth --batch "$batches" --reps 2 \
        --gpu-memory-utilization 0.95 --kv-cache-dtype "${KV_DTYPE:-auto}" ${ENGINE_ARGS:-} --json > "$OUT/engine_$N.json" 2> "$OUT/engine_$N.err"; then
      break
    fi
    batches=$(echo "$batches" | awk -F, '{OFS=","; NF--; print}')  # the largest batch did not fit
  done
  echo "== $N engine, distinct batches $batches at depth $depth"
  engine_json=
  [ -s "$OUT/engine_$N.json" ] && engine_json="--engine-json $OUT/engine_$N.json"  # none fits: no comparison
  # 2. The server.
  "$MXSERVE" serve --dummy-weights "$P" --device cuda --max-model-len "${MAX_MODEL_LEN:-4096}" \
    --max-num-seqs "${MAX_NUM_SEQS:-0}" --max-num-batched-tokens "${MAX_BATCHED:-8192}" \
    --gpu-memory-utilization "$GPU_MEM" --kv-cache-dtype "${KV_DTYPE:-auto}" ${ENGINE_ARGS:-} --port 8011 ${SERVE_ARGS:-} > "$OUT/serve_$N.log" 2>&1 &
  SP=$!
  # Ready, or the server gone (a bad flag or path): then its log's tail, and the next model.
  python3 - "$SP" <<'PY'
import os, sys, time, urllib.request
for _ in range(480):
    try:
        urllib.request.urlopen("http://127.0.0.1:8011/ready", timeout=1); break
    except Exception:
        if not os.path.exists(f"/proc/{sys.argv[1]}"): break
        time.sleep(0.5)
PY
  if ! kill -0 $SP 2>/dev/null; then
    echo "== $N: the server exited before it was ready:"; tail -5 "$OUT/serve_$N.log"; wait $SP; continue
  fi
  # 3. The load; the server's CPU time over it (user + system, all threads: a spinning wait shows here).
  cpu0=$(awk '{print $14 + $15}' /proc/$SP/stat); t0=$SECONDS
  ids=--prompt-ids
  [ "${PROMPT_IDS:-1}" = 0 ] && ids=
  # CLIENT_ARGS is a list of words on purpose.
  timeout "${LIMIT_S:-400}" python3 bench/bench_serving.py --base-url http://127.0.0.1:8011 \
    --concurrency "$CONCURRENCY" --prompt-tokens "$PROMPT_TOKENS" --max-tokens "$MAX_TOKENS" $ids \
    ${CLIENT_ARGS:---temperature 0} --requests-per-slot "${REQS:-1}" $engine_json \
    --json "$OUT/load_$N.json" > "$OUT/load_$N.txt" 2>&1
  echo "client exit $?"
  cpu1=$(awk '{print $14 + $15}' /proc/$SP/stat); tck=$(getconf CLK_TCK)
  echo "server CPU during the load: $(( (cpu1 - cpu0) / tck )) s over $(( SECONDS - t0 )) s of wall time"
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8011/metrics', timeout=5).read().decode())" \
    > "$OUT/metrics_$N.txt" 2>&1
  kill -TERM $SP; wait $SP
  echo "== $N serving (--max-num-seqs ${MAX_NUM_SEQS:-0 (by GPU)} --max-num-batched-tokens ${MAX_BATCHED:-8192}," \
       "${PROMPT_TOKENS}/${MAX_TOKENS} tokens, ${CLIENT_ARGS:---temperature 0})"
  cat "$OUT/load_$N.txt"
  grep -E "KV .* blocks" "$OUT/serve_$N.log" | tail -1
done
