#!/usr/bin/env bash
# Run HERE (not on the GPU machine): downloads the Debian dev packages the build needs and
# unpacks them into .devdeps/ (git-ignored), which device runs name in `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .devdeps && mkdir -p .devdeps/debs
(cd .devdeps/debs && apt-get download -qq libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 \
   nlohmann-json3-dev libgtest-dev libcli11-dev libcpp-httplib-dev libcpp-httplib0.11 libfmt-dev libfmt9 \
   libssl-dev zlib1g-dev libbrotli-dev libbrotli1 >/dev/null)
for f in .devdeps/debs/*.deb; do dpkg -x "$f" .devdeps; done
rm -rf .devdeps/debs .devdeps/usr/share/doc .devdeps/usr/share/man
du -sh .devdeps
