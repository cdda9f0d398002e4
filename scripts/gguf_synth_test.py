#!/usr/bin/python3
"""gguf_synth_test.py: scripts/gguf-synth.py writes a GGUF as llama.cpp lays one out.

Small files (2 layers, 8 experts, a 2,048-token vocabulary) read back by a
reader of this test's own: the header, every tensor's offset aligned and
inside the file, the tensor names and shapes of a qwen3moe model, the keys
convert_hf_to_gguf.py writes, the f16 scales of every q4_K and q6_K block
those the writer promises (finite, the values near 1/sqrt(cols)), f32
tensors finite; the same seed gives the same bytes; baton-arena imports it
and the host engine runs it. With LLAMA_GGUF_PY=DIR (llama.cpp's
gguf-py/gguf), the names, keys and block sizes are also checked against its
constants.py.
"""
import atexit
import hashlib
import importlib.util
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

SYNTH = os.path.join(ROOT, "scripts", "gguf-synth.py")
SIZES = {0: (1, 4), 12: (256, 144), 14: (256, 210)}


def tmpdir():
    d = tempfile.mkdtemp(prefix="gguf-synth-")
    atexit.register(shutil.rmtree, d, True)
    return d


def synth(path, layers=2, seed=17, experts=8, vocab=2048):
    subprocess.run([sys.executable, SYNTH, "--layers", str(layers), "--seed", str(seed),
                    "--out", path, "--experts", str(experts), "--vocab", str(vocab), "--quiet"],
                   check=True)


def read_gguf(path):
    """(version, {key: value}, [(name, type, ne, abs offset, bytes)], file bytes)."""
    b = open(path, "rb").read()
    assert b[:4] == b"GGUF"
    ver, nt, nk = struct.unpack_from("<IQQ", b, 4)
    p = 24

    def s():
        nonlocal p
        (n,) = struct.unpack_from("<Q", b, p)
        p += 8 + n
        return b[p - n:p].decode()

    def val(t):
        nonlocal p
        if t == 8:
            return s()
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, p)
            p += 12
            return [val(et) for _ in range(n)]
        fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}[t]
        (v,) = struct.unpack_from(fmt, b, p)
        p += struct.calcsize(fmt)
        return v

    kvs = {}
    for _ in range(nk):
        k = s()
        (t,) = struct.unpack_from("<I", b, p)
        p += 4
        kvs[k] = val(t)
    infos = []
    for _ in range(nt):
        name = s()
        (nd,) = struct.unpack_from("<I", b, p)
        ne = list(struct.unpack_from("<%dQ" % nd, b, p + 4))
        p += 4 + 8 * nd
        t, off = struct.unpack_from("<IQ", b, p)
        p += 12
        infos.append((name, t, ne, off))
    align = kvs.get("general.alignment", 32)
    start = (p + align - 1) // align * align
    out = []
    for name, t, ne, off in infos:
        blk, bb = SIZES[t]
        n = ne[0] // blk * bb
        for d in ne[1:]:
            n *= d
        assert off % align == 0, (name, off)
        assert start + off + n <= len(b), name
        out.append((name, t, ne, start + off, n))
    return ver, kvs, out, b, start


def f16(b, pos):
    return struct.unpack_from("<e", b, pos)[0]


def as_f16(x):
    return struct.unpack("<e", struct.pack("<e", x))[0]


def expected_tensors(layers, experts, vocab):
    t = {"token_embd.weight": (12, [2048, vocab]), "output_norm.weight": (0, [2048]),
         "output.weight": (14, [2048, vocab])}
    for l in range(layers):
        p = "blk.%d." % l
        t.update({p + "attn_norm.weight": (0, [2048]), p + "attn_q.weight": (12, [2048, 4096]),
                  p + "attn_k.weight": (12, [2048, 512]), p + "attn_v.weight": (12, [2048, 512]),
                  p + "attn_output.weight": (12, [4096, 2048]),
                  p + "attn_q_norm.weight": (0, [128]), p + "attn_k_norm.weight": (0, [128]),
                  p + "ffn_norm.weight": (0, [2048]), p + "ffn_gate_inp.weight": (0, [2048, experts]),
                  p + "ffn_gate_exps.weight": (12, [2048, 768, experts]),
                  p + "ffn_up_exps.weight": (12, [2048, 768, experts]),
                  p + "ffn_down_exps.weight": (12, [768, 2048, experts])})
    return t


