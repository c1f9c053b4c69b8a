"""Entry points of the flash-attention kernels (simd_fa.py, through native.py). Each returns None (or False) where
the native kernels are missing or the input is one the kernel does not take, and the caller (flash_attn.py) then
runs its numpy form, which gives the same bits wherever the kernel answers (tests/test_htp_fa_native.py)."""

from __future__ import annotations

import threading

import numpy as np

from kazeia.backends import native
from kazeia.backends.htp.fast import ptr


def lib():
    """The AVX2 flash-attention kernels, or None."""
    return native.library("kazeia.backends.htp.simd_fa") if native.available() else None


_SCRATCH = threading.local()


def _scratch(shape: tuple[int, ...]) -> np.ndarray:
    """This thread's float32 buffer of `shape`, kept between calls (a decode's K^T is 1 MB: a fresh one costs its
    page faults, ~40 us, on every call)."""
    cache = getattr(_SCRATCH, "bufs", None)
    if cache is None:
        cache = _SCRATCH.bufs = {}
    buf = cache.get(shape)
    if buf is None:
        if len(cache) > 8:
            cache.clear()
        buf = cache[shape] = np.empty(shape, dtype=np.float32)
    return buf


def transposed(k: np.ndarray, reuse: bool = False) -> np.ndarray | None:
    """np.ascontiguousarray(k.transpose(0, 2, 1)) of a C-contiguous (H, n, D) float32 array. `reuse`: into this
    thread's scratch of that shape, which the next call of the same shape overwrites."""
    lk = lib()
    if lk is None or k.ndim != 3 or k.dtype != np.float32 or not k.flags.c_contiguous:
        return None
    h, n, d = k.shape
    out = _scratch((h, d, n)) if reuse else np.empty((h, d, n), dtype=np.float32)
    lk["fa_transpose"](ptr(k), ptr(out), n, d, 0, h)
    return out


def scores(s: np.ndarray, mask: np.ndarray | None, scale: np.float32, hmx: bool) -> np.ndarray | None:
    """The argument of the softmax's exp, x - m, from the scores s (H, T, n) (C-contiguous float32): x =
    round_fp16(s * scale) (HMX) or s * scale, + mask[:T, :n] (rows of a (T', n') float32 view, T' >= T, n' >= n),
    m = the row max of x, 0 where it is -inf. None where the kernel declines (see simd_fa.fa_scores)."""
    lk = lib()
    if lk is None or s.dtype != np.float32 or s.ndim != 3 or not s.flags.c_contiguous:
        return None
    h, t, n = s.shape
    mp, ms = 0, 0
    if mask is not None:
        if (mask.dtype != np.float32 or mask.ndim != 2 or mask.shape[0] < t or mask.shape[1] < n
                or mask.strides[1] != 4 or mask.strides[0] % 4):
            return None
        mp, ms = ptr(mask), mask.strides[0] // 4
    out = np.empty_like(s)
    bad = np.zeros(1, dtype=np.int64)
    lk["fa_scores"](ptr(s), mp, ms, t, n, float(scale), int(hmx), ptr(out), ptr(bad), 0, h * t)
    return None if bad[0] else out


def acc16(o: np.ndarray, pv: np.ndarray) -> bool:
    """o += round_fp16(pv) when every |pv| <= 65504 (no NaN) and both are C-contiguous float32 of one shape;
    False (o untouched) otherwise."""
    lk = lib()
    if (lk is None or o.dtype != np.float32 or pv.dtype != np.float32 or o.shape != pv.shape
            or not (o.flags.c_contiguous and pv.flags.c_contiguous)):
        return False
    bad = np.zeros(1, dtype=np.int64)
    lk["fa_acc16"](ptr(pv), ptr(o), o.size, ptr(bad))
    return not bad[0]


def divide(o: np.ndarray, l: np.ndarray) -> bool:
    """o /= np.where(l == 0, 1.0, l) in place, o (..., D) and l (..., 1) C-contiguous float32; False (o untouched)
    where the kernel does not apply."""
    lk = lib()
    if (lk is None or o.dtype != np.float32 or l.dtype != np.float32 or not o.flags.c_contiguous
            or not l.flags.c_contiguous or l.shape != o.shape[:-1] + (1,)):
        return False
    lk["fa_div"](ptr(o), ptr(l), l.size, o.shape[-1])
    return True
