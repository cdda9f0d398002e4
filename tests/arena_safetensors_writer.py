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