def case_layout():
    d = tmpdir()
    path = os.path.join(d, "m.gguf")
    synth(path)
    ver, kvs, ts, b, start = read_gguf(path)
    assert ver == 3 and start % 32 == 0
    assert {n: (t, ne) for n, t, ne, _, _ in ts} == expected_tensors(2, 8, 2048)
    a = "qwen3moe."
    want = {"general.architecture": "qwen3moe", a + "block_count": 2, a + "embedding_length": 2048,
            a + "attention.head_count": 32, a + "attention.head_count_kv": 4,
            a + "attention.key_length": 128, a + "attention.value_length": 128,
            a + "expert_count": 8, a + "expert_used_count": 8,
            a + "expert_feed_forward_length": 768, a + "feed_forward_length": 6144,
            a + "rope.freq_base": 1000000.0, "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "qwen2", "general.quantization_version": 2}
    for k, v in want.items():
        assert kvs.get(k) == v, (k, kvs.get(k), v)
    assert abs(kvs[a + "attention.layer_norm_rms_epsilon"] - 1e-6) < 1e-12
    toks, types, merges = (kvs["tokenizer.ggml." + k] for k in ("tokens", "token_type", "merges"))
    assert len(toks) == len(types) == 2048 and len(set(toks)) == 2048
    base = 2048 - 293
    assert toks[base:base + 3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert kvs["tokenizer.ggml.eos_token_id"] == base + 2 and kvs["tokenizer.ggml.bos_token_id"] == base
    tokset = set(toks)
    for m in merges:  # each merge joins two tokens into a third
        x, y = m.split(" ")
        assert x in tokset and y in tokset and x + y in tokset, m
    assert len(merges) == base - 256
    for name, t, ne, pos, n in ts:
        if t == 0:
            xs = struct.unpack_from("<%df" % (n // 4), b, pos)
            assert all(math.isfinite(x) for x in xs), name
            if name.endswith("norm.weight"):
                assert all(0.9 <= x <= 1.1 for x in xs), name
            else:
                assert max(abs(x) for x in xs) <= 1 / math.sqrt(ne[0]) + 1e-6, name
            continue
        s = 1 / math.sqrt(ne[0])
        want_d = as_f16(s / 945 if t == 12 else s / 4096)  # f16 rounding, subnormal or not
        want_m = as_f16(s / 126)
        assert 0 < want_d and math.isfinite(want_d)
        bb = SIZES[t][1]
        for k in range(0, n, bb):
            if t == 12:
                assert (f16(b, pos + k), f16(b, pos + k + 2)) == (want_d, want_m), name
            else:
                assert f16(b, pos + k + 208) == want_d, name
    # the same seed, the same file; another seed, another
    p2, p3 = os.path.join(d, "again.gguf"), os.path.join(d, "other.gguf")
    synth(p2)
    synth(p3, seed=18)
    digest = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
    assert digest(path) == digest(p2) != digest(p3)
    return "%d tensors, %d bytes" % (len(ts), len(b))


def case_gguf_py_rules():
    gp = os.environ.get("LLAMA_GGUF_PY")
    if not gp:
        return "skipped: no LLAMA_GGUF_PY (llama.cpp's gguf-py/gguf)"
    spec = importlib.util.spec_from_file_location("gguf_constants", os.path.join(gp, "constants.py"))
    c = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(c)
    d = tmpdir()
    path = os.path.join(d, "m.gguf")
    synth(path)
    _, kvs, ts, _, _ = read_gguf(path)
    arch = c.MODEL_ARCH.QWEN3MOE
    assert c.MODEL_ARCH_NAMES[arch] == kvs["general.architecture"]
    allowed = set()
    for mt in c.MODEL_TENSORS[arch]:
        fmt = c.TENSOR_NAMES[mt]
        for l in range(2):
            allowed.add(fmt.format(bid=l) + ".weight")
    for name, t, ne, _, _ in ts:
        assert name in allowed, name
        blk, bb = c.GGML_QUANT_SIZES[c.GGMLQuantizationType(t)]
        assert (blk, bb) == SIZES[t], name
    keys = set()
    for group in vars(c.Keys).values():
        if isinstance(group, type):
            for v in vars(group).values():
                if isinstance(v, str):
                    try:
                        keys.add(v.format(arch="qwen3moe"))
                    except (KeyError, IndexError):
                        pass
    for k in kvs:
        assert k in keys, k
    return "%d names, %d keys in gguf-py" % (len(ts), len(kvs))


def case_import_and_run():
    d = tmpdir()
    path, arena = os.path.join(d, "m.gguf"), os.path.join(d, "m.arena")
    synth(path)
    subprocess.run([h.ARENA, "create", "--gguf", path, arena], check=True,
                   stdout=subprocess.DEVNULL)
    info = json.loads(subprocess.run([h.ARENA, "info", "--json", arena], check=True,
                                     capture_output=True, text=True).stdout)
    cfg = info["config"]
    assert info["arch"] == "qwen3_moe" and info["layers"] == 2 and info["experts"] == 8
    assert info["dtypes"]["gate"] == info["dtypes"]["down"] == "q4_K"
    assert cfg["vocab_size"] == 2048 and cfg["hidden_size"] == 2048 and not cfg["tie_word_embeddings"]
    if h.SAN:
        # the sanitizers' pass: the host kernels at this width take seconds a
        # token under ASan (217 s here); the import above is what is new, and
        # the kernels have their own sanitizer tests
        return "imported; the run is left to the plain pass under the sanitizers"
    out = os.path.join(d, "bench.json")
    subprocess.run([os.path.join(h.BIN, "baton-model-bench"), "--arena", arena, "--backend", "host", "--steps", "1",
                    "--prompts", "8", "--bandwidth-mib", "8", "--json", out], check=True,
                   stdout=subprocess.DEVNULL, env=dict(os.environ, BATON_HOSTDEV_DIR=d))
    m = json.load(open(out))
    assert m["decode_tok_s"] > 0
    return "decode %.1f tok/s on the host" % m["decode_tok_s"]


if __name__ == "__main__":
    sys.exit(h.run_cases([case_layout, case_gguf_py_rules, case_import_and_run], make=None))
