#!/usr/bin/env bash
# One device call for an A/B of two builds made on the dev VM: the GPU suite of the new build, then
# `mxserve bench` of the two builds in turn (base, new, base, new, ...) on the same GPU, so that the
# figures compare on one machine (machines differ by 2-5 %: docs/perf.md). Logs go to $OUT.
#   BIN     the new build: mxserve, test_kernels (optionally gzipped) and lib/ (default .devrun)
#   BASE    the base build's mxserve (default $BIN/base)
#   TESTS   gtest filter for the suite, or none (default: every test, with the 120b-width golden)
#   MODELS  presets (default: 120b 20b); ROUNDS (default 2)
#   BENCH   bench arguments (default: --pp 2048 --tg 64 --depth 2048 --batch 1,8 --reps 2)
set -u
cd "$(dirname "$0")/.."
source bench/device_run_env.sh /tmp/mxserve-device
BASE=${BASE:-$BIN/base}
for f in "$BIN"/*.gz "$BASE"/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x "$BIN"/mxserve "$BIN"/test_kernels "$BASE"/mxserve 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${TESTS:-}" != none ]; then
  MXSERVE_FIXTURE_CACHE=/tmp/fx timeout 420 "$BIN/test_kernels" ${TESTS:+--gtest_filter=$TESTS} > "$OUT/tests.log" 2>&1
  echo "tests exit $?"
  grep -E "^\[ *(FAILED|PASSED)|e2e|golden|Failure|Expected|Which is" "$OUT/tests.log" | head -40
fi
for r in $(seq "${ROUNDS:-2}"); do
  for m in ${MODELS:-120b 20b}; do
    for side in base new; do
      bin="$BIN/mxserve"; [ "$side" = base ] && bin="$BASE/mxserve"
      log="$OUT/bench_${m}_${side}_$r.log"
      timeout 300 "$bin" bench --preset "$m" ${BENCH:---pp 2048 --tg 64 --depth 2048 --batch 1,8 --reps 2} > "$log" 2>&1
      echo "== $m $side round $r (exit $?)"
      grep -E "^\| (pp|tg)|rror" "$log"
    done
  done
done
