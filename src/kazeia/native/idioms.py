"""IR idioms more than one kernel family uses: ggml block readers, an 8x8 register transpose, an 8-way integer
tree; and the block reader's portable twin. Sizes, code offsets and code books come from gguf/quants.py.

Blocks (ggml): Q4_0 = fp16 d, 16 bytes of nibbles (low nibble = element j, high = element j+16), value d*(q-8);
Q4_1 = fp16 d, fp16 m, 16 bytes, value d*q + m; Q8_0 = fp16 d, 32 int8, value d*q; IQ4_NL = fp16 d, 16 bytes of
nibbles, value d*codebook[q].
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from kazeia.gguf.quants import IQ4_NL, code_offsets
from kazeia.native.irkit import V8I32, V16I8, V16I16, Kernel, lanes, splat
from kazeia.native.portable import jit

CODE_OFFSET = code_offsets(("q4_0", "q4_1", "q8_0", "iq4_nl"))


def nibbles_i16(k: Kernel, q: ir.Value) -> tuple[ir.Value, ir.Value]:
    """<n x i8> of packed nibbles -> (low nibbles, high nibbles) as two <n x i16>: one vpmovzxbw, then the nibbles
    in 16-bit lanes (opaque: LLVM would split the bytes first, 3 more ops)."""
    b = k.b
    t = ir.VectorType(ir.IntType(16), q.type.count)
    z = k.opaque(b.zext(q, t))
    return b.and_(z, splat(t, 15)), b.lshr(z, splat(t, 4))


def codes_i16(k: Kernel, kind: str, base: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The 32 codes of the block at `base` as two <16 x i16> (elements 0..15 and 16..31): Q8_0 its int8 values,
    Q4_0 / Q4_1 the raw nibbles (Q4_0's -8 is the caller's)."""
    b = k.b
    if kind == "q8_0":
        lo = b.sext(k.load_vec(base, V16I8, 2), V16I16)
        hi = b.sext(k.load_vec(base, V16I8, 18), V16I16)
        return lo, hi
    return nibbles_i16(k, k.load_vec(base, V16I8, 4 if kind == "q4_1" else 2))


