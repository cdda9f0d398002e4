"""sources_test.py: baton-arena create --gguf and --safetensors on files the
tests write (tests/arena_gguf_writer.py, tests/arena_safetensors_writer.py),
every ggml type included: each expert's gate, up and down in the arena equal
the source's bytes exactly, as do the router and norm; info and verify
accept the arenas; malformed sources are refused with a clear message and
leave no arena behind.

Run from the repository root; $BUILD names the build folder (default build).
"""
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import arena_gguf_writer as gw  # noqa: E402
import arena_safetensors_writer as sw  # noqa: E402
import harness as h  # noqa: E402

BIN = h.ARENA
CASES = []
TMP = None


def case(fn):
    CASES.append(fn)
    return fn


def run(*args, want=0):
    p = subprocess.run([BIN] + list(args), capture_output=True, text=True, timeout=120)
    if want is not None and p.returncode != want:
        raise AssertionError("%s exited %d, want %d\nstdout: %s\nstderr: %s" % (
            " ".join(args), p.returncode, want, p.stdout, p.stderr))
    return p


def info(path):
    return json.loads(run("info", "--json", "--entries", path).stdout)


def tmp(name):
    return os.path.join(TMP, name)


def check_arena(path, shape, slices, dense=None):
    """Every expert part equals slices(layer, expert, part); every dense
    tensor equals dense(role, layer). Returns the info JSON."""
    j = info(path)
    for k, v in shape.items():
        assert j[k] == v, "%s: %r, want %r" % (k, j[k], v)
    with open(path, "rb") as f:
        data = f.read()
    n_exp = n_dense = 0
    for e in j["entries"]:
        if e["role"] == "expert":
            assert e["offset"] % 4096 == 0
            for i, part in enumerate(e["parts"]):
                assert part["offset"] % 256 == 0
                got = data[e["offset"] + part["offset"]:e["offset"] + part["offset"] + part["bytes"]]
                want_dtype, want = slices(e["layer"], e["expert"], i)
                assert part["dtype"] == want_dtype, (e["layer"], i, part["dtype"], want_dtype)
                assert got == want, "layer %d expert %d part %d differs from the source" % (
                    e["layer"], e["expert"], i)
            n_exp += 1
        elif dense:
            want_dtype, want = dense(e["role"], e["layer"])
            part = e["parts"][0]
            assert part["dtype"] == want_dtype, (e["role"], e["layer"], part["dtype"])
            assert data[e["offset"]:e["offset"] + e["bytes"]] == want, (e["role"], e["layer"])
            n_dense += 1
    assert n_exp == j["layers"] * j["experts"], n_exp
    p = run("verify", path)
    assert p.stdout.startswith("ok "), p.stdout
    return j, n_exp, n_dense


# ---- GGUF -------------------------------------------------------------------------

ALL_TYPES = list(gw.GGML_TYPES)


def gguf_slices(src, layout, arch_experts):
    names = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]

    def slices(layer, expert, part):
        name, t = names[part], None
        key = "blk.%d.%s.weight" % (layer, name)
        off, n = layout[key][0]
        t = layout[key][1]
        sl = n // arch_experts
        return t, src[off + expert * sl: off + (expert + 1) * sl]

    def dense(role, layer):
        key = "blk.%d.%s.weight" % (layer, "ffn_gate_inp" if role == "router" else "ffn_norm")
        (off, n), t = layout[key]
        return t, src[off:off + n]
    return slices, dense


def write_model(path, kvs, tensors, **kw):
    lay = gw.write_gguf(path, kvs, tensors, **kw)
    types = {name: t for name, t, _, _ in tensors}
    with open(path, "rb") as f:
        src = f.read()
    return src, {k: (v, types[k]) for k, v in lay.items()}


@case
def gguf_every_ggml_type():
    """Every ggml type appears as a gate, up or down somewhere; routers in
    f32 and f16; each expert blob equals the stacked tensor's slice."""
    rng = random.Random(1)
    types = ALL_TYPES[:]
    layers = (len(types) + 2) // 3
    lt = []
    for l in range(layers):
        trip = [types[(3 * l + i) % len(types)] for i in range(3)]
        lt.append(tuple(trip))
    rt = ["f16" if l % 3 == 1 else "f32" for l in range(layers)]
    kvs, tensors = gw.moe_model(rng, layers=layers, experts=4, top_k=2, d_model=256, d_ff=512,
                                layer_types=lt, router_types=rt)
    src_path, arena = tmp("all.gguf"), tmp("all.arena")
    src, layout = write_model(src_path, kvs, tensors)
    p = run("create", "--experts-only", "--gguf", src_path, arena)
    assert p.stdout.startswith("built "), p.stdout
    slices, dense = gguf_slices(src, layout, 4)
    j, n_exp, n_dense = check_arena(arena, {"layers": layers, "experts": 4, "top_k": 2,
                                            "d_model": 256, "d_ff": 512, "has_norm": True},
                                    slices, dense)
    seen = {d for l in j["layer_dtypes"] for d in l.values()}
    assert seen == set(ALL_TYPES), set(ALL_TYPES) - seen
    assert j["source"] == "gguf all.gguf (qwen2moe, experts only)", j["source"]
    assert j["dtypes"]["gate"] == lt[0][0] and j["dtypes"]["router"] == "f32"
    print("  %d ggml types, %d experts and %d dense tensors byte-exact" % (
        len(seen), n_exp, n_dense))
    human = run("info", arena).stdout
    assert "qwen2moe" in human and "iq2_xs" in human and "layer" in human, human


@case
def gguf_v2_alignment_no_norm():
    """GGUF v2, general.alignment 64, no norm tensors, no
    expert_feed_forward_length (d_ff from the tensor shape)."""
    rng = random.Random(2)
    kvs, tensors = gw.moe_model(rng, arch="deepseek2", layers=2, experts=8, top_k=3,
                                d_model=512, d_ff=256, norm=False, ffn_len_key=False,
                                layer_types=[("q8_0", "q8_0", "q4_0"), ("iq4_nl", "q5_1", "q4_1")])
    kvs.append(("general.alignment", "u32", 64))
    src_path, arena = tmp("v2.gguf"), tmp("v2.arena")
    src, layout = write_model(src_path, kvs, tensors, version=2, alignment=64)
    run("create", "--experts-only", "--gguf", src_path, arena)
    slices, dense = gguf_slices(src, layout, 8)
    j, _, n_dense = check_arena(arena, {"layers": 2, "experts": 8, "top_k": 3, "d_model": 512,
                                        "d_ff": 256, "has_norm": False}, slices, dense)
    assert n_dense == 2


@case
def gguf_reuse_and_replace():
    rng = random.Random(3)
    kvs, tensors = gw.moe_model(rng, layers=1, experts=2, top_k=1)
    a, b, arena = tmp("a.gguf"), tmp("b.gguf"), tmp("r.arena")
    gw.write_gguf(a, kvs, tensors)
    kvs2, tensors2 = gw.moe_model(random.Random(4), layers=1, experts=2, top_k=1)
    gw.write_gguf(b, kvs2 + [("general.note", "str", "another")], tensors2)
    run("create", "--experts-only", "--gguf", a, arena)
    assert run("create", "--experts-only", "--gguf", a, arena).stdout.startswith("reused ")
    p = run("create", "--experts-only", "--gguf", b, arena, want=1)
    assert "another arena" in p.stderr and "--force" in p.stderr, p.stderr
    assert run("create", "--experts-only", "--gguf", b, "--force", arena).stdout.startswith("built ")
    # the same metadata and shapes with other weights is another source too
    c = tmp("c.gguf")
    gw.write_gguf(c, kvs2 + [("general.note", "str", "another")],
                  [(n, t, ne, bytes(len(d))) for n, t, ne, d in tensors2])
    p = run("create", "--experts-only", "--gguf", c, arena, want=1)
    assert "another arena" in p.stderr, p.stderr
    assert run("create", "--experts-only", "--gguf", b, arena).stdout.startswith("reused ")


