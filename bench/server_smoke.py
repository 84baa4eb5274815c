#!/usr/bin/env python3
"""Smoke test of a running mxserve: one long greedy request whose context crosses the 2,560 keys at which the
CUDA engine's full layers switch from the tensor-core attention to the register kernel (a second decode graph
class, attention_decode.h), then four concurrent requests of mixed prompt lengths. Prints each response's usage,
finish reason and seconds; exits 1 on any HTTP error.

    python3 bench/server_smoke.py http://127.0.0.1:8000
"""
import concurrent.futures as cf
import json
import sys
import time
import urllib.error
import urllib.request

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
for _ in range(300):  # the model may still be loading
    try:
        urllib.request.urlopen(base + "/health", timeout=2).read()
        break
    except (urllib.error.URLError, OSError):
        time.sleep(1)
model = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=10).read())["data"][0]["id"]


def chat(words, max_tokens):
    body = {"model": model, "messages": [{"role": "user", "content": "hello " * words}],
            "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.time()
    r = json.loads(urllib.request.urlopen(req, timeout=600).read())
    return r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"], \
        round(time.time() - t, 2)


try:
    print("long (prompt, completion, finish, s):", chat(2500, 120), flush=True)
    with cf.ThreadPoolExecutor(4) as ex:
        for res in ex.map(lambda w: chat(w, 64), [10, 300, 1200, 2000]):
            print("concurrent:", res, flush=True)
except urllib.error.HTTPError as e:
    print("HTTP", e.code, e.read().decode(errors="replace")[:300])
    sys.exit(1)
