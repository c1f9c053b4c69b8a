"""FLASH_ATTN_EXT on the emulated DSP (moved out of executor.py): the HMX path's fp16 tiles and roundings, the
HVX path in float32, with the fp16 rounding and tiled-transpose helpers they use."""

from __future__ import annotations

import numpy as np

from kazeia.backends.htp.fast import ROUND_ROW, round_hw
from kazeia.backends.htp.fp16 import FP16_MAX, round_fp16
from kazeia.graph.tensor import Tensor

FA_KV_BLOCK = 128  # KV rows per HMX flash-attention step (fp16 P@V partial results are rounded per step)


def _round16(x: np.ndarray) -> np.ndarray:
    """round_fp16(x) of a float32 array, by the native rounding kernel (fast.round_hw) when every value is within
    +-65504: there the two roundings agree (both RNE; they differ only past 65504, where round_hw gives inf), and a
    fresh C-contiguous float32 result is what round_fp16 returns for a C-contiguous input. numpy's software fp16
    conversion is the slow part of a decode's flash attention (~70 us per 8k values, the native kernel ~10)."""
    if (x.dtype == np.float32 and x.size >= ROUND_ROW and x.flags.c_contiguous
            and x.max() <= FP16_MAX and x.min() >= -FP16_MAX):  # (False for a NaN)
        return round_hw(x)
    return round_fp16(x)


TRANSPOSE_TILE = 64  # 64x64 float32 tiles (16 KB in, 16 KB out) stay in L1/L2 while numpy transposes them


def _transposed(k: np.ndarray) -> np.ndarray:
    """np.ascontiguousarray(k.transpose(0, 2, 1)) of a C-contiguous (H, n, D) array, copied tile by tile: numpy's
    whole-matrix transposed copy strides through memory (a decode's K, 8 x 256 x 128: ~400 us, tiled ~200)."""
    h, n, d = k.shape
    out = np.empty((h, d, n), dtype=k.dtype)
    t = TRANSPOSE_TILE
    for d0 in range(0, d, t):
        for c0 in range(0, n, t):
            out[:, d0:d0 + t, c0:c0 + t] = k[:, c0:c0 + t, d0:d0 + t].transpose(0, 2, 1)
    return out


def flash_attn(io, n: Tensor, use_hmx: bool) -> None:
    """FLASH_ATTN_EXT on the DSP: HMX models its fp16 tiles (S and P@V read out as fp16 per KV block), HVX
    computes in float32. `io` loads the sources and stores dst (executor.DspOps)."""
    # (S, H, T, D) with S = 1 (ne3): work on 3-D stacks of C-contiguous matrices so numpy uses BLAS
    q = io.load(n.src[0])[0]                                     # (H, T, D)
    k, v = (io.load_c(s)[0] for s in n.src[1:3])                # (Hkv, n_kv, D), (Hkv, n_kv, Dv)
    mask = io.load(n.src[3])[0, 0] if len(n.src) > 3 and n.src[3] is not None else None  # (T', n_kv)
    hkv = k.shape[0]
    # GQA: query head h reads KV head h // (H / Hkv). The KV matrices are broadcast over the g heads of their group
    # (stride 0) instead of repeated: numpy calls the same BLAS product on the same C-contiguous matrices.
    v = np.ascontiguousarray(v)[:, None]                              # (Hkv, 1, n_kv, Dv)
    scale = np.float32(n.params["scale"])
    q16 = _round16(q)
    kt = _transposed(k)[:, None]                                       # (Hkv, 1, D, n_kv)
    s = _grouped(np.matmul, q16, kt, hkv)
    # HMX: the S tile is read out as fp16 with the qk scale applied by the output conversion block
    s = _round16(s * scale) if use_hmx else s * scale
    if mask is not None:
        s = s + mask[None, : s.shape[1], : s.shape[2]]
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        m = np.where(np.isneginf(m), 0.0, m).astype(np.float32)
        p = np.exp(s - m).astype(np.float32)
    l = p.sum(axis=-1, keepdims=True, dtype=np.float32)
    if use_hmx:
        p16 = _round16(p)
        o = np.zeros(q.shape[:-1] + (v.shape[-1],), dtype=np.float32)
        for j in range(0, p.shape[-1], FA_KV_BLOCK):  # per KV block: fp16 read-out, fp32 accumulation
            # the blocks are views: each of their matrices is row-contiguous, so numpy makes the same BLAS
            # calls as on copies (only the leading dimension differs; the same bits on 882 shapes tried)
            pj = p16[..., j:j + FA_KV_BLOCK]
            vj = v[:, :, j:j + FA_KV_BLOCK]
            o += _round16(_grouped(np.matmul, pj, vj, hkv))
    else:
        o = _grouped(np.matmul, p, v, hkv)
    o = o / np.where(l == 0, 1.0, l)
    io.store(n, o.transpose(1, 0, 2)[None])  # (T, H, Dv): dst ne = [Dv, H, T]

def _grouped(matmul, a: np.ndarray, b: np.ndarray, hkv: int) -> np.ndarray:
    """(H, T, X) @ (Hkv, 1, X, Y) -> (H, T, Y), head h against matrix h // (H / Hkv)."""
    h = a.shape[0]
    return matmul(a.reshape(hkv, h // hkv, *a.shape[1:]), b).reshape(h, a.shape[1], b.shape[-1])