def bad_gguf(name, data, words):
    path, arena = tmp(name + ".gguf"), tmp(name + ".arena")
    with open(path, "wb") as f:
        f.write(data)
    p = run("create", "--experts-only", "--gguf", path, arena, want=1)
    for w in words:
        assert w in p.stderr, "%s: %r lacks %r" % (name, p.stderr, w)
    assert not os.path.exists(arena), name
    assert not [f for f in os.listdir(TMP) if f.startswith(name + ".arena.tmp")]
    return p.stderr.strip()


@case
def gguf_malformed():
    rng = random.Random(5)
    kvs, tensors = gw.moe_model(rng, layers=2, experts=4, top_k=2, extras=False)
    good = tmp("good.gguf")
    gw.write_gguf(good, kvs, tensors)
    with open(good, "rb") as f:
        g = f.read()
    msgs = []

    def model(kvs_=None, tensors_=None, **kw):
        p = tmp("tmp.gguf")
        gw.write_gguf(p, kvs if kvs_ is None else kvs_, tensors if tensors_ is None else tensors_,
                      **kw)
        with open(p, "rb") as f:
            return f.read()

    msgs.append(bad_gguf("magic", b"GGUX" + g[4:], ["bad_source", "not a GGUF file"]))
    msgs.append(bad_gguf("empty", b"", ["not a regular, non-empty file"]))
    msgs.append(bad_gguf("v1", g[:4] + struct.pack("<I", 1) + g[8:], ["version 1 not supported"]))
    msgs.append(bad_gguf("short", g[:20], ["truncated or corrupt"]))
    msgs.append(bad_gguf("cut", g[:len(g) - 100], ["runs past the end"]))
    msgs.append(bad_gguf("nkv", g[:16] + struct.pack("<Q", 1 << 60) + g[24:], ["cannot fit"]))
    msgs.append(bad_gguf("ntensors", g[:8] + struct.pack("<Q", 1 << 40) + g[16:],
                         ["tensors cannot fit"]))
    # a key whose length runs past the end
    msgs.append(bad_gguf("keylen", g[:24] + struct.pack("<Q", 1 << 50) + g[32:],
                         ["truncated or corrupt", "metadata key"]))
    no_count = [kv for kv in kvs if not kv[0].endswith("expert_count")]
    msgs.append(bad_gguf("nocount", model(no_count), ["no qwen2moe.expert_count"]))
    bad_type = [(n, "u32", 1) if n == "general.architecture" else (n, t, v) for n, t, v in kvs]
    msgs.append(bad_gguf("archtype", model(bad_type), ["general.architecture"]))
    no_up = [t for t in tensors if t[0] != "blk.1.ffn_up_exps.weight"]
    msgs.append(bad_gguf("noup", model(tensors_=no_up), ["no blk.1.ffn_up_exps.weight"]))
    dup = tensors + [tensors[1]]
    msgs.append(bad_gguf("dup", model(tensors_=dup), ["appears twice"]))
    wrong = [(n, t, [ne[0], 384, ne[2]], b"\0" * gw.tensor_bytes(t, [ne[0], 384, ne[2]]))
             if n == "blk.0.ffn_gate_exps.weight" else (n, t, ne, d) for n, t, ne, d in tensors]
    msgs.append(bad_gguf("shape", model(tensors_=wrong), ["blk.0.ffn_gate_exps.weight has ne",
                                                          "256, 384, 4", "256, 512, 4"]))
    unk = [(n, 31 if n == "blk.0.ffn_down_exps.weight" else t, ne, d) for n, t, ne, d in tensors]
    msgs.append(bad_gguf("unknowntype", model(tensors_=unk), ["ggml type 31"]))
    kk = [kv for kv in kvs if not kv[0].endswith("expert_used_count")]
    kk.append(("qwen2moe.expert_used_count", "u32", 9))
    msgs.append(bad_gguf("topk", model(kk), ["expert_used_count 9 not in 1..4"]))
    kk = [kv for kv in kvs if not kv[0].endswith("block_count")]
    kk.append(("qwen2moe.block_count", "u32", 1))
    msgs.append(bad_gguf("blocks", model(kk), ["past qwen2moe.block_count 1"]))
    msgs.append(bad_gguf("align", model(kvs + [("general.alignment", "u32", 48)]),
                         ["general.alignment"]))
    nest = kvs + [("x.deep", "arr", ("arr", [("arr", [("arr", [("arr", [("u8", [1])])])])]))]
    msgs.append(bad_gguf("deep", model(nest), ["nested deeper"]))
    # a tensor offset that is not aligned: patch the first tensor info's offset
    b = bytearray(g)
    pos = b.find(b"blk.0.ffn_gate_inp.weight")
    off_at = pos + len("blk.0.ffn_gate_inp.weight") + 4 + 2 * 8 + 4
    struct.pack_into("<Q", b, off_at, struct.unpack_from("<Q", b, off_at)[0] + 4)
    msgs.append(bad_gguf("misaligned", bytes(b), ["not aligned to 32"]))
    # issue 28: a key twice (this parser took the first, another reader the
    # last), and two tensors over the same bytes; llama.cpp refuses both
    twice = kvs + [("qwen2moe.expert_used_count", "u32", 1)]
    msgs.append(bad_gguf("dupkey", model(twice), ["metadata key qwen2moe.expert_used_count appears twice"]))

    def info_offset_at(buf, name):
        pos = buf.find(name.encode() + struct.pack("<I", 3))
        assert pos > 0, name
        return pos + len(name) + 4 + 3 * 8 + 4

    b = bytearray(g)
    gate_at = info_offset_at(b, "blk.0.ffn_gate_exps.weight")
    up_at = info_offset_at(b, "blk.0.ffn_up_exps.weight")
    b[up_at:up_at + 8] = b[gate_at:gate_at + 8]
    msgs.append(bad_gguf("overlap", bytes(b), ["blk.0.ffn_gate_exps.weight", "overlap"]))
    for m in msgs:
        print("  " + m[m.find(": ", m.find(".arena")) + 2:][:110])


# ---- safetensors ---------------------------------------------------------------------

def st_slices(where, mixtral=False, folder=None):
    def read(name):
        path, off, n = where[name][:3]
        with open(path, "rb") as f:
            f.seek(off)
            return f.read(n)
    dt = {"BF16": "bf16", "F16": "f16", "F32": "f32", "F64": "f64", "I8": "i8"}

    def slices(layer, expert, part):
        nm = (["w1", "w3", "w2"] if mixtral else ["gate_proj", "up_proj", "down_proj"])[part]
        name = "model.layers.%d.%s.experts.%d.%s.weight" % (
            layer, "block_sparse_moe" if mixtral else "mlp", expert, nm)
        return dt[where[name][3]], read(name)

    def dense(role, layer):
        if role == "router":
            name = "model.layers.%d.%s.gate.weight" % (layer, "block_sparse_moe" if mixtral else "mlp")
        else:
            name = "model.layers.%d.post_attention_layernorm.weight" % layer
        return dt[where[name][3]], read(name)
    return slices, dense


