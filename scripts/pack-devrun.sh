#!/usr/bin/env bash
# Run HERE after `cmake --build --preset release`: packs the binaries a device call carries (`carry:
# [".devrun", ".assets"]`) for the bench/device_*.sh scripts: .devrun/NAME/mxserve.gz (NAME: new, or the
# first argument, e.g. base), .devrun/test_kernels.gz and .devrun/lib/ (the Debian libraries the GPU
# machine lacks). Only tracked or ignored paths travel: .devrun/ is git-ignored through .git/info/exclude.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-new}
mkdir -p .devrun/"$name" .devrun/lib
gzip -c build/cli/mxserve > .devrun/"$name"/mxserve.gz
if [ "$name" = new ]; then gzip -c build/tests/test_kernels > .devrun/test_kernels.gz; fi
for l in $(ldd build/cli/mxserve | awk '/=> \/lib/ {print $3}' | grep -E 'pcre2|httplib|brotli'); do cp -L "$l" .devrun/lib/; done
grep -qx '.devrun/' .git/info/exclude 2>/dev/null || echo '.devrun/' >> .git/info/exclude
du -sh .devrun
