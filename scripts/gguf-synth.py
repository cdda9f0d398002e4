#!/usr/bin/env python3
"""gguf-synth.py: a random model of Qwen3-30B-A3B's shape as a llama.cpp GGUF.

  python3 scripts/gguf-synth.py --layers N --seed S --out PATH
      [--experts N] [--vocab N] [--quiet]

Writes the file llama.cpp's convert_hf_to_gguf.py and llama-quantize would
make of such a model (architecture qwen3moe: hidden 2048, 32 query and 4 KV
heads of 128, 128 experts of 768, top-8, vocabulary 151,936): the same
tensor names and shapes (blk.N.attn_q ..., experts stacked in
blk.N.ffn_{gate,up,down}_exps), the qwen3moe.* and tokenizer.ggml.* keys
under their names, GGUF v3 with 32-byte alignment. Weight matrices are
q4_K (token_embd, attention, the three expert stacks), the output head
q6_K, norms and routers f32: issue 23's benchmark file (48 layers, 16.1 GiB).

The blocks are random but valid, as baton-arena's --synthetic-arch makes
them (arena/synth.c): every byte a draw except the f16 super-block scales,
set so the values stay near 1/sqrt(cols) (q4_K d = s/945, dmin = s/126;
q6_K d = s/4096), so nothing overflows in 48 layers. Norms are 1 + 0.1 r,
routers s r. The vocabulary is a byte-level BPE: the 256 byte symbols of
GPT-2's mapping, pairs and triples of them with their merges (each valid
UTF-8: ids 128..255, the lone high bytes, are the only tokens that are not
text alone), Qwen's
<|endoftext|>, <|im_start|>, <|im_end|> at 151,643..151,645, [PADn] after.

Fast with the standard library alone: a few pools of random blocks are
drawn once from the seed (random.Random) and patched in bulk (strided
slice assignment), and each tensor is written as windows of those pools at
seeded block offsets (zero-copy writes): 16 GiB in seconds where the
target is page cache or tmpfs. The same seed gives the same file.
"""
import argparse
import array
import os
import random
import struct
import sys
import time

# ggml type ids and block geometry (ggml.h / ggml.c type_traits)
F32, Q4_K, Q6_K = 0, 12, 14
BLOCK = {F32: (1, 4), Q4_K: (256, 144), Q6_K: (256, 210)}
ALIGN = 32  # GGUF_DEFAULT_ALIGNMENT; no general.alignment key, as gguf-py writes

# GGUF value types
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9

H, NH, NKV, HD, FF, FF_DENSE, TOPK = 2048, 32, 4, 128, 768, 6144, 8
POOL_BLOCKS = 1 << 18  # blocks per pool: 36 MiB of q4_K


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, t, v):
    out = gguf_str(key) + struct.pack("<I", t)
    if t == T_STR:
        return out + gguf_str(v)
    if t == T_ARR:
        et, items = v
        out += struct.pack("<IQ", et, len(items))
        if et == T_STR:
            return out + b"".join(gguf_str(x) for x in items)
        return out + array.array("i" if et == T_I32 else "f", items).tobytes()
    return out + struct.pack({T_U32: "<I", T_I32: "<i", T_F32: "<f", T_BOOL: "<?"}[t], v)


