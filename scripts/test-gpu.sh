#!/usr/bin/env bash
# The one command for GPU tests: builds the device preset and runs every gpu-labelled test.
# Run on the GPU machine from the repo root (with .devdeps/ and .assets/ present).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/device-env.sh
cmake --preset device -DMXSERVE_CUDA=ON >/dev/null
cmake --build --preset device -j"$(nproc)" --target test_kernels mxserve
ctest --preset device --output-on-failure "$@"
