"""FLASH_ATTN_EXT on the emulated DSP (moved out of executor.py): the HMX path's fp16 tiles and roundings, the
HVX path in float32, with the fp16 rounding and tiled-transpose helpers they use."""

from __future__ import annotations

import numpy as np

from kazeia.backends.htp.fp16 import FP16_MAX, round_fp16
from kazeia.backends.htp.kernels import fa as fast_fa
from kazeia.backends.htp.kernels import fa_decode
from kazeia.backends.htp.kernels.expf import exp_f32
from kazeia.backends.htp.kernels.fa_decode.tail import S_LIMIT, TAIL_CELLS
from kazeia.backends.htp.kernels.hvx import DECODE_ROWS
from kazeia.backends.htp.kernels.rounding import ROUND_ROW, round_hw
from kazeia.backends.ordered import ordered_matmul
from kazeia.graph.tensor import GGMLType, Tensor, array

FP16_CACHE = (GGMLType.F16, GGMLType.Q8_0)  # KV cache types whose values HMX reads as fp16 (load_c)
FA_KV_BLOCK = 128  # KV rows per HMX flash-attention step (fp16 P@V partial results are rounded per step)


def _round16(x: np.ndarray) -> np.ndarray:
    """round_fp16(x) of a float32 array, by the native rounding kernel (fast.round_hw) when every value is within
    +-65504: there the two roundings agree (both RNE; they differ only past 65504, where round_hw gives inf), and a
    fresh float32 result laid out as round_fp16's (astype keeps the input's memory order) is what round_fp16
    returns. numpy's software fp16 conversion is the slow part of a decode's flash attention (~70 us per 8k
    values, the native kernel ~10). An input whose axes, permuted, are C-contiguous (a prefill's Q, (H, T, D) view
    of a (T, H, D) buffer) is rounded in that order and permuted back: the same values in the same layout."""
    if x.dtype == np.float32 and x.size >= ROUND_ROW:
        if x.flags.c_contiguous:
            if x.max() <= FP16_MAX and x.min() >= -FP16_MAX:  # (False for a NaN)
                return round_hw(x)
            return round_fp16(x)
        order = np.argsort([-st for st in x.strides], kind="stable")  # the axes from the largest stride down
        xc = x.transpose(order)
        if xc.flags.c_contiguous and x.max() <= FP16_MAX and x.min() >= -FP16_MAX:
            y = round_hw(xc).transpose(np.argsort(order))
            if y.strides == np.empty_like(x).strides:  # the layout astype gives
                return y
    return round_fp16(x)
TRANSPOSE_TILE = 64  # 64x64 float32 tiles (16 KB in, 16 KB out) stay in L1/L2 while numpy transposes them


def _transposed(k: np.ndarray) -> np.ndarray:
    """np.ascontiguousarray(k.transpose(0, 2, 1)) of a C-contiguous (H, n, D) array, copied tile by tile: numpy's
    whole-matrix transposed copy strides through memory (a decode's K, 8 x 256 x 128: ~400 us, tiled ~200). The
    native kernel's result is a buffer the next flash attention of that shape overwrites: used only for S here."""
    out = fast_fa.transposed(k, reuse=True)  # native 8x8 transposes into a kept buffer, else numpy's, by tiles
    if out is not None:
        return out
    h, n, d = k.shape
    out = np.empty((h, d, n), dtype=k.dtype)
    t = TRANSPOSE_TILE
    for d0 in range(0, d, t):
        for c0 in range(0, n, t):
            out[:, d0:d0 + t, c0:c0 + t] = k[:, c0:c0 + t, d0:d0 + t].transpose(0, 2, 1)
    return out


def _k_transposed(io, t: Tensor, linger: bool) -> np.ndarray:
    """K^T, (Hkv, D, n_kv) C-contiguous float32, in a kept buffer (the next flash attention of that shape overwrites
    it): an F16 KV cache view widened and transposed in one pass (fast_fa.kt_from_f16: a decode's K is read once,
    from memory the weights' stream has evicted), else loaded, then transposed."""
    if t.type == GGMLType.F16 and (kt := fast_fa.kt_from_f16(array(t), linger)) is not None:
        return kt
    return _transposed(io.load_c(t)[0])


