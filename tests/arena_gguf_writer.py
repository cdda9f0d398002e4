"""arena_gguf_writer.py: writes small GGUF files for the arena's tests.

Standard library only. Follows the GGUF layout llama.cpp reads (v2 and v3
are the same on disk): magic, version, tensor count, metadata count, the
metadata, the tensor infos, padding to general.alignment (default 32) and
the tensor data, each tensor's offset aligned.

    kvs = [("general.architecture", "str", "qwen2moe"),
           ("qwen2moe.block_count", "u32", 2),
           ("tokenizer.ggml.tokens", "arr", ("str", ["a", "b"]))]
    tensors = [("blk.0.ffn_gate_exps.weight", "q4_K", [256, 512, 4], data)]
    layout = write_gguf(path, kvs, tensors)   # name -> (offset, bytes)
"""
import struct

# ggml type: (number, block size, bytes per block), as ggml's type_traits.
GGML_TYPES = {
    "f32": (0, 1, 4), "f16": (1, 1, 2), "q4_0": (2, 32, 18), "q4_1": (3, 32, 20),
    "q5_0": (6, 32, 22), "q5_1": (7, 32, 24), "q8_0": (8, 32, 34), "q8_1": (9, 32, 36),
    "q2_K": (10, 256, 84), "q3_K": (11, 256, 110), "q4_K": (12, 256, 144),
    "q5_K": (13, 256, 176), "q6_K": (14, 256, 210), "q8_K": (15, 256, 292),
    "iq2_xxs": (16, 256, 66), "iq2_xs": (17, 256, 74), "iq3_xxs": (18, 256, 98),
    "iq1_s": (19, 256, 50), "iq4_nl": (20, 32, 18), "iq3_s": (21, 256, 110),
    "iq2_s": (22, 256, 82), "iq4_xs": (23, 256, 136), "i8": (24, 1, 1), "i16": (25, 1, 2),
    "i32": (26, 1, 4), "i64": (27, 1, 8), "f64": (28, 1, 8), "iq1_m": (29, 256, 56),
    "bf16": (30, 1, 2), "tq1_0": (34, 256, 54), "tq2_0": (35, 256, 66),
    "mxfp4": (39, 32, 17),
}

VALUE_TYPES = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6,
               "bool": 7, "str": 8, "arr": 9, "u64": 10, "i64": 11, "f64": 12}
_FMT = {"u8": "<B", "i8": "<b", "u16": "<H", "i16": "<h", "u32": "<I", "i32": "<i",
        "f32": "<f", "bool": "<?", "u64": "<Q", "i64": "<q", "f64": "<d"}


def row_bytes(type_name, cols):
    _, block, nbytes = GGML_TYPES[type_name]
    assert cols % block == 0, (type_name, cols)
    return cols // block * nbytes


def tensor_bytes(type_name, ne):
    n = row_bytes(type_name, ne[0])
    for d in ne[1:]:
        n *= d
    return n


