"""float32 kernels of the `cpu` backend (the `ref` oracle keeps the plain kernels of numpy_ops), for the nodes the
native kernels (bind.py) do not take and for hosts without them.

Same results up to float32 rounding order; each falls back to the plain kernel outside the case it takes.
"""

from __future__ import annotations

import os

import numpy as np

from kazeia.backends.numpy_ops import KERNELS, NumpyOps, freq_factors, gelu_tanh, glu_halves, rope_angles
from kazeia.graph.builder import ROPE_NEOX, ROPE_NORM
from kazeia.graph.tensor import SCALAR_DTYPES, GGMLType, Tensor, array
from kazeia.native.threads import single_blas_thread, threads

F32_KERNELS: dict[str, tuple] = {}  # op -> (the plain kernel it stands in for, the float32 kernel)
FA_ROW_BLOCK = 64  # query rows per block: a causal block only attends to the KV cells its rows can see


def f32_kernel(op: str):
    def deco(fn):
        F32_KERNELS[op] = (KERNELS[op], fn)
        return fn
    return deco


def _kv(be: NumpyOps, t: Tensor, n: int) -> np.ndarray:
    """The first n cells of a K or V cache view (S, Hkv, n_kv, D), converted to float32."""
    mirror = getattr(be, "kv_mirror", None)
    m = mirror(t) if mirror is not None else None
    if m is not None:
        return m[:, :, :n]
    if t.type in SCALAR_DTYPES:
        return array(t)[:, :, :n].astype(be.ft)
    return be.load(t)[:, :, :n]


def _softmax_inplace(s: np.ndarray) -> None:
    """Softmax over the last axis, in place; an all -inf row gives zeros."""
    m = s.max(axis=-1, keepdims=True)
    m[np.isneginf(m)] = 0.0
    s -= m
    np.exp(s, out=s)
    z = s.sum(axis=-1, keepdims=True)
    z[z == 0] = 1.0
    s /= z


@f32_kernel("FLASH_ATTN_EXT")
def _flash_attn_ext(be: NumpyOps, n: Tensor) -> None:
    qt, kt, vt = n.src[0], n.src[1], n.src[2]
    mt = n.src[3] if len(n.src) > 3 else None
    if n.params.get("max_bias", 0.0) > 0.0 or n.params.get("softcap", 0.0) or mt is None or mt.ne[2] != 1:
        return KERNELS["FLASH_ATTN_EXT"](be, n)  # ALiBi, softcap, no mask or a per-head mask: the plain kernel
    q = be.load(qt)  # (S, H, T, D)
    S, H, T, D = q.shape
    Hkv = kt.ne[2]
    g = H // Hkv
    qs = (q * be.ft(n.params["scale"])).reshape(S, Hkv, g, T, D)  # GQA: a kv head's g query heads
    mask = array(mt)[:, :, :T, : kt.ne[1]]  # (S|1, 1, T, n_kv), -inf where a row must not look
    seen = ~np.isneginf(mask).all(axis=(0, 1))  # (T, n_kv): a cell some row of the batch sees
    out = np.empty((S, T, H, vt.ne[0]), dtype=be.ft)
    # one BLAS thread: the products are small GEMMs per KV head (T x D x n_kv), where two threads wait on each
    # other at every call, and on a shared machine for a descheduled worker (measured at pp128 of the 4B
    # model: 175 ms of CPU per layer with two threads)
    with single_blas_thread():
        _fa_blocks(be, kt, vt, qs, mask, seen, out, S, Hkv, g, T, D, H)
    be.store(n, out)


