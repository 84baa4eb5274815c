# Source on the GPU machine (Ubuntu 24.04, no package registry) before configuring with the
# 'device' preset: points CMake and pkg-config at the carried .devdeps/ tree.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PKG_CONFIG_SYSROOT_DIR="$_root/.devdeps"
export PKG_CONFIG_PATH="$_root/.devdeps/usr/lib/x86_64-linux-gnu/pkgconfig"
export CMAKE_PREFIX_PATH="$_root/.devdeps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export LD_LIBRARY_PATH="$_root/.devdeps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="/usr/local/cuda/bin:$PATH"
export NCCL_NVLS_ENABLE=0
# NCCL (tensor parallelism) ships with PyTorch's Python packages on the GPU machines, not with the toolkit.
_nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
if [ -n "$_nccl_lib" ] && [ -e "$_nccl_lib/libnccl.so.2" ]; then export LD_LIBRARY_PATH="$_nccl_lib:$LD_LIBRARY_PATH"; fi
