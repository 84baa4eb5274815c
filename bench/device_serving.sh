#!/usr/bin/env bash
# Serving benchmark on the GPU machine (issue 4): for 20b and 120b, start
# `mxserve serve --dummy-weights P`, wait for /ready, run bench/bench_serving.py at concurrency
# 1, 8, 32, 64, stop the server. Results (text + JSON + server logs) go to $OUT.
# Run from the repo root with build/cli/mxserve built and .devdeps/.assets present.
set -u
OUT=${OUT:-/tmp/mxserve-serving}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devdeps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for P in 20b 120b; do
  build/cli/mxserve serve --dummy-weights $P --device cuda --max-model-len 4096 --max-num-seqs 64 \
    --max-num-batched-tokens 2048 --port 8011 > $OUT/serve_$P.log 2>&1 &
  SP=$!
  python3 - <<'PY'
import time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen("http://127.0.0.1:8011/ready", timeout=1); break
    except Exception: time.sleep(0.5)
PY
  timeout 200 python3 bench/bench_serving.py --base-url http://127.0.0.1:8011 --concurrency 1,8,32,64 \
    --prompt-tokens 512 --max-tokens 128 --temperature 0 --requests-per-slot 2 --json $OUT/serving_$P.json > $OUT/serving_$P.txt 2>&1
  kill -TERM $SP; wait $SP
  echo "== $P"; cat $OUT/serving_$P.txt | tail -12
done