def single(path, tensors, metadata=None):
    lay = sw.write_safetensors(path, tensors, metadata)
    types = {n: d for n, d, _, _ in tensors}
    return {n: (path, off, b, types[n]) for n, (off, b) in lay.items()}


@case
def safetensors_single_file():
    rng = random.Random(6)
    folder = tmp("st1")
    os.makedirs(folder)
    tensors = sw.moe_tensors(rng, layers=3, experts=4, d_model=64, d_ff=96, dtype="BF16")
    where = single(os.path.join(folder, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"num_experts_per_tok": 3, "num_experts": 4}, f)
    arena = tmp("st1.arena")
    run("create", "--experts-only", "--safetensors", os.path.join(folder, "model.safetensors"), arena)
    slices, dense = st_slices(where)
    j, n_exp, n_dense = check_arena(arena, {"layers": 3, "experts": 4, "top_k": 3, "d_model": 64,
                                            "d_ff": 96, "has_norm": True}, slices, dense)
    assert n_dense == 6 and j["dtypes"]["gate"] == "bf16" and j["dtypes"]["norm"] == "f32"
    # the folder works too, and --top-k overrides config.json
    arena2 = tmp("st1b.arena")
    run("create", "--experts-only", "--safetensors", folder, "--top-k", "1", arena2)
    assert info(arena2)["top_k"] == 1


@case
def safetensors_sharded_folder():
    rng = random.Random(7)
    folder = tmp("st3")
    tensors = sw.moe_tensors(rng, layers=2, experts=6, d_model=128, d_ff=64, dtype="F16",
                             router_dtype="BF16")
    # layer 1's experts in F32: dtypes differ by layer
    tensors = [(n, "F32", s, rng.randbytes(sw.nbytes("F32", s)))
               if n.startswith("model.layers.1.mlp.experts.") else (n, d, s, b)
               for n, d, s, b in tensors]
    where = sw.write_sharded(folder, tensors, shards=3)
    types = {n: d for n, d, _, _ in tensors}
    where = {n: v + (types[n],) for n, v in where.items()}
    # a stray shard the index does not name is ignored
    sw.write_safetensors(os.path.join(folder, "stray.safetensors"),
                         [("model.layers.0.mlp.experts.0.gate_proj.weight", "F16", [1, 1], b"zz")])
    arena = tmp("st3.arena")
    run("create", "--experts-only", "--safetensors", folder, arena)
    slices, dense = st_slices(where)
    j, n_exp, _ = check_arena(arena, {"layers": 2, "experts": 6, "top_k": 2, "d_model": 128,
                                      "d_ff": 64}, slices, dense)
    assert [l["gate"] for l in j["layer_dtypes"]] == ["f16", "f32"], j["layer_dtypes"]
    assert j["source"] == "safetensors st3 (3 shards, experts only)", j["source"]
    print("  %d experts from 3 shards byte-exact" % n_exp)


@case
def safetensors_mixtral_names():
    rng = random.Random(8)
    tensors = sw.moe_tensors(rng, layers=2, experts=8, d_model=32, d_ff=64, dtype="F32",
                             norm=False, mixtral=True)
    path = tmp("mixtral.safetensors")
    where = single(path, tensors)
    arena = tmp("mixtral.arena")
    run("create", "--experts-only", "--safetensors", path, "--top-k", "2", arena)
    slices, dense = st_slices(where, mixtral=True)
    check_arena(arena, {"layers": 2, "experts": 8, "top_k": 2, "has_norm": False}, slices, dense)


def bad_st(name, src, words, extra=()):
    arena = tmp(name + ".arena")
    p = run("create", "--experts-only", "--safetensors", src, *extra, arena, want=1)
    for w in words:
        assert w in p.stderr, "%s: %r lacks %r" % (name, p.stderr, w)
    assert not os.path.exists(arena), name
    return p.stderr.strip()


@case
def safetensors_malformed():
    rng = random.Random(9)
    tensors = sw.moe_tensors(rng, layers=2, experts=2, d_model=32, d_ff=64, extras=False)
    good = tmp("good.safetensors")
    sw.write_safetensors(good, tensors)
    with open(good, "rb") as f:
        g = f.read()
    hl = struct.unpack_from("<Q", g)[0]
    msgs = []

    def raw(name, data):
        p = tmp(name + ".safetensors")
        with open(p, "wb") as f:
            f.write(data)
        return p

    def hdr(name, obj, data=b""):
        hj = json.dumps(obj).encode()
        return raw(name, struct.pack("<Q", len(hj)) + hj + data)

    msgs.append(bad_st("short", raw("short", b"\1\0\0"), ["too short"]))
    msgs.append(bad_st("hlen", raw("hlen", struct.pack("<Q", 1 << 40) + g[8:]),
                       ["header length"]))
    msgs.append(bad_st("hpast", raw("hpast", struct.pack("<Q", len(g)) + g[8:]),
                       ["runs past the end"]))
    msgs.append(bad_st("json", raw("json", struct.pack("<Q", 10) + b"{not json}"),
                       ["not JSON"]))
    msgs.append(bad_st("array", hdr("array", [1, 2]), ["not a JSON object"]))
    msgs.append(bad_st("dupkey", raw("dupkey", struct.pack("<Q", 16) + b'{"a": 1, "a": 2}'),
                       ["not JSON", "duplicate"]))
    msgs.append(bad_st("fields", hdr("fields", {"x": {"dtype": "F32"}}), ["data_offsets"]))
    msgs.append(bad_st("past", hdr("past", {"x": {"dtype": "F32", "shape": [4],
                                                  "data_offsets": [0, 16]}}, b"\0" * 8),
                       ["outside the 8-byte data section"]))
    msgs.append(bad_st("size", hdr("size", {"x": {"dtype": "F32", "shape": [3],
                                                  "data_offsets": [0, 16]}}, b"\0" * 16),
                       ["16 bytes, its F32 shape needs 12"]))
    msgs.append(bad_st("overlap", hdr("overlap", {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                                  "y": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}},
                                      b"\0" * 16), ["the data of x and y overlap"]))
    msgs.append(bad_st("neg", hdr("neg", {"x": {"dtype": "F32", "shape": [-1],
                                                "data_offsets": [0, 4]}}, b"\0" * 4),
                       ["bad shape"]))
    msgs.append(bad_st("noexperts", hdr("noexperts", {"x": {"dtype": "F32", "shape": [1],
                                                            "data_offsets": [0, 4]}}, b"\0" * 4),
                       ["no expert tensors"]))
    f8 = [(n, "F8_E4M3", s, d[:len(d) // 2]) if n.endswith("experts.1.up_proj.weight") else
          (n, dt, s, d) for n, dt, s, d in tensors]
    msgs.append(bad_st("f8", single(tmp("f8.safetensors"), f8) and tmp("f8.safetensors"),
                       ["F8_E4M3", "no ggml type"]))
    miss = [t for t in tensors if t[0] != "model.layers.1.mlp.experts.0.down_proj.weight"]
    msgs.append(bad_st("missing", single(tmp("m.safetensors"), miss) and tmp("m.safetensors"),
                       ["layer 1 expert 0 has no down weight"]))
    shp = [(n, dt, [s[1], s[0]], d) if n.endswith("experts.1.gate_proj.weight") else
           (n, dt, s, d) for n, dt, s, d in tensors]
    msgs.append(bad_st("shape", single(tmp("s.safetensors"), shp) and tmp("s.safetensors"),
                       ["has shape [32, 64], want [64, 32]"]))
    noroute = [t for t in tensors if t[0] != "model.layers.0.mlp.gate.weight"]
    msgs.append(bad_st("norouter", single(tmp("nr.safetensors"), noroute) and
                       tmp("nr.safetensors"), ["no router model.layers.0.mlp.gate.weight"]))
    mix = [(n, "F16", s, d) if n.startswith("model.layers.0.mlp.experts.1.") else
           (n, dt, s, d) for n, dt, s, d in tensors]
    msgs.append(bad_st("mixed", single(tmp("mx.safetensors"), mix) and tmp("mx.safetensors"),
                       ["but expert 0 of layer 0 has bf16"]))
    msgs.append(bad_st("topk", good, ["top-k 5 but only 2 experts"], extra=("--top-k", "5")))
    # sharded: the index names a shard without the tensor; an escaping path
    folder = tmp("badidx")
    sw.write_sharded(folder, tensors, shards=2)
    idx = os.path.join(folder, "model.safetensors.index.json")
    with open(idx) as f:
        ix = json.load(f)
    name = "model.layers.1.mlp.experts.1.up_proj.weight"
    other = [fn for fn in set(ix["weight_map"].values()) if fn != ix["weight_map"][name]][0]
    ix["weight_map"][name] = other
    with open(idx, "w") as f:
        json.dump(ix, f)
    msgs.append(bad_st("index", folder, ["does not have it"]))
    ix["weight_map"][name] = "../../etc/passwd"
    with open(idx, "w") as f:
        json.dump(ix, f)
    msgs.append(bad_st("escape", folder, ["not a file name in the folder"]))
    os.unlink(idx)
    msgs.append(bad_st("noindex", folder, ["no model.safetensors.index.json and no model.safetensors"]))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"num_local_experts": 3}, f)
    shutil.copy(good, os.path.join(folder, "model.safetensors"))
    msgs.append(bad_st("config", folder, ["config.json says 3 experts, the weights have 2"]))
    for m in msgs:
        print("  " + m[m.find(": ", m.find(".arena")) + 2:][:110])