def _fa_blocks(be, kt, vt, qs, mask, seen, out, S, Hkv, g, T, D, H) -> None:
    cols = np.flatnonzero(seen.any(axis=0))
    n_all = int(cols[-1]) + 1 if cols.size else 1  # masked cells beyond the last one seen add exactly nothing
    k_all, v_all = _kv(be, kt, n_all), _kv(be, vt, n_all)  # (S, Hkv, n, D) float32, converted once
    limits = []
    for t0 in range(0, T, FA_ROW_BLOCK):
        t1 = min(T, t0 + FA_ROW_BLOCK)
        cols = np.flatnonzero(seen[t0:t1].any(axis=0))
        limits.append((t0, t1, int(cols[-1]) + 1 if cols.size else 1))

    def heads(h0: int, h1: int) -> None:
        """The KV heads [h0, h1) and their query heads: each head's products are its own BLAS calls, so which
        thread runs a head never changes its bits."""
        for t0, t1, nv in limits:
            k, v = k_all[:, h0:h1, :nv], v_all[:, h0:h1, :nv]
            qb = qs[:, h0:h1, :, t0:t1].reshape(S, h1 - h0, g * (t1 - t0), D)
            s = np.matmul(qb, k.swapaxes(-1, -2)).reshape(S, h1 - h0, g, t1 - t0, nv)
            s += mask[:, :, None, t0:t1, :nv]
            with np.errstate(invalid="ignore", over="ignore"):
                _softmax_inplace(s)
            o = np.matmul(s.reshape(S, h1 - h0, g * (t1 - t0), nv), v).reshape(S, (h1 - h0) * g, t1 - t0, -1)
            out[:, t0:t1, h0 * g:h1 * g] = o.transpose(0, 2, 1, 3)

    half = Hkv // 2
    if threads() < 2 or half == 0 or T * n_all < FA_SPLIT_MIN:
        heads(0, Hkv)
        return
    other = _fa_pool().submit(heads, half, Hkv)  # numpy releases the GIL in the products and the softmax
    heads(0, half)
    other.result()


FA_SPLIT_MIN = 64 * 64  # query rows x KV cells from which the KV heads are split between two threads
_FA_POOL = None


def _fa_pool():
    """One helper thread for the second half of a prefill flash attention's KV heads (made on first use, and again in
    a forked child: the parent's thread does not exist there, and work queued to its pool would wait forever)."""
    global _FA_POOL
    if _FA_POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _FA_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kazeia-fa")
    return _FA_POOL


def _forget_fa_pool() -> None:
    global _FA_POOL
    _FA_POOL = None


os.register_at_fork(after_in_child=_forget_fa_pool)