def gguf_string(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    if t == "str":
        return gguf_string(v)
    if t == "arr":
        et, items = v
        return struct.pack("<IQ", VALUE_TYPES[et], len(items)) + b"".join(
            gguf_value(et, x) for x in items)
    return struct.pack(_FMT[t], v)


def _align(n, a):
    return (n + a - 1) // a * a


def write_gguf(path, kvs, tensors, version=3, alignment=32, type_ids=None):
    """Writes the file; returns {name: (absolute offset, bytes)}.

    tensors: (name, ggml type name or number, ne list, data bytes). A number
    writes that type id as is (for unknown types). `alignment` must match a
    general.alignment entry in kvs when there is one.
    """
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += gguf_string(key) + struct.pack("<I", VALUE_TYPES[t]) + gguf_value(t, v)
    rel = 0
    offsets = []
    for name, t, ne, data in tensors:
        rel = _align(rel, alignment)
        offsets.append(rel)
        tid = t if isinstance(t, int) else GGML_TYPES[t][0]
        out += gguf_string(name) + struct.pack("<I", len(ne)) + struct.pack(
            "<%dQ" % len(ne), *ne) + struct.pack("<IQ", tid, rel)
        rel += len(data)
    data_start = _align(len(out), alignment)
    out += b"\0" * (data_start - len(out))
    layout = {}
    for (name, t, ne, data), off in zip(tensors, offsets):
        pos = data_start + off
        out += b"\0" * (pos - len(out))
        out += data
        layout[name] = (pos, len(data))
    with open(path, "wb") as f:
        f.write(out)
    return layout


def moe_model(rng, arch="qwen2moe", layers=2, experts=4, top_k=2, d_model=256, d_ff=512,
              layer_types=None, router_types=None, norm=True, extras=True,
              ffn_len_key=True, embd_len_key=True):
    """(kvs, tensors) of a small MoE model with random tensor bytes.

    layer_types[l] = (gate, up, down) ggml type names; router_types[l] too.
    """
    layer_types = layer_types or [("q4_K", "q4_K", "q6_K")] * layers
    router_types = router_types or ["f32"] * layers
    kvs = [("general.architecture", "str", arch), ("general.name", "str", "baton test model"),
           (arch + ".block_count", "u32", layers), (arch + ".expert_count", "u32", experts),
           (arch + ".expert_used_count", "u32", top_k)]
    if embd_len_key:
        kvs.append((arch + ".embedding_length", "u32", d_model))
    if ffn_len_key:
        kvs.append((arch + ".expert_feed_forward_length", "u32", d_ff))
    if extras:  # every value type, to be skipped
        kvs += [("x.u8", "u8", 7), ("x.i8", "i8", -7), ("x.u16", "u16", 700),
                ("x.i16", "i16", -700), ("x.i32", "i32", -70000), ("x.f32", "f32", 0.5),
                ("x.bool", "bool", True), ("x.u64", "u64", 1 << 40), ("x.i64", "i64", -(1 << 40)),
                ("x.f64", "f64", 2.5),
                ("tokenizer.ggml.tokens", "arr", ("str", ["<s>", "</s>", "hello", ""])),
                ("tokenizer.ggml.scores", "arr", ("f32", [0.0, 1.5, -2.0])),
                ("x.nested", "arr", ("arr", [("i32", [1, 2]), ("str", ["a"])])),
                ("x.empty", "arr", ("u8", []))]
    tensors = []
    if extras:
        tensors.append(("token_embd.weight", "f16", [d_model, 32],
                        rng.randbytes(tensor_bytes("f16", [d_model, 32]))))
    for l in range(layers):
        g, u, d = layer_types[l]
        blk = "blk.%d." % l
        if extras:
            tensors.append((blk + "attn_norm.weight", "f32", [d_model],
                            rng.randbytes(4 * d_model)))
        shapes = [("ffn_gate_inp.weight", router_types[l], [d_model, experts]),
                  ("ffn_gate_exps.weight", g, [d_model, d_ff, experts]),
                  ("ffn_up_exps.weight", u, [d_model, d_ff, experts]),
                  ("ffn_down_exps.weight", d, [d_ff, d_model, experts])]
        if norm:
            shapes.append(("ffn_norm.weight", "f32", [d_model]))
        for name, t, ne in shapes:
            tensors.append((blk + name, t, ne, rng.randbytes(tensor_bytes(t, ne))))
    return kvs, tensors


# ---- whole models, as llama.cpp's convert_hf_to_gguf.py writes them -----------

GGUF_ARCH = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama", "olmoe": "olmoe"}
_ST_TO_GGML = {"F32": "f32", "F16": "f16", "BF16": "bf16"}

# model.layers.N.<hf> -> blk.N.<gguf> (llama.cpp's gguf-py tensor_mapping.py)
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                 "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_name(hf):
    if hf in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf]
    parts = hf.split(".", 3)  # model, layers, N, rest
    return "blk.%s.%s" % (parts[2], _LAYER_NAMES[parts[3]])


