"""The `cpu` backend's native small-op kernels (simd_ops.py, bound to nodes by cpu_native.py) against float64
oracles written here from ggml's definitions, on shapes no model uses: head dims and rows not a multiple of 8,
odd GQA ratios, several query rows, fully masked rows, 1 to 300 KV cells. Each case also says whether the
native call ran (cpu_native.bind), so a case that silently fell back to numpy cannot pass for the kernel; the
fallback cases (non-contiguous inputs, broadcasts the kernel does not do) must give the same answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kazeia import native
from kazeia.backends.cpu import CpuBackend
from kazeia.backends.cpu import bind as cpu_native
from kazeia.backends.cpu.kernels import program as cpu_program
from kazeia.engine.scheduler import Scheduler
from kazeia.graph import builder as gb
from kazeia.graph.alloc import GraphAllocator
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import GGMLType, TFlag, array
from kazeia.native.threads import set_kernel_threads, threads
from oracle_utils import assert_nmse, leaf, random_blocks

F32, F16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.I64
pytestmark = pytest.mark.skipif(not native.available(), reason="no AVX2/FMA/F16C host: the numpy paths run")


def run_cpu(out, native_expected: bool, be: CpuBackend | None = None) -> np.ndarray:
    """Run the graph of `out` on a CpuBackend; check that the node was (or was not) bound to a native call."""
    g = Graph()
    g.expand(out)
    GraphAllocator().allocate(g)
    be = be or CpuBackend()
    Scheduler([be]).compute(g)
    assert (cpu_native.bind(be, out) is not None) == native_expected, f"{out.op}: native bound != {native_expected}"
    return np.array(array(out), dtype=np.float64)


def U(rng, shape, lo=-1.0, hi=1.0) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


# --- flash attention -----------------------------------------------------------------------------------------


def fa64(q, k, v, mask, scale):
    """q (H, T, D), k/v (Hkv, n_kv, D), mask (T, n_kv) -> (T, H, Dv); a row seeing no cell gives zeros."""
    H, T, _ = q.shape
    g = H // k.shape[0]
    out = np.zeros((T, H, v.shape[-1]))
    for h in range(H):
        s = q[h].astype(np.float64) @ k[h // g].astype(np.float64).T * scale + mask.astype(np.float64)
        for t in range(T):
            if np.isneginf(s[t]).all():
                continue
            p = np.exp(s[t] - s[t].max())
            out[t, h] = p @ v[h // g].astype(np.float64) / p.sum()
    return out


@pytest.mark.parametrize("D,H,Hkv,T,n_kv,kv_type,mask_type", [
    (20, 6, 2, 1, 1, F16, F16),     # one cell, GQA 3
    (36, 5, 1, 3, 17, F16, F32),    # GQA 5, D not a multiple of 8
    (64, 4, 4, 2, 300, F32, F16),   # no GQA, more cells than a padded decode
    (8, 3, 3, 8, 9, F32, F32),
    (24, 4, 2, 20, 40, F16, F16),   # a short prompt's rows
], ids=str)
def test_flash_attn_decode(D, H, Hkv, T, n_kv, kv_type, mask_type):
    rng = np.random.default_rng(D * 7 + n_kv)
    n_ctx, kdt = n_kv + 5, np.float16 if kv_type == F16 else np.float32
    q = U(rng, (T, H, D), -2, 2)
    ck = rng.uniform(-1, 1, (n_ctx, Hkv, D)).astype(kdt)
    cv = rng.uniform(-1, 1, (n_ctx, Hkv, D)).astype(kdt)
    mask = rng.uniform(-1, 1, (T + 1, n_kv)).astype(np.float32)  # a padded row past T, never read
    mask[rng.uniform(size=mask.shape) < 0.3] = -np.inf
    if T > 1:
        mask[T - 1] = -np.inf  # the last row sees nothing
    mask = mask.astype(np.float16 if mask_type == F16 else np.float32)
    scale = 1.0 / math.sqrt(D)
    tk = leaf(kv_type, (D * Hkv, n_ctx), ck.reshape(n_ctx, -1))
    tv = leaf(kv_type, (D * Hkv, n_ctx), cv.reshape(n_ctx, -1))
    kp = gb.permute(gb.view_3d(tk, D, Hkv, n_kv, tk.nb[0] * D, tk.nb[1]), 0, 2, 1, 3)
    vp = gb.permute(gb.view_3d(tv, D, Hkv, n_kv, tv.nb[0] * D, tv.nb[1]), 0, 2, 1, 3)
    qp = gb.permute(leaf(F32, (D, H, T), q), 0, 2, 1, 3)
    out = gb.flash_attn_ext(qp, kp, vp, leaf(mask_type, (n_kv, T + 1), mask), scale)
    got = run_cpu(out, True)[0]  # (T, H, Dv)
    want = fa64(np.transpose(q, (1, 0, 2)), np.transpose(ck[:n_kv], (1, 0, 2)), np.transpose(cv[:n_kv], (1, 0, 2)),
                mask[:T], scale)
    assert T == 1 or np.all(got[T - 1] == 0.0)
    assert_nmse(got, want, 1e-10, "native flash attention vs float64")


def test_flash_attn_many_rows_falls_back():
    """More query rows than FA_MAX_T: numpy's batched products, the same answer."""
    rng = np.random.default_rng(5)
    T, D, H, n_kv = cpu_native.FA_MAX_T + 1, 16, 2, 12
    q, k, v = U(rng, (H, T, D)), U(rng, (H, n_kv, D)), U(rng, (H, n_kv, D))
    mask = np.zeros((T, n_kv), dtype=np.float32)
    out = gb.flash_attn_ext(leaf(F32, (D, T, H), q), leaf(F32, (D, n_kv, H), k), leaf(F32, (D, n_kv, H), v),
                            leaf(F32, (n_kv, T), mask), 0.25)
    assert_nmse(run_cpu(out, False)[0], fa64(q, k, v, mask, 0.25), 1e-10, "numpy flash attention")