# ---- whole models (format v2) -------------------------------------------------

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "arena", "hf")


def contents(path):
    """(info, dense {name: (dtype, rows, cols, bytes)}, experts {(l, e): (g, u, d)},
    blobs {key: bytes}) of an arena, read from the file by info's offsets."""
    j = info(path)
    with open(path, "rb") as f:
        data = f.read()
    dense = {t["name"]: (t["dtype"], t["rows"], t["cols"], data[t["offset"]:t["offset"] + t["bytes"]])
             for t in j["dense"]}
    experts = {}
    for e in j["entries"]:
        if e["role"] == "expert":
            experts[(e["layer"], e["expert"])] = tuple(
                data[e["offset"] + p["offset"]:e["offset"] + p["offset"] + p["bytes"]] for p in e["parts"])
    blobs = {b["key"]: data[b["offset"]:b["offset"] + b["bytes"]] for b in j["metadata"]}
    assert run("verify", path).stdout.startswith("ok ")
    return j, dense, experts, blobs


ST_TO_ARENA = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


def check_model(path, c, dense, experts, dtype):
    """The arena holds exactly the model's dense tensors (HF names, shapes,
    bytes) and experts."""
    j, got, exps, blobs = contents(path)
    assert j["arch"] == c["model_type"], j["arch"]
    want = {}
    for name, st, shape, data in dense:
        if c["model_type"] == "mixtral" and name.endswith(".mlp.gate.weight"):
            name = name.replace(".mlp.gate.", ".block_sparse_moe.gate.")
        rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
        want[name] = (ST_TO_ARENA[st], rows, cols, data)
    assert set(got) == set(want), (sorted(set(got) ^ set(want)))[:6]
    for name in want:
        assert got[name] == want[name], "%s differs: %r" % (name, got[name][:3])
    assert exps == experts, "experts differ"
    assert "config.json" in blobs
    return j, got, exps, blobs


def tok_files():
    # a tokenizer the engine loads (its merges' pieces in the vocabulary):
    # create checks it as the engine would (tokenizer_checked_at_import)
    tokens = ["<unk>", "<s>", "</s>", "t", "o", "k", "to", "tok"] + ["tok%d" % i for i in range(5)] + \
        ["\u0120h\u00e9llo"]
    tj = {"version": "1.0", "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)},
                                      "merges": ["t o", "to k"]}}
    return tokens, {"tokenizer.json": json.dumps(tj), "tokenizer_config.json":
                    '{"bos_token": "<s>", "model_max_length": 1000000000000000019884624838656}',
                    "chat_template.jinja": "{% for m in messages %}{{ m.content }}{% endfor %}"}


