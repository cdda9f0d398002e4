#!/usr/bin/python3
"""mixed_test.py: a GGUF model whose layers have different weight types (as
llama.cpp's quantization mixes make them) is computed with each layer's own
types, not layer 0's.

Two small qwen2moe GGUF files hold the same numbers: in "mixed", layer 0's
experts are f16 and layer 1's q8_0; in "plain", both layers are f16. Every
weight is a multiple of 1/128 with |w| <= 64/128, which f16 holds exactly
and q8_0 holds exactly with a block scale of 1/128, so the two models are
the same function. baton-engine (host backend) must answer a GEN on both
with the same output (to rounding: the kernels of the two types add in
their own order). Read as f16, layer 1's q8_0 bytes would give another
answer altogether. The last line is "N passed, N failed".
"""
import os
import random
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import arena_gguf_writer as gw  # noqa: E402
from harness import ARENA, EngineCase, call, ok, run_cases  # noqa: E402

D_MODEL, D_FF, EXPERTS, TOP_K = 64, 96, 4, 2


def values(rng, n):
    return [rng.randint(-64, 64) / 128.0 for _ in range(n)]


def f16_bytes(vals):
    return struct.pack("<%de" % len(vals), *vals)


def q8_0_bytes(vals):
    """Blocks of 32: an f16 scale 1/128, then 32 int8 (exact for these values)."""
    out = bytearray()
    for i in range(0, len(vals), 32):
        out += struct.pack("<e", 1 / 128.0)
        out += struct.pack("<32b", *[round(v * 128) for v in vals[i:i + 32]])
    return bytes(out)


def write_model(path, expert_types, seed=11):
    """A 2-layer qwen2moe GGUF; expert_types[l] is "f16" or "q8_0"."""
    rng = random.Random(seed)  # the same numbers for every expert_types
    arch = "qwen2moe"
    kvs = [("general.architecture", "str", arch), ("general.name", "str", "mixed types"),
           (arch + ".block_count", "u32", 2), (arch + ".expert_count", "u32", EXPERTS),
           (arch + ".expert_used_count", "u32", TOP_K), (arch + ".embedding_length", "u32", D_MODEL),
           (arch + ".expert_feed_forward_length", "u32", D_FF)]
    tensors = []
    for l, t in enumerate(expert_types):
        blk = "blk.%d." % l
        router = [rng.uniform(-1, 1) for _ in range(D_MODEL * EXPERTS)]
        tensors.append((blk + "ffn_gate_inp.weight", "f32", [D_MODEL, EXPERTS],
                        struct.pack("<%df" % len(router), *router)))
        for name, ne in (("ffn_gate_exps.weight", [D_MODEL, D_FF, EXPERTS]),
                         ("ffn_up_exps.weight", [D_MODEL, D_FF, EXPERTS]),
                         ("ffn_down_exps.weight", [D_FF, D_MODEL, EXPERTS])):
            v = values(rng, ne[0] * ne[1] * ne[2])
            data = f16_bytes(v) if t == "f16" else q8_0_bytes(v)
            assert len(data) == gw.tensor_bytes(t, ne)
            tensors.append((blk + name, t, ne, data))
        norm = [1.0 + rng.uniform(-0.1, 0.1) for _ in range(D_MODEL)]
        tensors.append((blk + "ffn_norm.weight", "f32", [D_MODEL], struct.pack("<%df" % D_MODEL, *norm)))
    gw.write_gguf(path, kvs, tensors)


def arena_of(c, name, expert_types):
    src = os.path.join(c.dir, name + ".gguf")
    write_model(src, expert_types)
    path = os.path.join(c.dir, name + ".arena")
    r = subprocess.run([ARENA, "create", "--experts-only", "--gguf", src, path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = subprocess.run([ARENA, "info", path], capture_output=True, text=True).stdout
    return path, info


def floats(rep):
    out = rep["output"]
    data = bytes.fromhex(out) if isinstance(out, str) else bytes(out)
    return struct.unpack("<%df" % (len(data) // 4), data)


def t_each_layer_with_its_types(c):
    mixed, info = arena_of(c, "mixed", ["f16", "q8_0"])
    plain, _ = arena_of(c, "plain", ["f16", "f16"])
    assert "q8_0" in info and "f16" in info, info
    m = c.engine("mixed", mixed)
    p = c.engine("plain", plain)
    for seed in range(4):
        a = floats(ok(call(m.url, "gen", steps=2, batch=3, seed=seed)))
        b = floats(ok(call(p.url, "gen", steps=2, batch=3, seed=seed)))
        assert len(a) == len(b) == 3 * D_MODEL, (len(a), len(b))
        scale = max(abs(x) for x in b)
        worst = max(abs(x - y) for x, y in zip(a, b)) / scale
        assert worst < 1e-5, "seed %d: mixed differs from plain by %.3g of the largest value" % (seed, worst)


CASES = [t_each_layer_with_its_types]


def main():
    return run_cases(CASES, sys.argv[1:], make=EngineCase, logs=("a", "b"))

if __name__ == "__main__":
    sys.exit(main())