# --- rope, rms_norm, binary, swiglu --------------------------------------------------------------------------


def rope64(x, pos, nd, mode, base, fs, af):
    """x (T, H, D) float64 by ggml_rope_ext's definition (ext_factor 0)."""
    out = x.astype(np.float64).copy()
    theta = pos[:, None].astype(np.float64) * fs * base ** (-np.arange(0, nd, 2) / nd)[None, :]  # (T, nd/2)
    c, s = (np.cos(theta) * af)[:, None, :], (np.sin(theta) * af)[:, None, :]
    i0 = np.arange(nd // 2) if mode == gb.ROPE_NEOX else np.arange(0, nd, 2)
    i1 = i0 + nd // 2 if mode == gb.ROPE_NEOX else i0 + 1
    x0, x1 = x[..., i0].astype(np.float64), x[..., i1].astype(np.float64)
    out[..., i0], out[..., i1] = x0 * c - x1 * s, x0 * s + x1 * c
    return out


@pytest.mark.parametrize("mode", [gb.ROPE_NORM, gb.ROPE_NEOX], ids=["norm", "neox"])
def test_rope(mode):
    rng = np.random.default_rng(11 + mode)
    T, H, D, nd = 5, 3, 22, 12  # the last 10 dims pass through
    x = U(rng, (T, H, D))
    pos = rng.integers(0, 512, T).astype(np.int32)
    out = gb.rope_ext(leaf(F32, (D, H, T), x), leaf(I32, (T,), pos), nd, mode, 10000.0, 0.5, attn_factor=0.75)
    got = run_cpu(out, True)[0]
    assert_nmse(got, rope64(x, pos, nd, mode, 10000.0, 0.5, 0.75), 1e-12, "native rope vs float64")
    np.testing.assert_array_equal(got[..., nd:], x[..., nd:])


def test_rope_table_is_numpys():
    """The native cos/sin table (libm on float64 angles) has numpy's bits: native and numpy ropes agree exactly."""
    from kazeia.backends.cpu.f32_ops import angles

    pos = np.arange(0, 4096, 7, dtype=np.int32)
    for p in ({"n_dims": 64, "freq_base": 1e4, "freq_scale": 1.0}, {"n_dims": 22, "freq_base": 1e6,
                                                                     "freq_scale": 0.25, "attn_factor": 0.7}):
        tab = cpu_native._RopeTable(leaf(I32, (pos.size,), pos), p)
        tab.fill(0)
        cos, sin = angles(pos, p)
        np.testing.assert_array_equal(tab.cos, cos)
        np.testing.assert_array_equal(tab.sin, sin)


def test_rms_norm_and_fallback():
    rng = np.random.default_rng(13)
    x = U(rng, (2, 3, 37), -10, 10)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5)
    got = run_cpu(gb.rms_norm(leaf(F32, (37, 3, 2), x), 1e-5), True)[0]
    assert_nmse(got, want, 1e-13, "native rms_norm")
    xt = np.ascontiguousarray(np.swapaxes(x, 1, 2))  # (2, 37, 3): a permuted view has rows with gaps
    pv = gb.permute(leaf(F32, (3, 37, 2), xt), 1, 0, 2, 3)
    assert_nmse(run_cpu(gb.rms_norm(pv, 1e-5), False)[0], want, 1e-13, "numpy rms_norm (permuted input)")