def permute_rows(data, rows, n_head, row_bytes):
    """convert_hf_to_gguf.py's LlamaModel.permute on whole rows: within each
    head of hd rows, HF row i*hd/2 + j goes to row 2j + i."""
    hd = rows // n_head
    half = hd // 2
    out = bytearray(len(data))
    for h in range(n_head):
        for i in range(2):
            for j in range(half):
                src = (h * hd + i * half + j) * row_bytes
                dst = (h * hd + 2 * j + i) * row_bytes
                out[dst:dst + row_bytes] = data[src:src + row_bytes]
    return bytes(out)


def gguf_from_hf(c, dense, experts, dtype="F32", tokenizer=None, extra_kvs=(), drop=()):
    """(kvs, tensors) of the GGUF convert_hf_to_gguf.py makes of this HF
    model: the <arch>.* keys, tensors renamed, experts stacked into
    blk.N.ffn_{gate,up,down}_exps, llama's Q/K rows permuted for Mixtral.
    tokenizer: extra (key, type, value) for the tokenizer.* keys."""
    arch = GGUF_ARCH[c["model_type"]]
    H, nh, nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or H // nh
    E = c.get("num_experts") or c.get("num_local_experts")
    qwen = c["model_type"].startswith("qwen")
    I = c["moe_intermediate_size"] if qwen else c["intermediate_size"]
    theta = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 10000.0))
    kvs = [("general.architecture", "str", arch), ("general.name", "str", "baton test"),
           (arch + ".block_count", "u32", c["num_hidden_layers"]),
           (arch + ".context_length", "u32", c["max_position_embeddings"]),
           (arch + ".embedding_length", "u32", H),
           (arch + ".feed_forward_length", "u32", c["intermediate_size"]),
           (arch + ".attention.head_count", "u32", nh),
           (arch + ".attention.head_count_kv", "u32", nkv),
           (arch + ".rope.freq_base", "f32", theta),
           (arch + ".attention.layer_norm_rms_epsilon", "f32", c["rms_norm_eps"]),
           (arch + ".expert_count", "u32", E), (arch + ".expert_used_count", "u32", c["num_experts_per_tok"])]
    if qwen:
        kvs.append((arch + ".expert_feed_forward_length", "u32", I))
    if c["model_type"] == "qwen3_moe":
        kvs += [(arch + ".attention.key_length", "u32", hd), (arch + ".attention.value_length", "u32", hd)]
    if c["model_type"] == "qwen2_moe":
        kvs.append((arch + ".expert_shared_feed_forward_length", "u32", c["shared_expert_intermediate_size"]))
    if arch == "llama":
        kvs += [(arch + ".vocab_size", "u32", c["vocab_size"]), (arch + ".rope.dimension_count", "u32", hd)]
    kvs += list(tokenizer or []) + list(extra_kvs)
    t = _ST_TO_GGML[dtype]
    tensors = []
    for name, st_dtype, shape, data in dense:
        if name in drop:
            continue
        gt = _ST_TO_GGML[st_dtype]
        ne = list(reversed(shape))
        if arch == "llama" and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            heads = nh if ".q_proj." in name else nkv
            data = permute_rows(data, shape[0], heads, row_bytes(gt, shape[1]))
        tensors.append((gguf_name(name), gt, ne, data))
    for l in range(c["num_hidden_layers"]):
        for k, (part, ne) in enumerate((("gate", [H, I, E]), ("up", [H, I, E]), ("down", [I, H, E]))):
            tensors.append(("blk.%d.ffn_%s_exps.weight" % (l, part), t, ne,
                            b"".join(experts[(l, e)][k] for e in range(E))))
    return kvs, tensors


def tokenizer_kvs(tokens, merges, template):
    """The tokenizer.* keys of a byte-level BPE (gpt2-style) tokenizer."""
    return [("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.pre", "str", "qwen2"),
            ("tokenizer.ggml.tokens", "arr", ("str", tokens)),
            ("tokenizer.ggml.token_type", "arr", ("i32", [1] * len(tokens))),
            ("tokenizer.ggml.merges", "arr", ("str", merges)),
            ("tokenizer.ggml.bos_token_id", "u32", 1), ("tokenizer.ggml.eos_token_id", "u32", 2),
            ("tokenizer.ggml.add_bos_token", "bool", False),
            ("tokenizer.chat_template", "str", template)]
