"""ggml block formats, one class per type (gguf-py's design), dequantized with numpy; the one table of their
sizes, where their codes start and their code books, which every kernel (native IR, portable twins, the HTP
model) reads.

`dequantize(raw, qtype, dtype)` turns raw block bytes (..., row_bytes) into values (..., n) in float32 or
float64. In float64 every format here is exact (the value the block format means), which is what the `ref`
oracle needs; in float32 the results are bitwise those of gguf-py (tested). Quantization for writing files
is left to gguf-py, which is byte-exact with llama.cpp for Q4_0/Q4_1/Q8_0.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kazeia.errors import UnsupportedError

T = GGMLQuantizationType


QK = 32  # elements of a Q4_0 / Q4_1 / Q8_0 / IQ4_NL block (and of the HTP's HVX sub-block)


class BlockFormat:
    qtype: T
    kind: str  # the lower-case ggml name the kernels use: q4_0, q4_1, q8_0, iq4_nl, ...
    block_size: int  # elements per block
    type_size: int  # bytes per block
    code_offset: int | None = None  # byte where the codes start (after the fp16 d, and m for Q4_1)
    codebook: tuple[int, ...] | None = None  # the value of each 4-bit code (non-linear formats)
    registry: dict[T, type[BlockFormat]] = {}
    by_kind: dict[str, type[BlockFormat]] = {}

    def __init_subclass__(cls, qtype: T, **kw):
        super().__init_subclass__(**kw)
        cls.qtype = qtype
        cls.kind = qtype.name.lower()
        cls.block_size, cls.type_size = GGML_QUANT_SIZES[qtype]
        BlockFormat.registry[qtype] = cls
        BlockFormat.by_kind[cls.kind] = cls

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """blocks: (n_blocks, type_size) uint8 -> (n_blocks, block_size) values."""
        raise NotImplementedError


def _f16(b: np.ndarray, dtype) -> np.ndarray:
    """Reinterpret pairs of bytes as fp16 and widen (exact in float32 and float64)."""
    return np.ascontiguousarray(b).view(np.float16).astype(dtype)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 quants in ggml order: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


class Q4_0(BlockFormat, qtype=T.Q4_0):
    code_offset = 2

    @classmethod
    def dequantize_blocks(cls, blocks, dtype):
        d = _f16(blocks[:, :2], dtype)
        q = _nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)
        return d * q.astype(dtype)


class Q4_1(BlockFormat, qtype=T.Q4_1):
    code_offset = 4

    @classmethod
    def dequantize_blocks(cls, blocks, dtype):
        d = _f16(blocks[:, 0:2], dtype)
        m = _f16(blocks[:, 2:4], dtype)
        q = _nibbles(blocks[:, 4:])
        return d * q.astype(dtype) + m


class Q5_0(BlockFormat, qtype=T.Q5_0):
    @classmethod
    def dequantize_blocks(cls, blocks, dtype):
        d = _f16(blocks[:, :2], dtype)
        qh = np.ascontiguousarray(blocks[:, 2:6]).view("<u4")  # bit j = high bit of element j
        ql = _nibbles(blocks[:, 6:])
        bits = (qh >> np.arange(32, dtype=np.uint32)) & 1
        q = (ql | (bits.astype(np.uint8) << 4)).astype(np.int8) - np.int8(16)
        return d * q.astype(dtype)


class Q8_0(BlockFormat, qtype=T.Q8_0):
    code_offset = 2

    @classmethod
    def dequantize_blocks(cls, blocks, dtype):
        d = _f16(blocks[:, :2], dtype)
        q = blocks[:, 2:].view(np.int8)
        return d * q.astype(dtype)

    @classmethod
    def quantize_rows(cls, x: np.ndarray) -> np.ndarray:
        """(..., n) float32 -> (..., n/32*34) uint8 as ggml-cpu's x86 quantize_row_q8_0 (its from_float: a KV cache
        row stored by SET_ROWS): d = fp16(amax / 127), q = round-to-nearest-even(x * (127 / amax)) (0 when amax is
        0); a non-finite product converts to int32's indefinite value and saturates to -128. (gguf-py's and
        ggml's reference quantizer use x * (1 / d) rounded half away from zero instead.)"""
        x = np.asarray(x, dtype=np.float32)
        lead, n = x.shape[:-1], x.shape[-1]
        b = x.reshape(-1, n // QK, QK)
        amax = np.abs(b).max(axis=-1)
        with np.errstate(all="ignore"):
            d = (amax / np.float32(127)).astype(np.float16)
            inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
            v = b * inv[..., None]
        q = np.where(np.isfinite(v), np.clip(np.rint(v), -128, 127), -128).astype(np.int8)
        out = np.empty(b.shape[:-1] + (34,), dtype=np.uint8)
        out[..., :2] = d[..., None].view(np.uint8)
        out[..., 2:] = q.view(np.uint8)
        return out.reshape(*lead, n // QK * 34)


class IQ4_NL(BlockFormat, qtype=T.IQ4_NL):
    """fp16 d, then 16 bytes of 4-bit codes (low nibble = element j, high = j+16), value d * kvalues_iq4nl[q]."""

    code_offset = 2
    codebook = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # ggml's kvalues_iq4nl

    @classmethod
    def dequantize_blocks(cls, blocks, dtype):
        d = _f16(blocks[:, :2], dtype)
        q = np.asarray(cls.codebook, dtype=np.int8)[_nibbles(blocks[:, 2:])]
        return d * q.astype(dtype)


def _q4k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 packed bytes -> 8 six-bit (scale, min) pairs, as in ggml's get_scale_min_k4."""
    sc = np.empty(s.shape[:-1] + (8,), dtype=np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


class Q4_K(BlockFormat, qtype=T.Q4_K):
    @classmethod
    def dequantize_blocks(cls, blocks, dtype):
        n = blocks.shape[0]
        d = _f16(blocks[:, 0:2], dtype)
        dmin = _f16(blocks[:, 2:4], dtype)
        sc, mn = _q4k_scales_mins(blocks[:, 4:16])
        qs = blocks[:, 16:].reshape(n, 4, 32)  # 4 chunks of 64 elements, 32 bytes each
        q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)  # sub-block 2c (low), 2c+1 (high)
        # ggml computes d*sc and dmin*m first (in float), then x = (d*sc)*q - (dmin*m)
        ds = (d * sc.astype(dtype))[:, :, None]
        dm = (dmin * mn.astype(dtype))[:, :, None]
        return (ds * q.astype(dtype) - dm).reshape(n, 256)


class Q6_K(BlockFormat, qtype=T.Q6_K):
    @classmethod
    def dequantize_blocks(cls, blocks, dtype):
        n = blocks.shape[0]
        ql = blocks[:, 0:128].reshape(n, 2, 64)
        qh = blocks[:, 128:192].reshape(n, 2, 32)
        sc = blocks[:, 192:208].view(np.int8).reshape(n, 2, 8)
        d = _f16(blocks[:, 208:210], dtype)[:, :, None]
        lo, hi = ql[:, :, :32], ql[:, :, 32:]
        q1 = (lo & 0x0F) | (((qh >> 0) & 3) << 4)
        q2 = (hi & 0x0F) | (((qh >> 2) & 3) << 4)
        q3 = (lo >> 4) | (((qh >> 4) & 3) << 4)
        q4 = (hi >> 4) | (((qh >> 6) & 3) << 4)
        q = np.stack([q1, q2, q3, q4], axis=2).astype(np.int8) - np.int8(32)  # (n, half, 4, 32)
        # scale index: sc[is + 2*j] with is = l // 16 -> per 16 elements
        s = sc.reshape(n, 2, 4, 2)  # (half, j, is)
        s = np.repeat(s, 16, axis=3)  # (n, 2, 4, 32)
        return ((d[:, :, :, None] * s.astype(dtype)) * q.astype(dtype)).reshape(n, 256)


class BF16(BlockFormat, qtype=T.BF16):
    @classmethod
    def dequantize_blocks(cls, blocks, dtype):
        u = np.ascontiguousarray(blocks).view("<u2").astype(np.uint32) << 16
        return u.view(np.float32).astype(dtype)


def bytes_per_32(kind: str) -> float:
    """Bytes that 32 elements of a ggml type take (its row size per 32 columns), by the lower-case type name, from
    gguf-py's table of every ggml type (mxfp4 and f16 included)."""
    block, size = GGML_QUANT_SIZES[T[kind.upper()]]
    return 32 * size / block


def block_bytes(kinds) -> dict[str, int]:
    """{kind: bytes per block} of these kinds (the kernels' tables)."""
    return {k: BlockFormat.by_kind[k].type_size for k in kinds}


def code_offsets(kinds) -> dict[str, int]:
    """{kind: byte where its codes start}."""
    return {k: BlockFormat.by_kind[k].code_offset for k in kinds}


def supported_types() -> list[T]:
    return [T.F32, T.F16, T.F64, *BlockFormat.registry]


def dequantize(raw: np.ndarray, qtype: T, dtype=np.float32) -> np.ndarray:
    """Raw rows (..., row_bytes) or typed arrays -> values (..., n_elements_per_row) in `dtype`."""
    qtype = T(qtype)
    dtype = np.dtype(dtype)
    if qtype in (T.F32, T.F16, T.F64):
        src = {T.F32: np.float32, T.F16: np.float16, T.F64: np.float64}[qtype]
        arr = raw if raw.dtype == src else np.ascontiguousarray(raw).view(src)
        return arr.astype(dtype)
    fmt = BlockFormat.registry.get(qtype)
    if fmt is None:
        raise UnsupportedError(f"tensor type {qtype.name} cannot be dequantized by kazeia")
    lead = raw.shape[:-1]
    blocks = np.ascontiguousarray(raw).reshape(-1, fmt.type_size)
    vals = fmt.dequantize_blocks(blocks, dtype)
    return vals.reshape(*lead, -1)
