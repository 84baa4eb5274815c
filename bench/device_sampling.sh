#!/usr/bin/env bash
# Filtered sampling on the GPU machine: the kernel alone (build/bench/sampler_bench), then serving 20b
# (bench/device_serving.sh) with temperature 0.8 + top_p 0.9, and with temperature 0.8 alone for
# comparison. BASE=path/to/older/mxserve adds the same top_p run with that binary (e.g. one that
# sampled filtered requests on the host). Results go to $OUT.
# Run from the repo root with build/cli/mxserve built and .devdeps/.assets present.
set -u
export OUT=${OUT:-/tmp/mxserve-sampling}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devdeps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
build/bench/sampler_bench | tee $OUT/sampler_bench.txt
export MODELS=20b
TAG=_top_p BENCH_ARGS="--temperature 0.8 --top-p 0.9" bash bench/device_serving.sh
TAG=_temperature BENCH_ARGS="--temperature 0.8" bash bench/device_serving.sh
if [ -n "${BASE:-}" ]; then
  BIN=$BASE TAG=_base_top_p BENCH_ARGS="--temperature 0.8 --top-p 0.9" bash bench/device_serving.sh
fi
