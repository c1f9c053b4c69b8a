"""The HVX vec_dot's portable twin (numba): the same arithmetic as the IR kernels in the same order, explicit IEEE
float32, no fastmath; weight types are the small ints of native/idioms.py."""

from __future__ import annotations

import numpy as np

from kazeia.native.idioms import KIND_IQ4_NL, KIND_Q4_0, KIND_Q4_1, KIND_Q8_0, block_code
from kazeia.native.portable import jit, prange

_f32, _i32 = np.float32, np.int32
U15, U4 = np.uint8(15), np.uint8(4)


@jit(cache=True, inline="always")
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


ROW_CHUNK = 16  # weight rows per parallel task in hvx_dot_portable (even: rows go in pairs)
PAIR_MAX_M = 4  # up to this many activation rows the codes are read from the blocks for each; past it, once


@jit(cache=True, inline="always")
def _q4_pair(blocks, n, n1, b, aq, m, off, bias, t0, t1):
    """Exact int32 dots of block b of rows n and n1 (4-bit codes minus `bias`) with activation row m."""
    for j in range(16):
        q0 = blocks[n, b, off + j]
        q1 = blocks[n1, b, off + j]
        xa = _i32(aq[m, b, j])
        xb = _i32(aq[m, b, 16 + j])
        t0[j] = (_i32(q0 & U15) - bias) * xa + (_i32(q0 >> U4) - bias) * xb
        t1[j] = (_i32(q1 & U15) - bias) * xa + (_i32(q1 >> U4) - bias) * xb
    s0 = _i32(0)
    s1 = _i32(0)
    for j in range(16):
        s0 += t0[j]
        s1 += t1[j]
    return s0, s1


@jit(cache=True, inline="always")
def _q8_pair(blocks, n, n1, b, aq, m, t0, t1):
    for j in range(16):
        xa = _i32(aq[m, b, j])
        xb = _i32(aq[m, b, 16 + j])
        t0[j] = _i32(np.int8(blocks[n, b, 2 + j])) * xa + _i32(np.int8(blocks[n, b, 18 + j])) * xb
        t1[j] = _i32(np.int8(blocks[n1, b, 2 + j])) * xa + _i32(np.int8(blocks[n1, b, 18 + j])) * xb
    s0 = _i32(0)
    s1 = _i32(0)
    for j in range(16):
        s0 += t0[j]
        s1 += t1[j]
    return s0, s1


@jit(cache=True, inline="always")
def _table_pair(blocks, n, n1, b, aq, m, iq4):
    s0 = _i32(0)
    s1 = _i32(0)
    for j in range(32):
        x = _i32(aq[m, b, j])
        s0 += _i32(iq4[block_code(blocks, n, b, j, 2, KIND_IQ4_NL)]) * x
        s1 += _i32(iq4[block_code(blocks, n1, b, j, 2, KIND_IQ4_NL)]) * x
    return s0, s1


@jit(cache=True, inline="always")
def _pair_terms(blocks, dbits, kind, iq4, lut, aq, ad, asum, n, n1, b, m, t0, t1):
    """Block b's fp32 terms of weight rows n and n1 with activation row m: fp32(ia * fp32(d_x * d_w)) [Q4_1: plus
    the rounded s_x * m_w], ia the exact int32 dot (May's and October's kernels share them; they sum them
    differently)."""
    if kind == KIND_Q4_0:
        ia0, ia1 = _q4_pair(blocks, n, n1, b, aq, m, 2, _i32(8), t0, t1)
    elif kind == KIND_Q4_1:
        ia0, ia1 = _q4_pair(blocks, n, n1, b, aq, m, 4, _i32(0), t0, t1)
    elif kind == KIND_Q8_0:
        ia0, ia1 = _q8_pair(blocks, n, n1, b, aq, m, t0, t1)
    else:
        ia0, ia1 = _table_pair(blocks, n, n1, b, aq, m, iq4)
    v0 = _f32(ia0) * (ad[m, b] * lut[dbits[n, b, 0]])
    v1 = _f32(ia1) * (ad[m, b] * lut[dbits[n1, b, 0]])
    if kind == KIND_Q4_1:
        v0 = v0 + asum[m, b] * lut[dbits[n, b, 1]]
        v1 = v1 + asum[m, b] * lut[dbits[n1, b, 1]]
    return v0, v1


