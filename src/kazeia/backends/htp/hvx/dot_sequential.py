"""HVX quantized matmul numerics of October 2026 (llama.cpp 0c1e57098bba, `htp/hvx-mm-kernels-tiled.h`:
quantize_block_f32_q8_0_tiled, tiled_vec_dot_q4_0_32x1 and siblings; `htp/hvx-base.h`: hvx_vec_add_f32_f32).

What changed since May (hvx/dot.py): activations are quantized in groups of 32 elements (May: 128), and each output
accumulates its 32-element blocks one after the other in K order (May: 32 lanes, one per sub-block of a 1024-element
chunk, reduced by a pairwise tree). Per activation row m and block b: d = fp16(fp16(amax) * fp16(1/127)) (a qf16
product), q = round-to-nearest-saturate(fp16(x16 * recip(d))) with the HVX fp16 reciprocal: the same quantizer as
May's at group 32 (hvx/quant.py `_quantize_rows`). Per output n and block b: ia = the exact int32 dot of the 32 weight
and activation quants; s = fp32(d_w) * fp32(d_x), exact (two fp16 values); acc = fp32(acc + fp32(ia * s)).

The arithmetic is the HVX dot family's `hvx_dot_seq` (kernels/hvx: native AVX2 IR, and its numba twin with the
same pair readers as May's), explicit IEEE float32, no fastmath. The adds are IEEE fp32 on v79/v81 and qf32 on
v73/v75 (`hvx_vec_add_f32_f32`); qf32 is modelled as IEEE fp32 here, as hvx/dot.py models May's qf32 steps.
Q4_1 and Q4_K (weights with an offset, htp_mm_weight_has_offset; tiled_vec_dot_q4_1_32x1 serves both): the
activations are q8_1 (quantize_block_f32_q8_1_tiled): the quants and d_a of the q8_0 quantizer above, and the block
sum s_a = fp16(f32(f32(amax * f32(1/127)) * sum(q))) from the fp32 amax, not from d_a; per block t = fp32(ia * s),
t = fp32(t + fp32(m_w * s_a)), acc = fp32(acc + t). Q4_K weights arrive as Q4_1 blocks (host/kquants.py), Q6_K
weights go to their own dot (kernels/kquants.py).
"""

from __future__ import annotations

import numpy as np

from kazeia.backends.htp.fp16 import fp16_to_bytes, round_fp16_hw
from kazeia.backends.htp.host.kquants import KQuantWeight
from kazeia.backends.htp.host.repack import F16_LUT, IQ4_NL_VALUES, QK, RepackedWeight
from kazeia.backends.htp.hvx.quant import (
    _image,
    _quantize_rows,
    _write_rows,
    parse_q8_1x4x2,
    parse_q8x4x2,
    q8_1x4x2_row_size,
    quantize_activations,
)
from kazeia.backends.htp.kernels.hvx import hvx_dot
from kazeia.backends.htp.kernels.kquants import hvx_dot_q6_k_seq
from kazeia.graph.tensor import GGMLType

GROUP = 32  # activation quantization group (QK_Q8_0 in the tiled kernels)
INV127 = np.float32(1.0) / np.float32(127.0)  # `1.0f / 127.0f` of quantize_block_f32_q8_1_tiled


def quantize_activations_2026_10(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(M, K) float32 -> (int8 quants (M, K), fp16 scales (M, K/32) as float32)."""
    q, d, k = _quantize_rows(xs, GROUP)
    return q[:, :k], d[:, : k // GROUP]


def quantize_q8_0_rows(vals: np.ndarray) -> np.ndarray:
    """(..., K) float32 -> (..., K/32*34) uint8 ggml Q8_0 blocks as 2026-10's SET_ROWS writes a Q8_0 KV cache
    (set-rows-ops.c -> hvx-quant.h: hvx_quantize_row_q8_0_f32): per 32 values the q8_0 quantizer of the
    activations (d = fp16(fp16(amax) * fp16(1/127)), its HVX reciprocal, round and saturate), stored as (d, quants)."""
    x = np.asarray(vals, dtype=np.float32)
    lead, k = x.shape[:-1], x.shape[-1]
    q, d = quantize_activations_2026_10(x.reshape(-1, k))
    out = np.empty((q.shape[0], k // QK, 34), dtype=np.uint8)
    out[..., :2] = fp16_to_bytes(d).reshape(q.shape[0], k // QK, 2)
    out[..., 2:] = q.reshape(q.shape[0], k // QK, QK).view(np.uint8)
    return out.reshape(*lead, k // QK * 34)


def quantize_q8_1_2026_10(xs: np.ndarray) -> np.ndarray:
    """(M, K) float32 -> the q8_1 activations of October's offset kernels, in May's q8_1x4x2 byte image (the layout
    kazeia's dot kernels read; October's tiled image holds the same numbers): per 32-element group the q8_0
    quants and d_a, and s_a = fp16(f32(f32(amax * f32(1/127)) * sum(q))) (hvx_vec_mul_f32_f32 twice, then the
    HVX fp32 -> fp16 conversion)."""
    q, d, k = _quantize_rows(xs, GROUP)
    m, kp = q.shape
    xf = np.zeros((m, kp), dtype=np.float32)
    xf[:, :k] = xs
    amax = np.abs(xf.reshape(m, kp // QK, QK)).max(axis=-1)
    sums = q.reshape(m, kp // QK, QK).astype(np.int32).sum(axis=-1).astype(np.float32)
    with np.errstate(all="ignore"):
        s = round_fp16_hw((amax * INV127) * sums)
    sbytes = fp16_to_bytes(np.stack([d, s], axis=-1).reshape(m, 2 * d.shape[1]))
    return _write_rows(_image(m, q8_1x4x2_row_size(k), None), q, sbytes, k)


def hvx_matmul_sequential(w: RepackedWeight | KQuantWeight, xs: np.ndarray) -> np.ndarray:
    """y (M, N) float32: the October HVX MUL_MAT of quantized weight `w` with float32 activations `xs` (M, K). The
    activations go through May's image format with one scale per 32-element group (the same quantizer; q8_1 for
    the offset types), the products through the HVX dot kernels in October's summation order (kernels/hvx:
    `hvx_dot_seq`; Q6_K: kernels/kquants.py)."""
    xs = np.asarray(xs, dtype=np.float32)
    m, k = xs.shape
    if w.qtype == GGMLType.Q6_K:
        q, d = quantize_activations_2026_10(xs)
        codes, scales = w.q6_k_fields()
        y = np.empty((m, w.n), dtype=np.float32)
        with np.errstate(all="ignore"):
            hvx_dot_q6_k_seq(codes, scales, np.ascontiguousarray(q), np.ascontiguousarray(d, dtype=np.float32), y)
        return y
    if w.qtype in (GGMLType.Q4_1, GGMLType.Q4_K):
        image, parse, kind = quantize_q8_1_2026_10(xs), parse_q8_1x4x2, GGMLType.Q4_1
        b8, b16 = w.q4_1_blocks() if w.qtype == GGMLType.Q4_K else w.blocks()
    else:
        image, parse, kind = quantize_activations(xs, w.qtype, GROUP), parse_q8x4x2, w.qtype
        b8, b16 = w.blocks()
    return hvx_dot(b8, b16, kind, image, m, k, parse, IQ4_NL_VALUES, F16_LUT, sequential=True)
