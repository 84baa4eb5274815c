# Sourced by the device scripts that run binaries built on the dev VM and carried in BIN (default
# .devrun: mxserve, test_kernels and lib/ with the Debian runtime libraries the GPU machine lacks).
# Sets OUT (default: the first argument), BIN and the library path, and makes OUT.
OUT=${OUT:-$1}
BIN=${BIN:-.devrun}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
