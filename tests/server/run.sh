#!/usr/bin/env bash
# Black-box tests of `mxserve serve` with the official OpenAI Node SDK.
# Usage: tests/server/run.sh path/to/mxserve
# Starts the server on a free port with the built-in demo model and an API key, waits for
# /ready, runs `node --test` on tests/server/*.test.mjs, and always stops the server.
set -euo pipefail
if [ $# -ne 1 ] || [ ! -x "$1" ]; then
  echo "usage: $0 path/to/mxserve (an executable)" >&2
  exit 2
fi
BIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
if [ ! -d node_modules/openai ]; then
  echo "tests/server: node_modules missing; run scripts/setup.sh (npm ci)" >&2
  exit 2
fi

WORK=$(mktemp -d)
LOG="$WORK/server.log"
PID=""
cleanup() {
  local rc=$?
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
    kill -TERM "$PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PID" 2>/dev/null || true
  fi
  if [ "$rc" -ne 0 ]; then echo "--- server log (last 40 lines) ---" >&2; tail -n 40 "$LOG" >&2 || true; fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT INT TERM

export MXSERVE_BIN="$BIN"
export MXSERVE_API_KEY="test-key-$$"
# The demo model is written once to the cache dir; each run shares it.
"$BIN" serve --port 0 --api-key "$MXSERVE_API_KEY" --max-num-seqs 64 --request-timeout 60 >"$LOG" 2>&1 &
PID=$!

# serve logs "listening on http://HOST:PORT" once bound; --port 0 picks a free port.
PORT=""
for _ in $(seq 300); do
  PORT=$(sed -n 's|.*listening on http://[^:]*:\([0-9]\+\).*|\1|p' "$LOG" | head -n1)
  [ -n "$PORT" ] && break
  kill -0 "$PID" 2>/dev/null || { echo "server exited during start-up" >&2; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "server did not report its port" >&2; exit 1; }
export MXSERVE_URL="http://127.0.0.1:$PORT"

for i in $(seq 600); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $MXSERVE_API_KEY" "$MXSERVE_URL/ready" || true)
  [ "$code" = "200" ] && break
  kill -0 "$PID" 2>/dev/null || { echo "server exited while loading" >&2; exit 1; }
  [ "$i" -eq 600 ] && { echo "server not ready after 60 s" >&2; exit 1; }
  sleep 0.1
done

start=$(date +%s)
node --test --test-concurrency=1 ./*.test.mjs
echo "tests/server: passed in $(( $(date +%s) - start )) s"
