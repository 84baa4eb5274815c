#!/usr/bin/env bash
# One device call for an A/B of builds made on the dev VM: the GPU suite of the candidate, then
# `mxserve bench` of each build in turn (base, new, then new, base, ...) on the same GPU, so that the
# figures compare on one machine (machines differ by 2-5 %: docs/perf.md). Logs go to $OUT.
#   BIN     test_kernels and lib/ (default .devrun); each build's mxserve in $BIN/NAME/ (optionally gzipped).
#           test_kernels finds tests/data and .assets by the source path it was built from: build it in
#           this checkout (or link that path to the repo root on the device first)
#   BUILDS  the builds to bench, in turn (default: base new)
#   TESTS   gtest filter for the suite, or none (default: every test, with the 120b-width golden)
#   TEST_BUILD  run $BIN/TEST_BUILD/test_kernels (`WITH_TESTS=1 scripts/pack-devrun.sh NAME REF`) instead
#   MODELS  presets (default: 120b 20b); ROUNDS (default 2); TAG: a prefix for the log names
#   BENCH   bench arguments (default: --pp 2048 --tg 64 --depth 2048 --batch 1,8 --reps 2)
set -u
cd "$(dirname "$0")/.."
source bench/device_run_env.sh /tmp/mxserve-device
BUILDS=${BUILDS:-base new}
for f in "$BIN"/*.gz "$BIN"/*/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x "$BIN"/test_kernels "$BIN"/*/mxserve "$BIN"/*/test_kernels 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${TESTS:-}" != none ]; then
  tk="$BIN/${TEST_BUILD:+$TEST_BUILD/}test_kernels"
  MXSERVE_FIXTURE_CACHE=/tmp/fx timeout 420 "$tk" ${TESTS:+--gtest_filter=$TESTS} > "$OUT/tests.log" 2>&1
  echo "tests exit $?"
  grep -E "^\[ *(FAILED|PASSED)|e2e|golden|Failure|Expected|Which is" "$OUT/tests.log" | head -40
fi
for r in $(seq "${ROUNDS:-2}"); do
  # Round r starts from the r-th build, so no build always runs first on a cold GPU.
  order=$(echo $BUILDS | awk -v r="$r" '{for (i = 0; i < NF; i++) printf "%s ", $((i + r - 1) % NF + 1)}')
  for m in ${MODELS:-120b 20b}; do
    for side in $order; do
      log="$OUT/bench${TAG:+_$TAG}_$side.log"  # one file a build (the device returns at most 8)
      echo "== $m round $r: bench --preset $m ${BENCH:-}" >> "$log"
      n=$(wc -l < "$log")
      timeout 300 "$BIN/$side/mxserve" bench --preset "$m" ${BENCH:---pp 2048 --tg 64 --depth 2048 --batch 1,8 --reps 2} >> "$log" 2>&1
      echo "== $m $side round $r (exit $?)"
      tail -n +"$((n + 1))" "$log" | grep -E "^\| (pp|tg)|rror"
    done
  done
done
