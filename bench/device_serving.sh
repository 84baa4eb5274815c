#!/usr/bin/env bash
# Serving benchmark on the GPU machine (issue 4): for each model, start
# `mxserve serve --dummy-weights P`, wait for /ready, run bench/bench_serving.py at concurrency
# 1, 8, 32, 64, stop the server. Results (text + JSON + server logs) go to $OUT.
# Knobs (environment): MODELS (default "20b 120b"), BIN (default build/cli/mxserve), TAG (suffix of
# the result files), BENCH_ARGS (default "--temperature 0"; passed to bench_serving.py).
# Run from the repo root with build/cli/mxserve built and .devdeps/.assets present.
set -u
OUT=${OUT:-/tmp/mxserve-serving}
MODELS=${MODELS:-"20b 120b"}
BIN=${BIN:-build/cli/mxserve}
TAG=${TAG:-}
BENCH_ARGS=${BENCH_ARGS:---temperature 0}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devdeps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for P in $MODELS; do
  N=$P$TAG
  $BIN serve --dummy-weights $P --device cuda --max-model-len 4096 --max-num-seqs 64 \
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
  timeout 200 python3 bench/bench_serving.py --base-url http://127.0.0.1:8011 --concurrency 1,8,32,64 \
    --prompt-tokens 512 --max-tokens 128 --requests-per-slot 2 $BENCH_ARGS \
    --json $OUT/serving_$N.json > $OUT/serving_$N.txt 2>&1
  kill -TERM $SP; wait $SP
  echo "== $N $BENCH_ARGS"; cat $OUT/serving_$N.txt | tail -12
done