@pytest.mark.parametrize("op", ["ADD", "MUL"])
@pytest.mark.parametrize("b_ne,native_expected", [((13, 4, 3, 1), True), ((13, 1, 1, 1), True),
                                                  ((13, 1, 3, 1), False)], ids=["same", "row", "plane"])
def test_binary(op, b_ne, native_expected):
    rng = np.random.default_rng(17)
    a = U(rng, (1, 3, 4, 13), 0.9, 1.1)
    b = U(rng, b_ne[::-1], 0.9, 1.1)
    f = gb.add if op == "ADD" else gb.mul
    got = run_cpu(f(leaf(F32, (13, 4, 3), a), leaf(F32, b_ne, b)), native_expected)
    want = (a.astype(np.float64) + b) if op == "ADD" else (a.astype(np.float64) * b)
    np.testing.assert_array_equal(got, want.astype(np.float32))  # one float32 rounding, as numpy


def test_swiglu_extremes():
    rng = np.random.default_rng(19)
    g = U(rng, (4, 29), -150, 150)
    g[0, :5] = [np.nan, np.inf, -np.inf, -100.0, 88.9]
    u = U(rng, (4, 29), -2, 2)
    out = gb.swiglu_split(leaf(F32, (29, 4), g), leaf(F32, (29, 4), u))
    got = run_cpu(out, True)
    with np.errstate(over="ignore", invalid="ignore"):
        want = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * u
    assert np.isnan(got[0, 0, 0, 0]) and np.isnan(got[0, 0, 0, 1]) == np.isnan(want[0, 1])
    fin = np.isfinite(want)
    assert_nmse(got.reshape(want.shape)[fin], want[fin], 1e-12, "native swiglu")


# --- SET_ROWS ----------------------------------------------------------------------------------------------


def test_set_rows_f16_and_out_of_range():
    rng = np.random.default_rng(23)
    rows_, ne0, n = 11, 13, 4
    old = rng.uniform(-1, 1, (rows_, ne0)).astype(np.float16)
    src = U(rng, (n, ne0), -70000, 70000)  # some overflow fp16: inf, as numpy's astype
    ids = rng.permutation(rows_)[:n].astype(np.int64)
    out = gb.set_rows(leaf(F16, (ne0, rows_), old), leaf(F32, (ne0, n), src), leaf(I64, (n,), ids))
    want = old.copy()
    with np.errstate(over="ignore"):
        want[ids] = src.astype(np.float16)
    np.testing.assert_array_equal(run_cpu(out, True)[0, 0], want.astype(np.float64))
    bad = ids.copy()
    bad[2] = rows_
    out = gb.set_rows(leaf(F16, (ne0, rows_), old), leaf(F32, (ne0, n), src), leaf(I64, (n,), bad))
    with pytest.raises(IndexError, match="out of range"):
        run_cpu(out, True)
    np.testing.assert_array_equal(array(out.src[2])[0, 0], old)  # nothing written


