"""The GEMM's portable twin (numba): the native GEMM's operations in their order (gemm/__init__.py `_micro`), the
FMAs emulated exactly (gemv/portable.py `fma32`), so its outputs are the native kernel's bits.

Per output y[m, n], blocks in order from acc = 0: acc = fma(float(dot), d_w * d_x, acc), dot the block's exact
int32 dot of the codes the GEMM widens (Q4_0: q - 8; Q4_1: q; Q8_0: the int8 value) with x's int16 codes; Q4_1
then acc = fma(m_w, d_x * float(sum x_q), acc). The native GEMM's K chunks store acc in y and load it back, which
changes no value. What a host without the native kernels (or KAZEIA_SIMD=0) runs past the GEMV's 4 rows of x."""

from __future__ import annotations

import numpy as np

from kazeia.backends.cpu.kernels.gemv.portable import KIND_Q4_0, KIND_Q4_1, _code, fma32
from kazeia.native.portable import jit, prange

__all__ = ["gemm_exact_portable"]


@jit(parallel=True, cache=True)
def gemm_exact_portable(w, d, xq, xd, xs, y, lut, kind):
    """y (M, N) = x @ W^T in the native GEMM's operations and order (module docstring). w: (N, nb, block bytes)
    uint8, d: its uint16 view (fp16 bits of d, and m for Q4_1), xq/xd/xs: quantize_activations' codes, scales
    and code sums, lut: fp16 bits -> float32."""
    n_rows, nb = w.shape[0], w.shape[1]
    m_rows = xq.shape[0]
    for n in prange(n_rows):
        codes = np.empty(32, np.int32)
        acc = np.zeros(m_rows, np.float32)
        for b in range(nb):
            for j in range(32):
                codes[j] = _code(w, n, b, j, kind) - (8 if kind == KIND_Q4_0 else 0)
            dw = lut[d[n, b, 0]]
            for m in range(m_rows):
                dot = np.int32(0)
                for j in range(32):
                    dot += codes[j] * np.int32(xq[m, b, j])
                dx = xd[m, b]
                a = fma32(np.float32(dot), np.float32(dw * dx), acc[m])
                if kind == KIND_Q4_1:
                    a = fma32(lut[d[n, b, 1]], np.float32(dx * np.float32(xs[m, b])), a)
                acc[m] = a
        for m in range(m_rows):
            y[m, n] = acc[m]
