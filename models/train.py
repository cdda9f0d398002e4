#!/usr/bin/env python3
"""Trains Baton's two embedded demo models: a tiny Qwen3-MoE and a tiny
Mixtral, each with its own BPE tokenizer trained here, on the King James
Bible (public domain; Debian package bible-kjv-text, extracted with
`bible -f "Gen1:1-Rev22:21"`), framed as chat so that `baton chat` answers
read as text.

Run on a machine with torch, transformers and tokenizers (the H200 device):
    python3 train.py KJV_TXT QWEN3_TEMPLATE MIXTRAL_TEMPLATE OUT_DIR [STEPS]
Writes OUT_DIR/kjv-qwen3-moe/ and OUT_DIR/kjv-mixtral/ (save_pretrained,
bf16 safetensors, tokenizer.json, tokenizer_config.json with the family's
real chat template) and OUT_DIR/samples.json (greedy answers from
transformers, the reference for the engine's test).

Seeded: the same inputs give the same models on the same software.
"""
import json
import math
import random
import re
import sys
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (MixtralConfig, MixtralForCausalLM, PreTrainedTokenizerFast, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

SEED = 1611
VOCAB = 4096
SEQ = 256
TIME_LIMIT = 120  # seconds of training per model, at most
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
STOP = {"the", "and", "of", "to", "that", "in", "he", "shall", "unto", "for", "i", "his", "a", "they",
        "be", "is", "him", "not", "them", "it", "with", "all", "thou", "thy", "was", "which", "my",
        "me", "said", "but", "ye", "their", "have", "will", "thee", "from", "as", "are", "when", "this",
        "out", "were", "upon", "by", "you", "there", "an", "so", "then", "had", "on", "into", "up",
        "at", "we", "her", "also", "hath", "o", "no", "or", "if", "should", "one", "came", "she",
        "let", "what", "do", "our", "us", "come", "now", "may", "these", "before", "even"}


def verses(path):
    out = []
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^\S+\d+:\d+ (.*)$", line.strip())
        if m and m.group(1):
            out.append(m.group(1))
    return out


def conversations(vs, rng):
    """Two kinds of turn: continue a verse from its first words, or speak
    of a word the verse holds."""
    convs = []
    for v in vs:
        words = v.split()
        if len(words) >= 6 and rng.random() < 0.5:
            k = rng.randint(3, min(6, len(words) - 2))
            convs.append([{"role": "user", "content": "Continue: " + " ".join(words[:k])},
                          {"role": "assistant", "content": v}])
        else:
            keys = [w.strip(",.;:?!()'").lower() for w in words]
            keys = [k for k in keys if k.isalpha() and k not in STOP and len(k) > 2]
            if not keys:
                continue
            convs.append([{"role": "user", "content": "Tell me of " + rng.choice(keys) + "."},
                          {"role": "assistant", "content": v}])
    return convs


def qwen_tokenizer(texts, template):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tr = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special, min_frequency=2,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, tr)
    tok.add_tokens(["<think>", "</think>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=4096)
    fast.chat_template = template
    return fast


def mixtral_tokenizer(texts, template):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    # Train with SentencePiece's word split (merges never cross a space);
    # the saved tokenizer is Llama's: normaliser, no pre-tokenizer.
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    special = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    tr = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special, min_frequency=2, show_progress=False)
    tok.train_from_iterator(texts, tr)
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=4096)
    fast.chat_template = template
    return fast


def batches(ids, bs, rng, device):
    n = (len(ids) - 1) // SEQ
    data = torch.tensor(ids[: n * SEQ + 1], dtype=torch.long)
    while True:
        starts = [rng.randrange(0, len(data) - SEQ - 1) for _ in range(bs)]
        x = torch.stack([data[s:s + SEQ] for s in starts]).to(device)
        y = torch.stack([data[s + 1:s + SEQ + 1] for s in starts]).to(device)
        yield x, y


