#!/usr/bin/env bash
# The SASS of one kernel, on the dev VM (no GPU; the toolkit here has no cuobjdump or nvdisasm).
# Debian's non-free nvidia-cuda-toolkit (11.8) has an nvdisasm that reads a CUDA 13 sm_90a cubin once the
# ELF header carries the old ABI's fields (OS/ABI 0x33, ABI version 7, e_flags 0x5a055a); only that binary is
# kept, in .devdeps/sass/. The cubin is built with the build tree's own compile command for SOURCE.
# Usage (after `cmake --preset release`): scripts/sass.sh kernels/moe_prefill/moe_fp8_sparse.cu 'moe_fp8_kILb1ELi4E'
# Out: the kernel's opcode counts (most first), then its SASS in .devdeps/sass/kernel.sass.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: scripts/sass.sh SOURCE.cu KERNEL_REGEX (a part of the mangled name)" >&2; exit 2; }
src=$1 kernel=$2 dir=.devdeps/sass
mkdir -p "$dir"
if [ ! -x "$dir/nvdisasm" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
  echo 'deb http://deb.debian.org/debian bookworm non-free' > "$tmp/sources.list"
  apt_opts=(-o Dir::Etc::sourcelist="$tmp/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$tmp/lists"
            -o Dir::Cache="$tmp/cache" -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update > "$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; exit 1; }
  (cd "$tmp" && apt-get "${apt_opts[@]}" download nvidia-cuda-toolkit >> apt.log 2>&1) || { cat "$tmp/apt.log" >&2; exit 1; }
  dpkg -x "$tmp"/nvidia-cuda-toolkit_*.deb "$tmp/x"
  cp "$tmp/x/usr/bin/nvdisasm" "$dir/nvdisasm"
fi
target=$(ninja -C build -t targets all | grep -o "^[^:]*/$(basename "$src").o" | head -1)
[ -n "$target" ] || { echo "sass.sh: no object for $src in build/ (cmake --preset release first)" >&2; exit 1; }
cubin=$PWD/$dir/kernel.cubin
# The object's command, made to write an sm_90a cubin instead.
ninja -C build -t commands "$target" | tail -1 |
  sed -E "s# -o [^ ]+# -o $cubin -cubin#; s# -c # #; s#--generate-code=[^ ]+#-arch=sm_90a#" > "$dir/cmd.sh"
(cd build && bash "$PWD/../$dir/cmd.sh")
python3 - "$cubin" << 'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
b[7], b[8] = 0x33, 7                        # OS/ABI, ABI version: the CUDA 11 ELF
struct.pack_into("<I", b, 0x30, 0x5A055A)   # e_flags: sm_90, virtual sm_90
open(sys.argv[1], "wb").write(b)
PY
"$dir/nvdisasm" "$cubin" > "$dir/all.sass"
awk -v k="$kernel" '/^\.text\./ { f = ($0 ~ k) } f' "$dir/all.sass" > "$dir/kernel.sass"
[ -s "$dir/kernel.sass" ] || { echo "sass.sh: no kernel matches '$kernel'; kernels:" >&2; grep -o '^\.text\.[^:]*' "$dir/all.sass" >&2; exit 1; }
grep -oP '^\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?\K[A-Z][A-Z0-9_.]*' "$dir/kernel.sass" | sort | uniq -c | sort -rn
echo "SASS: $dir/kernel.sass ($(grep -c '^\s*/\*[0-9a-f]*\*/' "$dir/kernel.sass") instructions)"
