"""K-quant weights as October 2026's host repacks them (ggml-hexagon.cpp: repack_q4_K_tiled, repack_q6_K_tiled;
llama.cpp 0c1e57098bba). The host decodes each block's scales in fp32 and stores one fp16 value per 32 elements
(Q4_K) or per 16 (Q6_K); the DSP never sees d, dmin or the six-bit scales:

- Q4_K, sub-block j of a 256-block: D = fp16(f32(d) * sc_j), M = fp16(-f32(dmin) * m_j) (get_scale_min_k4), codes
  q in 0..15 unsigned. The DSP treats the weight as Q4_1 (matmul-ops.c: `case HTP_TYPE_Q4_K:` beside Q4_1): w =
  D*q + M, the Q4_1 kernels of both units (HMX dequantizer, HVX q4_1 dot with q8_1 activations).
- Q6_K, 16-element group g: S = fp16(f32(d) * sc_g), codes q - 32 in -32..31: the HMX dequantizer gives
  fp16((q - 32) * S); the HVX dot is kernels/kquants.py.

kazeia keeps the ggml rows (memory-mapped) and makes these values from them for the rows a kernel asks for, each
time: the tiled byte image itself (32x32 tiles, the Q6_K "vrmpy-ready" planes) is a permutation of them that
nothing in this model reads back. Q5_K (a fifth-bit plane over the Q4_K tile) and MXFP4 are left to the CPU:
kazeia has no Q5_K block format at all, and no MXFP4 numerics for the HTP.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kazeia.backends.htp.host.repack import F16_LUT, w16_destination
from kazeia.backends.htp.kernels import kquants as kernel
from kazeia.backends.htp.kernels.hmx import hmx_weight_rows
from kazeia.backends.htp.kernels.rounding import round_hw
from kazeia.gguf.quants import QK
from kazeia.native.idioms import IQ4_NL_VALUES

GGMLType = GGMLQuantizationType
K_QUANT_TYPES = (GGMLType.Q4_K, GGMLType.Q6_K)  # the K-quants this model computes on the HTP


def q4_k_as_q4_1(raw: np.ndarray) -> np.ndarray:
    """Q4_K rows (R, K/256*144) -> the Q4_1 blocks (R, K/32, 20) the DSP's kernels see: (D, M, 16 code bytes,
    element j low nibble, j+16 high, as ggml's Q4_1)."""
    blk = np.ascontiguousarray(raw).reshape(raw.shape[0], -1, 144)
    out = np.empty((blk.shape[0], blk.shape[1] * 8, 20), dtype=np.uint8)
    kernel.q4_k_as_q4_1(blk, F16_LUT, out)
    return out


def q6_k_fields(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K rows (R, K/256*210) -> (signed codes q - 32 (R, K) int8 in element order, S (R, K/16) float32 of fp16
    values)."""
    blk = np.ascontiguousarray(raw).reshape(raw.shape[0], -1, 210)
    codes = np.empty((blk.shape[0], blk.shape[1] * 256), dtype=np.int8)
    scales = np.empty((blk.shape[0], blk.shape[1] * 16), dtype=np.float32)
    kernel.q6_k_fields(blk, F16_LUT, codes, scales)
    return codes, scales


class KQuantWeight:
    """A Q4_K or Q6_K weight in the REPACK buffer: its ggml rows (n, row bytes), kept as given (a view of the
    mapped file), and the values the DSP's kernels read, made for the rows asked for."""

    def __init__(self, qtype: GGMLType, k: int, ggml: np.ndarray) -> None:
        self.qtype = GGMLType(qtype)
        if self.qtype not in K_QUANT_TYPES:
            raise ValueError(f"{self.qtype.name} is not a K-quant this model computes on the HTP")
        if k <= 0 or k % 256:
            raise ValueError(f"K-quant rows need a multiple of 256 elements, got {k}")
        block, size = GGML_QUANT_SIZES[self.qtype]
        self.k, self.row_bytes = int(k), k // block * size
        self.ggml = np.asarray(ggml, dtype=np.uint8).reshape(-1, self.row_bytes)
        self.n = self.ggml.shape[0]

    @classmethod
    def from_ggml(cls, raw: np.ndarray, qtype: GGMLType, k: int) -> KQuantWeight:
        return cls(qtype, k, raw)

    @property
    def nsub(self) -> int:
        return self.k // QK

    def q4_1_blocks(self, r0: int = 0, r1: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Q4_K: rows r0..r1 as the DSP's Q4_1 blocks, (uint8 (R, K/32, 20), the same as uint16 (R, K/32, 10))."""
        if self.qtype != GGMLType.Q4_K:
            raise ValueError("only Q4_K weights are Q4_1 blocks on the DSP")
        b8 = q4_k_as_q4_1(self.ggml[r0:r1])
        return b8, b8.view(np.uint16)

    def q6_k_fields(self, r0: int = 0, r1: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        if self.qtype != GGMLType.Q6_K:
            raise ValueError("only Q6_K weights have Q6_K fields")
        return q6_k_fields(self.ggml[r0:r1])

    def w16_rows(self, r0: int = 0, r1: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """(R, k) float32 of fp16 values: rows r0..r1 as the HMX dequantizer makes them (Q4_K: the Q4_1 kernel's
        fp16(fp16(q*D) + M); Q6_K: fp16((q - 32) * S)). `out`: a C-contiguous float32 scratch of >= R*k."""
        rows, dst = w16_destination(self.n, self.k, r0, r1, out)
        if self.qtype == GGMLType.Q4_K:
            b8, b16 = self.q4_1_blocks(r0, r1)
            hmx_weight_rows(b8, b16, GGMLType.Q4_1, dst.reshape(rows, self.nsub, QK), IQ4_NL_VALUES, F16_LUT)
        else:
            codes, scales = self.q6_k_fields(r0, r1)
            with np.errstate(all="ignore"):
                np.multiply(codes, np.repeat(scales, 16, axis=1), out=dst)  # exact: 6-bit codes x fp16
            round_hw(dst, out=dst)
        return dst

    @property
    def w16(self) -> np.ndarray:
        return self.w16_rows()
