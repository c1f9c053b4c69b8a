"""HVX (vector unit) matmul numerics of ggml-hexagon: dynamic q8 quantization of src1 and the vec_dot kernels.

Upstream reference: htp/matmul-ops.c (quantize_f32_q8x4x2, quantize_f32_q8_1x4x2, quantize_f32_f16,
vec_dot_*_q8x4x2_{1x1,2x1,2x2,4x1}, vec_dot_f16_*, matmul_2d / matvec_2d / matmul_4d, op_matmul_hvx),
htp/hvx-inverse.h (fp16 reciprocal), htp/hvx-base.h (rounding int16 conversion), htp/hvx-reduce.h (lane
reductions); snapshot ggml-org/ggml bb4dc86a.

Model (quantized weights; all float arithmetic below is IEEE fp32 with round-to-nearest-even, which is how
the qf32 "vector float" steps are modelled):
- activations: each src1 row is quantized to int8 with one fp16 scale per group of G elements (q8x4x2) or,
  for Q4_1 weights, per 32 elements with an extra fp16 "sum" (q8_1x4x2); see `quantize_q8x4x2`.
- dot: chunks of 1024 elements; lane L (0..31) of a 32-lane fp32 accumulator owns sub-block L of every chunk.
  Per sub-block: ia = exact int32 dot of the 32 int8 products; dd = d_w * d_x (fp16*fp16, exact in fp32);
  acc_L = fp32(acc_L + fp32(ia * dd)). Q4_1: acc_L = fp32(acc_L + fp32(fp32(ia * dd) + m_w * s_x)).
  Lanes past the last sub-block of a partial chunk are masked (their accumulators do not change).
- reduction: the 32 lanes are summed by a pairwise fp32 tree. The 2x2/2x1/4x1 kernels (every output but
  one) add lanes 16 apart first, then 8, 4, 2, 1 ("far" tree); the 1x1 kernel, used only for the last
  weight row when N is odd, adds neighbours first (1, 2, 4, 8, 16: "adjacent" tree). Output is fp32.
Exactness of the vectorised form: |ia| <= 32*128*128 = 2^19 (Q8_0 weights, the worst case; Q4_0 2^15,
IQ4_NL 127*128*32 < 2^19, Q4_1 15*128*32 < 2^16), so the float32 batched matmul that computes ia sums
integers below 2^24 and is exact in any order; ia*dd is then rounded once, like the hardware's fp32 product.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from kazeia.backends.htp.fp16 import (
    round_fp16_hw,
)
from kazeia.backends.htp.host.repack import F16_LUT, IQ4_NL_VALUES, QK, RepackedWeight
from kazeia.backends.htp.hvx.quant import (
    _image_rows,
    activation_row_size,
    parse_f16,
    parse_q8_1x4x2,
    parse_q8x4x2,
    round_up,
)
from kazeia.backends.htp.kernels.hvx import hvx_dot

GGMLType = GGMLQuantizationType

CHUNK = 1024                   # elements per vec_dot step (4 super-blocks)
LANES = CHUNK // QK            # 32 fp32 accumulator lanes


# --- lane reductions ------------------------------------------------------------------------------------


def reduce_far(acc: np.ndarray) -> np.ndarray:
    """32 lanes on axis 0 -> fp32 pairwise sum adding lanes 16 apart first (hvx_vec_reduce_sum_f32x2/x4)."""
    v = acc
    while v.shape[0] > 1:
        h = v.shape[0] // 2
        v = v[:h] + v[h:]
    return v[0]


def reduce_adjacent(acc: np.ndarray) -> np.ndarray:
    """32 lanes on axis 0 -> fp32 pairwise sum adding neighbours first (hvx_vec_reduce_sum_f32, 1x1 kernels)."""
    v = acc
    while v.shape[0] > 1:
        v = v[0::2] + v[1::2]
    return v[0]


def _reduce_lanes(acc: np.ndarray, n_total: int, n0: int) -> np.ndarray:
    """Reduce a tile (32, M, nb) of columns n0.. ; the last column of an odd N uses the 1x1 kernel's tree."""
    y = reduce_far(acc)
    last = n_total - 1 - n0
    if n_total % 2 and 0 <= last < acc.shape[2]:
        y[:, last] = reduce_adjacent(acc[:, :, last])
    return y


