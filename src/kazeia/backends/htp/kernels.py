"""numba kernels of the HTP numerics, reading ggml blocks directly (no repacked or dequantized weight copies).

- `hmx_weight_rows`: the fp16 weight values the HMX dequant tasks write into weight tiles, for a range of rows.
- `hvx_dot`: the HVX vec_dot of int8 activations with the weight codes: exact int32 sub-block dots, fp32 scale
  products, 32 fp32 lanes, far / adjacent reduction trees (hvx_matmul.py gives the model).

All float arithmetic is explicit IEEE float32 (or float64 where the model says a sum is exact), with no
fastmath, so the results are bitwise those of the numpy formulation they replace (tests/test_htp_numerics.py).
Weight types are passed as small ints: 0 Q4_0, 1 Q4_1, 2 Q8_0, 3 IQ4_NL.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

f32, f64, i32, u32 = np.float32, np.float64, np.int32, np.uint32
KIND_Q4_0, KIND_Q4_1, KIND_Q8_0, KIND_IQ4_NL = 0, 1, 2, 3
U15, U4 = np.uint8(15), np.uint8(4)


@intrinsic
def _f32_bits(typingctx, x):
    """The IEEE bits of a float32 (an LLVM bitcast)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, u):
    """The float32 of IEEE bits: the low 32 bits of an integer (numba widens uint32 arithmetic), bitcast."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())
    return types.float32(u), codegen


@njit(cache=True, inline="always")
def round_f16_f32(x):
    """float32 -> float32 holding its fp16 RNE rounding, |x| > 65504 -> +-inf (round_fp16_hw), NaN kept.
    Normal fp16 range: the 13 low mantissa bits rounded away on the bits (ties to even); below 2^-14 the fp16
    quantum is 2^-24: rint(|x| * 2^24) * 2^-24, exact in float32. Every case is computed and one is selected
    (no branches, so loops over it vectorize)."""
    # every integer result is cast back to uint32 (numba computes in 64 bits otherwise: half the SIMD lanes)
    u = _f32_bits(x)
    sign = u32(u & u32(0x80000000))
    a = u32(u & u32(0x7FFFFFFF))
    normal = u32(u32(u32(a + u32(0xFFF)) + u32(u32(a >> u32(13)) & u32(1))) & u32(0xFFFFE000))
    tiny = _f32_bits(np.rint(abs(x) * f32(16777216.0)) * f32(5.9604644775390625e-08))
    r = normal if a >= u32(0x38800000) else tiny
    r = u32(0x7F800000) if a > u32(0x477FE000) else r
    r = a if a > u32(0x7F800000) else r
    return _bits_f32(u32(sign | r))


@njit(cache=True, inline="always")
def round_f16(v):
    """float64 -> float32 holding the fp16 RNE rounding of v; |v| > 65504 -> +-inf; NaN stays NaN."""
    if v != v:
        return f32(v)
    a = abs(v)
    if a > 65504.0:
        return f32(math.copysign(math.inf, v))
    if a == 0.0:
        return f32(v)
    _, e = math.frexp(a)  # a in [2^(e-1), 2^e): 11 significant bits -> ulp 2^(e-11), at least 2^-24
    sh = max(e - 11, -24)
    r = math.ldexp(np.rint(math.ldexp(a, -sh)), sh)
    return f32(math.copysign(r, v))


@njit(cache=True, inline="always")
def _code(blocks, n, b, j, off, kind):
    """Element j (0..31) of block b of row n: the 4-bit code (Q4 types) or the int8 value (Q8_0)."""
    if kind == KIND_Q8_0:
        return i32(np.int8(blocks[n, b, 2 + j]))
    q = blocks[n, b, off + (j & 15)]
    return i32(q >> 4) if j >= 16 else i32(q & 15)


@njit(parallel=True, cache=True)
def hmx_weight_rows(blocks, dbits, kind, iq4, lut, out):
    """ggml rows (R, nb, ts) -> out (R, nb, 32): fp16(q*d) (Q4_0 q-8, IQ4_NL table value, Q8_0 q), or
    fp16(fp16(q*d) + m) for Q4_1 (the products are exact in float32; the fp16 + fp16 sum is exact in float64,
    and rounded from there once)."""
    r, nb = blocks.shape[0], blocks.shape[1]
    for n in prange(r):
        for b in range(nb):
            d = lut[dbits[n, b, 0]]
            if kind == KIND_Q4_0:
                for j in range(16):
                    q = blocks[n, b, 2 + j]
                    out[n, b, j] = round_f16_f32(f32(i32(q & U15) - i32(8)) * d)
                    out[n, b, 16 + j] = round_f16_f32(f32(i32(q >> U4) - i32(8)) * d)
            elif kind == KIND_Q8_0:
                for j in range(32):
                    out[n, b, j] = round_f16_f32(f32(np.int8(blocks[n, b, 2 + j])) * d)
            elif kind == KIND_IQ4_NL:
                for j in range(16):
                    q = blocks[n, b, 2 + j]
                    out[n, b, j] = round_f16_f32(f32(iq4[q & U15]) * d)
                    out[n, b, 16 + j] = round_f16_f32(f32(iq4[q >> U4]) * d)
            else:
                m = f64(lut[dbits[n, b, 1]])
                for j in range(32):
                    c = _code(blocks, n, b, j, 4, KIND_Q4_1)
                    out[n, b, j] = round_f16(f64(round_f16_f32(f32(c) * d)) + m)


@njit(cache=True, inline="always")
def _reduce(acc, v, adjacent):
    """32 fp32 lanes -> one (v: scratch): pairwise tree adding lanes 16 apart first (far) or neighbours first
    (adjacent)."""
    v[:] = acc
    if adjacent:
        d = 1
        while d < 32:
            for i in range(0, 32, 2 * d):
                v[i] = v[i] + v[i + d]
            d *= 2
    else:
        h = 16
        while h >= 1:
            for i in range(h):
                v[i] = v[i] + v[i + h]
            h //= 2
    return v[0]


ROW_CHUNK = 16  # weight rows per parallel task in hvx_dot (even: rows go in pairs)
PAIR_MAX_M = 4  # up to this many activation rows the codes are read from the blocks for each; past it, once
U15, U4 = np.uint8(15), np.uint8(4)


@njit(cache=True, inline="always")
def _q4_pair(blocks, n, n1, b, aq, m, off, bias, t0, t1):
    """Exact int32 dots of block b of rows n and n1 (4-bit codes minus `bias`) with activation row m."""
    for j in range(16):
        q0 = blocks[n, b, off + j]
        q1 = blocks[n1, b, off + j]
        xa = i32(aq[m, b, j])
        xb = i32(aq[m, b, 16 + j])
        t0[j] = (i32(q0 & U15) - bias) * xa + (i32(q0 >> U4) - bias) * xb
        t1[j] = (i32(q1 & U15) - bias) * xa + (i32(q1 >> U4) - bias) * xb
    s0 = i32(0)
    s1 = i32(0)
    for j in range(16):
        s0 += t0[j]
        s1 += t1[j]
    return s0, s1


@njit(cache=True, inline="always")
def _q8_pair(blocks, n, n1, b, aq, m, t0, t1):
    for j in range(16):
        xa = i32(aq[m, b, j])
        xb = i32(aq[m, b, 16 + j])
        t0[j] = i32(np.int8(blocks[n, b, 2 + j])) * xa + i32(np.int8(blocks[n, b, 18 + j])) * xb
        t1[j] = i32(np.int8(blocks[n1, b, 2 + j])) * xa + i32(np.int8(blocks[n1, b, 18 + j])) * xb
    s0 = i32(0)
    s1 = i32(0)
    for j in range(16):
        s0 += t0[j]
        s1 += t1[j]
    return s0, s1


@njit(cache=True, inline="always")
def _table_pair(blocks, n, n1, b, aq, m, iq4):
    s0 = i32(0)
    s1 = i32(0)
    for j in range(32):
        x = i32(aq[m, b, j])
        s0 += i32(iq4[_code(blocks, n, b, j, 2, KIND_IQ4_NL)]) * x
        s1 += i32(iq4[_code(blocks, n1, b, j, 2, KIND_IQ4_NL)]) * x
    return s0, s1


@njit(parallel=True, cache=True)
def hvx_dot(blocks, dbits, kind, iq4, lut, aq, ad, asum, y):
    """y (M, N) = HVX MUL_MAT of ggml rows (N, nb, ts) with q8 activations aq (M, nb, 32) int8, scales ad
    (M, nb) and, for Q4_1, sums asum (M, nb) (float32 of fp16 values). Lane L of the 32-lane accumulator owns
    sub-blocks L, L+32, ...: acc_L = fp32(acc_L + fp32(ia * fp32(d_w * d_x))) [Q4_1: + fp32(m_w * s_x) first],
    ia the exact int32 dot of the block. The last row of an odd N reduces with the adjacent tree (the 1x1
    kernel), every other with the far tree. Rows go in pairs (they share the activation loads); an odd last
    row is computed twice and stored once."""
    n_rows, nb = blocks.shape[0], blocks.shape[1]
    m_rows = aq.shape[0]
    if m_rows > PAIR_MAX_M:
        _hvx_dot_decoded(blocks, dbits, kind, iq4, lut, aq, ad, asum, y)
        return
    for c in prange((n_rows + ROW_CHUNK - 1) // ROW_CHUNK):
        acc0 = np.empty(32, np.float32)
        acc1 = np.empty(32, np.float32)
        tmp = np.empty(32, np.float32)
        t0 = np.empty(16, np.int32)
        t1 = np.empty(16, np.int32)
        for n in range(c * ROW_CHUNK, min(n_rows, c * ROW_CHUNK + ROW_CHUNK), 2):
            n1 = min(n + 1, n_rows - 1)
            for m in range(m_rows):
                acc0[:] = 0
                acc1[:] = 0
                for b in range(nb):
                    if kind == KIND_Q4_0:
                        ia0, ia1 = _q4_pair(blocks, n, n1, b, aq, m, 2, i32(8), t0, t1)
                    elif kind == KIND_Q4_1:
                        ia0, ia1 = _q4_pair(blocks, n, n1, b, aq, m, 4, i32(0), t0, t1)
                    elif kind == KIND_Q8_0:
                        ia0, ia1 = _q8_pair(blocks, n, n1, b, aq, m, t0, t1)
                    else:
                        ia0, ia1 = _table_pair(blocks, n, n1, b, aq, m, iq4)
                    v0 = f32(ia0) * (ad[m, b] * lut[dbits[n, b, 0]])
                    v1 = f32(ia1) * (ad[m, b] * lut[dbits[n1, b, 0]])
                    if kind == KIND_Q4_1:
                        v0 = v0 + asum[m, b] * lut[dbits[n, b, 1]]
                        v1 = v1 + asum[m, b] * lut[dbits[n1, b, 1]]
                    acc0[b % 32] = acc0[b % 32] + v0
                    acc1[b % 32] = acc1[b % 32] + v1
                y[m, n] = _reduce(acc0, tmp, n_rows % 2 == 1 and n == n_rows - 1)
                if n1 != n:
                    y[m, n1] = _reduce(acc1, tmp, n_rows % 2 == 1 and n1 == n_rows - 1)


@njit(parallel=True, cache=True)
def _hvx_dot_decoded(blocks, dbits, kind, iq4, lut, aq, ad, asum, y):
    """hvx_dot for many activation rows: each weight row's operands are decoded once (codes as the vrmpy
    sees them, scales widened), then every activation row goes through them. Same arithmetic."""
    n_rows, nb = blocks.shape[0], blocks.shape[1]
    m_rows = aq.shape[0]
    off = 4 if kind == KIND_Q4_1 else 2
    for c in prange((n_rows + ROW_CHUNK - 1) // ROW_CHUNK):
        w = np.empty((nb, 32), np.int32)
        dw = np.empty(nb, np.float32)
        mw = np.empty(nb, np.float32)
        acc = np.empty(32, np.float32)
        tmp = np.empty(32, np.float32)
        t = np.empty(32, np.int32)
        for n in range(c * ROW_CHUNK, min(n_rows, c * ROW_CHUNK + ROW_CHUNK)):
            for b in range(nb):
                dw[b] = lut[dbits[n, b, 0]]
                mw[b] = lut[dbits[n, b, 1]] if kind == KIND_Q4_1 else f32(0)
                for j in range(32):
                    cj = _code(blocks, n, b, j, off, kind)
                    if kind == KIND_Q4_0:
                        cj = cj - 8
                    elif kind == KIND_IQ4_NL:
                        cj = i32(iq4[cj])
                    w[b, j] = cj
            adjacent = n_rows % 2 == 1 and n == n_rows - 1
            for m in range(m_rows):
                acc[:] = 0
                for b in range(nb):
                    for j in range(32):
                        t[j] = w[b, j] * i32(aq[m, b, j])
                    ia = i32(0)
                    for j in range(32):
                        ia += t[j]
                    v = f32(ia) * (ad[m, b] * dw[b])
                    if kind == KIND_Q4_1:
                        v = v + asum[m, b] * mw[b]
                    acc[b % 32] = acc[b % 32] + v
                y[m, n] = _reduce(acc, tmp, adjacent)
