"""Attention's ops: SOFT_MAX and FLASH_ATTN_EXT (masked, ALiBi slopes, softcap), with ggml-cpu's semantics."""

from __future__ import annotations

import numpy as np

from kazeia.backends.libm import HOST, HostMath, OwnedMath
from kazeia.backends.numpy_ops.base import NumpyOps, broadcast_to, kernel
from kazeia.graph.tensor import Tensor


def _softmax_rows(s: np.ndarray, exp=np.exp) -> np.ndarray:
    """Softmax over the last axis (`exp`: the backend's); a row that is entirely -inf gives zeros (never NaN)."""
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    e = exp(s - m)
    z = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(z == 0, 1.0, z)


def _alibi_slopes(n_head: int, max_bias: float, ft, math: HostMath | OwnedMath = HOST) -> np.ndarray:
    """ALiBi's per-head slopes (ggml: m0^(h+1) below the largest power of two n_floor <= n_head, else
    m1^(2(h - n_floor) + 1)), by the backend's power."""
    if max_bias <= 0.0:
        return np.ones(n_head, dtype=ft)
    n_floor = 1 << (int(n_head).bit_length() - 1)
    h = np.arange(n_head, dtype=np.float64)
    m0, m1 = math.power(2.0, np.array([-max_bias / n_floor, -(max_bias / 2.0) / n_floor]))
    low = math.power(float(m0), h + 1)
    high = math.power(float(m1), 2 * (h - n_floor) + 1)
    return np.where(h < n_floor, low, high).astype(ft)


@kernel("SOFT_MAX")
def _soft_max(be: NumpyOps, n: Tensor) -> None:
    x = be.load(n.src[0])  # (ne3, H, T, n_kv)
    s = x * be.ft(n.params["scale"])
    if len(n.src) > 1 and n.src[1] is not None:
        mask = be.load(n.src[1])[:, :, : x.shape[2], : x.shape[3]]
        slopes = _alibi_slopes(x.shape[1], n.params.get("max_bias", 0.0), be.ft, be.math)[None, :, None, None]
        s = s + slopes * broadcast_to(mask, (mask.shape[0], x.shape[1], x.shape[2], x.shape[3]))
    with np.errstate(invalid="ignore", over="ignore"):
        be.store(n, _softmax_rows(s, be.math.exp))


@kernel("FLASH_ATTN_EXT")
def _flash_attn_ext(be: NumpyOps, n: Tensor) -> None:
    q = be.load(n.src[0])  # (S, H, T, D)
    k = be.load(n.src[1])  # (S, Hkv, n_kv, D)
    v = be.load(n.src[2])  # (S, Hkv, n_kv, Dv)
    mask = be.load(n.src[3]) if len(n.src) > 3 and n.src[3] is not None else None
    H, T = q.shape[1], q.shape[2]
    g = H // k.shape[1]
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    s = np.matmul(q, k.swapaxes(-1, -2)) * be.ft(n.params["scale"])  # (S, H, T, n_kv)
    cap = n.params.get("softcap", 0.0)
    if cap:
        s = be.ft(cap) * be.math.tanh(s / be.ft(cap))
    if mask is not None:
        m = mask[:, :, :T, : s.shape[-1]]  # (S|1, H|1, T, n_kv)
        slopes = _alibi_slopes(H, n.params.get("max_bias", 0.0), be.ft, be.math)[None, :, None, None]
        s = s + slopes * m
    with np.errstate(invalid="ignore", over="ignore"):
        p = _softmax_rows(s, be.math.exp)
    o = np.matmul(p, v)  # (S, H, T, Dv)
    be.store(n, o.transpose(0, 2, 1, 3))  # result [Dv, H, T] -> numpy (S, T, H, Dv)