def test_numpy_attention_reads_what_native_stores_wrote():
    """Native KV stores, then a flash attention of more rows than the native one takes (numpy's), twice over: the
    second run must read the second run's rows (no stale copy of the cache anywhere)."""
    rng = np.random.default_rng(29)
    D, H, T = 16, 2, cpu_native.FA_MAX_T + 2
    n_kv = T + 3
    cache_k = leaf(F16, (D, n_kv), np.zeros((n_kv, D), np.float16))
    cache_v = leaf(F16, (D, n_kv), np.zeros((n_kv, D), np.float16))
    kx, vx, qx = leaf(F32, (D, T), None), leaf(F32, (D, T), None), leaf(F32, (D, T, H), None)
    ids = leaf(I64, (T,), np.arange(T, dtype=np.int64))
    g = Graph()
    stores = [gb.set_rows(cache_k, kx, ids), gb.set_rows(cache_v, vx, ids)]
    for t in stores:
        g.expand(t)
    kv = [gb.view_3d(c, D, n_kv, 1, c.nb[1], c.nb[1] * n_kv) for c in (cache_k, cache_v)]
    out = gb.flash_attn_ext(qx, kv[0], kv[1], leaf(F32, (n_kv, T), np.zeros((T, n_kv), np.float32)), 0.5)
    g.expand(out)
    GraphAllocator().allocate(g)
    be = CpuBackend()
    for _ in range(2):
        k, v, q = U(rng, (T, D)), U(rng, (T, D)), U(rng, (H, T, D))
        for t, x in ((kx, k), (vx, v), (qx, q)):
            array(t)[...] = x.reshape(array(t).shape)
        Scheduler([be]).compute(g)
        assert all(cpu_native.bind(be, t) is not None for t in stores) and cpu_native.bind(be, out) is None
        kk = np.zeros((1, n_kv, D), np.float16)
        vv = kk.copy()
        kk[0, :T], vv[0, :T] = k, v
        want = fa64(q, np.repeat(kk, H, 0), np.repeat(vv, H, 0), np.zeros((T, n_kv)), 0.5)
        assert_nmse(np.array(array(out), np.float64)[0], want, 1e-10, "numpy flash attention after native stores")


# --- bound GEMV (decode matmuls): fused groups, fresh inputs per run, re-placed graphs ------------------------


