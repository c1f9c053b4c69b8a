"""October 2026's K-quant weights (numba kernels): the host's repack of their blocks (ggml-hexagon.cpp:
repack_q4_K_tiled, repack_q6_K_tiled; host/kquants.py says what they make) and the HVX dot of Q6_K weights in
October's order (htp/hvx-mm-kernels-tiled.h: tiled_vec_dot_q6_k_32x1, accum_q6_k_32x1, scale_q6_k_32x1): Q6_K has
no x4x2 form for the native HVX dot family (kernels/hvx), whose 32-element blocks carry one scale, while a Q6_K tile
carries one per 16 elements.

The Q6_K dot:
Per output (weight row n, activation row m), per 32-element tile b in K order, one fp32 accumulator from +0.0:
isum_lo, isum_hi = the exact int32 dots of elements 0..15 and 16..31 of the signed codes (q - 32) with the int8
activation quants; lo = f32(f32(isum_lo) * f32(S_lo * d_a)), hi likewise (the fp16 x fp16 scale products are
exact in fp32); acc = f32(acc + f32(lo + hi)). Explicit IEEE float32, no fastmath; the rows are independent, so
the thread split changes nothing.
"""

from __future__ import annotations

import numpy as np

from kazeia.backends.htp.kernels.rounding import _f32_bits
from kazeia.native.idioms import q4_k_scale_min, q6_k_code
from kazeia.native.portable import jit, prange

_f32, _i32, _u32 = np.float32, np.int32, np.uint32


@jit(cache=True, inline="always")
def f16_bits(x):
    """float32 -> its IEEE fp16 bits, rounded to nearest even, past 65504 to inf (ggml's GGML_FP32_TO_FP16 on the
    host; numpy's float32 -> float16), NaN kept as a NaN with the top payload bits."""
    u = _f32_bits(x)
    sign = _u32((u >> _u32(16)) & _u32(0x8000))
    a = _u32(u & _u32(0x7FFFFFFF))
    if a >= _u32(0x7F800000):
        if a == _u32(0x7F800000):
            return _u32(sign | _u32(0x7C00))
        m = _u32((a >> _u32(13)) & _u32(0x3FF))
        return _u32(sign | _u32(0x7C00) | (m if m else _u32(1)))
    if a >= _u32(0x47800000):
        return _u32(sign | _u32(0x7C00))
    if a >= _u32(0x38800000):  # normal fp16: rebias the exponent, round the 13 bits dropped to nearest even
        v = _u32(a - _u32(0x38000000))
        r = _u32(v >> _u32(13))
        rem = _u32(v & _u32(0x1FFF))
        if rem > _u32(0x1000) or (rem == _u32(0x1000) and (r & _u32(1))):
            r = _u32(r + _u32(1))  # (a carry out of the mantissa is the next binade, up to inf: right)
        return _u32(sign | r)
    return _u32(sign | _u32(np.rint(abs(x) * _f32(16777216.0))))  # subnormal: quanta of 2^-24, exact


@jit(parallel=True, cache=True)
def q4_k_as_q4_1(blk, lut, out):
    """Q4_K blocks (R, nsb, 144) -> the DSP's Q4_1 blocks (R, nsb*8, 20): D = fp16(f32(d) * sc), M = fp16(-f32(dmin)
    * m), then the 16 code bytes of ggml's Q4_1 (element i low nibble, i+16 high). lut: fp16 bits -> float32."""
    n_rows, nsb = blk.shape[0], blk.shape[1]
    for r in prange(n_rows):
        for s in range(nsb):
            d = lut[_i32(blk[r, s, 0]) | (_i32(blk[r, s, 1]) << 8)]
            dmin = lut[_i32(blk[r, s, 2]) | (_i32(blk[r, s, 3]) << 8)]
            for j in range(8):
                sc, m = q4_k_scale_min(blk, r, s, j)
                big_d = f16_bits(_f32(d * _f32(sc)))
                big_m = f16_bits(_f32(_f32(-dmin) * _f32(m)))
                o = s * 8 + j
                out[r, o, 0] = big_d & _u32(255)
                out[r, o, 1] = big_d >> _u32(8)
                out[r, o, 2] = big_m & _u32(255)
                out[r, o, 3] = big_m >> _u32(8)
                c = 16 + (j >> 1) * 32  # chunk j//2: sub-block j's codes in its low (even j) or high (odd) nibbles
                for i in range(16):
                    lo, hi = blk[r, s, c + i], blk[r, s, c + 16 + i]
                    if j & 1:
                        out[r, o, 4 + i] = (lo >> 4) | (hi & 0xF0)
                    else:
                        out[r, o, 4 + i] = (lo & 15) | ((hi & 15) << 4)


@jit(parallel=True, cache=True)
def q6_k_fields(blk, lut, codes, scales):
    """Q6_K blocks (R, nsb, 210) -> codes (R, nsb*256) int8 = q - 32 in element order (dequantize_row_q6_K's
    layout) and scales (R, nsb*16) float32 = the fp16 value of f32(d) * sc per 16 elements."""
    n_rows, nsb = blk.shape[0], blk.shape[1]
    for r in prange(n_rows):
        for s in range(nsb):
            d = lut[_i32(blk[r, s, 208]) | (_i32(blk[r, s, 209]) << 8)]
            for g in range(16):
                sc = _f32(np.int8(blk[r, s, 192 + g]))
                scales[r, s * 16 + g] = lut[f16_bits(_f32(d * sc))]
            for h in range(2):
                for j in range(4):
                    e = s * 256 + h * 128 + j * 32
                    for lane in range(32):
                        codes[r, e + lane] = np.int8(q6_k_code(blk, r, s, h, j, lane) - 32)


@jit(parallel=True, cache=True)
def hvx_dot_q6_k_seq(codes, scales, aq, ad, y):
    """codes (N, K) int8 (q - 32), scales (N, K/16) float32 (fp16 values S), aq (M, K) int8, ad (M, K/32) float32
    (fp16 values d_a) -> y (M, N) float32."""
    n_rows, k = codes.shape
    m_rows = aq.shape[0]
    for n in prange(n_rows):
        for m in range(m_rows):
            acc = _f32(0)
            for b in range(k // 32):
                lo = _i32(0)
                hi = _i32(0)
                for e in range(16):
                    lo += _i32(codes[n, 32 * b + e]) * _i32(aq[m, 32 * b + e])
                    hi += _i32(codes[n, 32 * b + 16 + e]) * _i32(aq[m, 32 * b + 16 + e])
                s_lo = _f32(scales[n, 2 * b] * ad[m, b])
                s_hi = _f32(scales[n, 2 * b + 1] * ad[m, b])
                acc = _f32(acc + _f32(_f32(_f32(lo) * s_lo) + _f32(_f32(hi) * s_hi)))
            y[m, n] = acc
