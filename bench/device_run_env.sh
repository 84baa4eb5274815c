# Sourced by the device scripts that run binaries built on the dev VM and carried in BIN (default
# .devrun: mxserve, test_kernels and lib/ with the Debian runtime libraries the GPU machine lacks).
# Sets OUT (default: the first argument), BIN and the library path, and makes OUT.
OUT=${OUT:-$1}
BIN=${BIN:-.devrun}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# NCCL (tensor parallelism) ships with PyTorch's Python packages on the GPU machines, not with the toolkit.
_nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
if [ -n "$_nccl_lib" ] && [ -e "$_nccl_lib/libnccl.so.2" ]; then export LD_LIBRARY_PATH="$_nccl_lib:$LD_LIBRARY_PATH"; fi
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the shared machines (the device notes say why)
