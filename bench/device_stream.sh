#!/usr/bin/env bash
# One device call for the one-token stream kernel (kernels/decode/decode_stream.h): its GPU tests,
# then batch-1 decode with it and without it (the same binary, --decode-stream 1 / 0), and its step
# trace. Binaries built on the dev VM are carried in BIN (default .devrun: mxserve, test_kernels and
# lib/ with the Debian runtime libraries the GPU machine lacks). Logs go to $OUT.
#   TESTS   gtest filter (default: the decode-path tests)
#   MODELS  presets to bench (default: 120b 20b)
#   BENCH   extra bench arguments (default: --pp 16 --tg 64 --depth 2048 --batch 1 --reps 2)
#   RUNS    decode-stream settings, each S or S/V (--decode-stream S --stream-variant V; default: 1 0)
set -u
cd "$(dirname "$0")/.."
source bench/device_run_env.sh /tmp/mxserve-device
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
filter=${TESTS:-'CudaRunner.Stream*:CudaRunner.Tiny*:CudaRunner.Mini*:CudaRunner.Persistent*:GoldenLogitsGpu.*'}
if [ "$filter" != none ]; then
  timeout 400 "$BIN/test_kernels" --gtest_filter="$filter" > "$OUT/tests.log" 2>&1
  echo "tests exit $?"
  grep -E "^\[ *(FAILED|PASSED)|stream vs|e2e|golden|Failure|Expected|Which is" "$OUT/tests.log" | head -60
fi
# RUNS: space-separated decode-stream settings, each "S" or "S/V" (S: --decode-stream, V: --stream-variant).
for m in ${MODELS:-120b 20b}; do
  for run in ${RUNS:-1 0}; do
    st=${run%%/*}; var=0; [ "$run" != "$st" ] && var=${run#*/}
    tag="${m}_s${st}v${var}"
    timeout 240 "$BIN/mxserve" bench --preset "$m" ${BENCH:---pp 16 --tg 64 --depth 2048 --batch 1 --reps 2} \
      --decode-stream "$st" --stream-variant "$var" $([ "$st" = 1 ] && echo --step-trace "$OUT/trace_$tag.csv") \
      > "$OUT/bench_$tag.log" 2>&1
    echo "bench $tag exit $?"
    grep -E "^\| tg|stream trace|^  [a-zA-Z0-9-]+ [0-9]+ |rror" "$OUT/bench_$tag.log"
  done
done
