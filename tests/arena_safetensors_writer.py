"""arena_safetensors_writer.py: writes small safetensors files and sharded
folders for the arena's tests. Standard library only.

    u64 little-endian header length N, N bytes of JSON (padded with spaces
    to a multiple of 8), then the tensor data; data_offsets are relative to
    the first byte after the header.
"""
import json
import os
import struct

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
              "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def nbytes(dtype, shape):
    n = DTYPE_SIZE[dtype]
    for d in shape:
        n *= d
    return n


def write_safetensors(path, tensors, metadata=None):
    """tensors: (name, dtype, shape, data). Returns {name: (offset, bytes)}
    with absolute file offsets."""
    header = {}
    pos = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    if metadata is not None:
        header["__metadata__"] = metadata
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj)
        for _, _, _, data in tensors:
            f.write(data)
    base = 8 + len(hj)
    return {name: (base + header[name]["data_offsets"][0], len(data))
            for name, _, _, data in tensors}


def moe_tensors(rng, layers=2, experts=4, d_model=64, d_ff=128, dtype="BF16",
                router_dtype="F32", norm=True, mixtral=False, extras=True):
    """[(name, dtype, shape, data)] of a small Hugging Face MoE model."""
    out = []
    if extras:
        out.append(("model.embed_tokens.weight", dtype, [32, d_model],
                    rng.randbytes(nbytes(dtype, [32, d_model]))))
    for l in range(layers):
        p = "model.layers.%d." % l
        if extras:
            out.append((p + "input_layernorm.weight", "F32", [d_model],
                        rng.randbytes(4 * d_model)))
        if norm:
            out.append((p + "post_attention_layernorm.weight", "F32", [d_model],
                        rng.randbytes(4 * d_model)))
        moe = p + ("block_sparse_moe." if mixtral else "mlp.")
        out.append((moe + "gate.weight", router_dtype, [experts, d_model],
                    rng.randbytes(nbytes(router_dtype, [experts, d_model]))))
        for e in range(experts):
            names = (["w1", "w3", "w2"] if mixtral else ["gate_proj", "up_proj", "down_proj"])
            shapes = [[d_ff, d_model], [d_ff, d_model], [d_model, d_ff]]
            for n, s in zip(names, shapes):
                out.append(("%sexperts.%d.%s.weight" % (moe, e, n), dtype, s,
                            rng.randbytes(nbytes(dtype, s))))
    return out


def write_sharded(folder, tensors, shards=3, metadata=None):
    """Spreads tensors over `shards` files with an index; returns
    {name: (file path, offset, bytes)}."""
    os.makedirs(folder, exist_ok=True)
    per = (len(tensors) + shards - 1) // shards
    weight_map, where = {}, {}
    for i in range(shards):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        part = tensors[i * per:(i + 1) * per]
        lay = write_safetensors(os.path.join(folder, fn), part, metadata)
        for name, (off, n) in lay.items():
            weight_map[name] = fn
            where[name] = (os.path.join(folder, fn), off, n)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(v[2] for v in where.values())},
                   "weight_map": weight_map}, f)
    return where


# ---- whole models, as Hugging Face transformers 5 writes them ----------------

ARCHS = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")


