#!/usr/bin/env python3
"""bench-model-peer.py: the side-by-side peer of baton-model-bench.

Builds a Qwen3-MoE model of Qwen3-30B-A3B's shape (48 layers, 128 experts,
top-8, hidden 2048, expert FFN 768, 32 query and 4 KV heads of 128,
vocabulary 151,936) in Hugging Face transformers, with random bf16 weights
made on the GPU (nothing is downloaded), and measures on the same GPU:
decode tokens/s at batch 1 (greedy, with the KV cache, after a 32-token
prompt) and prefill tokens/s of 512- and 2,048-token prompts (random ids,
only the last token's logits, as the engine computes them). Eager PyTorch,
transformers' default attention (sdpa): the model as transformers runs it
out of the box. Prints one JSON object (and writes it to --json FILE).

  python3 scripts/bench-model-peer.py [--layers N] [--steps N]
      [--prompts 512,2048] [--json FILE]
"""
import argparse
import json
import sys
import time

import torch
import transformers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompts", default="512,2048")
    ap.add_argument("--json")
    args = ap.parse_args()
    prompts = [int(p) for p in args.prompts.split(",") if p]

    kw = dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
        decoder_sparse_step=1, mlp_only_layers=[])
    theta = 1000000.0
    try:
        cfg = Qwen3MoeConfig(**kw, rope_theta=theta)
    except TypeError:  # transformers 5 keeps it in rope_parameters
        cfg = Qwen3MoeConfig(**kw, rope_parameters=dict(rope_type="default", rope_theta=theta))
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = theta
    dev = torch.device("cuda")
    torch.manual_seed(0)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with dev:  # the weights are made on the GPU, random, never downloaded
        model = Qwen3MoeForCausalLM(cfg)
    model.to(torch.bfloat16)
    model.eval()
    torch.cuda.synchronize()
    build_s = time.time() - t0
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (1, max(prompts + [32])), generator=g).to(dev)

    out = {"peer": "transformers %s, torch %s, eager, %s attention" % (
        transformers.__version__, torch.__version__, model.config._attn_implementation),
        "device": torch.cuda.get_device_name(0), "layers": args.layers,
        "params": params, "build_s": round(build_s, 2)}
    with torch.inference_mode():
        # decode at batch 1: a 32-token prompt, 4 warm steps, then the timed ones
        o = model(ids[:, :32], use_cache=True, logits_to_keep=1)
        past, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
        for _ in range(4):
            o = model(tok, past_key_values=past, use_cache=True)
            past, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        t0 = time.time()
        for _ in range(args.steps):
            o = model(tok, past_key_values=past, use_cache=True)
            past, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        dt = (time.time() - t0) / args.steps
        out["decode_tok_s"] = round(1.0 / dt, 3)
        out["decode_ms"] = round(dt * 1e3, 4)
        del past, o
        # prefill: a warm-up of the shortest, then each length
        model(ids[:, :prompts[0]], use_cache=False, logits_to_keep=1)
        out["prefill"] = []
        for n in prompts:
            torch.cuda.synchronize()
            t0 = time.time()
            model(ids[:, :n], use_cache=False, logits_to_keep=1)
            torch.cuda.synchronize()
            out["prefill"].append({"tokens": n, "tok_s": round(n / (time.time() - t0), 3)})
    out["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    text = json.dumps(out)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
