#!/usr/bin/env bash
# Filtered sampling on the GPU machine: the kernel alone (build/bench/sampler_bench), then serving 20b
# (bench/device_load.sh, 512/128-token requests at 1-64 streams) with temperature 0.8 + top_p 0.9, and
# with temperature 0.8 alone for
# comparison. BASE=path/to/older/mxserve adds the same top_p run with that binary (e.g. one that
# sampled filtered requests on the host). Results go to $OUT.
# Run from the repo root with build/cli/mxserve built and .devdeps/.assets present.
set -u
export OUT=${OUT:-/tmp/mxserve-sampling}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devdeps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
build/bench/sampler_bench | tee $OUT/sampler_bench.txt
export MODELS=20b ENGINE=0 PROMPT_TOKENS=512 MAX_TOKENS=128 CONCURRENCY=1,8,32,64 REQS=2
TAG=_top_p CLIENT_ARGS="--temperature 0.8 --top-p 0.9" bash bench/device_load.sh
TAG=_temperature CLIENT_ARGS="--temperature 0.8" bash bench/device_load.sh
if [ -n "${BASE:-}" ]; then
  MXSERVE=$BASE TAG=_base_top_p CLIENT_ARGS="--temperature 0.8 --top-p 0.9" bash bench/device_load.sh
fi
