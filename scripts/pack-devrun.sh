#!/usr/bin/env bash
# Run HERE after `cmake --build --preset release`: packs what a device call carries (`carry: [".devrun"]`)
# for the bench/device_*.sh scripts, xz-compressed (bench/device_run_env.sh unpacks it there):
# .devrun/NAME/mxserve.xz and moe_fp8_bench.xz (NAME: new, or the first argument, e.g. base),
# .devrun/test_kernels.xz (with new), .devrun/lib/ (the Debian libraries the GPU machine lacks) and
# .devrun/assets/ (the tokenizer, for the tests and the server: 2.9 MB instead of 27). A binary is ~4.5 MB: about ten fit the 64 MiB a call
# carries. Only tracked or ignored paths travel: .devrun/ is git-ignored through .git/info/exclude.
# `pack-devrun.sh NAME REF` packs REF's mxserve instead (a WIP branch for an A/B): it applies HEAD...REF to a
# clean work tree, builds, packs (WITH_TESTS=1: its test_kernels too) and puts the tree back (rebuild before
# packing HEAD again).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-new}
# What every build shares: the runtime libraries the GPU machine lacks, the tokenizer, the git-ignore line.
pack_common() {
  mkdir -p .devrun/lib
  for l in $(ldd build/cli/mxserve | awk '/=> \/lib/ {print $3}' | grep -E 'pcre2|httplib|brotli'); do cp -L "$l" .devrun/lib/; done
  if [ -e .assets/tokenizer/tokenizer.json ] && [ ! -e .devrun/assets/tokenizer.json.xz ]; then
    mkdir -p .devrun/assets
    xz -6 -T2 -c .assets/tokenizer/tokenizer.json > .devrun/assets/tokenizer.json.xz
    cp .assets/tokenizer/tokenizer_config.json .devrun/assets/
  fi
  grep -qx '.devrun/' .git/info/exclude 2>/dev/null || echo '.devrun/' >> .git/info/exclude
}
if [ $# -ge 2 ]; then
  git diff --quiet HEAD || { echo "pack-devrun: the work tree has changes; commit or stash them first" >&2; exit 1; }
  added=$(git diff --name-only --diff-filter=A HEAD..."$2")
  git diff HEAD..."$2" | git apply
  trap 'git checkout -q -- . && { [ -z "$added" ] || rm -f $added; }' EXIT
  cmake --build --preset release > /tmp/pack-devrun-"$name".log 2>&1 || { echo "pack-devrun: $2 does not build (/tmp/pack-devrun-$name.log)" >&2; exit 1; }
  mkdir -p .devrun/"$name"
  xz -6 -T2 -c build/cli/mxserve > .devrun/"$name"/mxserve.xz
  # WITH_TESTS=1: its test_kernels too (device_run_env.sh makes .devrun/NAME/test_kernels runnable)
  if [ "${WITH_TESTS:-0}" = 1 ]; then xz -6 -T2 -c build/tests/test_kernels > .devrun/"$name"/test_kernels.xz; fi
  # its moe_fp8_bench too (0.7 MB): the MoE GEMMs alone on routing that does not depend on their outputs
  [ ! -e bench/moe_fp8_bench.cu ] || xz -6 -T2 -c build/bench/moe_fp8_bench > .devrun/"$name"/moe_fp8_bench.xz
  pack_common
  echo "packed $2 as .devrun/$name"
  exit 0
fi
# A source newer than the binary means the build is stale (session 51 carried one as "new" unawares).
stale=
while IFS= read -r -d '' f; do [ "$f" -nt build/cli/mxserve ] && { stale=$f; break; }; done \
  < <(git ls-files -z -- '*.cu' '*.cuh' '*.cpp' '*.h' '*CMakeLists.txt')
if [ -n "$stale" ]; then echo "pack-devrun: build/cli/mxserve is older than $stale: run cmake --build --preset release first" >&2; exit 1; fi
mkdir -p .devrun/"$name"
xz -6 -T2 -c build/cli/mxserve > .devrun/"$name"/mxserve.xz
if [ "$name" = new ]; then xz -6 -T2 -c build/tests/test_kernels > .devrun/test_kernels.xz; fi
xz -6 -T2 -c build/bench/moe_fp8_bench > .devrun/"$name"/moe_fp8_bench.xz
pack_common
du -sh .devrun