def test_bound_gemv_fused_and_replaced():
    rng = np.random.default_rng(31)
    K, Ns = 96, (40, 24)
    raws = [random_blocks(GGMLType.Q4_0, n, K // 32, seed=i, scale_kind="small") for i, n in enumerate(Ns)]
    ws = [leaf(GGMLType.Q4_0, (K, n), r, flags=TFlag.WEIGHT, name=f"w{i}") for i, (n, r) in enumerate(zip(Ns, raws))]
    from kazeia.gguf.quants import dequantize

    dense = [dequantize(r, GGMLType.Q4_0, np.float64).reshape(n, K) for r, n in zip(raws, Ns)]
    x = leaf(F32, (K, 1), np.zeros((1, K), np.float32))
    y0, y1 = gb.mul_mat(ws[0], x), gb.mul_mat(ws[1], x)
    out = gb.add(gb.view_2d(y0, 24, 1, y0.nb[1]), y1)  # both members consumed
    g = Graph()
    g.expand(out)
    be, sched = CpuBackend(), None
    for trial in range(3):
        if trial < 2 or sched is None:
            GraphAllocator().allocate(g)  # trial 1: a new buffer, new addresses
            sched = Scheduler([be])
        xv = U(rng, (1, K))
        array(x)[...] = xv.reshape(array(x).shape)
        sched.compute(g)
        want = xv.astype(np.float64) @ dense[0][:24].T + xv @ dense[1].T
        assert_nmse(np.array(array(out), np.float64).reshape(-1), want.reshape(-1), 1e-7, f"run {trial}")
        assert be._graph_bind.bound[y0][1] is not None and be._graph_bind.bound[y1][1] is not None


# --- GET_ROWS (the token embedding, the output rows) and the F16 cast of the mask ------------------------------


@pytest.mark.parametrize("qtype", [GGMLType.Q8_0, GGMLType.Q4_1, F32], ids=lambda t: t.name)
@pytest.mark.parametrize("n_ids", [1, 3])
def test_get_rows(qtype, n_ids):
    from kazeia.gguf.quants import dequantize

    rng = np.random.default_rng(37)
    K, N = 64, 10
    if qtype == F32:
        dense = U(rng, (N, K))
        table = leaf(F32, (K, N), dense)
    else:
        raw = random_blocks(qtype, N, K // 32, seed=3, scale_kind="small")
        table = leaf(qtype, (K, N), raw, flags=TFlag.WEIGHT)
        dense = dequantize(raw, qtype, np.float32).reshape(N, K)
    ids = rng.integers(0, N, n_ids).astype(np.int32)
    got = run_cpu(gb.get_rows(table, leaf(I32, (n_ids,), ids)), True)[0, 0]
    np.testing.assert_array_equal(got, dense[ids])  # exact: the values gguf-py gives
    with pytest.raises(IndexError, match="out of range"):
        run_cpu(gb.get_rows(table, leaf(I32, (n_ids,), np.full(n_ids, -1, np.int32))), True)


def test_cpy_f32_to_f16():
    rng = np.random.default_rng(41)
    x = U(rng, (3, 21), -70000, 70000)
    x[0, :2] = [-np.inf, np.nan]
    got = run_cpu(gb.cpy(leaf(F32, (21, 3), x), leaf(F16, (21, 3), np.zeros((3, 21), np.float16))), True)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got[0, 0], x.astype(np.float16).astype(np.float64))


def test_bound_gemv_same_bits_at_any_thread_count():
    """A weight large enough for the pool (qmatmul.PARALLEL_MIN_BYTES): 1 and 2 threads, the same bits, and the
    thread count read at each call (not when the node was bound)."""
    from kazeia.backends.cpu.kernels import dequant as qmatmul

    K, N = 1024, 2048
    raw = random_blocks(GGMLType.Q4_0, N, K // 32, seed=5, scale_kind="small")
    assert raw.nbytes >= qmatmul.PARALLEL_MIN_BYTES
    w = leaf(GGMLType.Q4_0, (K, N), raw, flags=TFlag.WEIGHT, name="big")
    x = leaf(F32, (K, 1), U(np.random.default_rng(43), (1, K)))
    out = gb.mul_mat(w, x)
    g = Graph()
    g.expand(out)
    GraphAllocator().allocate(g)
    sched, before = Scheduler([CpuBackend()]), threads()
    got = []
    try:
        for t in (1, 2, 1):
            set_kernel_threads(t)
            sched.compute(g)
            got.append(np.array(array(out)))
    finally:
        set_kernel_threads(before)
    assert sched.backends[0]._graph_bind.bound[out][1] is not None
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])


def test_node_alone_runs_the_kernel_it_ran_in_its_graph():
    """A node computed outside any graph begun on the backend (a replayed op) gets the same native call, so the
    same bits as inside its graph (dump/replay compares them bitwise)."""
    rng = np.random.default_rng(47)
    D, H, T, n_kv = 24, 3, 5, 9
    q, k, v = U(rng, (H, T, D)), U(rng, (H, n_kv, D)), U(rng, (H, n_kv, D))
    mask = np.zeros((T, n_kv), np.float32)
    out = gb.flash_attn_ext(leaf(F32, (D, T, H), q), leaf(F16, (D, n_kv, H), k.astype(np.float16)),
                            leaf(F16, (D, n_kv, H), v.astype(np.float16)), leaf(F32, (n_kv, T), mask), 0.3)
    rope = gb.rope_ext(leaf(F32, (D, H, T), q.transpose(1, 0, 2).copy()),
                       leaf(I32, (T,), np.arange(3, 3 + T, dtype=np.int32)), D, gb.ROPE_NEOX, 1e4)
    for node in (out, rope):
        in_graph = run_cpu(node, True)
        array(node)[...] = 0
        CpuBackend().compute(node)  # no begin_graph
        np.testing.assert_array_equal(np.array(array(node), np.float64), in_graph)


def test_programs_match_per_node_calls(tiny_qwen3_q4):
    """A decode with no hook runs programs (runs of native calls in one call); with a hook, node by node: the same
    bits, prompt and decode steps (Q4_0 GEMVs, fused Q/K/V and gate/up, ropes, KV stores, flash attention)."""
    from kazeia.backends.base import Hook
    from kazeia.engine.context import Context
    from oracle_utils import shared_model

    def logits(hook: bool) -> np.ndarray:
        ctx = Context(shared_model(tiny_qwen3_q4), Scheduler([CpuBackend()]), n_ctx=64, flash_attn=True)
        if hook:
            ctx.scheduler.add_hook(Hook())
        out = [ctx.decode([5, 9, 2, 7, 11])] + [ctx.decode([t]) for t in (3, 8, 1)]
        return np.stack(out)

    np.testing.assert_array_equal(logits(False), logits(True))
    be = CpuBackend()
    ctx = Context(shared_model(tiny_qwen3_q4), Scheduler([be]), n_ctx=64, flash_attn=True)
    ctx.decode([5])
    (calls,) = [c for _, c in be._graph_bind.programs.values()]
    assert any(isinstance(c, cpu_program._Program) for c in calls)
