#!/usr/bin/env python3
"""Serving (load) benchmark for an OpenAI-compatible server (mxserve or any peer).

Streams /v1/completions (or /v1/chat/completions) requests at fixed concurrency levels and reports
TTFT p50/p99, TPOT (each request's mean inter-token time: mean and p99 over requests), output
tokens/s over the wall time and, from the server's /metrics (vLLM names), the preemptions during the
level and the KV use after it. --prompt-ids sends each request its own random token ids (exactly
--prompt-tokens of them); otherwise prompts are random common words (about one token each).
--max-tokens-min M draws each request's max_tokens uniformly from [M, --max-tokens] (seeded), so
requests end at different steps and the batch changes as a real load's does.
--engine-json takes `mxserve bench --json` rows (distinct batches at the serving depth) and prints
the engine's step time at the same batch beside the served TPOT. From mxserve's own counters: the level's
engine steps, their mean length (wall / steps) and the GPU's busy share of the wall time (the rest is the
host's turns between steps). Past 256 streams the client runs in several processes (--client-procs): one
Python thread a stream holds the GIL ~20 us a streamed chunk, so one process cannot read thousands of
streams' tokens as fast as a GPU makes them; the client's CPU time is printed under each level. --min-tokens-eq-max sends
min_tokens = max_tokens and no ignore_eos: the lengths stay fixed by banning the stop tokens. Standard library only, so it runs on
machines without a package registry.

  python3 bench/bench_serving.py --base-url http://127.0.0.1:8000 --concurrency 64,128 \
      --prompt-tokens 1024 --max-tokens 1024 --prompt-ids --requests-per-slot 1 --json out.json
"""
import argparse
import http.client
import json
import math
import multiprocessing
import os
import random
import resource
import statistics
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

WORDS = ("the of and to in is was for on that with as by at from this be are or an it "
         "model token server batch kernel memory weight expert layer window cache").split()


def make_prompt(n_words, rng):
    # Roughly one token per word for these common words.
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def make_prompt_ids(n, rng):
    # Ordinary vocabulary ids (gpt-oss: the special tokens start at 199998).
    return [rng.randrange(1000, 199000) for _ in range(n)]


def one_request(url, args, prompt, max_tokens, api_key):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=args.timeout)
    if args.endpoint == "chat":
        path = "/v1/chat/completions"
        body = {"model": args.model, "messages": [{"role": "user", "content": prompt}]}
    else:
        path = "/v1/completions"
        body = {"model": args.model, "prompt": prompt}
    body.update({"max_tokens": max_tokens, "temperature": args.temperature, "stream": True,
                 "stream_options": {"include_usage": True}, "ignore_eos": True})
    if args.top_p is not None:
        body["top_p"] = args.top_p
    for k in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        if getattr(args, k) is not None:
            body[k] = getattr(args, k)
    if args.min_tokens_eq_max:  # the stop tokens banned until max_tokens instead of ignored
        body["min_tokens"] = max_tokens
        del body["ignore_eos"]
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    t0 = time.perf_counter()
    conn.request("POST", path, json.dumps(body), headers)
    resp = conn.getresponse()
    if resp.status != 200:
        err = resp.read()[:300]
        conn.close()
        return {"ok": False, "error": f"HTTP {resp.status}: {err!r}"}
    times = []
    usage = None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices") or []:
            text = ch.get("text")
            if text is None:
                d = ch.get("delta") or {}
                text = (d.get("content") or "") + (d.get("reasoning_content") or d.get("reasoning") or "")
            if text:
                times.append(time.perf_counter())
    t_end = time.perf_counter()
    conn.close()
    if not times:
        return {"ok": False, "error": "no tokens streamed"}
    n = usage["completion_tokens"] if usage else len(times)
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
    return {"ok": True, "ttft": times[0] - t0, "tpot": tpot, "e2e": t_end - t0, "tokens": n,
            "prompt_tokens": usage["prompt_tokens"] if usage else None, "times": times}


def pct(xs, p):
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def scrape_metrics(base_url):
    """The server's vLLM- and mxserve-named gauges and counters (empty when it has no /metrics)."""
    u = urllib.parse.urlparse(base_url)
    try:
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    except Exception:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith(("vllm:", "mxserve:")) and "_bucket" not in line:
            name, _, value = line.rpartition(" ")
            out[name.split("{")[0]] = float(value)
    return out


_SLICES = []  # the level's requests a client process, set before the processes fork


def run_slice(k):
    """In client process k: its requests on its threads, started together with the other processes'."""
    args, items, workers, start_at = _SLICES[k]
    time.sleep(max(0.0, start_at - time.time()))
    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(lambda pm: one_request(args.base_url, args, pm[0], pm[1], args.api_key), items))