@jit(parallel=True, cache=True)
def hvx_dot_portable(blocks, dbits, kind, iq4, lut, aq, ad, asum, y):
    """y (M, N) = HVX MUL_MAT of ggml rows (N, nb, ts) with q8 activations aq (M, nb, 32) int8, scales ad
    (M, nb) and, for Q4_1, sums asum (M, nb) (float32 of fp16 values). Lane L of the 32-lane accumulator owns
    sub-blocks L, L+32, ...: acc_L = fp32(acc_L + fp32(ia * fp32(d_w * d_x))) [Q4_1: + fp32(m_w * s_x) first],
    ia the exact int32 dot of the block. The last row of an odd N reduces with the adjacent tree (the 1x1
    kernel), every other with the far tree. Rows go in pairs (they share the activation loads); an odd last
    row is computed twice and stored once."""
    n_rows, nb = blocks.shape[0], blocks.shape[1]
    m_rows = aq.shape[0]
    if m_rows > PAIR_MAX_M:
        _hvx_dot_decoded_portable(blocks, dbits, kind, iq4, lut, aq, ad, asum, y)
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
                    v0, v1 = _pair_terms(blocks, dbits, kind, iq4, lut, aq, ad, asum, n, n1, b, m, t0, t1)
                    acc0[b % 32] = acc0[b % 32] + v0
                    acc1[b % 32] = acc1[b % 32] + v1
                y[m, n] = _reduce(acc0, tmp, n_rows % 2 == 1 and n == n_rows - 1)
                if n1 != n:
                    y[m, n1] = _reduce(acc1, tmp, n_rows % 2 == 1 and n1 == n_rows - 1)


@jit(parallel=True, cache=True)
def _hvx_dot_decoded_portable(blocks, dbits, kind, iq4, lut, aq, ad, asum, y):
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
                mw[b] = lut[dbits[n, b, 1]] if kind == KIND_Q4_1 else _f32(0)
                for j in range(32):
                    cj = block_code(blocks, n, b, j, off, kind)
                    if kind == KIND_Q4_0:
                        cj = cj - 8
                    elif kind == KIND_IQ4_NL:
                        cj = _i32(iq4[cj])
                    w[b, j] = cj
            adjacent = n_rows % 2 == 1 and n == n_rows - 1
            for m in range(m_rows):
                acc[:] = 0
                for b in range(nb):
                    for j in range(32):
                        t[j] = w[b, j] * _i32(aq[m, b, j])
                    ia = _i32(0)
                    for j in range(32):
                        ia += t[j]
                    v = _f32(ia) * (ad[m, b] * dw[b])
                    if kind == KIND_Q4_1:
                        v = v + asum[m, b] * mw[b]
                    acc[b % 32] = acc[b % 32] + v
                y[m, n] = _reduce(acc, tmp, adjacent)


@jit(parallel=True, cache=True)
def hvx_dot_seq_portable(blocks, dbits, kind, iq4, lut, aq, ad, asum, y):
    """hvx_dot_seq's twin (October 2026's order): per output, one fp32 accumulator over the blocks in K order:
    acc = fp32(acc + fp32(fp32(ia) * fp32(d_x * d_w))) [Q4_1: the block's term is fp32(that product +
    fp32(s_x * m_w))], ia the exact int32 dot of the block."""
    n_rows, nb = blocks.shape[0], blocks.shape[1]
    m_rows = aq.shape[0]
    for c in prange((n_rows + ROW_CHUNK - 1) // ROW_CHUNK):
        t0 = np.empty(16, np.int32)
        t1 = np.empty(16, np.int32)
        for n in range(c * ROW_CHUNK, min(n_rows, c * ROW_CHUNK + ROW_CHUNK), 2):
            n1 = min(n + 1, n_rows - 1)
            for m in range(m_rows):
                acc0 = _f32(0)
                acc1 = _f32(0)
                for b in range(nb):
                    v0, v1 = _pair_terms(blocks, dbits, kind, iq4, lut, aq, ad, asum, n, n1, b, m, t0, t1)
                    acc0 = _f32(acc0 + v0)
                    acc1 = _f32(acc1 + v1)
                y[m, n] = acc0
                if n1 != n:
                    y[m, n1] = acc1
