#!/usr/bin/env bash
# Serving benchmark on the GPU machine (issue 4): for each model, start
# `mxserve serve --dummy-weights P`, wait for /ready, run bench/bench_serving.py at concurrency
# 1, 8, 32, 64, stop the server. Results (text + JSON + server logs) go to $OUT.
# Knobs (environment): MODELS (default "20b 120b"), BIN (default build/cli/mxserve), TAG (suffix of
# the result files), BENCH_ARGS (default "--temperature 0"; passed to bench_serving.py), MAX_MODEL_LEN
# (4096), PROMPT_TOKENS (512), MAX_TOKENS (128), CONCURRENCY ("1,8,32,64"), REQS (requests per
# concurrency slot, 2), LIMIT_S (seconds for the whole client run, 200). The server's /metrics after
# the run (preemptions, KV usage) goes to metrics_*.txt.
# Run from the repo root with build/cli/mxserve built and .devdeps/.assets present.
set -u
OUT=${OUT:-/tmp/mxserve-serving}
MODELS=${MODELS:-"20b 120b"}
BIN=${BIN:-build/cli/mxserve}
TAG=${TAG:-}
BENCH_ARGS=${BENCH_ARGS:---temperature 0}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-4096}
PROMPT_TOKENS=${PROMPT_TOKENS:-512}
MAX_TOKENS=${MAX_TOKENS:-128}
CONCURRENCY=${CONCURRENCY:-1,8,32,64}
REQS=${REQS:-2}
LIMIT_S=${LIMIT_S:-200}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devdeps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for P in $MODELS; do
  N=$P$TAG
  $BIN serve --dummy-weights $P --device cuda --max-model-len $MAX_MODEL_LEN --max-num-seqs 64 \
    --max-num-batched-tokens 2048 --port 8011 > $OUT/serve_$N.log 2>&1 &
  SP=$!
  python3 - <<'PY'
import time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen("http://127.0.0.1:8011/ready", timeout=1); break
    except Exception: time.sleep(0.5)
PY
  # BENCH_ARGS is a list of words on purpose.
  timeout $LIMIT_S python3 bench/bench_serving.py --base-url http://127.0.0.1:8011 --concurrency $CONCURRENCY \
    --prompt-tokens $PROMPT_TOKENS --max-tokens $MAX_TOKENS --requests-per-slot $REQS $BENCH_ARGS \
    --json $OUT/serving_$N.json > $OUT/serving_$N.txt 2>&1
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8011/metrics', timeout=5).read().decode())" \
    > $OUT/metrics_$N.txt 2>&1
  kill -TERM $SP; wait $SP
  echo "== $N $BENCH_ARGS"; cat $OUT/serving_$N.txt | tail -12
  grep -E "KV .* blocks" $OUT/serve_$N.log | tail -1
  grep -E "^vllm:num_preemptions" $OUT/metrics_$N.txt
done
