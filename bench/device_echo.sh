#!/usr/bin/env bash
# What the prompt's log-probs cost through the server (completions' echo with logprobs, vLLM's
# prompt_logprobs: lm-eval's log-likelihood requests) on the GPU machine: `mxserve serve --dummy-weights P`,
# then bench/echo_load.py's modes (plain max_tokens 1, echo + logprobs 1, prompt_logprobs 5; MODES) on unique
# random token-id prompts. Results: $OUT/echo_P$TAG.txt, $OUT/serve_echo_P$TAG.log.
# Environment: OUT, MXSERVE (default build/cli/mxserve), MODELS ("120b"), REQUESTS (256), CONCURRENCY (32),
# PROMPT_TOKENS (1024), MODES (plain,echo,prompt5), TAG, SERVE_ARGS. Run from the repo root: OUT=$OUT MXSERVE=.devrun/new/mxserve bash bench/device_echo.sh
set -u
cd "$(dirname "$0")/.."
source bench/device_run_env.sh /tmp/mxserve-echo
MXSERVE=${MXSERVE:-build/cli/mxserve}
for P in ${MODELS:-120b}; do
  "$MXSERVE" serve --dummy-weights "$P" --device cuda --max-model-len 4096 --port 8012 ${SERVE_ARGS:-} \
    > "$OUT/serve_echo_$P${TAG:-}.log" 2>&1 &
  SP=$!
  for _ in $(seq 480); do
    curl -sf http://127.0.0.1:8012/ready > /dev/null && break
    kill -0 $SP 2>/dev/null || break
    sleep 0.5
  done
  timeout "${LIMIT_S:-300}" python3 bench/echo_load.py --base-url http://127.0.0.1:8012 --requests "${REQUESTS:-256}" \
    --concurrency "${CONCURRENCY:-32}" --prompt-tokens "${PROMPT_TOKENS:-1024}" \
    --modes "${MODES:-plain,echo,prompt5}" 2>&1 | tee "$OUT/echo_$P${TAG:-}.txt"
  kill -TERM $SP; wait $SP
done
