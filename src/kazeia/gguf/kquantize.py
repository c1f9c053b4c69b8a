"""Q4_K and Q6_K blocks for writing files (gguf-py quantizes Q4_0/Q4_1/Q8_0 but raises NotImplementedError for the
K-quants). The byte layouts are ggml's (block_q4_K, block_q6_K in ggml-common.h; read back by gguf-py's and
kazeia's dequantizers, tests/test_kquantize.py). The choice of scales is a plain min/max one, NOT llama.cpp's
iterative make_qkx2_quants / make_qx_quants search: the files are valid K-quant files with llama.cpp's meaning,
not byte-identical to what llama-quantize would write from the same floats.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _blocks(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % QK_K:
        raise ValueError(f"K-quant rows need a multiple of {QK_K} elements, got {x.shape[-1]}")
    return x.reshape(-1, QK_K)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), 0)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """(..., K) float32 -> (..., K/256 * 144) uint8: x ~ d*sc_j*q - dmin*m_j per 32-element sub-block j,
    q in 0..15, sc_j and m_j six-bit, d and dmin fp16."""
    lead = np.asarray(x).shape[:-1]
    b = _blocks(x).reshape(-1, 8, 32)                                  # (n, sub-block, element)
    lo = np.minimum(b.min(axis=-1), 0)                                 # the sub-block's offset: -min, >= 0
    scale = (b.max(axis=-1) - lo) / 15
    d = (scale.max(axis=-1) / 63).astype(np.float16)
    dmin = ((-lo).max(axis=-1) / 63).astype(np.float16)
    sc = np.clip(np.rint(_ratio(scale, d.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_ratio(-lo, dmin.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    step = d.astype(np.float32)[:, None] * sc                          # d*sc_j, (n, 8)
    off = dmin.astype(np.float32)[:, None] * mn                        # dmin*m_j
    q = np.clip(np.rint(_ratio(b + off[..., None], step[..., None])), 0, 15).astype(np.uint8)
    out = np.empty((b.shape[0], 144), dtype=np.uint8)
    out[:, 0:2] = d.reshape(-1, 1).view(np.uint8)
    out[:, 2:4] = dmin.reshape(-1, 1).view(np.uint8)
    out[:, 4:16] = _pack_scales_mins(sc, mn)
    qs = q.reshape(-1, 4, 2, 32)                                       # chunk c: sub-blocks 2c (low), 2c+1 (high)
    out[:, 16:] = (qs[:, :, 0] | (qs[:, :, 1] << 4)).reshape(-1, 128)
    return out.reshape(*lead, -1)


def _pack_scales_mins(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit (scale, min) pairs -> ggml's 12 bytes (the inverse of get_scale_min_k4)."""
    s = np.empty((sc.shape[0], 12), dtype=np.uint8)
    s[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    s[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    return s


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """(..., K) float32 -> (..., K/256 * 210) uint8: x ~ d*sc_g*(q - 32) per 16-element group g, q in 0..63, sc_g
    int8, d fp16. Layout: ql (128 B), qh (64 B), scales (16 B), d."""
    lead = np.asarray(x).shape[:-1]
    b = _blocks(x).reshape(-1, 16, 16)                                 # (n, group, element)
    amax = np.abs(b).max(axis=-1)
    scale = amax / 31
    d = (scale.max(axis=-1) / 127).astype(np.float16)
    sc = np.clip(np.rint(_ratio(scale, d.astype(np.float32)[:, None])), -128, 127).astype(np.int8)
    step = d.astype(np.float32)[:, None] * sc
    q = (np.clip(np.rint(_ratio(b, step[..., None])), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    ql = np.empty((q.shape[0], 2, 64), dtype=np.uint8)                 # per half: element groups j = 0..3 of 32
    ql[:, :, :32] = (q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4)
    ql[:, :, 32:] = (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    out = np.empty((q.shape[0], 210), dtype=np.uint8)
    out[:, 0:128] = ql.reshape(-1, 128)
    out[:, 128:192] = qh.reshape(-1, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d.reshape(-1, 1).view(np.uint8)
    return out.reshape(*lead, -1)