def flash_attn(io, n: Tensor, use_hmx: bool) -> None:
    """FLASH_ATTN_EXT on the DSP: HMX models its fp16 tiles (S and P@V read out as fp16 per KV block), HVX
    computes in float32. `io` loads the sources and stores dst (executor.DspOps)."""
    # (S, H, T, D) with S = 1 (ne3): work on 3-D stacks of matrices
    q = io.load(n.src[0])[0]                                     # (H, T, D)
    decode = q.shape[1] <= DECODE_ROWS  # the kernel threads keep spinning for the decode's next op
    if decode and _decode_pass(n, q, use_hmx):
        return
    kt = _k_transposed(io, n.src[1], decode)                      # (Hkv, D, n_kv)
    v = io.load_c(n.src[2], linger=decode)[0]                    # (Hkv, n_kv, Dv)
    mask = io.load(n.src[3])[0, 0] if len(n.src) > 3 and n.src[3] is not None else None  # (T', n_kv)
    hkv = kt.shape[0]
    # GQA: query head h reads KV head h // (H / Hkv) (_grouped).
    v = np.ascontiguousarray(v)                                       # (Hkv, n_kv, Dv)
    scale = np.float32(n.params["scale"])
    q16 = _round16(q)
    # HMX's tiles are fp16: with an F16 (or Q8_0, dequantized to fp16) cache every product is exact in float32
    fp16_k, fp16_v = (use_hmx and t.type in FP16_CACHE for t in (n.src[1], n.src[2]))
    nc = computed_cells(q16, kt, v, mask, scale, use_hmx)
    parts = _left_out_tail(q16, kt, mask, scale, use_hmx, hkv, fp16_k, nc, decode) if nc < kt.shape[2] else None
    if parts is not None:  # a masked tail left out: its cells' p is +0 (see computed_cells)
        p, l, native = parts
        v = v[:, :nc]
    else:
        s = _grouped(q16, kt, hkv, fp16_k, decode)                    # kt: (Hkv, D, n_kv)
        p, l, native = _softmax_parts(s, mask, scale, use_hmx)
    if use_hmx:
        p16 = round_hw(p) if native else _round16(p)  # (native: p = exp(x <= 0) is in [0, 1], never NaN)
        o = np.zeros(q.shape[:-1] + (v.shape[-1],), dtype=np.float32)
        for j in range(0, p.shape[-1], FA_KV_BLOCK):  # per KV block: fp16 read-out, fp32 accumulation
            pj = p16[..., j:j + FA_KV_BLOCK]
            vj = v[:, j:j + FA_KV_BLOCK]
            pv = _grouped(pj, vj, hkv, fp16_v, decode)
            if not fast_fa.acc16(o, pv):
                o += _round16(pv)
    else:
        o = _grouped(p, v, hkv, linger=decode)
    if not fast_fa.divide(o, l):
        o = o / np.where(l == 0, 1.0, l)
    io.store(n, o.transpose(1, 0, 2)[None])  # (T, H, Dv): dst ne = [Dv, H, T]


def _decode_pass(n: Tensor, q: np.ndarray, use_hmx: bool) -> bool:
    """A decode step over an F16 cache in one native pass (kernels/fa_decode/: this function's bits, its
    operations in its order); False where it does not apply or declines (this function's form then runs)."""
    k, v = n.src[1], n.src[2]
    if k.type != GGMLType.F16 or v.type != GGMLType.F16:
        return False
    m = n.src[3] if len(n.src) > 3 else None
    scale, q4 = float(n.params["scale"]), array(n.src[0])
    if q4.dtype != np.float32:  # (q: widened by the load)
        mask = None if m is None else array(m)[0, 0]
        return fa_decode.decode(q, array(k), array(v), mask, scale, use_hmx, array(n), linger=True)
    # the tensors' kept views: the pass's arguments are kept by them (q is q4[0])
    mask4 = None if m is None else array(m)
    return fa_decode.decode_bound(q4, array(k), array(v), mask4, scale, use_hmx, array(n), linger=True)


