"""Weight matmuls of the `cpu` backend on the quantized bytes (numba kernels; no float copy of any weight).

`weight_matmul(raw, qtype, k, x)` computes y (M, N) = x (M, K) @ W^T for a 2-D weight given by its raw rows
(N, row_bytes), typically a view of the memory-mapped GGUF:

- small M (decode, M <= GEMV_MAX_M) on Q4_0 / Q4_1 / Q8_0: a GEMV that streams each weight row's bytes once.
  The activations are quantized first, as ggml does with its vec_dot_type, but to int16 per 32-element block
  with one float32 scale d = amax/32767 (ggml: int8, fp16 scale): the conversion error is ~1e-9 NMSE, far
  below test-backend-ops' 5e-4 and the 1e-5 the whole-model tests allow. Per block the dot of the 4/8-bit
  codes with the int16 activations is an exact int32 in 16 lanes, scaled by d_w * d_x into 16 float32 lanes
  summed at the end of the row. Every row's reduction is sequential, so results do not depend on the thread
  count or scheduling.
- otherwise: TILE rows of the weight at a time are dequantized (numba, exact: the values gguf-py gives) into a
  cache-sized float32 scratch that numpy's BLAS multiplies. The K reduction is BLAS's, per output element, for
  a fixed tile shape: deterministic at a fixed thread count.
- F32 weights are multiplied in place (BLAS on the mapped rows); F16 / BF16 and the other block formats are
  converted per tile (numpy) and multiplied the same way.

The numba kernels (qkernels.py) are compiled once and cached on disk; numba is imported lazily (jit.py).
"""

from __future__ import annotations

import contextlib

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kazeia.backends import jit
from kazeia.engine.threads import single_blas_thread
from kazeia.gguf.quants import dequantize

T = GGMLQuantizationType
GEMV_MAX_M = 2           # rows of x up to which the int8 GEMV beats dequantize + BLAS (measured, bench/README)
TILE_BYTES = 4 << 20     # float32 scratch per dequantized tile (about L3 / 8: BLAS packs it anyway)
ROW_CHUNK = 32           # GEMV rows per parallel task: their bytes stay in L2 while every x row passes
QK = 32
SMALL_GEMM_M = 16    # x rows up to which the tiled path's GEMMs run on one BLAS thread
GEMV_TYPES = (T.Q4_0, T.Q4_1, T.Q8_0)

_F16_LUT = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)  # fp16 bits -> value


def _k():
    return jit.kernels("kazeia.backends.qkernels")


def tile_rows(k: int) -> int:
    """Weight rows per dequantized tile: TILE_BYTES of float32, a multiple of 16 rows."""
    return max(16, TILE_BYTES // (4 * k) // 16 * 16)


def _blocks(raw: np.ndarray, qtype: T, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, row_bytes) uint8 rows -> (uint8 (N, nb, type_size), uint16 (N, nb, type_size/2)) views, no copy."""
    _, ts = GGML_QUANT_SIZES[qtype]
    n = raw.shape[0]
    b8 = raw.reshape(n, k // QK, ts)
    return b8, raw.view(np.uint16).reshape(n, k // QK, ts // 2)


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (M, K) float32 -> (int16 codes (M, K/32, 32), float32 scale (M, K/32), int32 code sums).

    d = amax/32767, q = rint(x / d). A block holding inf or NaN gets d = NaN, so its products stay non-finite."""
    m, k = x.shape
    xq = np.empty((m, k // QK, QK), dtype=np.int16)
    xd = np.empty((m, k // QK), dtype=np.float32)
    xs = np.empty((m, k // QK), dtype=np.int32)
    _k().quantize_x(np.ascontiguousarray(x, dtype=np.float32).reshape(m, k // QK, QK), xq, xd, xs)
    return xq, xd, xs


def weight_matmul(raw: np.ndarray, qtype: T, k: int, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """y (M, N) = x (M, K) @ W^T for the weight rows `raw` (N, row_bytes) of type `qtype`; `out` may be a
    (M, N) view (e.g. columns of a fused product)."""
    qtype = T(qtype)
    n = raw.shape[0]
    x = np.asarray(x, dtype=np.float32)
    m = x.shape[0]
    if out is None:
        out = np.empty((m, n), dtype=np.float32)
    if qtype == T.F32:
        w = raw.view(np.float32)  # (N, K), mapped
        np.matmul(x, w.T, out=out)
        return out
    if qtype in GEMV_TYPES and m <= GEMV_MAX_M:
        _gemv(raw, qtype, k, x, out)
        return out
    _tiled(raw, qtype, k, x, out)
    return out


def _gemv(raw: np.ndarray, qtype: T, k: int, x: np.ndarray, out: np.ndarray) -> None:
    kern = _k()
    xq, xd, xs = quantize_activations(x)
    b8, b16 = _blocks(raw, qtype, k)
    y = out if out.flags.c_contiguous else np.empty(out.shape, dtype=np.float32)
    if qtype == T.Q4_0:
        kern.gemv_q4_0(b8, b16, xq, xd, y, _F16_LUT)
    elif qtype == T.Q4_1:
        kern.gemv_q4_1(b8, b16, xq, xd, xs, y, _F16_LUT)
    else:
        kern.gemv_q8_0(b8.view(np.int8), b16, xq, xd, y, _F16_LUT)
    if y is not out:
        out[...] = y


def dequantize_rows(raw: np.ndarray, qtype: T, k: int, scratch: np.ndarray | None = None) -> np.ndarray:
    """Rows (R, row_bytes) -> float32 (R, K), the values `gguf.quants.dequantize` gives (bitwise)."""
    r = raw.shape[0]
    dst = scratch[:r] if scratch is not None else np.empty((r, k), dtype=np.float32)
    if qtype in GEMV_TYPES:
        b8, b16 = _blocks(raw, qtype, k)
        d3 = dst.reshape(r, k // QK, QK)
        kern = _k()
        if qtype == T.Q4_0:
            kern.dequant_q4_0(b8, b16, d3, _F16_LUT)
        elif qtype == T.Q4_1:
            kern.dequant_q4_1(b8, b16, d3, _F16_LUT)
        else:
            kern.dequant_q8_0(b8.view(np.int8), b16, d3, _F16_LUT)
    elif qtype == T.F16:
        np.copyto(dst, raw.view(np.float16))
    else:
        dst[...] = dequantize(raw, qtype, np.float32)
    return dst


def _tiled(raw: np.ndarray, qtype: T, k: int, x: np.ndarray, out: np.ndarray) -> None:
    n = raw.shape[0]
    tr = min(n, tile_rows(k))
    scratch = np.empty((tr, k), dtype=np.float32)
    x = np.ascontiguousarray(x)
    # a few rows of x make tiny GEMMs: two BLAS threads gain nothing there and, when another process holds the
    # second core, every call waits for a descheduled worker (measured: 110 ms instead of 1 ms at M=5)
    with single_blas_thread() if x.shape[0] <= SMALL_GEMM_M else contextlib.nullcontext():
        for r0 in range(0, n, tr):
            r1 = min(n, r0 + tr)
            w = dequantize_rows(raw[r0:r1], qtype, k, scratch)
            np.matmul(x, w.T, out=out[:, r0:r1])
