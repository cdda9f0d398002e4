"""blockq.py: ggml's blocks of 32 (q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4)
encoded and decoded in plain Python, for tests that need quantized GGUF
files and the values those files hold (engine/model/fixtures/hf_to_gguf.py
--quant). Standard library only; written from the block formats (ggml's
ggml-common.h) and what dequantize_row_<type> of ggml-quants.c computes,
not from Baton's C code:

    q4_0   f16 d, 16 bytes of nibbles      x = (q - 8) * d
    q4_1   f16 d, f16 m, nibbles           x = q * d + m
    q5_0   f16 d, u32 qh, nibbles          x = (q - 16) * d, bit i of qh
                                           the fifth bit of element i
    q5_1   f16 d, f16 m, u32 qh, nibbles   x = q * d + m
    iq4_nl f16 d, nibbles                  x = d * KV_IQ4NL[q]
    mxfp4  u8 e, nibbles                   x = KV_FP4[q] * 2^(e - 128)

Byte j of the nibbles holds element j (low) and j + 16 (high). Products
and sums are rounded to f32 as ggml's float arithmetic does (each value is
one f32 product, or a product and a sum, each rounded once: a double
computes them exactly here, then one rounding to f32).

The encoders are simple (nearest value for a scale from the block's range),
not llama-quantize's search: any valid block does for a test.
"""
import math
import struct

KV_IQ4NL = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
KV_FP4 = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18, "mxfp4": 17}


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f16_round(x):
    return struct.unpack("<e", struct.pack("<e", x))[0]


def f16_bytes(x):
    return struct.pack("<e", x)


def f16_at(b, o):
    return struct.unpack_from("<e", b, o)[0]


def e8m0_half(e):
    return math.ldexp(1.0, e - 128)


def decode(t, data):
    """The f32 values (as Python floats) of `data` in ggml type t."""
    if t == "f32":
        return list(struct.unpack("<%df" % (len(data) // 4), data))
    if t == "f16":
        return list(struct.unpack("<%de" % (len(data) // 2), data))
    if t == "bf16":
        hs = struct.unpack("<%dH" % (len(data) // 2), data)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in hs]
    bb = BLOCK_BYTES[t]
    assert len(data) % bb == 0, (t, len(data))
    out = []
    for o in range(0, len(data), bb):
        b = data[o:o + bb]
        if t == "mxfp4":
            d, qs = e8m0_half(b[0]), b[1:17]
        elif t in ("q4_1", "q5_1"):
            d, m = f16_at(b, 0), f16_at(b, 2)
        else:
            d = f16_at(b, 0)
        if t in ("q5_0", "q5_1"):
            qh = struct.unpack_from("<I", b, 2 if t == "q5_0" else 4)[0]
            qs = b[6:22] if t == "q5_0" else b[8:24]
        elif t in ("q4_0", "iq4_nl"):
            qs = b[2:18]
        elif t == "q4_1":
            qs = b[4:20]
        q = [qs[j] & 15 for j in range(16)] + [qs[j] >> 4 for j in range(16)]
        if t in ("q5_0", "q5_1"):
            q = [q[i] | ((qh >> i) & 1) << 4 for i in range(32)]
        for i in range(32):
            if t == "q4_0":
                v = f32((q[i] - 8) * d)
            elif t == "q5_0":
                v = f32((q[i] - 16) * d)
            elif t in ("q4_1", "q5_1"):
                v = f32(f32(q[i] * d) + m)
            elif t == "iq4_nl":
                v = f32(d * KV_IQ4NL[q[i]])
            else:
                v = f32(KV_FP4[q[i]] * d)
            out.append(v)
    return out


def _nearest(table, x):
    return min(range(len(table)), key=lambda k: (abs(table[k] - x), k))


def _pack(q, head, t):
    """The block's bytes: head, then qh for the 5-bit types, then nibbles."""
    out = bytearray(head)
    if t in ("q5_0", "q5_1"):
        out += struct.pack("<I", sum(((q[i] >> 4) & 1) << i for i in range(32)))
    out += bytes((q[j] & 15) | (q[j + 16] & 15) << 4 for j in range(16))
    return bytes(out)


def encode(t, vals):
    """vals (a multiple of 32 floats) as blocks of type t."""
    assert len(vals) % 32 == 0
    out = bytearray()
    for o in range(0, len(vals), 32):
        x = vals[o:o + 32]
        amax, lo, hi = max(abs(v) for v in x), min(x), max(x)
        if t in ("q4_0", "q5_0"):
            top = 7 if t == "q4_0" else 15
            d = f16_round(amax / top)
            off = 8 if t == "q4_0" else 16
            q = [min(2 * off - 1, max(0, round(v / d) + off)) if d else off for v in x]
            out += _pack(q, f16_bytes(d), t)
        elif t in ("q4_1", "q5_1"):
            top = 15 if t == "q4_1" else 31
            m = f16_round(lo)
            d = f16_round((hi - m) / top)
            q = [min(top, max(0, round((v - m) / d))) if d else 0 for v in x]
            out += _pack(q, f16_bytes(d) + f16_bytes(m), t)
        elif t == "iq4_nl":
            d = f16_round(amax / 127)
            q = [_nearest(KV_IQ4NL, v / d) if d else 8 for v in x]
            out += _pack(q, f16_bytes(d), t)
        elif t == "mxfp4":
            e = 0
            if amax > 0:
                e = min(254, max(0, math.ceil(math.log2(amax / 12)) + 128))
            s = e8m0_half(e)
            q = [_nearest(KV_FP4, v / s) for v in x]
            out += _pack(q, bytes([e]), t)
        else:
            raise ValueError("blockq: no encoder for " + t)
    return bytes(out)