def computed_cells(q16: np.ndarray, kt: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: np.float32,
                   use_hmx: bool) -> int:
    """The KV cells a prefill computes: all n_kv, or the cells before a tail that every query row's mask holds at
    -inf (from the last seen cell, rounded up to TAIL_CELLS) when nothing there can reach the result: Q, K and V
    finite (a NaN score or product would), a finite scale, and under HMX an S read-out within fp16 (bounded by
    max_r sum_d |q16[r, d]| * max |K| * |scale|, with a margin for the float32 sums). Such cells' x is -inf and
    their p +0 (exp_f32(-inf) == +0), and adding their zero products changes no sum, which is fa_decode's
    argument for a decode too (kernels/fa_decode/tail.py)."""
    n = kt.shape[2]
    if mask is None or not np.isfinite(scale):
        return n
    seen = np.flatnonzero(~np.isneginf(mask[:q16.shape[1], :n]).all(axis=0))
    cut = -(-(int(seen[-1]) + 1 if seen.size else 0) // TAIL_CELLS) * TAIL_CELLS
    if cut >= n:
        return n
    kt_tail, v_tail = kt[:, :, cut:], v[:, cut:]
    if not (np.isfinite(kt_tail).all() and np.isfinite(v_tail).all() and np.isfinite(q16).all()):
        return n
    if use_hmx:
        q1 = float(np.abs(q16).sum(axis=-1, dtype=np.float64).max()) if q16.size else 0.0
        if q1 * float(np.abs(kt_tail).max(initial=0.0)) * abs(float(scale)) > S_LIMIT:
            return n
    return cut


def _left_out_tail(q16: np.ndarray, kt: np.ndarray, mask: np.ndarray | None, scale: np.float32, use_hmx: bool,
                   hkv: int, fp16_k: bool, nc: int, linger: bool) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """(p, l, True) of the cells before nc, l summed over all n_kv cells (the tail's p, +0, included: numpy's
    pairwise sum then adds in the same tree as over the whole row); None where the native scores' pass declines
    on those cells (the caller then computes every cell, as without a tail)."""
    s = _grouped(q16, kt[:, :, :nc], hkv, fp16_k, linger)
    x = fast_fa.scores(s, mask, scale, use_hmx)
    if x is None:
        return None
    p = exp_f32(x)
    full = np.zeros(p.shape[:-1] + (kt.shape[2],), dtype=np.float32)
    full[..., :nc] = p
    return p, full.sum(axis=-1, keepdims=True, dtype=np.float32), True


def _softmax_parts(s: np.ndarray, mask: np.ndarray | None, scale: np.float32,
                   use_hmx: bool) -> tuple[np.ndarray, np.ndarray, bool]:
    """(p, l, native): p = exp(x - m) of the scaled (HMX: fp16-rounded) and masked scores x and their row max m
    (0 where -inf), l the row sums of p. The element-wise passes before the exp are one native kernel
    (fast_fa.scores) where it applies (native = True), else these numpy expressions; the exp is the device
    model's own (kernels/expf.py), the sum numpy's pairwise float32 sum (plain C: the same order on every host)."""
    x = fast_fa.scores(s, mask, scale, use_hmx)
    if x is not None:
        p = exp_f32(x)
        return p, p.sum(axis=-1, keepdims=True, dtype=np.float32), True
    # HMX: the S tile is read out as fp16 with the qk scale applied by the output conversion block
    s = _round16(s * scale) if use_hmx else s * scale
    if mask is not None:
        s = s + mask[None, : s.shape[1], : s.shape[2]]
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        m = np.where(np.isneginf(m), 0.0, m).astype(np.float32)
        p = exp_f32((s - m).astype(np.float32))
    return p, p.sum(axis=-1, keepdims=True, dtype=np.float32), False


def _grouped(a: np.ndarray, b: np.ndarray, hkv: int, exact: bool = False, linger: bool = False) -> np.ndarray:
    """(H, T, X) @ (Hkv, X, Y) -> (H, T, Y), head h against matrix h // (H / Hkv): the g = H / Hkv heads of a
    group are one (g*T, X) matrix against their KV matrix, every product in the device model's order
    (backends/ordered.py: a multiply then an add per x, x ascending; no BLAS). `exact`: both operands hold fp16
    values (the kernel may fuse each multiply into its add: the same bits); `linger`: a decode step's."""
    h, t = a.shape[0], a.shape[1]
    y = ordered_matmul(a.reshape(hkv, (h // hkv) * t, a.shape[2]), b, exact, linger)
    return y.reshape(h, t, b.shape[-1])
