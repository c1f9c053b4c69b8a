"""The HVX dot of Q6_K weights in October 2026's order (htp/hvx-mm-kernels-tiled.h: tiled_vec_dot_q6_k_32x1,
accum_q6_k_32x1, scale_q6_k_32x1), a numba kernel: Q6_K has no x4x2 form for the native HVX dot family (kernels/hvx),
whose 32-element blocks carry one scale, while a Q6_K tile carries one per 16 elements.

Per output (weight row n, activation row m), per 32-element tile b in K order, one fp32 accumulator from +0.0:
isum_lo, isum_hi = the exact int32 dots of elements 0..15 and 16..31 of the signed codes (q - 32) with the int8
activation quants; lo = f32(f32(isum_lo) * f32(S_lo * d_a)), hi likewise (the fp16 x fp16 scale products are
exact in fp32); acc = f32(acc + f32(lo + hi)). Explicit IEEE float32, no fastmath; the rows are independent, so
the thread split changes nothing.
"""

from __future__ import annotations

import numpy as np

from kazeia.native.portable import jit, prange

_f32, _i32 = np.float32, np.int32


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
