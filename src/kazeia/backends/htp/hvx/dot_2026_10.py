"""HVX quantized matmul numerics of October 2026 (llama.cpp 0c1e57098bba, `htp/hvx-mm-kernels-tiled.h`:
quantize_block_f32_q8_0_tiled, tiled_vec_dot_q4_0_32x1 and siblings; `htp/hvx-base.h`: hvx_vec_add_f32_f32).

What changed since May (hvx/dot.py): activations are quantized in groups of 32 elements (May: 128), and each output
accumulates its 32-element blocks one after the other in K order (May: 32 lanes, one per sub-block of a 1024-element
chunk, reduced by a pairwise tree). Per activation row m and block b: d = fp16(fp16(amax) * fp16(1/127)) (a qf16
product), q = round-to-nearest-saturate(fp16(x16 * recip(d))) with the HVX fp16 reciprocal: the same quantizer as
May's at group 32 (hvx/quant.py `_quantize_rows`). Per output n and block b: ia = the exact int32 dot of the 32 weight
and activation quants; s = fp32(d_w) * fp32(d_x), exact (two fp16 values); acc = fp32(acc + fp32(ia * s)).

The arithmetic is a numba kernel over the ggml blocks (the same pair readers as the May twin,
kernels/hvx/portable.py), explicit IEEE float32, no fastmath. The adds are IEEE fp32 on v79/v81 and qf32 on
v73/v75 (`hvx_vec_add_f32_f32`); qf32 is modelled as IEEE fp32 here, as hvx/dot.py models May's qf32 steps.
Q4_1 (weights with an offset): the block's m_w * s_x term is added to the product, as May's kernel does
(acc = fp32(acc + fp32(fp32(ia * s) + fp32(m_w * s_x)))), and the q8_1 block sum is fp16(d_x * sum of the block's
quants): both are kazeia's assumptions, not read from the October source.
"""

from __future__ import annotations

import numpy as np

from kazeia.backends.htp.fp16 import round_fp16_hw
from kazeia.backends.htp.host.repack import F16_LUT, IQ4_NL_VALUES, QK, RepackedWeight
from kazeia.backends.htp.hvx.quant import _quantize_rows
from kazeia.backends.htp.kernels.hvx.portable import _q4_pair, _q8_pair, _table_pair
from kazeia.graph.tensor import GGMLType
from kazeia.native.idioms import KIND_CODE, KIND_Q4_0, KIND_Q4_1, KIND_Q8_0
from kazeia.native.portable import jit, prange

GROUP = 32  # activation quantization group (QK_Q8_0 in the tiled kernels)
ROW_CHUNK = 16  # weight rows per parallel task


def quantize_activations_2026_10(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(M, K) float32 -> (int8 quants (M, K), fp16 scales (M, K/32) as float32)."""
    q, d, k = _quantize_rows(xs, GROUP)
    return q[:, :k], d[:, : k // GROUP]


def hvx_matmul_2026_10(w: RepackedWeight, xs: np.ndarray) -> np.ndarray:
    """y (M, N) float32: the October HVX MUL_MAT of quantized weight `w` with float32 activations `xs` (M, K)."""
    xs = np.asarray(xs, dtype=np.float32)
    m, k = xs.shape
    nb = k // QK
    q, d = quantize_activations_2026_10(xs)
    aq = np.ascontiguousarray(q.reshape(m, nb, QK))
    ad = np.ascontiguousarray(d, dtype=np.float32)
    asum = np.zeros_like(ad)
    if w.qtype == GGMLType.Q4_1:  # q8_1 block sums (kazeia's assumption: fp16(d_x * sum of the block's quants))
        asum = round_fp16_hw(ad * aq.astype(np.float32).sum(axis=2)).astype(np.float32)
    b8, b16 = w.blocks()
    y = np.empty((m, w.n), dtype=np.float32)
    _dot_2026_10(b8, b16, KIND_CODE[_NAMES[w.qtype]], IQ4_NL_VALUES, F16_LUT, aq, ad, asum, y)
    return y


_NAMES = {GGMLType.Q4_0: "q4_0", GGMLType.Q4_1: "q4_1", GGMLType.Q8_0: "q8_0", GGMLType.IQ4_NL: "iq4_nl"}


@jit(parallel=True, cache=True)
def _dot_2026_10(blocks, dbits, kind, iq4, lut, aq, ad, asum, y):
    """y (M, N): per output, one fp32 accumulator over the blocks in K order: acc = fp32(acc + fp32(fp32(ia) *
    fp32(d_x * d_w))) [Q4_1: the block's term is fp32(that product + fp32(s_x * m_w))], ia the exact int32 dot."""
    n_rows, nb = blocks.shape[0], blocks.shape[1]
    m_rows = aq.shape[0]
    for c in prange((n_rows + ROW_CHUNK - 1) // ROW_CHUNK):
        t0 = np.empty(16, np.int32)
        t1 = np.empty(16, np.int32)
        for n in range(c * ROW_CHUNK, min(n_rows, c * ROW_CHUNK + ROW_CHUNK), 2):
            n1 = min(n + 1, n_rows - 1)
            for m in range(m_rows):
                acc0 = np.float32(0)
                acc1 = np.float32(0)
                for b in range(nb):
                    if kind == KIND_Q4_0:
                        ia0, ia1 = _q4_pair(blocks, n, n1, b, aq, m, 2, np.int32(8), t0, t1)
                    elif kind == KIND_Q4_1:
                        ia0, ia1 = _q4_pair(blocks, n, n1, b, aq, m, 4, np.int32(0), t0, t1)
                    elif kind == KIND_Q8_0:
                        ia0, ia1 = _q8_pair(blocks, n, n1, b, aq, m, t0, t1)
                    else:
                        ia0, ia1 = _table_pair(blocks, n, n1, b, aq, m, iq4)
                    v0 = np.float32(ia0) * (ad[m, b] * lut[dbits[n, b, 0]])
                    v1 = np.float32(ia1) * (ad[m, b] * lut[dbits[n1, b, 0]])
                    if kind == KIND_Q4_1:
                        v0 = v0 + asum[m, b] * lut[dbits[n, b, 1]]
                        v1 = v1 + asum[m, b] * lut[dbits[n1, b, 1]]
                    acc0 = np.float32(acc0 + v0)
                    acc1 = np.float32(acc1 + v1)
                y[m, n] = acc0
                if n1 != n:
                    y[m, n1] = acc1
