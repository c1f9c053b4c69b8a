"""A decode step's HTP flash attention in one native pass per KV head (ops/flash_attn.py): the same bits as
flash_attn's numpy form (its portable form, which runs wherever this declines), from the fp16 KV cache as it lies.

flash_attn's form makes each step a whole-array numpy call: widen and transpose K, widen V, round Q, S = Q K^T,
the scores' pass, exp, the row sums, the fp16 read-outs, P V per 128-cell block, the division. For a decode (a
few query rows against a short cache) those calls, not their arithmetic, are the cost (~0.7 ms a layer on a
36-layer Qwen3-4B, 25 ms a token). `fa_decode` does the same operations in the same order for the query rows of
one KV head, in cache:

    q16 = rne16(q)                              (both paths: flash_attn rounds Q for HVX too)
    S[r, j] = sum_d q16[r, d] * K[j, d]         d ascending from +0 (backends/ordered.py); fp16 x fp16 products
                                                are exact, so a fused multiply-add gives the multiply-then-add bits
    x = [rne16](S * scale) + mask[r % T, j]     (fa.py fa_scores; HMX rounds the S read-out)
    p = exp(x - m), m = row max (-inf -> 0)     (kernels/expf.py's rule, its exp_lanes)
    l = numpy's pairwise float32 sum of p       (numpy's pairwise_sum: 8 accumulators over blocks of <= 128,
                                                 halves rounded to 8 above; init +0)
    HMX: o = sum over 128-cell blocks of rne16(sum_j rne16(p)[r, j] * V[j, :]), each block from +0, o from +0
    HVX: o = sum_j p[r, j] * V[j, :] from +0 (float32 products: a multiply, then an add)
    out[t, h, :] = o / (l == 0 ? 1 : l)

A decode's cache is padded past the cells any row sees (a 16-token decode of the 36-layer Qwen3-4B: 17 of 256). From
the last seen cell, rounded up to 16, every row's mask is -inf: those cells' x is -inf and p +0 whatever their K and
V hold, unless a non-finite K or V (or, under HMX, an S read-out past 65504, bounded by max_r sum_d |q16| * max|K| *
|scale|) would turn a score, a product or the read-out into what numpy's form declines on. The pass reads that
tail's K and V once to check this (tail.py `computed_cells`); where it holds, it leaves those cells out of S and P V
(each of their products is a zero, and adding a zero changes no sum that starts from +0) and gives them the -inf
score they would have had; else it computes every cell. The bits are the same either way (tests/test_htp_fa_decode.py
puts NaN, inf and fp16-overflowing values in the masked tail). 36-layer decode, flash attention a layer: 118-141 ->
~108 us (2026-10, HVX), 189 -> ~124 us (robust, HMX).

It declines (sets the head's `bad`, the front returns False and flash_attn runs its numpy form, which writes every
output again) on what numpy's form meets differently or what this does not restate: a NaN or |q| > 65504, an HMX
|S * scale| > 65504, a NaN or +inf score after the mask, an HMX block read-out past 65504 or NaN, and any
non-finite output. K and V must be F16 (rows of D and Dv contiguous halves, D and Dv multiples of 8); the mask
F16 or F32 rows. Workspace per KV head: q16 (R x D), a K^T tile (D x 16), a block of V (128 x Dv), S / p
(R x n) and the row sums (R), R = g * T query rows.
"""

from __future__ import annotations

import threading

import numpy as np

from kazeia.backends.htp.kernels.fa_decode.ir import BLOCK, PARALLEL_MIN_MACS, W, emit_decode, emit_pairwise
from kazeia.identity import IdentityCache
from kazeia.native.buffers import ThreadScratch
from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import Library, available
from kazeia.native.pool import run_rows

LIB = Library(__name__, "kazeia_htp_fa_decode")
PAIRWISE = LIB.kernel("fa_pairwise", emit_pairwise)
DECODE = LIB.kernels("fa_decode", emit_decode, ("hmx", "hvx"), par=True)


_SCRATCH = ThreadScratch(limit=8)


def _f16_rows(v: np.ndarray) -> bool:
    """A (1, Hkv, n, D) float16 view with D contiguous, a multiple of 8, and whole rows of bytes."""
    return (v.dtype == np.float16 and v.ndim == 4 and v.shape[0] == 1 and v.shape[3] % 8 == 0 and v.shape[3] > 0
            and v.strides[3] == 2)


