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
Q4_1 (weights with an offset): the block's m_w * s_x term is added to the product, as May's kernel does
(acc = fp32(acc + fp32(fp32(ia * s) + fp32(m_w * s_x)))), with May's q8_1 block sums: kazeia's assumptions, not read
from the October source.
"""

from __future__ import annotations

import numpy as np

from kazeia.backends.htp.host.repack import F16_LUT, IQ4_NL_VALUES, RepackedWeight
from kazeia.backends.htp.hvx.quant import _quantize_rows, parse_q8_1x4x2, parse_q8x4x2, quantize_activations
from kazeia.backends.htp.kernels.hvx import hvx_dot
from kazeia.graph.tensor import GGMLType

GROUP = 32  # activation quantization group (QK_Q8_0 in the tiled kernels)


def quantize_activations_2026_10(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(M, K) float32 -> (int8 quants (M, K), fp16 scales (M, K/32) as float32)."""
    q, d, k = _quantize_rows(xs, GROUP)
    return q[:, :k], d[:, : k // GROUP]


def hvx_matmul_2026_10(w: RepackedWeight, xs: np.ndarray) -> np.ndarray:
    """y (M, N) float32: the October HVX MUL_MAT of quantized weight `w` with float32 activations `xs` (M, K). The
    activations go through May's image format with one scale per 32-element group (the same quantizer), the
    products through the HVX dot kernels in October's summation order (kernels/hvx: `hvx_dot_seq`)."""
    xs = np.asarray(xs, dtype=np.float32)
    m, k = xs.shape
    image = quantize_activations(xs, w.qtype, GROUP)
    parse = parse_q8_1x4x2 if w.qtype == GGMLType.Q4_1 else parse_q8x4x2
    b8, b16 = w.blocks()
    return hvx_dot(b8, b16, w.qtype, image, m, k, parse, IQ4_NL_VALUES, F16_LUT, sequential=True)