_rope_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def angles(pos: np.ndarray, p: dict, factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin (T, n_dims/2) * attn_factor, float32, computed once per positions and parameters (Q and K of
    every layer share them)."""
    key = (pos.tobytes(), p["n_dims"], p["freq_base"], p["freq_scale"], p.get("attn_factor", 1.0),
           None if factors is None else factors.tobytes())
    hit = _rope_cache.get(key)
    if hit is None:
        cos, sin = rope_angles(pos, p["n_dims"], p["freq_base"], p["freq_scale"], np.float32, factors)
        af = np.float32(p.get("attn_factor", 1.0))
        if len(_rope_cache) > 8:
            _rope_cache.clear()
        hit = _rope_cache[key] = (cos * af, sin * af)
    return hit


@f32_kernel("ROPE")
def _rope(be: NumpyOps, n: Tensor) -> None:
    p = n.params
    if p.get("ext_factor", 0.0) != 0.0 or p["mode"] not in (ROPE_NORM, ROPE_NEOX):
        return KERNELS["ROPE"](be, n)
    x = be.load(n.src[0])  # (ne3, T, H, D)
    nd = p["n_dims"]
    cos, sin = angles(array(n.src[1]).reshape(-1), p, freq_factors(n))
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = array(n)
    if nd < x.shape[-1]:
        out[..., nd:] = x[..., nd:]
    if p["mode"] == ROPE_NEOX:
        x0, x1 = x[..., : nd // 2], x[..., nd // 2: nd]
        o0, o1 = out[..., : nd // 2], out[..., nd // 2: nd]
    else:
        x0, x1 = x[..., 0:nd:2], x[..., 1:nd:2]
        o0, o1 = out[..., 0:nd:2], out[..., 1:nd:2]
    if np.shares_memory(x, out):  # in place (the allocator may reuse the source's memory)
        x0, x1 = x0.copy(), x1.copy()
    np.multiply(x0, cos, out=o0)
    o0 -= x1 * sin
    np.multiply(x0, sin, out=o1)
    o1 += x1 * cos


def _numpy_broadcastable(a: Tensor, b: Tensor) -> bool:
    """ggml_repeat of b over a is plain numpy broadcasting (no tiling)."""
    return all(bd == 1 or bd == ad for ad, bd in zip(a.ne, b.ne))


def _binary(ufunc, fallback: str):
    def kern(be: NumpyOps, n: Tensor) -> None:
        a, b = n.src
        if n.type != GGMLType.F32 or not _numpy_broadcastable(a, b):
            return KERNELS[fallback](be, n)
        ufunc(be.load(a), be.load(b), out=array(n))
    return kern


f32_kernel("ADD")(_binary(np.add, "ADD"))
f32_kernel("MUL")(_binary(np.multiply, "MUL"))


@f32_kernel("RMS_NORM")
def _rms_norm(be: NumpyOps, n: Tensor) -> None:
    x = be.load(n.src[0])
    mean = np.einsum("...i,...i->...", x, x, dtype=np.float64) / x.shape[-1]
    inv = (1.0 / np.sqrt(mean + n.params["eps"])).astype(np.float32)
    np.multiply(x, inv[..., None], out=array(n))


GELU_TABLE_RANGE = 10.0  # ggml_vec_geglu_f32: 0 below -10, x * g above 10, the fp16 table between


def gelu_fp16_table(x: np.ndarray) -> np.ndarray:
    """ggml-cpu's GELU with GGML_GELU_FP16 (vec.h, ggml_vec_geglu_f32 / ggml_vec_gelu_f32): x rounded to fp16 indexes
    ggml_table_gelu_f16, which holds fp16(ggml_gelu_f32(x)); outside (-10, 10) the function's limits."""
    h = x.astype(np.float16).astype(np.float32)
    table = gelu_tanh(h).astype(np.float16).astype(np.float32)
    return np.where(x <= -GELU_TABLE_RANGE, np.float32(0), np.where(x >= GELU_TABLE_RANGE, x, table))


@f32_kernel("GLU")
def _glu(be: NumpyOps, n: Tensor) -> None:
    if n.params["glu_op"] == "GEGLU":
        a, b = glu_halves(be, n)
        with np.errstate(over="ignore", invalid="ignore"):
            np.multiply(gelu_fp16_table(a), b, out=array(n))
        return None
    if n.params["glu_op"] != "SWIGLU":
        return KERNELS["GLU"](be, n)
    a, b = glu_halves(be, n)
    t = np.negative(a)  # silu(a) = a / (1 + exp(-a)), the same operations as the plain kernel
    with np.errstate(over="ignore"):
        np.exp(t, out=t)
    t += 1
    np.divide(a, t, out=t)
    np.multiply(t, b, out=array(n))


@f32_kernel("SET_ROWS")
def _set_rows(be: NumpyOps, n: Tensor) -> None:
    """The KV-cache store of one micro-batch: one contiguous block of rows, indices in range."""
    src, ids = n.src[0], n.src[1]
    if src.ne[2] != 1 or src.ne[3] != 1 or n.ne[2] != 1 or n.ne[3] != 1 or ids.ne[1] != 1 or ids.ne[2] != 1:
        return KERNELS["SET_ROWS"](be, n)
    sel = array(ids).reshape(-1)
    if sel.size and (int(sel.min()) < 0 or int(sel.max()) >= n.ne[1]):
        raise IndexError(f"{n.name}: row id out of range [0, {n.ne[1]})")
    be.store_rows(n, sel.reshape(1, 1, 1, -1), be.load(src))
