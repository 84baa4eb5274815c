# Sourced by the device scripts that run binaries built on the dev VM and carried in BIN (default
# .devrun: mxserve, test_kernels and lib/ with the Debian runtime libraries the GPU machine lacks, and
# assets/ with the tokenizer; scripts/pack-devrun.sh). Run from the repository root.
# Sets OUT (default: the first argument), BIN and the library path, and makes OUT.
OUT=${OUT:-$1}
BIN=${BIN:-.devrun}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# scripts/pack-devrun.sh packs binaries and the tokenizer with xz (about 60 % of gzip's size, a tenth of the
# tokenizer's): unpack them in place, and put the tokenizer where the tests and the server look for it.
_mx_unxz() {
  if command -v xz > /dev/null; then xz -d -f "$1"
  else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[1][:-3], "wb"))' "$1" && rm -f "$1"; fi
}
for _f in "$BIN"/*.xz "$BIN"/*/*.xz; do [ -e "$_f" ] && _mx_unxz "$_f"; done
for _f in "$BIN"/*/mxserve "$BIN"/*/moe_fp8_bench "$BIN"/*/test_kernels "$BIN"/test_kernels; do [ -e "$_f" ] && chmod +x "$_f"; done
if [ -e "$BIN/assets/tokenizer.json" ] && [ ! -e .assets/tokenizer/tokenizer.json ]; then
  mkdir -p .assets/tokenizer && cp "$BIN"/assets/* .assets/tokenizer/
fi
# NCCL (tensor parallelism) ships with PyTorch's Python packages on the GPU machines, not with the toolkit.
_nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
if [ -n "$_nccl_lib" ] && [ -e "$_nccl_lib/libnccl.so.2" ]; then export LD_LIBRARY_PATH="$_nccl_lib:$LD_LIBRARY_PATH"; fi
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the shared machines (the device notes say why)
