"""numba kernels of qmatmul.py: activation quantization, GEMVs on Q4_0 / Q4_1 / Q8_0 blocks, tile dequantizers.

Written for LLVM's vectorizers: integer products are kept in int32 explicitly (numba widens small integers to
int64 otherwise, which defeats SIMD), and each block's 16 lanes are independent (no float reduction inside a
block: the float sums keep a fixed lane order, so no fastmath is needed or used). The activations are int16
(scale amax/32767): on AVX2 the products run in 8 x int32 lanes whether x is int8 or int16, so the finer
activations cost nothing and keep the GEMV within ~1e-9 NMSE of the float product.

Blocks (ggml): Q4_0 = fp16 d, 16 bytes of nibbles (low nibble = element j, high = element j+16), value
d*(q-8); Q4_1 = fp16 d, fp16 m, 16 bytes, value d*q + m; Q8_0 = fp16 d, 32 int8, value d*q.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

i16, i32, f32 = np.int16, np.int32, np.float32
U15, U4 = np.uint8(15), np.uint8(4)
ROW_CHUNK = 32


@njit(parallel=True, cache=True)
def quantize_x(x, xq, xd, xs):
    """x (M, nb, 32) float32 -> xq int16 codes in [-32767, 32767], xd float32 scales (amax / 32767), xs int32
    sums of the codes. A block holding inf or NaN gets xd = NaN, so its products stay non-finite."""
    m, nb = x.shape[0], x.shape[1]
    for i in prange(m * nb):
        r, b = i // nb, i % nb
        amax = f32(0.0)
        bad = False
        for j in range(32):
            v = x[r, b, j]
            if v != v or v == np.inf or v == -np.inf:
                bad = True
            a = abs(v)
            if a > amax:
                amax = a
        s = i32(0)
        if bad or amax == 0:
            xd[r, b] = np.nan if bad else f32(0.0)
            for j in range(32):
                xq[r, b, j] = 0
        else:
            d = amax / f32(32767.0)
            inv = f32(1.0) / d
            xd[r, b] = d
            for j in range(32):
                q = i16(min(max(np.rint(x[r, b, j] * inv), f32(-32767.0)), f32(32767.0)))
                xq[r, b, j] = q
                s += i32(q)
        xs[r, b] = s


@njit(parallel=True, cache=True)
def gemv_q4_0(w, d, xq, xd, y, lut):
    """y (M, N) = x @ W^T, W Q4_0 blocks w (N, nb, 18) uint8 / d (N, nb, 9) uint16; x as quantize_x gives it.
    Lane j of a block holds the exact int32 (q_j - 8) x_j + (q_j+16 - 8) x_j+16, scaled by d_w d_x in float32."""
    n_rows, nb = w.shape[0], w.shape[1]
    m_rows = xq.shape[0]
    for c in prange((n_rows + ROW_CHUNK - 1) // ROW_CHUNK):
        sc = np.empty(nb, np.float32)  # d_w * d_x per block, gathered first: the block loop vectorizes better
        acc = np.empty(16, np.float32)
        for m in range(m_rows):
            for n in range(c * ROW_CHUNK, min(n_rows, c * ROW_CHUNK + ROW_CHUNK)):
                for b in range(nb):
                    sc[b] = lut[d[n, b, 0]] * xd[m, b]
                acc[:] = 0
                for b in range(nb):
                    sb = sc[b]
                    for j in range(16):
                        q = w[n, b, 2 + j]
                        t = (i32(q & U15) - i32(8)) * i32(xq[m, b, j]) + (i32(q >> U4) - i32(8)) * i32(xq[m, b, 16 + j])
                        acc[j] += sb * f32(i32(t))
                s = f32(0)
                for j in range(16):
                    s += acc[j]
                y[m, n] = s


@njit(parallel=True, cache=True)
def gemv_q4_1(w, d, xq, xd, xs, y, lut):
    """Q4_1 blocks w (N, nb, 20) / d (N, nb, 10): value d*q + m. The lanes hold (q - 8) x exactly like Q4_0's
    (written so, LLVM vectorizes the loop; with q alone it does not), so a block adds
    d_w d_x sum((q-8) x) + (8 d_w + m_w) d_x sum(x), the second term in a loop of its own."""
    n_rows, nb = w.shape[0], w.shape[1]
    m_rows = xq.shape[0]
    for c in prange((n_rows + ROW_CHUNK - 1) // ROW_CHUNK):
        sc = np.empty(nb, np.float32)  # d_w * d_x per block, gathered first: the block loop vectorizes better
        acc = np.empty(16, np.float32)
        for m in range(m_rows):
            for n in range(c * ROW_CHUNK, min(n_rows, c * ROW_CHUNK + ROW_CHUNK)):
                for b in range(nb):
                    sc[b] = lut[d[n, b, 0]] * xd[m, b]
                acc[:] = 0
                for b in range(nb):
                    sb = sc[b]
                    for j in range(16):
                        q = w[n, b, 4 + j]
                        t = (i32(q & U15) - i32(8)) * i32(xq[m, b, j]) + (i32(q >> U4) - i32(8)) * i32(xq[m, b, 16 + j])
                        acc[j] += sb * f32(i32(t))
                cm = f32(0)
                for b in range(nb):
                    cm += (f32(8) * lut[d[n, b, 0]] + lut[d[n, b, 1]]) * (xd[m, b] * f32(xs[m, b]))
                s = f32(0)
                for j in range(16):
                    s += acc[j]
                y[m, n] = s + cm


@njit(parallel=True, cache=True)
def gemv_q8_0(w, d, xq, xd, y, lut):
    """Q8_0 blocks w (N, nb, 34) int8 / d (N, nb, 17); 32 lanes (one product each)."""
    n_rows, nb = w.shape[0], w.shape[1]
    m_rows = xq.shape[0]
    for c in prange((n_rows + ROW_CHUNK - 1) // ROW_CHUNK):
        sc = np.empty(nb, np.float32)  # d_w * d_x per block, gathered first: the block loop vectorizes better
        acc = np.empty(32, np.float32)
        for m in range(m_rows):
            for n in range(c * ROW_CHUNK, min(n_rows, c * ROW_CHUNK + ROW_CHUNK)):
                for b in range(nb):
                    sc[b] = lut[d[n, b, 0]] * xd[m, b]
                acc[:] = 0
                for b in range(nb):
                    sb = sc[b]
                    for j in range(32):
                        acc[j] += sb * f32(i32(w[n, b, 2 + j]) * i32(xq[m, b, j]))
                s = f32(0)
                for j in range(32):
                    s += acc[j]
                y[m, n] = s


@njit(parallel=True, cache=True)
def dequant_q4_0(w, d, out, lut):
    """Q4_0 rows -> out (R, nb, 32) float32 = d * (q - 8) (exact products: gguf-py's values). Two rows per
    iteration; an odd last row is done once more by itself."""
    r, nb = w.shape[0], w.shape[1]
    for p in prange(r // 2):
        n = 2 * p
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            d1 = lut[d[n + 1, b, 0]]
            for j in range(16):
                q0 = w[n, b, 2 + j]
                q1 = w[n + 1, b, 2 + j]
                out[n, b, j] = d0 * f32(i16(q0 & U15) - i16(8))
                out[n, b, 16 + j] = d0 * f32(i16(q0 >> U4) - i16(8))
                out[n + 1, b, j] = d1 * f32(i16(q1 & U15) - i16(8))
                out[n + 1, b, 16 + j] = d1 * f32(i16(q1 >> U4) - i16(8))
    if r % 2:
        n = r - 1
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            for j in range(16):
                q0 = w[n, b, 2 + j]
                out[n, b, j] = d0 * f32(i16(q0 & U15) - i16(8))
                out[n, b, 16 + j] = d0 * f32(i16(q0 >> U4) - i16(8))


@njit(parallel=True, cache=True)
def dequant_q4_1(w, d, out, lut):
    """Q4_1 rows -> d * q + m (one float32 product, exact, then one rounded add: gguf-py's values)."""
    r, nb = w.shape[0], w.shape[1]
    for p in prange(r // 2):
        n = 2 * p
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            m0 = lut[d[n, b, 1]]
            d1 = lut[d[n + 1, b, 0]]
            m1 = lut[d[n + 1, b, 1]]
            for j in range(16):
                q0 = w[n, b, 4 + j]
                q1 = w[n + 1, b, 4 + j]
                out[n, b, j] = d0 * f32(i16(q0 & U15)) + m0
                out[n, b, 16 + j] = d0 * f32(i16(q0 >> U4)) + m0
                out[n + 1, b, j] = d1 * f32(i16(q1 & U15)) + m1
                out[n + 1, b, 16 + j] = d1 * f32(i16(q1 >> U4)) + m1
    if r % 2:
        n = r - 1
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            m0 = lut[d[n, b, 1]]
            for j in range(16):
                q0 = w[n, b, 4 + j]
                out[n, b, j] = d0 * f32(i16(q0 & U15)) + m0
                out[n, b, 16 + j] = d0 * f32(i16(q0 >> U4)) + m0


@njit(parallel=True, cache=True)
def dequant_q8_0(w, d, out, lut):
    """Q8_0 rows (int8 view) -> d * q."""
    r, nb = w.shape[0], w.shape[1]
    for p in prange(r // 2):
        n = 2 * p
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            d1 = lut[d[n + 1, b, 0]]
            for j in range(32):
                out[n, b, j] = d0 * f32(w[n, b, 2 + j])
                out[n + 1, b, j] = d1 * f32(w[n + 1, b, 2 + j])
    if r % 2:
        n = r - 1
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            for j in range(32):
                out[n, b, j] = d0 * f32(w[n, b, 2 + j])
