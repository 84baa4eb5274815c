#!/usr/bin/env bash
# One device call on a two-GPU machine (nvidia-h100-x2) for tensor parallelism (docs/tensor_parallel.md).
#   1. The group's GPU tests (TESTS, a gtest filter; none to skip).
#   2. Two processes with one GPU each (--nnodes 2 on one host) against one process with both GPUs: the
#      same greedy text from `generate` on the mini fixture (with two ranks every sum is one addition, so
#      the two arrangements agree bit for bit); then a node killed mid-service. NODES=0 skips both.
#   3. The engine under each flag set in turn (SETTINGS, ;-separated; default TP=1, TP=2, TP=2 with whole
#      experts a GPU), per model (MODELS), bench arguments BENCH, ROUNDS.
#   4. TRACE=1: the one-token step's per-CTA timeline (`bench --step-trace`, rank 0's under TP) at TP=1
#      and TP=2 for the first model; the per-phase summary is printed.
# BIN as device_ab.sh: new/mxserve (optionally gzipped), test_kernels and lib/. Logs go to $OUT, and at
# the end all of them in $OUT/all.tgz (the device returns at most 8 files; the others are removed).
# TEST_TIMEOUT, BENCH_TIMEOUT: seconds for the tests and for each bench run.
set -u
cd "$(dirname "$0")/.."
source bench/device_run_env.sh /tmp/mxserve-device
for f in "$BIN"/*.gz "$BIN"/*/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x "$BIN"/test_kernels "$BIN"/new/mxserve 2>/dev/null
M="$BIN/new/mxserve"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
if [ "${TESTS:-}" != none ]; then
  MXSERVE_FIXTURE_CACHE=/tmp/fx timeout "${TEST_TIMEOUT:-420}" "$BIN/test_kernels" \
    --gtest_filter="${TESTS:-NcclComm.*:PeerAllReduce.*:TensorParallel.*:GoldenLogitsGpu.Width120bTwoLayers*}" \
    > "$OUT/tests.log" 2>&1
  echo "tests exit $?"
  grep -E "^\[ *(FAILED|PASSED)|e2e|golden|Failure|Expected|Which is" "$OUT/tests.log" | head -40
fi
if [ "${NODES:-1}" = 1 ]; then
  "$M" fixture --preset mini /tmp/mini > /dev/null 2>&1 || echo "fixture failed"
  G=(generate --model /tmp/mini --prompt "The quick brown fox" --max-tokens 24 --temperature 0 --device cuda)
  timeout 120 "$M" "${G[@]}" --tensor-parallel-size 2 > "$OUT/gen_one_process.txt" 2> "$OUT/gen_one_process.err"
  echo "one process, two GPUs: exit $?"
  CUDA_VISIBLE_DEVICES=1 timeout 150 "$M" "${G[@]}" --tensor-parallel-size 2 --nnodes 2 --node-rank 1 \
    --master-addr 127.0.0.1 --master-port 29517 > /dev/null 2> "$OUT/gen_node1.err" &
  CUDA_VISIBLE_DEVICES=0 timeout 150 "$M" "${G[@]}" --tensor-parallel-size 2 --nnodes 2 --node-rank 0 \
    --master-port 29517 > "$OUT/gen_two_processes.txt" 2> "$OUT/gen_node0.err"
  echo "two processes: exit $?"
  wait
  cmp "$OUT/gen_one_process.txt" "$OUT/gen_two_processes.txt" && echo "two processes == one process"
  timeout 60 "$M" "${G[@]}" > "$OUT/gen_one_gpu.txt" 2>&1
  tail -n 3 "$OUT"/gen_*.err
  # A node that dies mid-service: node 0 must exit with one line, not hang.
  S=(serve --model /tmp/mini --device cuda --tensor-parallel-size 2 --nnodes 2 --max-model-len 4096 --master-port 29518)
  CUDA_VISIBLE_DEVICES=1 "$M" "${S[@]}" --node-rank 1 --master-addr 127.0.0.1 > "$OUT/fail_node1.log" 2>&1 &
  N1=$!
  CUDA_VISIBLE_DEVICES=0 "$M" "${S[@]}" --node-rank 0 --port 8012 > "$OUT/fail_node0.log" 2>&1 &
  N0=$!
  for _ in $(seq 240); do curl -sf localhost:8012/ready > /dev/null && break; sleep 0.5; done
  curl -s localhost:8012/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt":"Hello","max_tokens":8,"temperature":0}' > "$OUT/fail_before.json"
  kill -9 $N1
  curl -s -m 60 localhost:8012/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt":"Hello again","max_tokens":200,"temperature":0}' > "$OUT/fail_after.json" 2>&1
  for _ in $(seq 60); do kill -0 $N0 2>/dev/null || break; sleep 0.5; done
  if kill -0 $N0 2>/dev/null; then echo "node 0 still running 30 s after node 1 died"; kill -9 $N0; fi
  wait $N0; echo "node 0 exit $? after node 1 died: $(grep -h 'tensor parallelism' "$OUT/fail_node0.log" | tail -1)"
fi
IFS=';' read -r -a sets <<< "${SETTINGS:---tensor-parallel-size 1;--tensor-parallel-size 2;--tensor-parallel-size 2 --enable-expert-parallel}"
for r in $(seq "${ROUNDS:-1}"); do
  for m in ${MODELS:-120b 20b}; do
    for i in "${!sets[@]}"; do
      log="$OUT/bench_$i.log"
      echo "== $m round $r: ${sets[$i]}" >> "$log"
      n=$(wc -l < "$log")
      # shellcheck disable=SC2086  # the flag set splits into arguments
      timeout "${BENCH_TIMEOUT:-400}" "$M" bench --preset "$m" ${sets[$i]} \
        ${BENCH:---pp 2048 --tg 128 --depth 2048 --batch 1,64 --reps 2 --gpu-memory-utilization 0.9} >> "$log" 2>&1
      echo "== $m ${sets[$i]} round $r (exit $?)"
      tail -n +"$((n + 1))" "$log" | grep -E "^\| (pp|tg)|rror|loaded"
    done
  done
done
if [ "${TRACE:-0}" = 1 ]; then
  m=$(echo "${MODELS:-120b 20b}" | awk '{print $1}')
  for tp in 1 2; do
    timeout "${BENCH_TIMEOUT:-400}" "$M" bench --preset "$m" --pp 16 --tg 64 --depth 2048 --batch 1 --reps 1 \
      --tensor-parallel-size $tp --step-trace "$OUT/trace_${m}_tp$tp.csv" > "$OUT/trace_${m}_tp$tp.log" 2>&1
    echo "== $m step trace TP=$tp (exit $?)"
    grep -A12 "per-op step trace" "$OUT/trace_${m}_tp$tp.log"
  done
fi
(cd "$OUT" && tar czf /tmp/all.tgz --exclude all.tgz . && find . -type f ! -name all.tgz -delete && mv /tmp/all.tgz .)
