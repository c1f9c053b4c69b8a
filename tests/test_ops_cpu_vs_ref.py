"""Per-op differential tests in the style of test-backend-ops.

Every case builds a one-op graph over seeded random inputs (often non-contiguous views: permuted,
transposed, row views with gaps) and runs it on `cpu` (float32) and on `ref` (float64). Two checks:
- `ref` against an independent float64 oracle written here from ggml's definition of the op (numpy on the
  logical arrays, never through kazeia's kernels or ne/nb views): NMSE <= 1e-20, or exact where exact;
- `cpu` against `ref` with test-backend-ops' thresholds (5e-4 MUL_MAT and FLASH_ATTN_EXT, 1e-6 SOFT_MAX,
  1e-7 otherwise; 0 for copies).
Input ranges follow test-backend-ops (U(-1, 1); MUL/DIV U(0.9, 1.1); unary/GLU U(-150, 150); RMS_NORM
U(-10, 10); ROPE positions < 512).
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from gguf import quants as gq

from kazeia.gguf.quants import dequantize
from kazeia.graph import builder as gb
from kazeia.graph.tensor import GGMLType, TFlag
from oracle_utils import NMSE_FLOAT64, assert_nmse, cpu_and_ref, leaf, random_blocks, threshold

T = GGMLType
F32, F16, I32, I64 = T.F32, T.F16, T.I32, T.I64


def U(rng, shape, lo=-1.0, hi=1.0) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def check(op: str, build, expected: np.ndarray, cpu_limit: float | None = None, exact: bool = False) -> None:
    cpu, ref = cpu_and_ref(build)
    expected = np.asarray(expected, dtype=np.float64)
    assert cpu.shape == ref.shape == expected.shape, (cpu.shape, ref.shape, expected.shape)
    if exact:
        np.testing.assert_array_equal(ref, expected, err_msg=f"{op}: ref != oracle")
        np.testing.assert_array_equal(cpu, ref, err_msg=f"{op}: cpu != ref")
        return
    assert_nmse(ref, expected, NMSE_FLOAT64, f"{op}: ref vs float64 oracle")
    assert_nmse(cpu, ref, threshold(op) if cpu_limit is None else cpu_limit, f"{op}: cpu vs ref")


def np_axes_of_permute(per: tuple[int, int, int, int]) -> tuple[int, ...]:
    """numpy transpose order turning a logical array (ggml dims L) into the base array whose ggml dim per[i]
    holds logical dim i."""
    order = [0] * 4
    for i in range(4):
        order[3 - per[i]] = 3 - i
    return tuple(order)


def permuted_leaf(t: GGMLType, logical: np.ndarray, per: tuple[int, int, int, int], flags: int = 0):
    """A view with logical value `logical` (numpy order, 4-D) over a base tensor laid out with permuted dims:
    ggml dim per[i] of the base holds logical dim i (test-backend-ops' `per`)."""
    base_np = np.ascontiguousarray(np.transpose(logical, np_axes_of_permute(per)))
    base = leaf(t, base_np.shape[::-1], base_np, flags=flags)
    inv = [0] * 4
    for i in range(4):
        inv[per[i]] = i
    v = gb.permute(base, *inv)  # source dim j goes to inv[j]: base dim per[i] -> i
    assert v.ne == logical.shape[::-1], (v.ne, logical.shape)
    return v


# ---------------------------------------------------------------------------------------------------
# binary ops with broadcasting (ggml_repeat semantics: b tiles a)

BCAST = [
    ((16, 5, 3, 2), (16, 1, 1, 1)),
    ((16, 5, 3, 2), (16, 5, 1, 1)),
    ((16, 5, 3, 2), (16, 1, 3, 2)),
    ((16, 5, 3, 2), (16, 5, 3, 2)),
    ((16, 6, 4, 1), (8, 3, 2, 1)),  # tiled, not just broadcast
    ((10, 5, 4, 3), (1, 5, 1, 3)),
]


@pytest.mark.parametrize("op", ["ADD", "MUL"])
@pytest.mark.parametrize("ne_a,ne_b", BCAST, ids=str)
@pytest.mark.parametrize("noncontig", [False, True])
def test_binary(op, ne_a, ne_b, noncontig):
    rng = np.random.default_rng(zlib.crc32(repr((op, ne_a, ne_b, noncontig)).encode()))
    lo, hi = (0.9, 1.1) if op == "MUL" else (-1.0, 1.0)
    a = U(rng, ne_a[::-1], lo, hi)
    b = U(rng, ne_b[::-1], lo, hi)
    fn = gb.add if op == "ADD" else gb.mul

    def build():
        if noncontig:
            ta = permuted_leaf(F32, a, (0, 2, 1, 3))
            tb = permuted_leaf(F32, b, (1, 0, 3, 2))
        else:
            ta, tb = leaf(F32, ne_a, a), leaf(F32, ne_b, b)
        return fn(ta, tb)

    reps = tuple(x // y for x, y in zip(a.shape, b.shape))
    bb = np.tile(b.astype(np.float64), reps)
    want = a + bb if op == "ADD" else a * bb
    check(op, build, want)


def test_scale_with_bias():
    rng = np.random.default_rng(1)
    x = U(rng, (2, 3, 7, 16))
    check("SCALE", lambda: gb.scale(permuted_leaf(F32, x, (0, 3, 2, 1)), 0.37, bias=-0.25),
          x.astype(np.float64) * 0.37 - 0.25)


# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["contiguous", "row_gaps", "transposed", "permuted"])
def test_rms_norm(layout):
    rng = np.random.default_rng(2)
    eps = 1e-6
    x = U(rng, (1, 3, 7, 64), -10, 10)

    def build():
        if layout == "contiguous":
            return gb.rms_norm(leaf(F32, (64, 7, 3), x), eps)
        if layout == "row_gaps":  # rows of 64 inside rows of 80
            wide = np.zeros((1, 3, 7, 80), dtype=np.float32)
            wide[..., :64] = x
            base = leaf(F32, (80, 7, 3), wide)
            return gb.rms_norm(gb.view(base, (64, 7, 3), (4, 80 * 4, 80 * 4 * 7)), eps)
        if layout == "transposed":  # elements of a row are strided
            base = leaf(F32, (7, 64, 3), np.ascontiguousarray(np.swapaxes(x, 2, 3)))
            return gb.rms_norm(gb.transpose(base), eps)
        return gb.rms_norm(permuted_leaf(F32, x, (0, 2, 1, 3)), eps)

    x64 = x.astype(np.float64)
    check("RMS_NORM", build, x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps))


# ---------------------------------------------------------------------------------------------------


def _table(rng, qtype: GGMLType, n_rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(data to store, float64 values) of a [k, n_rows] table of the given type.

    Quantized values come from gguf-py where its float32 result is exact (Q4_0, Q8_0: f16 scale times a small
    integer), else from kazeia's float64 dequantization, which test_quants checks bit-exactly against a
    rational transcription of ggml's dequantize_row_*."""
    x = rng.standard_normal((n_rows, k)).astype(np.float32)
    if qtype == F32:
        return x, x.astype(np.float64)
    if qtype == F16:
        h = x.astype(np.float16)
        return h, h.astype(np.float64)
    if qtype in (T.Q4_K, T.Q6_K):  # gguf-py cannot quantize K-types: random valid blocks
        raw = random_blocks(qtype, n_rows, k // 256, seed=int(qtype), scale_kind="realistic")
    else:
        raw = gq.quantize(x, qtype)
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(n_rows, -1)
    if qtype in (T.Q4_0, T.Q8_0):
        return raw, gq.dequantize(raw, qtype).astype(np.float64)
    return raw, dequantize(raw, qtype, np.float64)


@pytest.mark.parametrize("qtype", [F32, F16, T.Q4_0, T.Q8_0, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("as_weight", [True, False])
def test_get_rows(qtype, as_weight):
    rng = np.random.default_rng(3)
    k = 256
    data, vals = _table(rng, qtype, 20, k)
    ids = rng.integers(0, 20, size=9).astype(np.int32)  # duplicates included
    check("GET_ROWS", lambda: gb.get_rows(leaf(qtype, (k, 20), data, flags=TFlag.WEIGHT if as_weight else 0),
                                          leaf(I32, (9,), ids)),
          vals[ids].reshape(1, 1, 9, k), exact=True)


def test_get_rows_batched():
    """ids [n, 2, 3] pick rows of a [k, rows, 2, 3]: ids dim 1/2 index a's dim 2/3."""
    rng = np.random.default_rng(4)
    a = U(rng, (3, 2, 10, 32))
    ids = rng.integers(0, 10, size=(3, 2, 5)).astype(np.int32)
    want = np.empty((3, 2, 5, 32))
    for i12 in range(3):
        for i11 in range(2):
            want[i12, i11] = a[i12, i11, ids[i12, i11]]
    check("GET_ROWS", lambda: gb.get_rows(permuted_leaf(F32, a, (0, 1, 3, 2)), leaf(I32, (5, 2, 3), ids)),
          want, exact=True)


# ---------------------------------------------------------------------------------------------------
# MUL_MAT: out[i3, i2, n, m] = sum_k a[i3 / r3, i2 / r2, m, k] * b[i3, i2, n, k]


def mm_oracle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    r2, r3 = b.shape[1] // a.shape[1], b.shape[0] // a.shape[0]
    out = np.empty((b.shape[0], b.shape[1], b.shape[2], a.shape[2]))
    for i3 in range(b.shape[0]):
        for i2 in range(b.shape[1]):
            out[i3, i2] = b[i3, i2].astype(np.float64) @ a[i3 // r3, i2 // r2].astype(np.float64).T
    return out


MM_TYPES = [F32, F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K]


@pytest.mark.parametrize("qtype", MM_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("as_weight", [True, False], ids=["weight", "tensor"])
@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_mul_mat_types(qtype, as_weight, n):
    rng = np.random.default_rng(5 + n)
    m, k = 16, 256
    if qtype == T.BF16:
        x = rng.standard_normal((m, k)).astype(np.float32)
        data = (x.view(np.uint32) >> 16).astype(np.uint16)
        a_vals = (data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        data, a_vals = _table(rng, qtype, m, k)
    b = U(rng, (1, 1, n, k))
    check("MUL_MAT", lambda: gb.mul_mat(leaf(qtype, (k, m), data, flags=TFlag.WEIGHT if as_weight else 0),
                                        leaf(F32, (k, n), b)),
          mm_oracle(a_vals.reshape(1, 1, m, k), b))


# (m, n, k, bs, nr) as in test-backend-ops' base_types block
MM_BATCH = [
    (16, 1, 256, (1, 1), (2, 1)), (16, 1, 256, (1, 1), (1, 2)), (16, 1, 256, (3, 1), (2, 1)),
    (16, 4, 256, (3, 2), (2, 2)), (16, 16, 256, (3, 2), (1, 2)), (16, 8, 64, (3, 2), (2, 2)),
    (64, 45, 128, (8, 1), (4, 1)), (1, 7, 2048, (1, 1), (1, 1)), (16, 32, 65, (1, 1), (1, 1)),
    (64, 32, 80, (4, 1), (1, 1)),
]


@pytest.mark.parametrize("atype", [F32, F16], ids=lambda t: t.name)
@pytest.mark.parametrize("m,n,k,bs,nr", MM_BATCH, ids=str)
def test_mul_mat_batched(atype, m, n, k, bs, nr):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = U(rng, (bs[1], bs[0], m, k))
    if atype == F16:
        a = a.astype(np.float16)
    b = U(rng, (bs[1] * nr[1], bs[0] * nr[0], n, k))
    check("MUL_MAT", lambda: gb.mul_mat(leaf(atype, a.shape[::-1], a), leaf(F32, b.shape[::-1], b)),
          mm_oracle(a, b))


@pytest.mark.parametrize("atype", [F32, F16], ids=lambda t: t.name)
@pytest.mark.parametrize("per", [(0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 2, 1)], ids=str)
@pytest.mark.parametrize("n", [1, 8])
def test_mul_mat_permuted(atype, per, n):
    """Both operands non-contiguous: built with permuted dims, then permuted back (bs [2, 3])."""
    rng = np.random.default_rng(sum(per) + n)
    m, k = 16, 256
    a = U(rng, (3, 2, m, k))
    if atype == F16:
        a = a.astype(np.float16)
    b = U(rng, (3, 2, n, k))
    check("MUL_MAT", lambda: gb.mul_mat(permuted_leaf(atype, a, per), permuted_leaf(F32, b, per)),
          mm_oracle(a, b))


@pytest.mark.parametrize("atype", [F32, F16, T.Q4_0], ids=lambda t: t.name)
def test_mul_mat_row_views(atype):
    """k_v > k: both operands are views of the first k values of wider rows."""
    rng = np.random.default_rng(11)
    m, n, k, kv = 16, 5, 256, 320
    if atype == T.Q4_0:
        wide, wide_vals = _table(rng, atype, m, kv)
        a_vals = wide_vals[:, :k]
    else:
        wide = U(rng, (m, kv)).astype(np.float16 if atype == F16 else np.float32)
        a_vals = wide[:, :k].astype(np.float64)
    bw = U(rng, (n, kv))

    def build():
        ta = leaf(atype, (kv, m), wide)
        tb = leaf(F32, (kv, n), bw)
        va = gb.view_2d(ta, k, m, ta.nb[1])
        vb = gb.view_2d(tb, k, n, tb.nb[1])
        return gb.mul_mat(va, vb)

    check("MUL_MAT", build, mm_oracle(a_vals.reshape(1, 1, m, k), bw[:, :k].reshape(1, 1, n, k)))


def test_mul_mat_attention_shapes():
    """kq = K^T Q and kqv = V^T softmax over permuted views of F16 caches with GQA broadcast."""
    rng = np.random.default_rng(12)
    D, H, Hkv, T_, n_kv = 64, 4, 2, 5, 32
    cache = rng.uniform(-1, 1, (n_kv, Hkv, D)).astype(np.float16)  # [D*Hkv, n_kv] as [D, Hkv, n_kv]
    q = U(rng, (T_, H, D))

    def build():
        ck = leaf(F16, (D * Hkv, n_kv), cache.reshape(n_kv, D * Hkv))
        kv = gb.view_3d(ck, D, Hkv, n_kv, ck.nb[0] * D, ck.nb[1])
        kp = gb.permute(kv, 0, 2, 1, 3)  # [D, n_kv, Hkv]
        tq = gb.permute(leaf(F32, (D, H, T_), q), 0, 2, 1, 3)  # [D, T, H]
        return gb.mul_mat(kp, tq)  # [n_kv, T, H]

    k_log = np.transpose(cache, (1, 0, 2))[None]  # (1, Hkv, n_kv, D)
    q_log = np.transpose(q, (1, 0, 2))[None]  # (1, H, T, D)
    check("MUL_MAT", build, mm_oracle(k_log, q_log))


# ---------------------------------------------------------------------------------------------------
# ROPE


def rope_oracle(x: np.ndarray, pos: np.ndarray, n_dims: int, mode: int, base: float, freq_scale: float,
                attn_factor: float) -> np.ndarray:
    """x (ne3, T, H, D) float64; ggml_rope_ext without YaRN: theta = p * freq_scale * base^(-i0/n_dims)."""
    out = x.astype(np.float64).copy()
    for t in range(x.shape[1]):
        for i0 in range(0, n_dims, 2):
            theta = float(pos[t]) * freq_scale * base ** (-i0 / n_dims)
            c, s = math.cos(theta) * attn_factor, math.sin(theta) * attn_factor
            if mode == gb.ROPE_NORM:
                j0, j1 = i0, i0 + 1
            else:
                j0, j1 = i0 // 2, i0 // 2 + n_dims // 2
            x0, x1 = x[:, t, :, j0].astype(np.float64), x[:, t, :, j1].astype(np.float64)
            out[:, t, :, j0] = x0 * c - x1 * s
            out[:, t, :, j1] = x0 * s + x1 * c
    return out


@pytest.mark.parametrize("mode", [gb.ROPE_NORM, gb.ROPE_NEOX], ids=["norm", "neox"])
@pytest.mark.parametrize("n_dims,base,freq_scale,attn_factor", [(64, 10000.0, 1.0, 1.0), (32, 1e6, 0.25, 1.0),
                                                                  (64, 1e5, 1.0, 0.7)], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "gaps", "batched"])
def test_rope(mode, n_dims, base, freq_scale, attn_factor, layout):
    rng = np.random.default_rng(13 + n_dims)
    D, H, T_ = 64, 4, 7
    S = 2 if layout == "batched" else 1
    x = U(rng, (S, T_, H, D))
    pos = rng.integers(0, 512, size=T_).astype(np.int32)

    def build():
        if layout == "gaps":  # [D, H, T] view of a [D, H + 1, T] tensor
            wide = np.zeros((1, T_, H + 1, D), dtype=np.float32)
            wide[:, :, :H] = x
            base_t = leaf(F32, (D, H + 1, T_), wide)
            src = gb.view_3d(base_t, D, H, T_, base_t.nb[1], base_t.nb[2])
        else:
            src = leaf(F32, (D, H, T_, S), x)
        return gb.rope_ext(src, leaf(I32, (T_,), pos), n_dims, mode, base, freq_scale, attn_factor=attn_factor)

    check("ROPE", build, rope_oracle(x, pos, n_dims, mode, base, freq_scale, attn_factor))


def test_rope_yarn_is_refused():
    from kazeia.errors import UnsupportedError

    x = np.zeros((1, 1, 2, 64), dtype=np.float32)
    with pytest.raises(UnsupportedError):
        cpu_and_ref(lambda: gb.rope_ext(leaf(F32, (64, 2, 1), x), leaf(I32, (1,), np.zeros(1, np.int32)), 64,
                                        gb.ROPE_NEOX, 1e4, ext_factor=1.0))


# ---------------------------------------------------------------------------------------------------
# SOFT_MAX and FLASH_ATTN_EXT


def alibi_slope(h: int, n_head: int, max_bias: float) -> float:
    if max_bias <= 0:
        return 1.0
    n_log2 = 2 ** math.floor(math.log2(n_head))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_log2)
    return m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1)


def softmax64(s: np.ndarray) -> np.ndarray:
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    return e / e.sum(axis=-1, keepdims=True)


def causal_mask(rng, n_kv: int, T_: int, rows: int, extra_holes: bool = True) -> np.ndarray:
    m = rng.uniform(-1, 1, (rows, n_kv)).astype(np.float32)
    for t in range(rows):
        m[t, n_kv - T_ + t + 1:] = -np.inf
    if extra_holes:
        m[rng.uniform(size=m.shape) < 0.2] = -np.inf
        m[:, 0] = 0.0  # keep every row alive
    return m


@pytest.mark.parametrize("mask_type", [None, F32, F16], ids=lambda t: getattr(t, "name", "nomask"))
@pytest.mark.parametrize("max_bias", [0.0, 8.0])
@pytest.mark.parametrize("pad_rows", [0, 3])
def test_soft_max(mask_type, max_bias, pad_rows):
    rng = np.random.default_rng(17)
    n_kv, T_, H, S = 32, 7, 6, 2
    scale = 0.125
    x = U(rng, (S, H, T_, n_kv))
    mask = causal_mask(rng, n_kv, T_, T_ + pad_rows)
    if mask_type == F16:
        mask = mask.astype(np.float16)

    def build():
        mk = leaf(mask_type, (n_kv, T_ + pad_rows), mask) if mask_type is not None else None
        return gb.soft_max_ext(permuted_leaf(F32, x, (0, 1, 3, 2)), mk, scale, max_bias)

    s = x.astype(np.float64) * scale
    if mask_type is not None:
        slopes = np.array([alibi_slope(h, H, max_bias) for h in range(H)])[None, :, None, None]
        s = s + slopes * mask[:T_].astype(np.float64)[None, None]
    check("SOFT_MAX", build, softmax64(s))


def test_soft_max_fully_masked_row_is_zero_not_nan():
    x = np.zeros((1, 1, 2, 8), dtype=np.float32)
    mask = np.zeros((2, 8), dtype=np.float32)
    mask[1] = -np.inf
    cpu, ref = cpu_and_ref(lambda: gb.soft_max_ext(leaf(F32, (8, 2), x), leaf(F32, (8, 2), mask), 1.0))
    for out in (cpu, ref):
        assert not np.isnan(out).any()
        np.testing.assert_array_equal(out[0, 0, 1], 0.0)
        np.testing.assert_allclose(out[0, 0, 0], 1 / 8)


def fa_oracle(q, k, v, mask, scale, softcap, max_bias):
    """q (S, H, T, D), k/v (S, Hkv, n_kv, D), mask (T, n_kv) -> (S, T, H, Dv) as FLASH_ATTN_EXT lays it out."""
    S, H, T_, _ = q.shape
    g = H // k.shape[1]
    out = np.empty((S, T_, H, v.shape[-1]))
    for s_ in range(S):
        for h in range(H):
            sc = q[s_, h].astype(np.float64) @ k[s_, h // g].astype(np.float64).T * scale
            if softcap:
                sc = softcap * np.tanh(sc / softcap)
            if mask is not None:
                sc = sc + alibi_slope(h, H, max_bias) * mask[:T_].astype(np.float64)
            out[s_, :, h] = softmax64(sc) @ v[s_, h // g].astype(np.float64)
    return out


@pytest.mark.parametrize("softcap,max_bias", [(0.0, 0.0), (30.0, 0.0), (0.0, 8.0)], ids=str)
@pytest.mark.parametrize("T_,n_kv", [(1, 32), (7, 32), (5, 256)], ids=str)
@pytest.mark.parametrize("with_mask", [True, False])
def test_flash_attn_ext(softcap, max_bias, T_, n_kv, with_mask):
    """The real graph's layout: q a permuted [D, T, H] view, K/V permuted views of F16 caches, F16 mask."""
    rng = np.random.default_rng(19 + T_)
    D, H, Hkv, n_ctx = 64, 4, 2, n_kv + 16
    q = U(rng, (T_, H, D))
    ck = rng.uniform(-1, 1, (n_ctx, Hkv, D)).astype(np.float16)
    cv = rng.uniform(-1, 1, (n_ctx, Hkv, D)).astype(np.float16)
    mask = causal_mask(rng, n_kv, T_, T_).astype(np.float16) if with_mask else None
    scale = 1.0 / math.sqrt(D)

    def build():
        tk = leaf(F16, (D * Hkv, n_ctx), ck.reshape(n_ctx, -1))
        tv = leaf(F16, (D * Hkv, n_ctx), cv.reshape(n_ctx, -1))
        kp = gb.permute(gb.view_3d(tk, D, Hkv, n_kv, tk.nb[0] * D, tk.nb[1]), 0, 2, 1, 3)
        vp = gb.permute(gb.view_3d(tv, D, Hkv, n_kv, tv.nb[0] * D, tv.nb[1]), 0, 2, 1, 3)
        qp = gb.permute(leaf(F32, (D, H, T_), q), 0, 2, 1, 3)
        mk = leaf(F16, (n_kv, T_), mask) if with_mask else None
        return gb.flash_attn_ext(qp, kp, vp, mk, scale, max_bias, softcap)

    k_log = np.transpose(ck[:n_kv], (1, 0, 2))[None]
    v_log = np.transpose(cv[:n_kv], (1, 0, 2))[None]
    q_log = np.transpose(q, (1, 0, 2))[None]
    check("FLASH_ATTN_EXT", build, fa_oracle(q_log, k_log, v_log, mask, scale, softcap, max_bias))


# ---------------------------------------------------------------------------------------------------
# GLU / UNARY


def silu64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


@pytest.mark.parametrize("swapped", [0, 1])
@pytest.mark.parametrize("fused", [False, True], ids=["split", "views_of_fused"])
def test_swiglu(swapped, fused):
    rng = np.random.default_rng(23)
    n, T_ = 64, 5
    g = U(rng, (1, 1, T_, n), -150, 150)
    u = U(rng, (1, 1, T_, n), -150, 150)

    def build():
        if fused:  # gate | up rows of one [2n, T] tensor, as a fused up_gate projection gives them
            both = leaf(F32, (2 * n, T_), np.concatenate([g, u], axis=-1))
            tg = gb.view_2d(both, n, T_, both.nb[1], 0)
            tu = gb.view_2d(both, n, T_, both.nb[1], n * 4)
        else:
            tg, tu = leaf(F32, (n, T_), g), leaf(F32, (n, T_), u)
        r = gb.swiglu_split(tg, tu)
        r.params["swapped"] = swapped
        return r

    a, b = (u, g) if swapped else (g, u)
    check("GLU", build, silu64(a) * b.astype(np.float64))


def test_silu():
    rng = np.random.default_rng(29)
    x = U(rng, (2, 3, 5, 64), -150, 150)
    check("UNARY", lambda: gb.silu(permuted_leaf(F32, x, (0, 2, 3, 1))), silu64(x))


# ---------------------------------------------------------------------------------------------------
# SET_ROWS / CPY / CONT


@pytest.mark.parametrize("dst_type", [F16, F32], ids=lambda t: t.name)
def test_set_rows(dst_type):
    """K of [D, Hkv, T] (a view with gaps, like Kcur) stored into rows of a [D*Hkv, 16] cache."""
    rng = np.random.default_rng(31)
    D, Hkv, T_, size = 32, 2, 5, 16
    old = rng.uniform(-1, 1, (size, D * Hkv)).astype(np.float16 if dst_type == F16 else np.float32)
    k = U(rng, (T_, Hkv + 1, D))  # Hkv + 1 heads per token: the view skips the last one
    ids = rng.permutation(size)[:T_].astype(np.int64)

    def build():
        dst = leaf(dst_type, (D * Hkv, size), old)
        kt = leaf(F32, (D, Hkv + 1, T_), k)
        src = gb.view_2d(kt, D * Hkv, T_, kt.nb[2])
        return gb.set_rows(dst, src, leaf(I64, (T_,), ids))

    want = old.astype(np.float64).copy()
    rows_ = k[:, :Hkv].reshape(T_, D * Hkv)
    want[ids] = rows_.astype(np.float16 if dst_type == F16 else np.float32)
    check("SET_ROWS", build, want.reshape(1, 1, size, D * Hkv), exact=True)


@pytest.mark.parametrize("dst_type", [F32, F16], ids=lambda t: t.name)
def test_cpy_from_permuted(dst_type):
    rng = np.random.default_rng(37)
    x = U(rng, (2, 3, 5, 16), -150, 150)
    dst_np = np.zeros(x.shape, dtype=np.float32)

    def build():
        src = permuted_leaf(F32, x, (0, 2, 1, 3))
        return gb.cpy(src, leaf(dst_type, x.shape[::-1], dst_np.astype(np.float16 if dst_type == F16 else
                                                                          np.float32)))

    want = x.astype(np.float16 if dst_type == F16 else np.float32).astype(np.float64)
    check("CPY", build, want, exact=True)


@pytest.mark.parametrize("src_type", [F32, F16], ids=lambda t: t.name)
@pytest.mark.parametrize("per", [(0, 2, 1, 3), (1, 0, 2, 3), (3, 1, 0, 2)], ids=str)
def test_cont(src_type, per):
    rng = np.random.default_rng(41)
    x = U(rng, (2, 3, 5, 8)).astype(np.float16 if src_type == F16 else np.float32)
    check("CONT", lambda: gb.cont(permuted_leaf(src_type, x, per)), x.astype(np.float64), exact=True)