@case
def model_hf_and_gguf_agree():
    """Per architecture and dtype: an HF folder, the same weights fused, and
    the GGUF llama.cpp's converter would make of it give the same dense
    tensors (by Hugging Face name, byte for byte, Mixtral's Q/K un-permuted)
    and the same experts; the GGUF's config.json says what the HF one says."""
    rng = random.Random(17)
    tokens, tok = tok_files()
    for arch in sw.ARCHS:
        for dtype in ("F32", "BF16"):
            c = sw.hf_config(arch, tie=arch == "olmoe" and dtype == "BF16")
            dense, experts = sw.hf_model(rng, c, dtype)
            folder = tmp("%s_%s" % (arch, dtype))
            sw.write_hf_folder(folder, c, dense, experts, dtype, shards=1 if dtype == "F32" else 2,
                               tokenizer=tok)
            a = tmp("%s_%s.arena" % (arch, dtype))
            run("create", "--safetensors", folder, a)
            j, got, exps, blobs = check_model(a, c, dense, experts, dtype)
            assert blobs["tokenizer.json"] == tok["tokenizer.json"].encode()
            assert blobs["chat_template.jinja"] == tok["chat_template.jinja"].encode()
            assert json.loads(blobs["config.json"]) == c
            assert j["tokenizer"] is True and j["top_k"] == 2

            fused = tmp("%s_%s_fused" % (arch, dtype))
            sw.write_hf_folder(fused, c, dense, experts, dtype, fused=True)
            af = tmp("%s_%s_fused.arena" % (arch, dtype))
            run("create", "--safetensors", fused, af)
            check_model(af, c, dense, experts, dtype)

            kvs, tensors = gw.gguf_from_hf(c, dense, experts, dtype, gw.tokenizer_kvs(
                tokens, ["t o", "to k"], tok["chat_template.jinja"]))
            g = tmp("%s_%s.gguf" % (arch, dtype))
            gw.write_gguf(g, kvs, tensors)
            ag = tmp("%s_%s_gguf.arena" % (arch, dtype))
            run("create", "--gguf", g, ag)
            jg, gd, ge, gb = check_model(ag, c, dense, experts, dtype)
            assert set(gb) == {"config.json", "gguf_tokenizer.json"}, set(gb)
            gc = json.loads(gb["config.json"])
            E = c.get("num_experts") or c.get("num_local_experts")
            for k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "vocab_size", "num_experts_per_tok",
                      "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
                      "eos_token_id", "intermediate_size", "moe_intermediate_size",
                      "shared_expert_intermediate_size", "norm_topk_prob"):
                if k in c:
                    assert gc[k] == c[k], (arch, k, gc[k], c[k])
            assert gc["num_experts"] == E and gc["num_local_experts"] == E
            assert gc["head_dim"] == (c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
            assert abs(gc["rms_norm_eps"] - c["rms_norm_eps"]) < 1e-12
            assert gc["rope_theta"] == c["rope_parameters"]["rope_theta"] == gc["rope_parameters"]["rope_theta"]
            gt = json.loads(gb["gguf_tokenizer.json"])
            assert gt["tokenizer.ggml.tokens"] == tokens, gt["tokenizer.ggml.tokens"]
            assert gt["tokenizer.ggml.merges"] == ["t o", "to k"]
            assert gt["tokenizer.chat_template"] == tok["chat_template.jinja"]
            assert gt["tokenizer.ggml.add_bos_token"] is False and gt["tokenizer.ggml.eos_token_id"] == 2
            assert jg["source"].startswith("gguf %s_%s.gguf" % (arch, dtype)), jg["source"]
        print("  %-9s HF folder, fused experts and GGUF: %d dense tensors, %d experts agree" % (
            arch, len(got), len(exps)))


@case
def model_json_as_published():
    """Every JSON file of an HF folder read by base.h's policy, as real files
    hold them: config.json with integral reals and exponent forms where
    integers are expected and integers past 64 bits under keys nothing
    reads, the shard index with a total_size past 64 bits, tokenizer.json
    with one too, tokenizer_config.json's unset model_max_length,
    generation_config.json's eos list as reals; the experts-only import's
    config.json too. The files are kept byte for byte, and the arena's
    info reads the config (a double where jansson cannot hold the
    integer)."""
    rng = random.Random(31)
    tokens, tok = tok_files()
    tj = json.loads(tok["tokenizer.json"])
    tj["truncation"] = {"max_length": 10 ** 30}
    tok["tokenizer.json"] = json.dumps(tj)
    c = sw.hf_config("qwen3_moe")
    dense, experts = sw.hf_model(rng, c, "F32")
    raw = json.dumps(c)
    for k in ("vocab_size", "hidden_size", "num_experts_per_tok", "num_attention_heads"):
        raw = raw.replace('"%s": %d' % (k, c[k]), '"%s": %d.0' % (k, c[k]), 1)
    raw = raw.replace('"max_position_embeddings": %d' % c["max_position_embeddings"],
                      '"max_position_embeddings": %de0' % c["max_position_embeddings"], 1)
    raw = raw[:-1] + ', "model_max_length": 1000000000000000019884624838656, "x": [18446744073709551616]}'
    assert raw.count(".0,") >= 3 and "e0" in raw, raw
    folder = tmp("published")
    sw.write_hf_folder(folder, c, dense, experts, "F32", shards=2, tokenizer=tok)
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write(raw)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        f.write('{"bos_token_id": 1.0, "eos_token_id": [2.0, 1], "max_length": 1e30}')
    ix = os.path.join(folder, "model.safetensors.index.json")
    with open(ix) as f:
        j = json.load(f)
    j.setdefault("metadata", {})["total_size"] = 10 ** 30
    with open(ix, "w") as f:
        json.dump(j, f)
    a = tmp("published.arena")
    run("create", "--safetensors", folder, a)
    _, _, _, blobs = contents(a)
    assert blobs["config.json"] == raw.encode()
    assert blobs["tokenizer.json"] == tok["tokenizer.json"].encode()
    i = info(a)
    assert i["config"]["vocab_size"] == c["vocab_size"] and i["config"]["model_max_length"] > 1e29, i["config"]
    assert "hidden_size %d" % c["hidden_size"] in run("info", a).stdout
    # experts-only: the config's num_experts_per_tok as a real still gives top_k
    eo = tmp("published_eo.arena")
    run("create", "--experts-only", "--safetensors", folder, eo)
    assert info(eo)["top_k"] == c["num_experts_per_tok"]
    print("  config, index, tokenizer, tokenizer_config and generation_config as published: imported")


@case
def model_rope_scaling():
    """YaRN and linear rope scaling import: an HF config.json with Qwen3's
    model-card YaRN is kept as it is; a GGUF's <arch>.rope.scaling.* keys
    (as convert_hf_to_gguf.py writes Qwen3's) become the rope_parameters
    transformers reads, llama.cpp's attn_factor folded into the attention
    factor (attn_factor * (1 + 0.1 ln factor), what ggml's rope_yarn
    multiplies by), and the older rope.scale_linear becomes linear."""
    rng = random.Random(29)
    c = sw.hf_config("qwen3_moe")
    c["max_position_embeddings"] = 40960
    c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    dense, experts = sw.hf_model(rng, c, "F32")
    folder = tmp("yarn_hf")
    sw.write_hf_folder(folder, c, dense, experts, "F32")
    a = tmp("yarn_hf.arena")
    run("create", "--safetensors", folder, a)
    _, _, _, blobs = contents(a)
    assert json.loads(blobs["config.json"])["rope_scaling"] == c["rope_scaling"]

    base = dict(c)
    del base["rope_scaling"]
    kvs, tensors = gw.gguf_from_hf(base, dense, experts)
    cases = [
        ([("qwen3moe.rope.scaling.type", "str", "yarn"), ("qwen3moe.rope.scaling.factor", "f32", 4.0),
          ("qwen3moe.rope.scaling.original_context_length", "u32", 32768)],
         {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
        ([("qwen3moe.rope.scaling.type", "str", "yarn"), ("qwen3moe.rope.scaling.factor", "f32", 2.0),
          ("qwen3moe.rope.scaling.attn_factor", "f32", 0.5),
          ("qwen3moe.rope.scaling.yarn_beta_fast", "f32", 16.0),
          ("qwen3moe.rope.scaling.yarn_beta_slow", "f32", 2.0)],
         {"rope_type": "yarn", "factor": 2.0, "attention_factor": 0.5 * (1 + 0.1 * math.log(2.0)),
          "beta_fast": 16.0, "beta_slow": 2.0}),
        ([("qwen3moe.rope.scaling.type", "str", "linear"), ("qwen3moe.rope.scaling.factor", "f32", 2.5)],
         {"rope_type": "linear", "factor": 2.5}),
        ([("qwen3moe.rope.scale_linear", "f32", 2.0)], {"rope_type": "linear", "factor": 2.0}),
        ([("qwen3moe.rope.scaling.type", "str", "none")], {"rope_type": "default"}),
    ]
    for n, (extra, want) in enumerate(cases):
        g = tmp("yarn%d.gguf" % n)
        gw.write_gguf(g, kvs + extra, tensors)
        ag = tmp("yarn%d.arena" % n)
        run("create", "--gguf", g, ag)
        _, _, _, gb = contents(ag)
        rp = json.loads(gb["config.json"])["rope_parameters"]
        del rp["rope_theta"]
        assert set(rp) == set(want), (n, rp, want)
        for k, v in want.items():
            assert rp[k] == v if isinstance(v, str) else abs(rp[k] - v) < 1e-12, (n, k, rp[k], v)
    print("  an HF YaRN config kept; %d GGUF rope settings as rope_parameters" % len(cases))


@case
def model_mixtral_gguf_permutation():
    """The Q/K rows really are moved: the GGUF's attn_q bytes differ from
    HF's, the arena's equal HF's."""
    rng = random.Random(3)
    c = sw.hf_config("mixtral", heads=4, kv_heads=2, head_dim=16)
    dense, experts = sw.hf_model(rng, c, "F32")
    kvs, tensors = gw.gguf_from_hf(c, dense, experts, "F32")
    q = [d for n, _, _, d in dense if n == "model.layers.0.self_attn.q_proj.weight"][0]
    gq = [d for n, _, _, d in tensors if n == "blk.0.attn_q.weight"][0]
    assert q != gq and sorted(q[i:i + 256] for i in range(0, len(q), 256)) == \
        sorted(gq[i:i + 256] for i in range(0, len(gq), 256))
    g = tmp("m.gguf")
    gw.write_gguf(g, kvs, tensors)
    run("create", "--gguf", g, tmp("m.arena"))
    _, got, _, _ = contents(tmp("m.arena"))
    assert got["model.layers.0.self_attn.q_proj.weight"][3] == q
    # and a quantized type moves whole rows: q8_0 rows of 64 columns
    qd = [(n, "F32", s, d) for n, _, s, d in dense]
    kvs, tensors = gw.gguf_from_hf(c, qd, experts, "F32")
    rows = {}
    for i, (n, t, ne, d) in enumerate(tensors):
        if n in ("blk.0.attn_q.weight", "blk.0.attn_k.weight"):
            rb = gw.row_bytes("q8_0", ne[0])
            hf_rows = [rng.randbytes(rb) for _ in range(ne[1])]
            heads = 4 if "attn_q" in n else 2
            rows[n] = b"".join(hf_rows)
            tensors[i] = (n, "q8_0", ne, gw.permute_rows(rows[n], ne[1], heads, rb))
    gw.write_gguf(g, kvs, tensors)
    run("create", "--force", "--gguf", g, tmp("m.arena"))
    _, got, _, _ = contents(tmp("m.arena"))
    assert got["model.layers.0.self_attn.q_proj.weight"] == ("q8_0", 64, 64, rows["blk.0.attn_q.weight"])
    assert got["model.layers.0.self_attn.k_proj.weight"][3] == rows["blk.0.attn_k.weight"]


@case
def model_transformers_fixtures():
    """What transformers 5.17's save_pretrained wrote (tests/fixtures/arena/hf)
    imports whole: every tensor of the file is in the arena, byte for byte."""
    for arch in ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "qwen3_moe_bf16"):
        folder = os.path.join(FIXTURES, arch)
        a = tmp(arch + ".arena")
        run("create", "--safetensors", folder, a)
        j, dense, experts, blobs = contents(a)
        with open(os.path.join(folder, "model.safetensors"), "rb") as f:
            raw = f.read()
        n = struct.unpack("<Q", raw[:8])[0]
        hdr = json.loads(raw[8:8 + n])
        base = 8 + n
        nd = 0
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            b = raw[base + t["data_offsets"][0]:base + t["data_offsets"][1]]
            if ".experts." in name:
                parts = name.split(".")
                l, e = int(parts[2]), int(parts[5])
                k = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1, "down_proj": 2, "w2": 2}[parts[6]]
                assert experts[(l, e)][k] == b, name
            else:
                assert dense[name][3] == b, name
                nd += 1
        assert nd == len(dense), (nd, len(dense))
        want_blobs = {"config.json", "generation_config.json"} | (
            set() if arch.endswith("bf16") else {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
        assert set(blobs) == want_blobs, set(blobs)
        print("  %-15s %2d dense tensors, %d experts, %s" % (arch, nd, len(experts),
                                                             ", ".join(sorted(blobs))))


def refuse(name, src, words, *extra, gguf=False):
    a = tmp(name + ".arena")
    p = run("create", "--gguf" if gguf else "--safetensors", src, *extra, a, want=1)
    for w in words:
        assert w in p.stderr, "%s: %r lacks %r" % (name, p.stderr, w)
    assert not os.path.exists(a)
    return p.stderr.strip()


@case
def model_unsupported_refused():
    """An architecture, option or tensor the forward pass does not know is
    refused at create, by name; nothing is imported wrong."""
    rng = random.Random(5)
    msgs = []

    def folder(name, c, dense=None, experts=None, tensors_of=None, **kw):
        """tensors as for tensors_of (default c), config.json says c"""
        if dense is None:
            dense, experts = sw.hf_model(random.Random(9), c)
        f = tmp(name)
        sw.write_hf_folder(f, tensors_of or c, dense, experts, **kw)
        with open(os.path.join(f, "config.json"), "w") as fp:
            json.dump(c, fp)
        return f

    base = sw.hf_config("qwen3_moe")
    dense, experts = sw.hf_model(rng, base)
    for key, val, words in (
            ("model_type", "deepseek_v2", ['model_type "deepseek_v2" is not supported', "--experts-only"]),
            ("rope_parameters", {"rope_type": "longrope", "factor": 4.0}, ['rope_parameters type "longrope"']),
            ("rope_scaling", {"type": "dynamic", "factor": 2.0}, ['rope_scaling type "dynamic"']),
            ("mlp_only_layers", [1], ["mlp_only_layers is set"]),
            ("decoder_sparse_step", 2, ["decoder_sparse_step 2"]),
            ("use_sliding_window", True, ["use_sliding_window"]),
            ("hidden_act", "gelu", ['hidden_act "gelu"']),
            ("quantization_config", {"quant_method": "gptq"}, ["quantization_config"]),
            ("num_experts_per_tok", 9, ["4 experts, 9 per token"])):
        c = dict(base)
        c[key] = val
        msgs.append(refuse(key, folder(key, c, dense, experts, tensors_of=base), words))
    c = dict(base)
    del c["hidden_size"]
    msgs.append(refuse("nohidden", folder("nohidden", c, dense, experts, tensors_of=base),
                       ["no hidden_size"]))
    # a tensor missing, one too many, a wrong shape, a dtype without ggml type
    msgs.append(refuse("missing", folder("missing", base, [d for d in dense if "k_norm" not in d[0]],
                                          experts), ["no tensor model.layers.0.self_attn.k_norm.weight"]))
    msgs.append(refuse("extra", folder("extra", base, dense, experts,
                                        extra=[("model.layers.0.mlp.bias", "F32", [4], b"\0" * 16)]),
                       ["tensor model.layers.0.mlp.bias is not part of a qwen3_moe model"]))
    bad = [(n, d, [s[0] + 1] + s[1:] if n == "model.embed_tokens.weight" else s,
            rng.randbytes(sw.nbytes(d, [s[0] + 1] + s[1:])) if n == "model.embed_tokens.weight" else b)
           for n, d, s, b in dense]
    msgs.append(refuse("shape", folder("shape", base, bad, experts), ["model.embed_tokens.weight has shape"]))
    f8 = [(n, "F8_E4M3" if n == "model.norm.weight" else d, s, b[:len(b) // 4] if n == "model.norm.weight" else b)
          for n, d, s, b in dense]
    msgs.append(refuse("f8", folder("f8", base, f8, experts), ["F8_E4M3"]))
    E = dict(experts)
    del E[(1, 3)]
    msgs.append(refuse("noexpert", folder("noexpert", base, dense, E), ["layer 1 expert 3 has no"]))
    nc = folder("nocfg", base, dense, experts)
    os.unlink(os.path.join(nc, "config.json"))
    msgs.append(refuse("nocfg", nc, ["no config.json", "--experts-only"]))
    msgs.append(refuse("topk", folder("topk", base, dense, experts), ["--top-k 3 disagrees"], "--top-k", "3"))
    p = run("create", "--experts-only", "--safetensors", nc, tmp("eo.arena"))
    assert info(tmp("eo.arena"))["arch"] == ""
    # mixtral with a sliding window
    m = sw.hf_config("mixtral")
    m["sliding_window"] = 4096
    msgs.append(refuse("swa", folder("swa", m), ["sliding_window is set"]))

    # GGUF: an unknown architecture, rope scaling, a stray tensor, a missing one
    kvs, tensors = gw.gguf_from_hf(base, dense, experts)
    def gg(name, k, t):
        path = tmp(name + ".gguf")
        gw.write_gguf(path, k, t)
        return path
    ren = [(n, ty, v.replace("qwen3moe", "deepseek2") if n == "general.architecture" else v)
           if n == "general.architecture" else (n.replace("qwen3moe.", "deepseek2."), ty, v) for n, ty, v in kvs]
    msgs.append(refuse("g_arch", gg("g_arch", ren, tensors), ['GGUF architecture "deepseek2"'], gguf=True))
    msgs.append(refuse("g_rope", gg("g_rope", kvs + [("qwen3moe.rope.scaling.type", "str", "longrope")], tensors),
                       ['rope.scaling.type "longrope"'], gguf=True))
    msgs.append(refuse("g_yarn_log", gg("g_yarn_log", kvs + [
        ("qwen3moe.rope.scaling.type", "str", "yarn"), ("qwen3moe.rope.scaling.factor", "f32", 4.0),
        ("qwen3moe.rope.scaling.yarn_log_multiplier", "f32", 0.1)], tensors),
        ["yarn_log_multiplier"], gguf=True))
    msgs.append(refuse("g_rot", gg("g_rot", kvs + [("qwen3moe.rope.dimension_count", "u32", 8)], tensors),
                       ["partial rotary"], gguf=True))
    msgs.append(refuse("g_extra", gg("g_extra", kvs, tensors + [("rope_freqs.weight", "f32", [8], b"\0" * 32)]),
                       ["tensor rope_freqs.weight is not part"], gguf=True))
    msgs.append(refuse("g_missing", gg("g_missing", kvs, [t for t in tensors if t[0] != "output_norm.weight"]),
                       ["no tensor for model.norm.weight"], gguf=True))
    msgs.append(refuse("g_heads", gg("g_heads", [(n, "arr", ("u32", [2, 2])) if n.endswith("head_count_kv")
                                                  else (n, t, v) for n, t, v in kvs], tensors),
                       ["head_count_kv is not an unsigned 32-bit integer"], gguf=True))
    badtok = kvs + [("tokenizer.ggml.tokens", "arr", ("str", [b"\xff\xfe"]))]
    msgs.append(refuse("g_utf8", gg("g_utf8", badtok, tensors), ["tokenizer.ggml.tokens has a value JSON cannot hold"],
                       gguf=True))
    run("create", "--experts-only", "--gguf", gg("g_eo", ren, tensors), tmp("geo.arena"))
    for m in msgs:
        print("  " + m[m.find(": ", m.find(".arena")) + 2:][:120])


@case
def model_import_checks():
    """Issue 28: what every engine refuses at load is refused at import
    (a context of 2^32-1, rope_theta <= 1, rms_norm_eps <= 0, from a
    folder or a GGUF), and only regular files inside the model folder are
    read: a link out of it (chat_template.jinja -> a secret) is refused,
    the links of a Hugging Face cache snapshot (into ../../blobs) are
    followed."""
    rng = random.Random(28)
    msgs = []
    base = sw.hf_config("qwen3_moe")
    dense, experts = sw.hf_model(rng, base)

    def folder(name, c, **kw):
        f = tmp(name)
        sw.write_hf_folder(f, c, dense, experts, tokenizer=tok_files()[1], **kw)
        return f

    for name, edit, words in (
            ("ctx", {"max_position_embeddings": (1 << 32) - 1}, ["max_position_embeddings 4294967295"]),
            ("ctx0", {"max_position_embeddings": 0}, ["max_position_embeddings 0"]),
            ("theta", {"rope_parameters": {"rope_theta": 1.0, "rope_type": "default"}}, ["rope_theta"]),
            ("eps0", {"rms_norm_eps": 0}, ["rms_norm_eps"]),
            ("epsneg", {"rms_norm_eps": -1e-6}, ["rms_norm_eps"]),
            ("prf", {"partial_rotary_factor": 0.5}, ["partial_rotary_factor"])):
        c = dict(base)
        c.update(edit)
        msgs.append(refuse("ic_" + name, folder("ic_" + name, c), words))
    kvs, tensors = gw.gguf_from_hf(base, dense, experts)

    def gg(name, key, t, v):
        path = tmp(name + ".gguf")
        gw.write_gguf(path, [(n, t, v) if n == key else kv for kv in kvs for n in [kv[0]]], tensors)
        return path
    msgs.append(refuse("ig_ctx", gg("ig_ctx", "qwen3moe.context_length", "u32", (1 << 32) - 1),
                       ["max_position_embeddings 4294967295"], gguf=True))
    msgs.append(refuse("ig_theta", gg("ig_theta", "qwen3moe.rope.freq_base", "f32", 0.5), ["rope_theta"], gguf=True))
    msgs.append(refuse("ig_eps", gg("ig_eps", "qwen3moe.attention.layer_norm_rms_epsilon", "f32", 0.0),
                       ["rms_norm_eps"], gguf=True))

    # a link out of the folder: refused, the secret nowhere
    secret = tmp("secret.txt")
    with open(secret, "w") as f:
        f.write("root:x:0:0:secret\n")
    for name in ("chat_template.jinja", "config.json", "model.safetensors"):
        f = folder("il_" + name.split(".")[0], base)
        os.rename(os.path.join(f, name), os.path.join(TMP, "moved_" + name))
        os.symlink(secret if name == "chat_template.jinja" else os.path.join(TMP, "moved_" + name),
                   os.path.join(f, name))
        msgs.append(refuse("il_" + name, f, ["outside the model folder"]))
    # a link inside the folder is fine; so is a Hugging Face cache snapshot
    f = folder("il_inside", base)
    os.rename(os.path.join(f, "config.json"), os.path.join(f, "real_config.json"))
    os.symlink("real_config.json", os.path.join(f, "config.json"))
    run("create", "--safetensors", f, tmp("il_inside.arena"))
    repo = tmp("models--org--m")
    snap = os.path.join(repo, "snapshots", "0123abc")
    src = folder("il_src", base)
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(snap)
    for i, name in enumerate(sorted(os.listdir(src))):
        os.rename(os.path.join(src, name), os.path.join(repo, "blobs", "h%d" % i))
        os.symlink(os.path.join("..", "..", "blobs", "h%d" % i), os.path.join(snap, name))
    run("create", "--safetensors", snap, tmp("il_hub.arena"))
    for m in msgs:
        print("  " + m[m.find(": ", m.find(".arena")) + 2:][:120])


@case
def tokenizer_checked_at_import():
    """Issue 28: a tokenizer the engine would refuse at load (bogus merges,
    an empty added token, a pre-tokenizer regex PCRE2 cannot compile, a
    GGUF merge of unknown tokens) is refused by create, before anything is
    written, with the engine's message ("the arena's tokenizer: ..."; the
    loader's words are those `baton tokenize --tokenizer` prints for the
    same file); a good one still imports, and --synthetic-arch's
    --tokenizer is checked too."""
    rng = random.Random(29)
    msgs = []
    base = sw.hf_config("qwen3_moe")
    dense, experts = sw.hf_model(rng, base)
    tokens, tok = tok_files()
    tj = json.loads(tok["tokenizer.json"])

    def bad_tj(edit):
        j = json.loads(json.dumps(tj))
        edit(j)
        return j

    for name, j, words in (
            ("merge3", bad_tj(lambda j: j["model"].__setitem__("merges", ["t o x"])),
             ["merge 0 (t o x) is not two pieces"]),
            ("mergeout", bad_tj(lambda j: j["model"].__setitem__("merges", ["zz yy"])),
             ["merge 0 uses a piece outside the vocabulary"]),
            ("added", bad_tj(lambda j: j.__setitem__("added_tokens", [
                {"id": 3, "content": "", "special": True}])), ["added token 3 is empty"]),
            ("regex", bad_tj(lambda j: j.__setitem__("pre_tokenizer", {
                "type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})),
             ["split pattern (unclosed"])):
        f = tmp("tk_" + name)
        files = dict(tok)
        files["tokenizer.json"] = json.dumps(j)
        sw.write_hf_folder(f, base, dense, experts, tokenizer=files)
        m = refuse("tk_" + name, f, ["the arena's tokenizer: "] + words)
        # the engine's loader says the same of the same file
        cli = subprocess.run([h.CLI, "tokenize", "--tokenizer", os.path.join(f, "tokenizer.json"), "x"],
                             capture_output=True, text=True, timeout=30)
        assert cli.returncode == 1, cli
        said = cli.stderr.strip()[len("baton: "):]
        assert said and said in m, (said, m)
        assert not [n for n in os.listdir(TMP) if n.startswith("tk_%s.arena" % name)], os.listdir(TMP)
        msgs.append(m)
        # --synthetic-arch with that folder as its tokenizer: the same
        p = run("create", "--synthetic-arch", "qwen3_moe", "--layers", "1", "--experts", "2", "--top-k", "1",
                "--d-model", "64", "--d-ff", "64", "--vocab", "64", "--tokenizer", f,
                tmp("tks_" + name + ".arena"), want=1)
        assert words[0] in p.stderr, p.stderr
        assert not os.path.exists(tmp("tks_" + name + ".arena"))
    f = tmp("tk_good")
    sw.write_hf_folder(f, base, dense, experts, tokenizer=tok)
    run("create", "--safetensors", f, tmp("tk_good.arena"))
    # GGUF: a merge of tokens not in the vocabulary
    kvs, tensors = gw.gguf_from_hf(base, dense, experts, "F32", gw.tokenizer_kvs(
        tokens, ["q z"], tok["chat_template.jinja"]))
    path = tmp("tk_g.gguf")
    gw.write_gguf(path, kvs, tensors)
    msgs.append(refuse("tk_g", path, ["the arena's tokenizer: ",
                                      "tokenizer.ggml.merges[0] uses a token not in the vocabulary"], gguf=True))
    for m in msgs:
        print("  " + m[m.find(": ", m.find(".arena")) + 2:][:120])


@case
def model_synthetic_arch():
    """--synthetic-arch makes a whole random model of real shapes: every
    tensor the architecture has, a config.json, deterministic."""
    a = tmp("s.arena")
    run("create", "--synthetic-arch", "qwen2_moe", "--layers", "2", "--experts", "4", "--top-k", "2",
        "--d-model", "64", "--d-ff", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
        "--vocab", "96", "--shared-ff", "48", "--dtype", "bf16", "--seed", "3", a)
    c = sw.hf_config("qwen2_moe")
    j, dense, experts, blobs = contents(a)
    want = {n: s for n, s in sw.hf_shapes(c)}
    assert set(dense) == set(want), sorted(set(dense) ^ set(want))[:5]
    for n, s in want.items():
        rows, cols = (s[0], s[1]) if len(s) == 2 else (1, s[0])
        assert dense[n][1:3] == (rows, cols), (n, dense[n][1:3], s)
    assert dense["model.embed_tokens.weight"][0] == "bf16" and dense["model.norm.weight"][0] == "f32"
    gc = json.loads(blobs["config.json"])
    assert gc["model_type"] == "qwen2_moe" and gc["shared_expert_intermediate_size"] == 48
    h = run("info", a).stdout
    assert "arch       qwen2_moe" in h and "tokenizer  none" in h, h
    b = tmp("s2.arena")
    run("create", "--synthetic-arch", "qwen2_moe", "--layers", "2", "--experts", "4", "--top-k", "2",
        "--d-model", "64", "--d-ff", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
        "--vocab", "96", "--shared-ff", "48", "--dtype", "bf16", "--seed", "3", "--threads", "1", b)
    assert contents(b)[1] == dense
    # the preset's shape (its real size is for the benchmarks: checked, not built)
    p = run("create", "--synthetic-arch", "mixtral", "--preset", "qwen3-30b-a3b", tmp("x"), want=2)
    assert "another architecture" in p.stderr
    p = run("create", "--synthetic-arch", "llama", "--layers", "1", "--experts", "2", "--top-k", "1",
            "--d-model", "64", "--d-ff", "32", tmp("y"), want=1)
    assert 'synthetic architecture "llama"' in p.stderr, p.stderr
    run("create", "--synthetic-arch", "qwen3_moe", "--preset", "qwen3-30b-a3b", "--layers", "1",
        "--experts", "8", "--vocab", "1024", "--dtype", "q8_0", tmp("q.arena"))
    jq, dq, _, _ = contents(tmp("q.arena"))
    assert jq["d_model"] == 2048 and jq["d_ff"] == 768 and jq["top_k"] == 8
    assert dq["model.layers.0.self_attn.q_proj.weight"][:3] == ("q8_0", 4096, 2048)
    assert dq["model.layers.0.self_attn.k_norm.weight"][:3] == ("f32", 1, 128)



def in_fresh_dir(fn):
    """fn with TMP a directory of its own, removed afterwards."""
    def run_in():
        global TMP
        TMP = tempfile.mkdtemp(prefix="baton-arena-src.")
        try:
            fn()
        finally:
            shutil.rmtree(TMP, ignore_errors=True)
    run_in.__name__ = fn.__name__
    return run_in


def main():
    h.need(BIN)
    return h.run_cases([in_fresh_dir(fn) for fn in CASES], sys.argv[1:], make=None)

if __name__ == "__main__":
    sys.exit(main())
