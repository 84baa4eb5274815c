#!/usr/bin/env bash
# Filtered sampling on the GPU machine: the kernel alone (build/bench/sampler_bench), then serving
# 20b (`mxserve serve --dummy-weights 20b`) with temperature 0.8 + top_p 0.9 at concurrency 1, 8, 32, 64,
# and with temperature 0.8 alone for comparison. BASE=path/to/older/mxserve adds the same top_p run
# with that binary (e.g. one that sampled filtered requests on the host). Results go to $OUT.
# Run from the repo root with build/cli/mxserve built and .devdeps/.assets present.
set -u
OUT=${OUT:-/tmp/mxserve-sampling}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devdeps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
build/bench/sampler_bench | tee $OUT/sampler_bench.txt
serve_and_bench() {  # name binary extra-bench-args...
  local name=$1 bin=$2
  shift 2
  $bin serve --dummy-weights 20b --device cuda --max-model-len 4096 --max-num-seqs 64 \
    --max-num-batched-tokens 2048 --port 8012 > $OUT/serve_$name.log 2>&1 &
  local sp=$!
  python3 - <<'PY'
import time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen("http://127.0.0.1:8012/ready", timeout=1); break
    except Exception: time.sleep(0.5)
PY
  timeout 200 python3 bench/bench_serving.py --base-url http://127.0.0.1:8012 --concurrency 1,8,32,64 \
    --prompt-tokens 512 --max-tokens 128 --temperature 0.8 --requests-per-slot 2 "$@" \
    --json $OUT/serving_$name.json > $OUT/serving_$name.txt 2>&1
  kill -TERM $sp; wait $sp
  echo "== $name $*"; tail -7 $OUT/serving_$name.txt
}
serve_and_bench top_p build/cli/mxserve --top-p 0.9
serve_and_bench temperature build/cli/mxserve
if [ -n "${BASE:-}" ]; then serve_and_bench base_top_p "$BASE" --top-p 0.9; fi