def _n_tile(m: int, n: int, lanes: int) -> int:
    """Columns per tile so that one (lanes, M, tile) float32 buffer stays around 4 MiB (cache friendly)."""
    t = max(64, (4 << 20) // (4 * lanes * max(m, 1)))
    return min(n, t)


# --- quantized HVX matmul ---------------------------------------------------------------------------------


def hvx_matmul(w: RepackedWeight, q8_image: np.ndarray, M: int) -> np.ndarray:
    """y (M, N) float32 = the HVX MUL_MAT of x4x2 weight `w` with the quantized src1 image (M rows).

    `q8_image` holds M rows of `activation_row_size(K, w.qtype)` bytes (q8_1x4x2 for Q4_1, q8x4x2 else)
    exactly as in VTCM; it may contain arbitrary bytes (garbage in -> deterministic garbage out). The weight
    codes and scales are read from its ggml rows by the kernel (kernels/hvx `hvx_dot`), row by row.
    """
    m = M
    if w.qtype == GGMLType.F16:
        return hvx_matmul_f16(w, q8_image, m)
    parse = parse_q8_1x4x2 if w.qtype == GGMLType.Q4_1 else parse_q8x4x2
    img = _image_rows(q8_image, m, activation_row_size(w.k, w.qtype))
    b8, b16 = w.blocks()
    return hvx_dot(b8, b16, w.qtype, img, m, w.k, parse, IQ4_NL_VALUES, F16_LUT)


# --- F16 weights ------------------------------------------------------------------------------------------


def _f16_weight(w: RepackedWeight | np.ndarray) -> np.ndarray:
    if isinstance(w, RepackedWeight):
        if w.qtype != GGMLType.F16:
            raise ValueError("expected an F16 weight")
        return w.w16
    return np.asarray(w, dtype=np.float32)


def _weight_vectors(w: RepackedWeight | np.ndarray, order: np.ndarray) -> tuple[np.ndarray, int]:
    """Lane-ordered weight vectors (K/64, N, 64) and K, made for this call (not kept: no float copy of a weight
    outlives its matmul)."""
    w16 = _f16_weight(w)
    k = w16.shape[1]
    return _lane_vectors(w16, k, order), k


def _lane_vectors(v: np.ndarray, k: int, order: np.ndarray) -> np.ndarray:
    """(R, K) -> (K/64 vectors, R, 64) zero-padded (masked tail), elements of each vector reordered."""
    r = v.shape[0]
    kp = round_up(k, 64)
    p = np.zeros((r, kp), dtype=np.float32)
    p[:, :k] = v
    return np.ascontiguousarray(p.reshape(r, kp // 64, 64)[:, :, order].transpose(1, 0, 2))


# position inside a 64-element fp16 vector of each accumulator lane: the widening multiply puts even
# elements in the low 32 lanes and odd elements in the high 32 lanes.
_EVEN_ODD = np.concatenate([np.arange(0, 64, 2), np.arange(1, 64, 2)])


def hvx_matmul_f16(w: RepackedWeight | np.ndarray, f16_image: np.ndarray, M: int) -> np.ndarray:
    """HVX F16 x F16 matmul with src1 in VTCM (vec_dot_f16_f16_aa_{1x1,2x1,2x2}): y (M, N) float32.

    Per 64-element vector, 64 fp32 lanes (even elements in lanes 0..31, odd in 32..63) accumulate the exact
    fp16*fp16 products: acc = fp32(acc + x*w); tail elements are masked to 0. Then lanes j and j+32 are
    added (fp32) and the 32 lanes are reduced with the far tree (adjacent for the last row of an odd N).
    """
    m = M
    wv, k = _weight_vectors(w, _EVEN_ODD)   # (nv, N, 64)
    n = wv.shape[1]
    x16 = parse_f16(f16_image, k, m)
    xv = _lane_vectors(x16, k, _EVEN_ODD)                        # (nv, M, 64)
    y = np.empty((m, n), dtype=np.float32)
    nt = _n_tile(m, n, 64)
    with np.errstate(all="ignore"):
        for n0 in range(0, n, nt):
            n1 = min(n, n0 + nt)
            acc = np.zeros((m, n1 - n0, 64), dtype=np.float32)
            tmp = np.empty_like(acc)
            for i in range(xv.shape[0]):
                np.multiply(xv[i][:, None, :], wv[i][None, n0:n1, :], out=tmp)   # exact products
                np.add(acc, tmp, out=acc)
            lanes = (acc[..., :32] + acc[..., 32:]).transpose(2, 0, 1)
            y[:, n0:n1] = _reduce_lanes(lanes, n, n0)
    return y


_PAIRS = np.arange(64)  # natural order: lane j takes elements 2j and 2j+1 of every vector


def hvx_matmul_f16_ddr(w: RepackedWeight | np.ndarray, x: np.ndarray, src1_f16: bool = False) -> np.ndarray:
    """HVX F16 matmul fallback reading src1 from DDR (matmul_4d + vec_dot_f16_f32_uu / f16_f16_uu): (M, N).

    Taken when src1 does not fit VTCM or the matmul is batched/permuted. f32 src1 is converted per vector
    (qf32 path, no NaN rewrite). 32 lanes, lane j takes elements 2j and 2j+1 of every 64-element vector:
    acc_j = fp32(acc_j + fp32(x[2j]*w[2j] + x[2j+1]*w[2j+1])); then the adjacent tree (1x1 kernel only).
    """
    wv, k = _weight_vectors(w, _PAIRS)
    n = wv.shape[1]
    wv = wv.reshape(-1, n, 32, 2)
    x = np.asarray(x, dtype=np.float32)
    x16 = x if src1_f16 else round_fp16_hw(x)
    m = x16.shape[0]
    xv = _lane_vectors(x16, k, _PAIRS).reshape(-1, m, 32, 2)
    y = np.empty((m, n), dtype=np.float32)
    nt = _n_tile(m, n, 32)
    with np.errstate(all="ignore"):
        for n0 in range(0, n, nt):
            n1 = min(n, n0 + nt)
            acc = np.zeros((m, n1 - n0, 32), dtype=np.float32)
            lo, hi = np.empty_like(acc), np.empty_like(acc)
            for i in range(xv.shape[0]):
                np.multiply(xv[i, :, None, :, 0], wv[i, None, n0:n1, :, 0], out=lo)   # exact products
                np.multiply(xv[i, :, None, :, 1], wv[i, None, n0:n1, :, 1], out=hi)
                np.add(lo, hi, out=lo)                                              # lo + hi, rounded
                np.add(acc, lo, out=acc)
            y[:, n0:n1] = reduce_adjacent(acc.transpose(2, 0, 1))
    return y