def codes_i8(k: Kernel, kind: str, base: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Block codes as the operand the HTP hardware sees, two <16 x i8> (elements 0..15, 16..31): Q4_0 q-8,
    Q4_1 q, Q8_0 q, IQ4_NL the code book value."""
    b = k.b
    if kind == "q8_0":
        return k.load_vec(base, V16I8, 2), k.load_vec(base, V16I8, 18)
    q = k.load_vec(base, V16I8, CODE_OFFSET[kind])
    lo, hi = b.and_(q, splat(V16I8, 15)), b.lshr(q, splat(V16I8, 4))
    if kind == "q4_0":
        return b.sub(lo, splat(V16I8, 8)), b.sub(hi, splat(V16I8, 8))
    if kind == "iq4_nl":
        table = lanes(V16I8, IQ4_NL.codebook)
        return (k.call("llvm.x86.ssse3.pshuf.b.128", V16I8, table, lo),
                k.call("llvm.x86.ssse3.pshuf.b.128", V16I8, table, hi))
    return lo, hi


def tree8(k: Kernel, ps: list[ir.Value]) -> ir.Value:
    """8 x <8 x i32> -> <8 x i32> whose lane r is the sum of the lanes of ps[r] (integers: exact in any order)."""
    b = k.b
    hadd = lambda u, v: k.call("llvm.x86.avx2.phadd.d", V8I32, u, v)  # noqa: E731
    h01, h23, h45, h67 = hadd(ps[0], ps[1]), hadd(ps[2], ps[3]), hadd(ps[4], ps[5]), hadd(ps[6], ps[7])
    lo, hi = hadd(h01, h23), hadd(h45, h67)  # lane j: row j%4 (+4 for hi), half j//4 of its lanes
    return b.add(k.shuffle(lo, hi, [0, 1, 2, 3, 8, 9, 10, 11]), k.shuffle(lo, hi, [4, 5, 6, 7, 12, 13, 14, 15]))


def transpose8(k: Kernel, rows: list[ir.Value]) -> list[ir.Value]:
    """8 x <8 x i32> -> their transpose (vector c = lane c of every row)."""
    t = []
    for i in range(0, 8, 2):
        t.append(k.shuffle(rows[i], rows[i + 1], [0, 8, 1, 9, 4, 12, 5, 13]))
        t.append(k.shuffle(rows[i], rows[i + 1], [2, 10, 3, 11, 6, 14, 7, 15]))
    u = []
    for i in range(0, 8, 4):
        for j in range(2):
            u.append(k.shuffle(t[i + j], t[i + 2 + j], [0, 1, 8, 9, 4, 5, 12, 13]))
            u.append(k.shuffle(t[i + j], t[i + 2 + j], [2, 3, 10, 11, 6, 7, 14, 15]))
    out = [None] * 8
    for c in range(4):
        out[c] = k.shuffle(u[c], u[4 + c], [0, 1, 2, 3, 8, 9, 10, 11])
        out[c + 4] = k.shuffle(u[c], u[4 + c], [4, 5, 6, 7, 12, 13, 14, 15])
    return out


# --- the portable twin of the block readers: type codes of the twins' `kind` argument -----------------------

KIND_Q4_0, KIND_Q4_1, KIND_Q8_0, KIND_IQ4_NL = 0, 1, 2, 3
KIND_CODE = {"q4_0": KIND_Q4_0, "q4_1": KIND_Q4_1, "q8_0": KIND_Q8_0, "iq4_nl": KIND_IQ4_NL}
IQ4_NL_VALUES = np.array(IQ4_NL.codebook, dtype=np.int8)
_i32 = np.int32


@jit(cache=True)
def block_code(blocks, n, b, j, off, kind):
    """Element j (0..31) of block b of row n of ggml blocks (R, nb, type_size): the 4-bit code (Q4 types, codes
    from byte `off`) or the int8 value (Q8_0)."""
    if kind == KIND_Q8_0:
        return _i32(np.int8(blocks[n, b, 2 + j]))
    q = blocks[n, b, off + (j & 15)]
    return _i32(q >> 4) if j >= 16 else _i32(q & 15)




@jit(cache=True, inline="always")
def q4_k_scale_min(blocks, n, s, j):
    """ggml's get_scale_min_k4: the six-bit (scale, min) of sub-block j (0..7) of Q4_K block s of row n (blocks
    (R, nsb, 144); the 12 packed bytes at 4..15)."""
    if j < 4:
        return _i32(blocks[n, s, 4 + j] & 63), _i32(blocks[n, s, 8 + j] & 63)
    sc = _i32(blocks[n, s, 8 + j] & 15) | (_i32(blocks[n, s, j] >> 6) << 4)
    m = _i32(blocks[n, s, 8 + j] >> 4) | (_i32(blocks[n, s, 4 + j] >> 6) << 4)
    return sc, m


@jit(cache=True, inline="always")
def q6_k_code(blocks, n, s, h, j, lane):
    """The unsigned six-bit code (0..63) of element h*128 + j*32 + lane of Q6_K block s of row n (blocks (R, nsb,
    210)), in dequantize_row_q6_K's layout: in half h, group j (0..3) takes its low 4 bits from ql (groups 1 and 3
    32 bytes on; groups 2 and 3 the high nibble) and its top 2 bits from qh at bit 2j. (Callers loop j outside lane:
    the branches on j then leave the inner loop.)"""
    ql = _i32(blocks[n, s, h * 64 + lane + 32 * (j & 1)])
    low = (ql >> 4) if j >= 2 else (ql & 15)
    return low | (((_i32(blocks[n, s, 128 + h * 32 + lane]) >> (2 * j)) & 3) << 4)
