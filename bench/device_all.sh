#!/usr/bin/env bash
# One device call that checks and measures a build made on the dev VM: the GPU tests, then
# `mxserve bench` for 120b and 20b (pp2048, tg128 at depth 2048, batch 1/4/8/32, per-kernel breakdown),
# then the load benchmark at 512/128 tokens. Logs go to $OUT (tests.log, bench_120b.log, bench_20b.log, load_*).
# Run from the repo root on the GPU machine with build/tests/test_kernels and build/cli/mxserve
# carried (device carry: .devdeps .assets build/tests/test_kernels build/cli/mxserve); ~8 minutes.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mxserve-device}
mkdir -p "$OUT"
source scripts/device-env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
git log -1 --format='commit %H' 2>/dev/null | tee -a "$OUT/gpu.txt"
MXSERVE_FIXTURE_CACHE=/tmp/fx build/tests/test_kernels 2>&1 |
  grep -E "^\[ *(FAILED|PASSED)|e2e|golden|^\[==|Failure|mismatch at" | tee "$OUT/tests.log"
for m in 120b 20b; do
  build/cli/mxserve bench --preset $m --pp 2048 --tg 128 --depth 2048 --batch 1,4,8,32 --reps 3 --breakdown 2>&1 |
    grep -v "^I " > "$OUT/bench_$m.log"
  tail -8 "$OUT/bench_$m.log"
done
OUT=$OUT ENGINE=0 PROMPT_TOKENS=512 MAX_TOKENS=128 CONCURRENCY=1,8,32,64 REQS=2 bash bench/device_load.sh 2>&1 | tail -14