def client_procs(args, conc):
    """Client processes for a level: one thread a stream is GIL-bound past a few hundred streams (~20 us of
    Python a streamed chunk), so more streams are spread over processes of at most 256, on at most half the
    cores (the server has the rest)."""
    if args.client_procs > 0:
        return min(args.client_procs, conc)
    return max(1, min(math.ceil(conc / 256), (os.cpu_count() or 4) // 2))


def cpu_seconds():
    """This process's and its reaped children's CPU time."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def run_level(args, conc, rng):
    n_req = max(args.min_requests, conc * args.requests_per_slot)
    if args.prompt_ids:
        prompts = [make_prompt_ids(args.prompt_tokens, rng) for _ in range(n_req)]
    else:
        prompts = [make_prompt(args.prompt_tokens, rng) for _ in range(n_req)]
    # Drawn only when asked, so the prompts of later levels stay those of earlier runs.
    lengths = [args.max_tokens] * n_req
    if args.max_tokens_min is not None:
        lengths = [rng.randint(args.max_tokens_min, args.max_tokens) for _ in range(n_req)]
    before = scrape_metrics(args.base_url)
    procs = client_procs(args, conc)
    # Process k: requests k, k + procs, ... and its share of the streams; all start at start_at (the
    # monotonic clock, which the processes share, times the tokens). One process runs its slice itself.
    items = list(zip(prompts, lengths))
    start_at = time.time() + (1.0 + 0.05 * procs if procs > 1 else 0.0)
    _SLICES[:] = [(args, items[k::procs], conc // procs + (k < conc % procs), start_at) for k in range(procs)]
    cpu0 = cpu_seconds()
    t0 = time.perf_counter() + (start_at - time.time())
    if procs == 1:
        results = run_slice(0)
    else:
        with multiprocessing.get_context("fork").Pool(procs) as pool:
            results = [r for part in pool.map(run_slice, range(procs)) for r in part]
            pool.close()
            pool.join()  # reaped: their CPU time counts in RUSAGE_CHILDREN
    wall = time.perf_counter() - t0
    client_cpu = cpu_seconds() - cpu0
    # The server counts a request done just after its last token: give the gauges a moment.
    after = scrape_metrics(args.base_url)
    for _ in range(20):
        if not after or (after.get("vllm:num_requests_running", 0) == 0 and after.get("vllm:kv_cache_usage_perc", 0) == 0):
            break
        time.sleep(0.25)
        after = scrape_metrics(args.base_url)
    ok = [r for r in results if r["ok"]]
    if not ok:
        return {"concurrency": conc, "requests": n_req, "ok": 0, "errors": [r["error"] for r in results][:3]}
    toks = sum(r["tokens"] for r in ok)
    # Steady decode: inter-token times after every request of the level has its first token, i.e. with
    # no prompt left to prefill (what the engine's distinct-batch step measures). Only meaningful when
    # all requests run at once (--requests-per-slot 1).
    all_started = max(r["times"][0] for r in ok)
    steady = []
    for r in ok:
        t = [x for x in r["times"] if x >= all_started]
        if len(t) > 1:
            steady.append((t[-1] - t[0]) / (len(t) - 1))
    row = {
        "concurrency": conc, "requests": n_req, "ok": len(ok),
        "ttft_p50_ms": 1e3 * pct([r["ttft"] for r in ok], 50),
        "ttft_p99_ms": 1e3 * pct([r["ttft"] for r in ok], 99),
        "tpot_mean_ms": 1e3 * statistics.mean(r["tpot"] for r in ok),
        "tpot_p99_ms": 1e3 * pct([r["tpot"] for r in ok], 99),
        "tpot_steady_ms": 1e3 * statistics.mean(steady) if steady else None,
        "e2e_p50_s": pct([r["e2e"] for r in ok], 50),
        "output_tok_s": toks / wall,
        "output_tokens": toks,
        "wall_s": wall,
        "client_procs": procs,
        "client_cpu_s": client_cpu,
        "errors": [r["error"] for r in results if not r["ok"]][:3],
    }
    if before and after:
        row["preemptions"] = int(after.get("vllm:num_preemptions_total", 0) - before.get("vllm:num_preemptions_total", 0))
        row["kv_usage_after"] = after.get("vllm:kv_cache_usage_perc")
        row["running_after"] = after.get("vllm:num_requests_running")
        row["waiting_after"] = after.get("vllm:num_requests_waiting")
        # The GPU's share of the wall time in steps, and the steps' mean length (engine_steps_total's rate):
        # what the load leaves of the GPU to the host's turns between steps.
        steps = after.get("mxserve:engine_steps_total", 0) - before.get("mxserve:engine_steps_total", 0)
        busy = after.get("mxserve:device_busy_seconds_total", 0) - before.get("mxserve:device_busy_seconds_total", 0)
        if steps > 0:
            row["steps"] = int(steps)
            row["step_ms"] = 1e3 * wall / steps
        if busy > 0:
            row["gpu_busy"] = busy / wall
    return row


def engine_steps(path):
    """{batch: ms a decode step} from `mxserve bench --json` (tg rows)."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        d = json.load(f)
    return {r["batch"]: 1e3 * r["batch"] / r["tok_s"] for r in d.get("results", [])
            if r["test"].startswith("tg") and r["tok_s"] > 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-tokens-min", type=int, default=None,
                    help="each request's max_tokens uniform in [this, --max-tokens] (default: all --max-tokens)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=None, help="send top_p (default: not sent)")
    for k in ("presence", "frequency", "repetition"):
        ap.add_argument(f"--{k}-penalty", type=float, default=None, help=f"send {k}_penalty (default: not sent)")
    ap.add_argument("--min-tokens-eq-max", action="store_true",
                    help="send min_tokens = max_tokens and no ignore_eos: fixed output lengths by banning the stop tokens")
    ap.add_argument("--requests-per-slot", type=int, default=2)
    ap.add_argument("--min-requests", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write results here")
    ap.add_argument("--client-procs", type=int, default=0,
                    help="client processes a level (0: one a 256 streams, at most half the cores)")
    ap.add_argument("--prompt-ids", action="store_true",
                    help="prompts are --prompt-tokens random token ids, unique per request (completions only)")
    ap.add_argument("--engine-json", default=None,
                    help="`mxserve bench --json` output (distinct batches): its step time beside each level")
    args = ap.parse_args()
    if args.prompt_ids and args.endpoint != "completions":
        ap.error("--prompt-ids needs --endpoint completions")
    if args.max_tokens_min is not None and not 1 <= args.max_tokens_min <= args.max_tokens:
        ap.error("--max-tokens-min must be in [1, --max-tokens]")
    rng = random.Random(args.seed)
    levels = [int(x) for x in args.concurrency.split(",")]
    engine = engine_steps(args.engine_json)
    rows = []
    print(f"{'conc':>5} {'reqs':>5} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'TPOT ms':>8} {'TPOT p99':>9} "
          f"{'steady':>7} {'out tok/s':>10} {'preempt':>8} {'KV after':>9} {'engine step ms':>15} "
          f"{'served/engine':>14} {'steady/engine':>14} {'steps':>7} {'step ms':>8} {'GPU busy':>9}")
    for c in levels:
        r = run_level(args, c, rng)
        if c in engine:
            r["engine_step_ms"] = engine[c]
            r["served_over_engine"] = r["tpot_mean_ms"] / engine[c] if r.get("ok") else None
            if r.get("tpot_steady_ms"):
                r["steady_over_engine"] = r["tpot_steady_ms"] / engine[c]
        rows.append(r)
        if r.get("ok"):
            eng = f"{'n/a':>15} {'':>14} {'':>14}"
            if c in engine:
                eng = f"{engine[c]:>15.2f} {r['served_over_engine']:>14.3f} {r.get('steady_over_engine') or 0:>14.3f}"
            steady = r["tpot_steady_ms"] or 0
            busy = f"{100 * r['gpu_busy']:>8.1f}%" if "gpu_busy" in r else f"{'n/a':>9}"
            steps = f"{r['steps']:>7} {r['step_ms']:>8.2f}" if "steps" in r else f"{'n/a':>7} {'':>8}"
            print(f"{c:>5} {r['requests']:>5} {r['ttft_p50_ms']:>12.1f} {r['ttft_p99_ms']:>12.1f} "
                  f"{r['tpot_mean_ms']:>8.3f} {r['tpot_p99_ms']:>9.3f} {steady:>7.3f} {r['output_tok_s']:>10.1f} "
                  f"{r.get('preemptions', 'n/a'):>8} {r.get('kv_usage_after', 'n/a'):>9} {eng} {steps} {busy}"
                  + (f"  errors: {r['errors']}" if r["errors"] else ""), flush=True)
            print(f"      client: {r['client_procs']} process(es), {r['client_cpu_s']:.0f} s of CPU over {r['wall_s']:.0f} s",
                  flush=True)
        else:
            print(f"{c:>5} failed: {r.get('errors')}", flush=True)
    if args.json:
        with open(args.json, "w") as f:  # rows only (no per-token times)
            json.dump({"args": vars(args), "results": rows}, f, indent=2)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