def decode(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float, hmx: bool,
           dst: np.ndarray, linger: bool = False) -> bool:
    """flash_attn's result for q (H, T, D) float32 against the fp16 cache views k (1, Hkv, n, D) and v (1, Hkv, n,
    Dv), mask rows (T' >= T, n' >= n; F16 or F32) or None, written into dst (1, T, H, Dv) float32; True when done,
    False where the kernel declines or does not apply (dst may then hold anything: the caller computes it again).
    `linger`: the kernel threads keep spinning for the decode's next op (native.pool.run)."""
    call = _prepare(q, k, v, mask, scale, hmx, dst)
    return call is not None and call.run(linger)


class _Call:
    """One pass's kernel, arguments and decline flags, worked out from the arrays' shapes, strides and addresses
    (`decode_bound` keeps it for the next token: the same views, new contents)."""

    __slots__ = ("kernel", "args", "bad", "keep", "hkv", "parallel", "scale", "hmx", "tid")

    def run(self, linger: bool) -> bool:
        run_rows(self.kernel, self.args, self.hkv, 1, self.parallel, linger=linger)
        return not self.bad.any()


def _prepare(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float, hmx: bool,
             dst: np.ndarray) -> _Call | None:
    """The `_Call` of `decode`'s arguments, or None where the kernel does not apply."""
    if not available() or not (_f16_rows(k) and _f16_rows(v)) or q.dtype != np.float32 or q.ndim != 3:
        return None
    h, t, d = q.shape
    _, hkv, n, dk = k.shape
    dv = v.shape[3]
    if (dk != d or v.shape[1] != hkv or v.shape[2] != n or not n or not hkv or h % hkv or q.strides[2] != 4
            or q.strides[0] % 4 or q.strides[1] % 4 or dst.dtype != np.float32 or dst.shape != (1, t, h, dv)
            or dst.strides[3] != 4 or dst.strides[1] % 4 or dst.strides[2] % 4):
        return None
    mp, mst, mf16 = 0, 0, 0
    if mask is not None:
        if (mask.ndim != 2 or mask.dtype not in (np.float16, np.float32) or mask.shape[0] < t or mask.shape[1] < n
                or mask.strides[1] != mask.itemsize):
            return None
        mp, mst, mf16 = addr(mask), mask.strides[0], int(mask.dtype == np.float16)
    g = h // hkv
    r = g * t
    wsh = r * d + d * 2 * W + BLOCK * dv + r * n + r
    ws = _SCRATCH.get((hkv, wsh), lambda: np.empty(hkv * wsh, dtype=np.float32))
    c = _Call()
    c.bad = np.zeros(hkv, dtype=np.int64)
    scale_bits = int(np.float32(scale).view(np.uint32))
    prm = np.array([q.strides[0] // 4, q.strides[1] // 4, k.strides[2], k.strides[1], v.strides[2], v.strides[1],
                    mst, mf16, t, g, n, d, dv, scale_bits, wsh, dst.strides[2] // 4, dst.strides[1] // 4],
                   dtype=np.int64)
    c.args = (addr(prm), addr(q), addr(k), addr(v), mp, addr(ws), addr(dst), addr(c.bad))
    c.keep = prm, ws  # (the kernel reads both at every call)
    c.kernel = DECODE["hmx" if hmx else "hvx"]
    c.hkv, c.parallel = hkv, h * t * n * (d + dv) >= PARALLEL_MIN_MACS
    c.scale, c.hmx, c.tid = scale, hmx, threading.get_ident()
    return c


_BOUND: IdentityCache[_Call | None] = IdentityCache("htp.fa_decode", limit=1024, bind=True)


def decode_bound(q4: np.ndarray, k: np.ndarray, v: np.ndarray, mask4: np.ndarray | None, scale: float, hmx: bool,
                 dst: np.ndarray, linger: bool = False) -> bool:
    """`decode(q4[0], k, v, mask4[0, 0], ...)` with its `_Call` kept by these very arrays (tensor.array's views,
    the same objects every token while a decode graph keeps its places): a decode step's flash attention then
    costs the kernel and a few Python steps (~0.1 ms a layer of checks and arguments otherwise). The call is made
    again for another scale, path or thread (the workspace is the thread's)."""
    def make() -> _Call | None:
        return _prepare(q4[0], k, v, None if mask4 is None else mask4[0, 0], scale, hmx, dst)

    def valid(c: _Call | None) -> bool:
        return c is None or (c.scale == scale and c.hmx == hmx and c.tid == threading.get_ident())

    call = _BOUND.get((q4, k, v, mask4, dst), make, valid)
    return call is not None and call.run(linger)
