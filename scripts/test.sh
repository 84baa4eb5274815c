#!/usr/bin/env bash
# Builds mxserve (CUDA too when nvcc is present) and runs every CPU test. GPU tests carry the
# ctest label 'gpu' and run on a GPU machine with scripts/test-gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh   # idempotent: installs what is missing, fetches the tokenizer asset
jobs=$(nproc)
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs" --timeout 600
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then
  bash scripts/compile-blackwell.sh sm_121a
fi
if [ -f tests/server/run.sh ]; then
  bash tests/server/run.sh build/cli/mxserve
fi
