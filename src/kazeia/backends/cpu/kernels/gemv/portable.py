"""The GEMV family's portable twin (numba): the native kernels' operations in their order, the FMAs emulated exactly
(`fma32`), so its outputs are their bits."""

from __future__ import annotations

import math

import numpy as np

from kazeia.native.portable import jit, prange

KIND_Q4_0, KIND_Q4_1, KIND_Q8_0 = 0, 1, 2
GROUP = 8  # weight rows the native kernel transposes into the lanes of one vector (_emit_rows8)


@jit(cache=True, inline="always")
def fma32(a, b, c):
    """fl32(a * b + c), rounded once, as vfmadd: the float64 product of two float32 is exact; the float64 sum is
    made round-to-odd (TwoSum's error decides the last bit), and rounding that to float32 is then the correctly
    rounded result (53 >= 24 + 2 bits)."""
    p = np.float64(a) * np.float64(b)
    cc = np.float64(c)
    s = p + cc
    bp = s - p
    e = (p - (s - bp)) + (cc - bp)
    if e != 0.0 and np.isfinite(s):
        m, ex = math.frexp(s)
        ulp = math.ldexp(1.0, ex - 53)
        if np.int64(abs(s) / ulp) % 2 == 0:  # even: the odd neighbour on e's side
            up = (e > 0.0) == (s > 0.0)      # away from zero
            step = ulp if up or abs(m) != 0.5 else ulp * 0.5
            s = s + step if e > 0.0 else s - step
    return np.float32(s)


@jit(cache=True, inline="always")
def _code(w, n, b, j, kind):
    """Element j of block b of row n as the kernel widens it: Q4 nibbles raw (0..15), Q8_0 the int8 value."""
    if kind == KIND_Q8_0:
        return np.int32(np.int8(w[n, b, 2 + j]))
    q = w[n, b, (4 if kind == KIND_Q4_1 else 2) + (j & 15)]
    return np.int32(q >> np.uint8(4)) if j >= 16 else np.int32(q & np.uint8(15))


@jit(cache=True, inline="always")
def _lane(w, xq, n, b, m, lane, kind):
    """pmaddwd(lo) + pmaddwd(hi), lane `lane`: codes 2l, 2l+1, 16+2l, 17+2l times their activations (exact)."""
    t = np.int32(0)
    for j in (2 * lane, 2 * lane + 1, 16 + 2 * lane, 17 + 2 * lane):
        t += _code(w, n, b, j, kind) * np.int32(xq[m, b, j])
    return t


@jit(parallel=True, cache=True)
def gemv_exact_portable(w, d, xq, xd, xs, y, lut, kind):
    """y (M, N) = x @ W^T in the native GEMV's operations and order (kernels above): rows in whole groups of 8
    (from row 0) take each block's exact int32 dot, then acc = fma(dot, d_w*d_x, acc) in block order; the last
    N % 8 rows keep 8 lanes (pmaddwd's pair sums, one fma chain each) summed at the end by hsum8's tree; Q4_0 and
    Q4_1 add their own chain cm = fma(d_w (Q4_0) or m_w (Q4_1), d_x*sum(x_q) (*-8 for Q4_0), cm)."""
    n_rows, nb = w.shape[0], w.shape[1]
    m_rows = xq.shape[0]
    n_grouped = n_rows - n_rows % GROUP
    for n in prange(n_rows):
        lanes = np.empty(8, np.float32)
        for m in range(m_rows):
            acc = np.float32(0)
            cm = np.float32(0)
            lanes[:] = 0
            for b in range(nb):
                dw = lut[d[n, b, 0]]
                dx = xd[m, b]
                sc = np.float32(dw * dx)
                if n < n_grouped:
                    dot = np.int32(0)
                    for lane in range(8):
                        dot += _lane(w, xq, n, b, m, lane, kind)
                    acc = fma32(np.float32(dot), sc, acc)
                else:
                    for lane in range(8):
                        lanes[lane] = fma32(np.float32(_lane(w, xq, n, b, m, lane, kind)), sc, lanes[lane])
                if kind != KIND_Q8_0:
                    dxs = np.float32(dx * np.float32(xs[m, b]))
                    if kind == KIND_Q4_0:
                        cm = fma32(dw, np.float32(dxs * np.float32(-8.0)), cm)
                    else:
                        cm = fma32(lut[d[n, b, 1]], dxs, cm)
            if n >= n_grouped:
                acc = np.float32(np.float32(np.float32(lanes[0] + lanes[4]) + np.float32(lanes[2] + lanes[6]))
                                 + np.float32(np.float32(lanes[1] + lanes[5]) + np.float32(lanes[3] + lanes[7])))
            y[m, n] = np.float32(acc + cm) if kind != KIND_Q8_0 else acc