SINGLE_HIGH = range(0x80, 0x100)  # token ids of the lone bytes from 0x80: never whole UTF-8


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (byte-level BPE symbols)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def vocabulary(vocab):
    """tokens, token types, merges of a consistent byte-level BPE."""
    n_special = 293  # Qwen3: 151,643 regular tokens of 151,936
    base = vocab - n_special
    sym = bytes_to_unicode()
    tokens, merges = list(sym), []
    # pairs, then triples (pair + symbol), each with the merge that makes
    # it, and each valid UTF-8 whole (printable ASCII first, then the rest
    # of ASCII, then two-byte characters), so any answer of tokens past the
    # 128 single bytes from 0x80 (SINGLE_HIGH) is text: llama-server
    # refuses to stream bytes that are not
    printable = list(range(0x20, 0x7F))
    ascii_ = printable + [b for b in range(0x80) if b not in printable]
    pairs = [(x, y) for x in printable for y in printable]
    pairs += [(x, y) for x in ascii_ for y in ascii_ if x not in printable or y not in printable]
    pairs += [(x, y) for x in range(0xC2, 0xE0) for y in range(0x80, 0xC0)]
    for x, y in pairs:
        if len(tokens) >= base:
            break
        tokens.append(sym[x] + sym[y])
        merges.append(sym[x] + " " + sym[y])
    n_pp = len(printable) * len(printable)
    i = 0
    while len(tokens) < base:  # a printable pair, then a printable byte
        x, y = pairs[i % n_pp]
        z = printable[i // n_pp]
        tokens.append(sym[x] + sym[y] + sym[z])
        merges.append(sym[x] + sym[y] + " " + sym[z])
        i += 1
    types = [1] * len(tokens)
    for k in range(n_special):
        if k < 3:
            tokens.append(("<|endoftext|>", "<|im_start|>", "<|im_end|>")[k])
            types.append(3)  # control
        else:
            tokens.append("[PAD%d]" % (base + k))
            types.append(5)  # unused, as the converter pads Qwen's vocabulary
    return tokens, types, merges, base


CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


class Pools:
    """Random valid blocks per (type, cols), drawn once from the seed."""

    def __init__(self, rng):
        self.rng = rng
        self.raw = {Q4_K: rng.randbytes(POOL_BLOCKS * 144),
                    Q6_K: rng.randbytes((POOL_BLOCKS // 4) * 210)}
        self.cache = {}

    def kquant(self, t, cols):
        key = (t, cols)
        if key not in self.cache:
            s = 1.0 / cols ** 0.5
            buf = bytearray(self.raw[t])
            bb = BLOCK[t][1]
            n = len(buf) // bb
            if t == Q4_K:
                d = struct.pack("<e", s / (63.0 * 15.0))
                dmin = struct.pack("<e", s / (2.0 * 63.0))
                for j, byte in enumerate(d + dmin):
                    buf[j::bb] = bytes([byte]) * n
            else:
                d = struct.pack("<e", s / (128.0 * 32.0))
                for j, byte in enumerate(d):
                    buf[208 + j::bb] = bytes([byte]) * n
            self.cache[key] = memoryview(bytes(buf))
        return self.cache[key]

    def f32(self, kind, cols):
        key = (kind, cols)
        if key not in self.cache:
            r = random.Random(self.rng.getrandbits(64))
            n = 1 << 18 if kind == "router" else 1 << 14
            if kind == "norm":
                vals = [1.0 + 0.1 * (2.0 * r.random() - 1.0) for _ in range(n)]
            else:
                s = 1.0 / cols ** 0.5
                vals = [s * (2.0 * r.random() - 1.0) for _ in range(n)]
            self.cache[key] = memoryview(array.array("f", vals).tobytes())
        return self.cache[key]


def tensors_of(layers, experts, vocab):
    """(name, ggml type, ne, kind) in the converter's order."""
    out = [("token_embd.weight", Q4_K, [H, vocab], "w")]
    for l in range(layers):
        p = "blk.%d." % l
        out += [(p + "attn_k.weight", Q4_K, [H, NKV * HD], "w"),
                (p + "attn_k_norm.weight", F32, [HD], "norm"),
                (p + "attn_norm.weight", F32, [H], "norm"),
                (p + "attn_output.weight", Q4_K, [NH * HD, H], "w"),
                (p + "attn_q.weight", Q4_K, [H, NH * HD], "w"),
                (p + "attn_q_norm.weight", F32, [HD], "norm"),
                (p + "attn_v.weight", Q4_K, [H, NKV * HD], "w"),
                (p + "ffn_down_exps.weight", Q4_K, [FF, H, experts], "w"),
                (p + "ffn_gate_exps.weight", Q4_K, [H, FF, experts], "w"),
                (p + "ffn_gate_inp.weight", F32, [H, experts], "router"),
                (p + "ffn_norm.weight", F32, [H], "norm"),
                (p + "ffn_up_exps.weight", Q4_K, [H, FF, experts], "w")]
    out += [("output_norm.weight", F32, [H], "norm"),
            ("output.weight", Q6_K, [H, vocab], "w")]
    return out


def nbytes(t, ne):
    blk, bb = BLOCK[t]
    assert ne[0] % blk == 0
    n = ne[0] // blk * bb
    for d in ne[1:]:
        n *= d
    return n


def metadata(layers, experts, vocab):
    tokens, types, merges, base = vocabulary(vocab)
    a = "qwen3moe"
    kvs = [kv("general.architecture", T_STR, a), kv("general.type", T_STR, "model"),
           kv("general.name", T_STR, "Baton Synthetic Qwen3 30B A3B"),
           kv("general.size_label", T_STR, "30B-A3B"),
           kv(a + ".block_count", T_U32, layers), kv(a + ".context_length", T_U32, 40960),
           kv(a + ".embedding_length", T_U32, H), kv(a + ".feed_forward_length", T_U32, FF_DENSE),
           kv(a + ".attention.head_count", T_U32, NH), kv(a + ".attention.head_count_kv", T_U32, NKV),
           kv(a + ".rope.freq_base", T_F32, 1000000.0),
           kv(a + ".attention.layer_norm_rms_epsilon", T_F32, 1e-6),
           kv(a + ".expert_used_count", T_U32, TOPK),
           kv(a + ".attention.key_length", T_U32, HD), kv(a + ".attention.value_length", T_U32, HD),
           kv("general.file_type", T_U32, 15),  # LLAMA_FTYPE_MOSTLY_Q4_K_M
           kv(a + ".expert_count", T_U32, experts),
           kv(a + ".expert_feed_forward_length", T_U32, FF),
           kv("general.quantization_version", T_U32, 2),
           kv("tokenizer.ggml.model", T_STR, "gpt2"), kv("tokenizer.ggml.pre", T_STR, "qwen2"),
           kv("tokenizer.ggml.tokens", T_ARR, (T_STR, tokens)),
           kv("tokenizer.ggml.token_type", T_ARR, (T_I32, types)),
           kv("tokenizer.ggml.merges", T_ARR, (T_STR, merges)),
           kv("tokenizer.ggml.eos_token_id", T_U32, base + 2),
           kv("tokenizer.ggml.padding_token_id", T_U32, base),
           kv("tokenizer.ggml.bos_token_id", T_U32, base),
           kv("tokenizer.ggml.add_bos_token", T_BOOL, False),
           kv("tokenizer.chat_template", T_STR, CHAT_TEMPLATE)]
    return kvs


def align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def write(path, layers, experts, vocab, seed, quiet=False):
    t0 = time.time()
    rng = random.Random(seed)
    pools = Pools(rng)
    kvs = metadata(layers, experts, vocab)
    ts = tensors_of(layers, experts, vocab)
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(kvs)))
    for k in kvs:
        head += k
    rel = 0
    for name, t, ne, _ in ts:
        head += gguf_str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        head += struct.pack("<IQ", t, rel)
        rel = align(rel + nbytes(t, ne))
    head += b"\0" * (align(len(head)) - len(head))
    total = len(head) + rel
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(head)
        pos = 0
        for name, t, ne, kind in ts:
            n = nbytes(t, ne)
            pool = pools.f32(kind, ne[0]) if t == F32 else pools.kquant(t, ne[0])
            unit = BLOCK[t][1] if t != F32 else 4
            units = len(pool) // unit
            left = n
            while left:
                take = min(left, (units // 2) * unit)
                start = rng.randrange(0, units - take // unit + 1) * unit
                f.write(pool[start:start + take])
                left -= take
            pos += n
            pad = align(pos) - pos
            if pad:
                f.write(b"\0" * pad)
                pos += pad
    os.replace(tmp, path)
    dt = time.time() - t0
    if not quiet:
        print("gguf-synth: %s: %d layers, %d experts, %d tensors, %d bytes (%.2f GiB) in %.1f s" % (
            path, layers, experts, len(ts), total, total / 2**30, dt))
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--out", required=True)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    if a.layers < 1 or a.experts < TOPK or a.vocab < 1024:
        sys.exit("gguf-synth: --layers >= 1, --experts >= 8, --vocab >= 1024")
    write(a.out, a.layers, a.experts, a.vocab, a.seed, a.quiet)


if __name__ == "__main__":
    main()
