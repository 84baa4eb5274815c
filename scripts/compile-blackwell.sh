#!/usr/bin/env bash
# Compiles the decode kernels for Blackwell (sm_121a: DGX Spark GB10; sm_120a: RTX 50-series and RTX PRO)
# so they cannot rot: compiled, never run here (no such GPU is lent). A whole build for them:
#   cmake --preset release -DCMAKE_CUDA_ARCHITECTURES="90a;120a;121a"
# Usage: scripts/compile-blackwell.sh [ARCH ...]   (default sm_121a); needs nvcc, no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for arch in "${@:-sm_121a}"; do
  pids=()
  for f in kernels/decode/*.cu kernels/attention_decode/*.cu; do
    # The flags of kernels/CMakeLists.txt (device code is C++17 there).
    "$NVCC" -std=c++17 -O3 --expt-relaxed-constexpr -arch="$arch" -I. -c "$f" -o "$out/$(basename "$f").o" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  echo "compile-blackwell: decode kernels build for $arch"
done
