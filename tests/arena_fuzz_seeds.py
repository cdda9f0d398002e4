"""arena_fuzz_seeds.py OUT BIN: writes seed corpora for the arena's fuzz
targets: OUT/arena_open (small arenas made by BIN, baton-arena, some with
the fuzzer's "recompute the checksums" byte set), OUT/arena_gguf and
OUT/arena_safetensors (small models from the test writers).
"""
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import arena_gguf_writer as gw  # noqa: E402
import arena_safetensors_writer as sw  # noqa: E402


def main(out, binary):
    rng = random.Random(1)
    for d in ("arena_open", "arena_gguf", "arena_safetensors"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    for i, (l, e, dm, dff, dt) in enumerate([(1, 1, 32, 32, "f32"), (2, 3, 32, 64, "q8_0"),
                                             (1, 2, 16, 8, "bf16")]):
        p = os.path.join(out, "arena_open", "a%d" % i)
        subprocess.run([binary, "create", "--synthetic", "--layers", str(l), "--experts", str(e),
                        "--top-k", "1", "--d-model", str(dm), "--d-ff", str(dff), "--dtype", dt,
                        "--force", p], check=True, capture_output=True)
        os.unlink(p + ".lock")
        with open(p, "rb") as f:
            b = bytearray(f.read())
        b[464] = 1  # the fuzzer recomputes the checksums
        with open(p + "-fix", "wb") as f:
            f.write(b)
    # whole models (format v2): names, dense tensors, config.json
    for i, arch in enumerate(sw.ARCHS):
        p = os.path.join(out, "arena_open", "m%d" % i)
        subprocess.run([binary, "create", "--synthetic-arch", arch, "--layers", "1", "--experts", "2",
                        "--top-k", "1", "--d-model", "32", "--d-ff", "32", "--heads", "2",
                        "--kv-heads", "1", "--head-dim", "16", "--vocab", "8", "--shared-ff", "32",
                        "--dtype", "f16", "--force", p], check=True, capture_output=True)
        os.unlink(p + ".lock")
        with open(p, "rb") as f:
            b = bytearray(f.read())
        b[464] = 1
        with open(p + "-fix", "wb") as f:
            f.write(b)
        c = sw.hf_config(arch, layers=1, experts=2, top_k=1, hidden=32, heads=2, kv_heads=1,
                         head_dim=16, moe_ff=32, shared_ff=32, vocab=8)
        dense, experts = sw.hf_model(rng, c, "F16")
        kvs, tensors = gw.gguf_from_hf(c, dense, experts, "F16", gw.tokenizer_kvs(
            ["a", "b", "c"], ["a b"], "{{ messages }}"))
        gw.write_gguf(os.path.join(out, "arena_gguf", "m%d" % i), kvs, tensors)
        # a header that is a config.json: the config checks see it
        with open(os.path.join(out, "arena_safetensors", "c%d" % i), "wb") as f:
            hj = json.dumps(c).encode()
            f.write(len(hj).to_bytes(8, "little") + hj)
    for i, (types, norm) in enumerate([(("f32", "f16", "bf16"), True),
                                       (("q8_0", "q4_0", "iq4_nl"), False)]):
        kvs, tensors = gw.moe_model(rng, layers=2, experts=2, top_k=1, d_model=32, d_ff=32,
                                    layer_types=[types, types], norm=norm, extras=i == 0)
        gw.write_gguf(os.path.join(out, "arena_gguf", "g%d" % i), kvs, tensors)
    kvs, tensors = gw.moe_model(rng, layers=1, experts=2, top_k=1, d_model=256, d_ff=256,
                                layer_types=[("q4_K", "iq2_xs", "q6_K")], extras=False)
    gw.write_gguf(os.path.join(out, "arena_gguf", "g2"), kvs, tensors, version=2)
    sw.write_safetensors(os.path.join(out, "arena_safetensors", "s0"),
                         sw.moe_tensors(rng, layers=1, experts=2, d_model=8, d_ff=8),
                         {"format": "pt"})
    sw.write_safetensors(os.path.join(out, "arena_safetensors", "s1"),
                         [("a", "F16", [2, 3], b"\0" * 12), ("b", "U8", [], b"x"),
                          ("c", "F8_E4M3", [0], b"")])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