def hf_config(arch, layers=2, experts=4, top_k=2, hidden=64, heads=4, kv_heads=2, head_dim=16,
              moe_ff=32, shared_ff=48, vocab=96, tie=False):
    """config.json of a small model, with the fields transformers 5.17 writes."""
    c = {"architectures": [{"qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                            "mixtral": "MixtralForCausalLM", "olmoe": "OlmoeForCausalLM"}[arch]],
         "model_type": arch, "hidden_size": hidden, "num_hidden_layers": layers,
         "num_attention_heads": heads, "num_key_value_heads": kv_heads, "vocab_size": vocab,
         "num_experts_per_tok": top_k, "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
         "tie_word_embeddings": tie, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
         "rope_parameters": {"rope_theta": 1000000.0 if arch.startswith("qwen") else 10000.0,
                             "rope_type": "default"}}
    if arch == "qwen3_moe":
        c.update(head_dim=head_dim, moe_intermediate_size=moe_ff, intermediate_size=3 * moe_ff,
                 num_local_experts=experts, norm_topk_prob=True, decoder_sparse_step=1,
                 mlp_only_layers=[], use_sliding_window=False, attention_bias=False)
    elif arch == "qwen2_moe":
        c.update(moe_intermediate_size=moe_ff, intermediate_size=3 * moe_ff, num_experts=experts,
                 shared_expert_intermediate_size=shared_ff, norm_topk_prob=False, qkv_bias=True,
                 decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
                 sliding_window=0, layer_types=["full_attention"] * layers)
    elif arch == "mixtral":
        c.update(intermediate_size=moe_ff, num_local_experts=experts, head_dim=None,
                 sliding_window=None, router_jitter_noise=0.0)
    else:
        c.update(intermediate_size=moe_ff, num_experts=experts, norm_topk_prob=False,
                 clip_qkv=None, attention_bias=False)
    return c


def hf_shapes(c):
    """[(name, shape)] of every dense tensor of the model config c describes."""
    arch = c["model_type"]
    H = c["hidden_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or H // nh
    V = c["vocab_size"]
    out = [("model.embed_tokens.weight", [V, H]), ("model.norm.weight", [H])]
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", [V, H]))
    E = c.get("num_experts") or c.get("num_local_experts")
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        out += [(p + "input_layernorm.weight", [H]), (p + "post_attention_layernorm.weight", [H]),
                (p + "self_attn.q_proj.weight", [nh * hd, H]),
                (p + "self_attn.k_proj.weight", [nkv * hd, H]),
                (p + "self_attn.v_proj.weight", [nkv * hd, H]),
                (p + "self_attn.o_proj.weight", [H, nh * hd])]
        if arch == "qwen2_moe":
            out += [(p + "self_attn.q_proj.bias", [nh * hd]), (p + "self_attn.k_proj.bias", [nkv * hd]),
                    (p + "self_attn.v_proj.bias", [nkv * hd])]
            S = c["shared_expert_intermediate_size"]
            out += [(p + "mlp.shared_expert.gate_proj.weight", [S, H]),
                    (p + "mlp.shared_expert.up_proj.weight", [S, H]),
                    (p + "mlp.shared_expert.down_proj.weight", [H, S]),
                    (p + "mlp.shared_expert_gate.weight", [1, H])]
        if arch == "qwen3_moe":
            out += [(p + "self_attn.q_norm.weight", [hd]), (p + "self_attn.k_norm.weight", [hd])]
        if arch == "olmoe":
            out += [(p + "self_attn.q_norm.weight", [nh * hd]),
                    (p + "self_attn.k_norm.weight", [nkv * hd])]
        out.append((p + ("block_sparse_moe" if arch == "mixtral" else "mlp") + ".gate.weight", [E, H]))
    return out


def hf_model(rng, c, dtype="F32", fused=False):
    """(dense, experts): dense [(name, dtype, shape, data)]; experts
    {(layer, expert): (gate, up, down) bytes}; random bytes of `dtype`
    (norms and biases too, as transformers saves them)."""
    dense = [(n, dtype, s, rng.randbytes(nbytes(dtype, s))) for n, s in hf_shapes(c)]
    H = c["hidden_size"]
    I = c.get("moe_intermediate_size") if c["model_type"].startswith("qwen") else c["intermediate_size"]
    E = c.get("num_experts") or c.get("num_local_experts")
    experts = {}
    for l in range(c["num_hidden_layers"]):
        for e in range(E):
            experts[(l, e)] = tuple(rng.randbytes(nbytes(dtype, s)) for s in ([I, H], [I, H], [H, I]))
    return dense, experts


def hf_expert_tensors(c, experts, dtype="F32", fused=False):
    """The experts as safetensors tensors: one per expert and part, named as
    save_pretrained writes them (mixtral: block_sparse_moe.experts.E.w1/w3/w2),
    or fused per layer as transformers 5 holds them in memory
    (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I])."""
    H = c["hidden_size"]
    I = c.get("moe_intermediate_size") if c["model_type"].startswith("qwen") else c["intermediate_size"]
    E = c.get("num_experts") or c.get("num_local_experts")
    out = []
    for l in range(c["num_hidden_layers"]):
        if fused:
            p = "model.layers.%d.mlp.experts." % l
            gu = b"".join(experts[(l, e)][0] + experts[(l, e)][1] for e in range(E))
            dn = b"".join(experts[(l, e)][2] for e in range(E))
            out += [(p + "gate_up_proj", dtype, [E, 2 * I, H], gu), (p + "down_proj", dtype, [E, H, I], dn)]
            continue
        for e in range(E):
            if (l, e) not in experts:  # for tests of a missing expert
                continue
            g, u, d = experts[(l, e)]
            if c["model_type"] == "mixtral":
                p = "model.layers.%d.block_sparse_moe.experts.%d." % (l, e)
                out += [(p + "w1.weight", dtype, [I, H], g), (p + "w3.weight", dtype, [I, H], u),
                        (p + "w2.weight", dtype, [H, I], d)]
            else:
                p = "model.layers.%d.mlp.experts.%d." % (l, e)
                out += [(p + "gate_proj.weight", dtype, [I, H], g), (p + "up_proj.weight", dtype, [I, H], u),
                        (p + "down_proj.weight", dtype, [H, I], d)]
    return out


def write_hf_folder(folder, c, dense, experts, dtype="F32", fused=False, shards=1, extra=None,
                    tokenizer=None):
    """An HF folder: config.json, generation_config.json, the weights (one
    file or sharded with an index), and tokenizer files when given
    ({filename: text})."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "transformers_version": "5.17.0"}, f)
    for name, text in (tokenizer or {}).items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    tensors = dense + hf_expert_tensors(c, experts, dtype, fused) + (extra or [])
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), tensors, {"format": "pt"})
    else:
        write_sharded(folder, tensors, shards, {"format": "pt"})
