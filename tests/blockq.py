"""blockq.py: ggml's blocks of 32 (q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4)
and super-blocks of 256 (q2_K, q3_K, iq4_xs) encoded and decoded in plain
Python, for tests that need quantized GGUF files and the values those
files hold (engine/model/fixtures/hf_to_gguf.py --quant). Standard library
only; written from the block formats (ggml's ggml-common.h) and what
dequantize_row_<type> of ggml-quants.c computes, not from Baton's C code:

    q4_0   f16 d, 16 bytes of nibbles      x = (q - 8) * d
    q4_1   f16 d, f16 m, nibbles           x = q * d + m
    q5_0   f16 d, u32 qh, nibbles          x = (q - 16) * d, bit i of qh
                                           the fifth bit of element i
    q5_1   f16 d, f16 m, u32 qh, nibbles   x = q * d + m
    iq4_nl f16 d, nibbles                  x = d * KV_IQ4NL[q]
    mxfp4  u8 e, nibbles                   x = KV_FP4[q] * 2^(e - 128)

Byte j of the nibbles holds element j (low) and j + 16 (high).

    q2_K   scales[16] (4-bit scale | 4-bit min << 4 per 16 elements),
           qs[64], f16 d, f16 dmin      x = (d * sc) * q - dmin * m
    q3_K   hmask[32], qs[64], scales[12] (sixteen 6-bit s), f16 d
                                        x = (d * (s - 32)) * (q - 4 * !h)
    iq4_xs f16 d, u16 scales_h, scales_l[4], qs[128]: eight blocks of 32,
           ls = low nibble | 2 bits << 4  x = (d * (ls - 32)) * KV_IQ4NL[q]
In q2_K and q3_K, element 128 n + 32 j + 16 h + l has its 2 bits at bit
2 j of qs[32 n + 16 h + l], its scale at 8 n + 2 j + h, and (q3_K) its
high bit at bit 4 n + j of hmask[16 h + l]. q3_K's scale i has its low
nibble in byte i % 8 (low nibble for i < 8, high for i >= 8) and its two
high bits at bit 2 (i // 4) of byte 8 + i % 4. Products
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
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18, "mxfp4": 17,
               "q2_K": 84, "q3_K": 110, "iq4_xs": 136}
BLOCK = {t: 256 if t in ("q2_K", "q3_K", "iq4_xs") else 32 for t in BLOCK_BYTES}


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
        if BLOCK[t] == 256:
            out += _decode_k(t, b)
            continue
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


def _decode_k(t, b):
    """One super-block of 256 of q2_K, q3_K or iq4_xs."""
    out = [0.0] * 256
    if t == "q2_K":
        sc, qs, d, dmin = b[0:16], b[16:80], f16_at(b, 80), f16_at(b, 82)
        for n in range(2):
            for j in range(4):
                for h in range(2):
                    s = sc[8 * n + 2 * j + h]
                    dl, ml = f32(d * (s & 15)), f32(dmin * (s >> 4))
                    for l in range(16):
                        q = (qs[32 * n + 16 * h + l] >> (2 * j)) & 3
                        out[128 * n + 32 * j + 16 * h + l] = f32(f32(dl * q) - ml)
    elif t == "q3_K":
        hm, qs, sb, d = b[0:32], b[32:96], b[96:108], f16_at(b, 108)
        s6 = [((sb[i % 8] >> (4 * (i // 8))) & 15) | (((sb[8 + i % 4] >> (2 * (i // 4))) & 3) << 4)
              for i in range(16)]
        for n in range(2):
            for j in range(4):
                for h in range(2):
                    dl = f32(d * (s6[8 * n + 2 * j + h] - 32))
                    for l in range(16):
                        q = (qs[32 * n + 16 * h + l] >> (2 * j)) & 3
                        hb = (hm[16 * h + l] >> (4 * n + j)) & 1
                        out[128 * n + 32 * j + 16 * h + l] = f32(dl * (q - (0 if hb else 4)))
    else:  # iq4_xs
        d, sh, sl, qs = f16_at(b, 0), struct.unpack_from("<H", b, 2)[0], b[4:8], b[8:136]
        for ib in range(8):
            ls = ((sl[ib // 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
            dl = f32(d * (ls - 32))
            for j in range(16):
                q = qs[16 * ib + j]
                out[32 * ib + j] = f32(dl * KV_IQ4NL[q & 15])
                out[32 * ib + 16 + j] = f32(dl * KV_IQ4NL[q >> 4])
    return out


def _encode_k(t, x):
    """256 floats as one super-block of t (a scale per group from its range,
    then the nearest values)."""
    if t == "iq4_xs":
        dls = [max(abs(v) for v in x[32 * i:32 * i + 32]) / 127 for i in range(8)]
        d = f16_round(max(dls) / 31)
        ls = [min(31, max(-32, round(dl / d))) + 32 if d else 32 for dl in dls]
        qs = bytearray(128)
        for ib in range(8):
            s = d * (ls[ib] - 32)
            q = [_nearest(KV_IQ4NL, v / s) if s else 8 for v in x[32 * ib:32 * ib + 32]]
            for j in range(16):
                qs[16 * ib + j] = q[j] | q[j + 16] << 4
        sh = sum((ls[ib] >> 4) << (2 * ib) for ib in range(8))
        sl = bytes((ls[2 * i] & 15) | (ls[2 * i + 1] & 15) << 4 for i in range(4))
        return f16_bytes(d) + struct.pack("<H", sh) + sl + bytes(qs)
    groups = [x[16 * g:16 * g + 16] for g in range(16)]
    # group g of the layout: element 128 n + 32 j + 16 h + l is in group 8 n + 2 j + h
    qs = bytearray(64)
    if t == "q2_K":
        mins = [-min(0.0, min(gr)) for gr in groups]
        dls = [(max(gr) + m) / 3 for gr, m in zip(groups, mins)]
        d, dmin = f16_round(max(dls) / 15), f16_round(max(mins) / 15)
        sc = [min(15, max(0, round(dl / d))) if d else 0 for dl in dls]
        mm = [min(15, max(0, round(m / dmin))) if dmin else 0 for m in mins]
        for g, gr in enumerate(groups):
            n, j, h = g // 8, (g % 8) // 2, g % 2
            step = d * sc[g]
            for l, v in enumerate(gr):
                q = min(3, max(0, round((v + dmin * mm[g]) / step))) if step else 0
                qs[32 * n + 16 * h + l] |= q << (2 * j)
        return bytes(s | m << 4 for s, m in zip(sc, mm)) + bytes(qs) + f16_bytes(d) + f16_bytes(dmin)
    # q3_K
    dls = [max(abs(v) for v in gr) / 4 for gr in groups]
    d = f16_round(max(dls) / 31)
    s6 = [min(31, max(-32, round(dl / d))) + 32 if d else 32 for dl in dls]
    hm = bytearray(32)
    for g, gr in enumerate(groups):
        n, j, h = g // 8, (g % 8) // 2, g % 2
        step = d * (s6[g] - 32)
        for l, v in enumerate(gr):
            q = min(3, max(-4, round(v / step))) + 4 if step else 4
            qs[32 * n + 16 * h + l] |= (q & 3) << (2 * j)
            if q >= 4:
                hm[16 * h + l] |= 1 << (4 * n + j)
    sb = bytearray(12)
    for i in range(16):
        sb[i % 8] |= (s6[i] & 15) << (4 * (i // 8))
        sb[8 + i % 4] |= (s6[i] >> 4) << (2 * (i // 4))
    return bytes(hm) + bytes(qs) + bytes(sb) + f16_bytes(d)


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
    """vals (a multiple of the block's floats) as blocks of type t."""
    assert len(vals) % BLOCK[t] == 0
    out = bytearray()
    if BLOCK[t] == 256:
        for o in range(0, len(vals), 256):
            out += _encode_k(t, vals[o:o + 256])
        return bytes(out)
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
