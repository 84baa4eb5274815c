#!/usr/bin/env python3
"""The FP8 and bf16 KV caches against transformers at long prompts (issue 28; the GPU machine).

Reads what `MXSERVE_DUMP_DIR=DIR test_kernels --gtest_filter='Fp8KvLongPrompts*'` wrote (per prompt length
L: L.ids, L.bf16.f32, L.fp8.f32: the engine's logits at the last 32 positions) and runs the same prompts
through transformers (GptOssForCausalLM, Mxfp4Config(dequantize=True), float32, eager attention, TF32 off)
on the test's fixture. Prints per length and cache: rel L2 of the logits, greedy agreement and the largest
|log-prob difference| over transformers' top 20.

  python3 tools/goldens/long_prompt_check.py --fixture /tmp/mx_fp8_kv_long_l2e8 --dumps DIR [--lengths 128,2048,8192,32768]
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from make_logits import load_model  # noqa: E402

TAIL = 32


def forward_tail(model, ids, chunk):
    """Logits of the last TAIL positions; prompts longer than `chunk` go through the KV cache in chunks
    (eager attention over the whole prompt at once needs L^2 x heads floats)."""
    x = torch.tensor(ids[None, :].astype(np.int64), device="cuda")
    with torch.no_grad():
        if x.shape[1] <= 4 * chunk:  # 8192 tokens at once fit an H100 (as does a 2048 x 32768 chunk)
            return model(x, logits_to_keep=TAIL).logits[0].double().cpu()
        from transformers import DynamicCache
        try:
            cache = DynamicCache(config=model.config)  # sliding layers keep their window
        except TypeError:
            cache = DynamicCache()
        L = x.shape[1]
        cuts = list(range(0, L - TAIL, chunk)) + [L - TAIL, L]
        cuts = sorted(set(cuts))
        for s, e in zip(cuts[:-1], cuts[1:]):
            out = model(x[:, s:e], past_key_values=cache, use_cache=True, logits_to_keep=TAIL,
                        cache_position=torch.arange(s, e, device="cuda"))
            cache = out.past_key_values
        return out.logits[0].double().cpu()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--dumps", required=True)
    ap.add_argument("--lengths", default="128,2048,8192,32768")
    ap.add_argument("--chunk", type=int, default=2048, help="prompts past 4 chunks run in chunks through the cache")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = load_model(a.fixture)
    V = model.config.vocab_size
    print("| prompt tokens | KV | rel L2 mean | rel L2 max | greedy agree | max abs d log-prob, top 20 |")
    print("|---|---|---|---|---|---|")
    for L in [int(x) for x in a.lengths.split(",")]:
        ids = np.fromfile(os.path.join(a.dumps, f"{L}.ids"), dtype=np.int32)
        try:
            ref = forward_tail(model, ids, a.chunk)
        except torch.cuda.OutOfMemoryError:
            print(f"| {L} | - | out of GPU memory (eager attention) | | | |", flush=True)
            torch.cuda.empty_cache()
            continue
        ref_lp = torch.log_softmax(ref, dim=-1)
        top = torch.topk(ref, 20, dim=-1).indices
        for kv in ("bf16", "fp8"):
            got = torch.from_numpy(np.fromfile(os.path.join(a.dumps, f"{L}.{kv}.f32"), dtype=np.float32)
                                   .reshape(TAIL, V)).double()
            rel = ((got - ref).norm(dim=-1) / ref.norm(dim=-1))
            agree = int((got.argmax(-1) == ref.argmax(-1)).sum())
            dlp = (torch.log_softmax(got, -1).gather(1, top) - ref_lp.gather(1, top)).abs().max()
            print(f"| {L} | {kv} | {rel.mean():.3e} | {rel.max():.3e} | {agree} / {TAIL} | {dlp:.3f} |", flush=True)
        del ref
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
