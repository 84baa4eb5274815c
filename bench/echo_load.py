#!/usr/bin/env python3
"""Log-likelihood requests as lm-eval sends them (echo, logprobs 1, max_tokens 1, a token-id prompt)
against the same prompts without echo: what scoring a prompt's tokens costs through the server.
Every echo response is checked: one log-prob a prompt token after the first (the first null), finite.
Usage: echo_load.py --base-url URL [--requests 256] [--concurrency 32] [--prompt-tokens 1024]
       [--modes plain,echo,score,prompt5] [--vocab 200000]"""
import argparse, json, math, random, threading, time, urllib.request


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def body_of(mode, prompt):
    b = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    if mode == "echo":
        b.update(echo=True, logprobs=1)
    elif mode == "score":  # OpenAI's scoring request: the prompt's log-probs, nothing generated
        b.update(echo=True, logprobs=1, max_tokens=0)
    elif mode.startswith("prompt"):
        b["prompt_logprobs"] = int(mode[len("prompt"):])
    return b


def check(mode, prompt, r):
    c = r["choices"][0]
    if mode in ("echo", "score"):
        lp = c["logprobs"]["token_logprobs"]
        assert len(lp) == len(prompt) + (mode == "echo") and lp[0] is None, len(lp)
        assert all(x is not None and math.isfinite(x) and x <= 0 for x in lp[1:]), "a bad log-prob"
    elif mode.startswith("prompt"):
        pl = c["prompt_logprobs"]
        assert len(pl) == len(prompt) and pl[0] is None
        assert all(str(t) in e for t, e in zip(prompt[1:], pl[1:])), "a prompt token missing"


def busy_seconds(base):
    """The server's mxserve:device_busy_seconds_total (0 where it has none)."""
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("mxserve:device_busy_seconds_total"):
                    return float(line.split()[-1])
    except Exception:  # noqa: BLE001 (no metrics: no busy share)
        pass
    return 0.0


def run(args, mode, prompts, quiet=False):
    url = args.base_url + "/v1/completions"
    lat, errors, lock, it = [], [], threading.Lock(), iter(range(len(prompts)))

    def worker():
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            t0 = time.time()
            try:
                check(mode, prompts[i], post(url, body_of(mode, prompts[i])))
                with lock:
                    lat.append(time.time() - t0)
            except Exception as e:  # noqa: BLE001 (reported, counted)
                with lock:
                    errors.append(repr(e)[:200])

    busy0, t0 = busy_seconds(args.base_url), time.time()
    ts = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.time() - t0
    busy = (busy_seconds(args.base_url) - busy0) / wall
    lat.sort()
    n = len(lat)
    if quiet:
        return
    if n == 0:
        print(f"{mode:>8}: no request succeeded; {len(errors)} errors{': ' + errors[0] if errors else ''}", flush=True)
        return
    print(f"{mode:>8}: {n} requests in {wall:.2f} s = {n / wall:.2f} req/s, {n * args.prompt_tokens / wall:,.0f} prompt "
          f"tok/s; latency p50 {lat[n // 2] * 1e3:.0f} ms, p99 {lat[min(n - 1, n * 99 // 100)] * 1e3:.0f} ms; "
          f"GPU busy {busy:.1%}; {len(errors)} errors{': ' + errors[0] if errors else ''}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--modes", default="plain,echo,prompt5")
    ap.add_argument("--vocab", type=int, default=200000)
    ap.add_argument("--warmup", type=int, default=256, help="untimed requests of every mode first (graphs, allocations)")
    args = ap.parse_args()
    rng = random.Random(99)
    for mode in args.modes.split(","):
        run(args, mode, [[rng.randrange(args.vocab) for _ in range(args.prompt_tokens)] for _ in range(args.warmup)], True)
    for k, mode in enumerate(args.modes.split(",")):
        rng = random.Random(k)  # unique prompts each mode: no prefix-cache hits between them
        prompts = [[rng.randrange(args.vocab) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]
        run(args, mode, prompts)


if __name__ == "__main__":
    main()
