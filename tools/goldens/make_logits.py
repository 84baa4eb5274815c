#!/usr/bin/env python3
"""Golden logits from Hugging Face transformers for mxserve fixtures (runs on the GPU machine).

The fixture is written by our own `mxserve fixture` (same options + seed => same bytes; the shard
hashes are recorded so a mismatch is detected). transformers loads it as GptOssForCausalLM with
Mxfp4Config(dequantize=True) and runs in float32 (TF32 off) with eager attention, so the goldens
are the model's exact semantics to fp32 rounding.

  python3 tools/goldens/make_logits.py --fixture DIR --preset tiny --seed 0 --out tests/data/goldens/tiny.json
"""
import argparse
import hashlib
import json
import os
import sys

import torch

P_HI = [12194]
P_FOX = [200006, 976, 4853, 19705, 68347, 65613, 1072]
P_APOLLO = [637, 220, 6514, 24, 11, 62673, 220, 994, 50570, 402, 290, 28157, 13, 58186, 81203, 326, 75288,
            42136, 23910, 23272, 402, 290, 9753, 2049, 13266, 53696, 74142, 2106, 5151, 306, 290, 6348, 8827,
            30414, 26, 1023, 10508, 29018, 316, 16464, 13]


def shard_hashes(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            h = hashlib.sha256()
            with open(os.path.join(d, f), "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 24), b""):
                    h.update(chunk)
            out[f] = h.hexdigest()
    return out


def load_model(d):
    from transformers import GptOssForCausalLM
    try:
        from transformers import Mxfp4Config
        m = GptOssForCausalLM.from_pretrained(d, quantization_config=Mxfp4Config(dequantize=True),
                                              dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        from transformers import Mxfp4Config
        m = GptOssForCausalLM.from_pretrained(d, quantization_config=Mxfp4Config(dequantize=True),
                                              torch_dtype=torch.float32, attn_implementation="eager")
    return m.float().cuda().eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=-1)
    ap.add_argument("--experts", type=int, default=-1)
    ap.add_argument("--subset", type=int, default=2048, help="logits kept at this many fixed ids")
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--long", action="store_true", help="add a 164-token prompt (crosses a 128 window)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    model = load_model(a.fixture)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(1234)
    subset = torch.randperm(V, generator=g)[: a.subset].sort().values.tolist()
    prompts = [P_HI, P_FOX, P_APOLLO] + ([P_APOLLO * 4] if a.long else [])
    out = {
        "fixture": {"preset": a.preset, "seed": a.seed, "layers": a.layers, "experts": a.experts,
                    "shards_sha256": shard_hashes(a.fixture)},
        "oracle": {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
                   "dtype": "float32", "attn": "eager", "device": torch.cuda.get_device_name(0)},
        "subset_ids": subset,
        "prompts": [],
    }
    with torch.no_grad():
        for ids in prompts:
            logits = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu()  # [T, V]
            pos = []
            for t in range(logits.shape[0]):
                row = logits[t]
                top = torch.topk(row, a.topk)
                pos.append({
                    "top_ids": top.indices.tolist(),
                    "top_logits": [round(x, 6) for x in top.values.tolist()],
                    "subset_logits": [round(x, 6) for x in row[subset].tolist()],
                    "mean": float(row.double().mean()), "std": float(row.double().std()),
                    "l2": float(row.double().norm()),
                })
            out["prompts"].append({"ids": ids, "positions": pos})
            print(f"prompt len {len(ids)}: last argmax {int(logits[-1].argmax())}", flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print("wrote", a.out, os.path.getsize(a.out), "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
