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
    Normal fp16 range: round the 13 low mantissa bits away on the bits (ties to even); below 2^-14 the fp16
    quantum is 2^-24: rint(x * 2^24) * 2^-24, exact in float32."""
    u = _f32_bits(x)
    sign = u & u32(0x80000000)
    a = u & u32(0x7FFFFFFF)
    if a > u32(0x7F800000):
        return x
    if a > u32(0x477FE000):
        return _bits_f32(sign | u32(0x7F800000))
    if a >= u32(0x38800000):
        a = (a + u32(0xFFF) + ((a >> u32(13)) & u32(1))) & u32(0xFFFFE000)
        return _bits_f32(sign | a)
    r = np.rint(abs(x) * f32(16777216.0)) * f32(5.9604644775390625e-08)
    return -r if sign else r


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
    off = 4 if kind == KIND_Q4_1 else 2
    for n in prange(r):
        for b in range(nb):
            d32 = lut[dbits[n, b, 0]]
            m = f64(lut[dbits[n, b, 1]]) if kind == KIND_Q4_1 else 0.0
            for j in range(32):
                c = _code(blocks, n, b, j, off, kind)
                if kind == KIND_Q4_0:
                    v = round_f16_f32(f32(c - 8) * d32)
                elif kind == KIND_IQ4_NL:
                    v = round_f16_f32(f32(iq4[c]) * d32)
                elif kind == KIND_Q8_0:
                    v = round_f16_f32(f32(c) * d32)
                else:
                    v = round_f16(f64(round_f16_f32(f32(c) * d32)) + m)
                out[n, b, j] = v


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


ROW_CHUNK = 16  # weight rows per parallel task in hvx_dot


@njit(parallel=True, cache=True)
def hvx_dot(blocks, dbits, kind, iq4, lut, aq, ad, asum, y):
    """y (M, N) = HVX MUL_MAT of ggml rows (N, nb, ts) with q8 activations aq (M, nb, 32) int8, scales ad
    (M, nb) and, for Q4_1, sums asum (M, nb) (float32 of fp16 values). Lane L of the 32-lane accumulator owns
    sub-blocks L, L+32, ...: acc_L = fp32(acc_L + fp32(ia * fp32(d_w * d_x))) [Q4_1: + fp32(m_w * s_x) first],
    ia the exact int32 dot of the block. The last row of an odd N reduces with the adjacent tree (the 1x1
    kernel), every other with the far tree."""
    n_rows, nb = blocks.shape[0], blocks.shape[1]
    m_rows = aq.shape[0]
    off = 4 if kind == KIND_Q4_1 else 2
    for c in prange((n_rows + ROW_CHUNK - 1) // ROW_CHUNK):
        w = np.empty((nb, 32), np.int32)
        dw = np.empty(nb, np.float32)
        mw = np.empty(nb, np.float32)
        acc = np.empty(32, np.float32)
        tmp = np.empty(32, np.float32)
        for n in range(c * ROW_CHUNK, min(n_rows, c * ROW_CHUNK + ROW_CHUNK)):
            for b in range(nb):  # the row's operands: codes as the vrmpy sees them, scales widened
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
                    ia = i32(0)
                    for j in range(32):
                        ia = i32(ia + w[b, j] * i32(aq[m, b, j]))
                    t = f32(ia) * (ad[m, b] * dw[b])
                    if kind == KIND_Q4_1:
                        t = t + asum[m, b] * mw[b]
                    acc[b % 32] = acc[b % 32] + t
                y[m, n] = _reduce(acc, tmp, adjacent)