def train(name, model, tok, convs, steps, device, log):
    rng = random.Random(SEED)
    ids = []
    for c in convs:
        ids += tok.apply_chat_template(c, tokenize=True, add_generation_prompt=False, return_dict=False)
    log[name] = {"tokens": len(ids), "conversations": len(convs)}
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    it = batches(ids, 48, rng, device)
    t0 = time.time()
    for step in range(steps):
        if time.time() - t0 > TIME_LIMIT:
            print(f"{name}: time limit at step {step}", flush=True)
            break
        lr = 3e-3 * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = next(it)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"{name} step {step} loss {loss.item():.3f} {time.time() - t0:.0f}s", flush=True)
    log[name]["final_loss"] = loss.item()
    log[name]["seconds"] = time.time() - t0
    return model


def samples(name, model, tok, device, **kw):
    out = []
    for q in ["Tell me of light.", "Continue: In the beginning God", "Tell me of wisdom.",
              "Continue: And the LORD spake unto Moses", "Tell me of the sea."]:
        msgs = [{"role": "user", "content": q}]
        prompt = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False,
                                        **kw)
        with torch.no_grad():
            g = model.generate(torch.tensor([prompt], device=device), max_new_tokens=48, do_sample=False)
        new = g[0, len(prompt):].tolist()
        out.append({"messages": msgs, "template_kwargs": kw, "prompt_ids": prompt, "greedy_ids": new,
                    "text": tok.decode(new, skip_special_tokens=True)})
        print(name, q, "->", out[-1]["text"], flush=True)
    return out


def main():
    kjv, qtpl, mtpl, out = sys.argv[1:5]
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 1500
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    vs = verses(kjv)
    convs = conversations(vs, rng)
    device = "cuda"
    log = {"verses": len(vs)}
    res = {}

    qt = qwen_tokenizer(vs, open(qtpl).read())
    qcfg = Qwen3MoeConfig(vocab_size=len(qt), hidden_size=192, intermediate_size=384, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=48, num_experts=8,
                          num_experts_per_tok=2, moe_intermediate_size=128, norm_topk_prob=True,
                          tie_word_embeddings=True, max_position_embeddings=4096, rms_norm_eps=1e-6,
                          bos_token_id=None, eos_token_id=qt.convert_tokens_to_ids("<|im_end|>"),
                          pad_token_id=qt.pad_token_id)
    torch.manual_seed(SEED)
    qm = train("kjv-qwen3-moe", Qwen3MoeForCausalLM(qcfg), qt, convs, steps, device, log)
    qm.eval()
    qm.to(torch.bfloat16).save_pretrained(f"{out}/kjv-qwen3-moe")
    qt.save_pretrained(f"{out}/kjv-qwen3-moe")
    qm.float()
    res["kjv-qwen3-moe"] = samples("kjv-qwen3-moe", qm, qt, device)
    res["kjv-qwen3-moe/no-thinking"] = samples("kjv-qwen3-moe", qm, qt, device, enable_thinking=False)

    mt = mixtral_tokenizer(vs, open(mtpl).read())
    mcfg = MixtralConfig(vocab_size=len(mt), hidden_size=192, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=48, num_local_experts=8,
                         num_experts_per_tok=2, tie_word_embeddings=True, max_position_embeddings=4096,
                         rms_norm_eps=1e-5, bos_token_id=mt.bos_token_id, eos_token_id=mt.eos_token_id)
    torch.manual_seed(SEED)
    mm = train("kjv-mixtral", MixtralForCausalLM(mcfg), mt, convs, steps, device, log)
    mm.eval()
    mm.to(torch.bfloat16).save_pretrained(f"{out}/kjv-mixtral")
    mt.save_pretrained(f"{out}/kjv-mixtral")
    mm.float()
    res["kjv-mixtral"] = samples("kjv-mixtral", mm, mt, device)

    # The bf16 models' own greedy answers: what the engine must reproduce.
    for name, m, t in (("kjv-qwen3-moe", qm, qt), ("kjv-mixtral", mm, mt)):
        m.to(torch.bfloat16)
        res[name + "@bf16"] = samples(name, m, t, device)
    log["torch"] = torch.__version__
    json.dump({"log": log, "samples": res}, open(f"{out}/samples.json", "w"), indent=1)


if __name__ == "__main__":
    main()
