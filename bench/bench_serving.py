#!/usr/bin/env python3
"""Serving benchmark for an OpenAI-compatible server (mxserve or any peer).

Streams /v1/completions (or /v1/chat/completions) requests at fixed concurrency levels and reports
TTFT p50/p99, TPOT (mean inter-token time per request), and output tokens/s over the wall time.
Standard library only, so it runs on machines without a package registry.

  python3 bench/bench_serving.py --base-url http://127.0.0.1:8000 --concurrency 1,8,32,64 \
      --prompt-tokens 512 --max-tokens 128 --json out.json
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

WORDS = ("the of and to in is was for on that with as by at from this be are or an it "
         "model token server batch kernel memory weight expert layer window cache").split()


def make_prompt(n_words, rng):
    # Roughly one token per word for these common words.
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def one_request(url, args, prompt, api_key):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=args.timeout)
    if args.endpoint == "chat":
        path = "/v1/chat/completions"
        body = {"model": args.model, "messages": [{"role": "user", "content": prompt}]}
    else:
        path = "/v1/completions"
        body = {"model": args.model, "prompt": prompt}
    body.update({"max_tokens": args.max_tokens, "temperature": args.temperature, "stream": True,
                 "stream_options": {"include_usage": True}, "ignore_eos": True})
    if args.top_p is not None:
        body["top_p"] = args.top_p
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
            "prompt_tokens": usage["prompt_tokens"] if usage else None}


def pct(xs, p):
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def run_level(args, conc, rng):
    n_req = max(args.min_requests, conc * args.requests_per_slot)
    prompts = [make_prompt(args.prompt_tokens, rng) for _ in range(n_req)]
    results = []
    lock = threading.Lock()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=conc) as ex:
        for r in ex.map(lambda p: one_request(args.base_url, args, p, args.api_key), prompts):
            with lock:
                results.append(r)
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    if not ok:
        return {"concurrency": conc, "requests": n_req, "ok": 0, "errors": [r["error"] for r in results][:3]}
    toks = sum(r["tokens"] for r in ok)
    return {
        "concurrency": conc, "requests": n_req, "ok": len(ok),
        "ttft_p50_ms": 1e3 * pct([r["ttft"] for r in ok], 50),
        "ttft_p99_ms": 1e3 * pct([r["ttft"] for r in ok], 99),
        "tpot_mean_ms": 1e3 * statistics.mean(r["tpot"] for r in ok),
        "e2e_p50_s": pct([r["e2e"] for r in ok], 50),
        "output_tok_s": toks / wall,
        "wall_s": wall,
        "errors": [r["error"] for r in results if not r["ok"]][:3],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=None, help="send top_p (default: not sent)")
    ap.add_argument("--requests-per-slot", type=int, default=2)
    ap.add_argument("--min-requests", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    levels = [int(x) for x in args.concurrency.split(",")]
    rows = []
    print(f"{'conc':>5} {'reqs':>5} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'TPOT ms':>8} {'out tok/s':>10}")
    for c in levels:
        r = run_level(args, c, rng)
        rows.append(r)
        if r.get("ok"):
            print(f"{c:>5} {r['requests']:>5} {r['ttft_p50_ms']:>12.1f} {r['ttft_p99_ms']:>12.1f} "
                  f"{r['tpot_mean_ms']:>8.2f} {r['output_tok_s']:>10.1f}", flush=True)
        else:
            print(f"{c:>5} failed: {r.get('errors')}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": rows}, f, indent=2)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
