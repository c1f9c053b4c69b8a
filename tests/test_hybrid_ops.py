"""The ops of the hybrid (gated delta net) layers, test-backend-ops style, on `ref`, `cpu` and `htp`.

Every case is a one-op graph over seeded random inputs in test-backend-ops' ranges (GATED_DELTA_NET: q/k
L2-normalized, g U(-20, -1e-4), beta U(0, 1), v U(-0.3, 5); unary ops U(-150, 150)). Checks:
- `ref` against an independent float64 oracle written here from ggml's definitions (ggml-cpu ops.cpp), on the
  logical arrays: NMSE <= 1e-20 (exact where exact);
- `cpu` and the HTP model (both profiles, the op placed on HTP0) against `ref` with test-backend-ops' 1e-7;
- a prefill split in two micro-batches carries the state (GDN state, conv columns) exactly;
- the HTP's host-side checks (supports_op) refuse what upstream refuses, and those ops fall back to the CPU;
- the 2026-05 defects these ops carry: HVX SSM_CONV reads shifted conv weights when a thread's channel count is
  not a multiple of 32 (computed here from the aligned-load rule, independently of the kernel), and the ops that
  write VTCM without clearing the src1 shortcut make a following HVX matmul on the same src1 read their bytes.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from kazeia.backends.cpu import CpuBackend
from kazeia.backends.htp.backend import HtpBackend
from kazeia.backends.htp.host.support import supports_op
from kazeia.backends.htp.settings import HtpSettings
from kazeia.engine.scheduler import Scheduler
from kazeia.graph import builder as gb
from kazeia.graph.alloc import GraphAllocator
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import GGMLType, TFlag, array
from oracle_utils import NMSE_DEFAULT, NMSE_FLOAT64, assert_nmse, cpu_and_ref, leaf, run_graph

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32
PROFILES = ["robust", "2026-05"]


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def U(rng, shape, lo=-1.0, hi=1.0) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def run_htp(build, profile: str, nhvx: int = 6, expect_htp: bool = True) -> np.ndarray:
    """The output of build()'s graph with HTP0 (then CPU for what it refuses); asserts where the op ran."""
    out = build()
    g = Graph()
    g.expand(out)
    GraphAllocator().allocate(g)
    htp = HtpBackend(HtpSettings(profile=profile, nhvx=nhvx))
    sched = Scheduler([htp, CpuBackend()])
    sched.compute(g)
    where = {p.node: p.backend for p in sched.placements}
    assert where[out.name] == ("HTP0" if expect_htp else "CPU"), where
    return np.array(array(out), dtype=np.float64)


def check_all(build, expected: np.ndarray, htp: bool = True, exact: bool = False) -> None:
    cpu, ref = cpu_and_ref(build)
    expected = np.asarray(expected, dtype=np.float64)
    assert ref.shape == expected.shape, (ref.shape, expected.shape)
    if exact:
        np.testing.assert_array_equal(ref, expected)
        np.testing.assert_array_equal(cpu, ref)
    else:
        assert_nmse(ref, expected, NMSE_FLOAT64, "ref vs float64 oracle")
        assert_nmse(cpu, ref, NMSE_DEFAULT, "cpu vs ref")
    if htp:
        for profile in PROFILES:
            got = run_htp(build, profile)
            if exact:
                np.testing.assert_array_equal(got, ref, err_msg=profile)
            else:
                assert_nmse(got, ref, NMSE_DEFAULT, f"htp {profile} vs ref")


# ---------------------------------------------------------------------------------------------------
# SSM_CONV: out[s, t, i] = sum_j sx[s, i, t + j] * c[i, j]


def conv_oracle(sx: np.ndarray, c: np.ndarray) -> np.ndarray:
    """sx (n_s, d_inner, ncs), c (d_inner, d_conv) -> (1, n_s, n_t, d_inner), a loop per output element."""
    sx, c = sx.astype(np.float64), c.astype(np.float64)
    n_s, d_inner, ncs = sx.shape
    d_conv = c.shape[1]
    n_t = ncs - d_conv + 1
    out = np.zeros((1, n_s, n_t, d_inner))
    for s in range(n_s):
        for t in range(n_t):
            out[0, s, t] = np.sum(sx[s, :, t:t + d_conv] * c, axis=1)
    return out


@pytest.mark.parametrize("d_inner,n_t,n_s", [(40, 5, 2), (64, 1, 1), (96, 40, 1), (256, 33, 2)])
def test_ssm_conv(d_inner, n_t, n_s):
    """Decode (n_t 1), short prefill (scalar path) and >= 32 tokens with 32+ channels (the HVX path; thread row
    counts multiples of 32 here so that 2026-05 is right too: 96 / 6 = 16 is not, so only robust is checked)."""
    rng = rng_for("ssm_conv", d_inner, n_t, n_s)
    d_conv = 4
    sx = U(rng, (n_s, d_inner, d_conv - 1 + n_t))
    c = U(rng, (d_inner, d_conv))

    def build():
        return gb.ssm_conv(leaf(F32, sx.shape[::-1], sx), leaf(F32, c.shape[::-1], c))

    want = conv_oracle(sx, c)
    cpu, ref = cpu_and_ref(build)
    assert_nmse(ref, want, NMSE_FLOAT64, "ref vs oracle")
    assert_nmse(cpu, ref, NMSE_DEFAULT, "cpu vs ref")
    assert_nmse(run_htp(build, "robust"), ref, NMSE_DEFAULT, "htp robust")
    if n_t < 32 or d_inner < 32:
        assert_nmse(run_htp(build, "2026-05"), ref, NMSE_DEFAULT, "htp 2026-05 scalar path")


def shifted_weights(c: np.ndarray, n_threads: int, padded: bool) -> np.ndarray:
    """The weights HVX SSM_CONV multiplies: per thread, tap j's row of [d_conv][rows] starts j * stride floats
    in; an aligned 32-float load starts (j * stride) % 32 floats earlier, so channel i gets element
    j * stride + i - (j * stride) % 32 of the thread's transposed weights (ssm-conv.c, HVX aligned loads)."""
    d_inner, d_conv = c.shape
    per = -(-d_inner // n_threads)
    rows = -(-per // 32) * 32 if padded else per + per % 2
    out = np.empty_like(c)
    for t in range(n_threads):
        i0, i1 = t * rows, min((t + 1) * rows, d_inner)
        if i0 >= i1:
            continue
        stride = rows if padded else i1 - i0
        flat = np.zeros(c.shape[1] * rows + 64, dtype=c.dtype)
        for j in range(d_conv):
            flat[j * stride:j * stride + i1 - i0] = c[i0:i1, j]
        for j in range(d_conv):
            idx = j * stride + np.arange(i1 - i0) - (j * stride) % 32
            out[i0:i1, j] = flat[idx]
    return out


@pytest.mark.parametrize("d_inner,nhvx", [(256, 6), (8192 // 8, 6), (256, 4)])
def test_ssm_conv_2026_05_reads_shifted_weights(d_inner, nhvx):
    """2026-05, prefill (40 tokens), 6 HVX threads: ceil(256 / 6) = 43 -> 44 rows per thread, taps 1..3 read
    weights 12, 24 and 4 channels early; the result is the conv with those weights, not a crash. With 4 threads
    (64 rows) the stride is aligned and 2026-05 is right; robust pads the stride (#24470) and is always right."""
    rng = rng_for("ssm_conv_defect", d_inner, nhvx)
    sx = U(rng, (1, d_inner, 3 + 40))
    c = U(rng, (d_inner, 4))

    def build():
        return gb.ssm_conv(leaf(F32, sx.shape[::-1], sx), leaf(F32, c.shape[::-1], c))

    right = conv_oracle(sx, c)
    assert_nmse(run_htp(build, "robust", nhvx), right, NMSE_DEFAULT, "robust")
    got = run_htp(build, "2026-05", nhvx)
    per = -(-d_inner // nhvx)
    if (per + per % 2) % 32 == 0:
        assert_nmse(got, right, NMSE_DEFAULT, "2026-05 with an aligned stride")
    else:
        assert_nmse(got, conv_oracle(sx, shifted_weights(c, nhvx, padded=False)), NMSE_DEFAULT, "2026-05 shifted")
        assert np.sum((got - right) ** 2) / np.sum(right ** 2) > 0.1  # really wrong, not rounding


def test_ssm_conv_state_carried_across_micro_batches():
    """Two micro-batches: conv over (state ++ x1), the new state is its last 3 columns, then conv over (state ++
    x2) == one conv over (state ++ x1 ++ x2)."""
    rng = rng_for("ssm_conv_state")
    C, T1, T2 = 64, 7, 5
    state, x = U(rng, (1, C, 3)), U(rng, (1, C, T1 + T2))
    c = U(rng, (C, 4))
    whole = conv_oracle(np.concatenate([state, x], axis=2), c)

    def step(st, xs):
        def build():
            cat = gb.concat(leaf(F32, st.shape[::-1], st), gb.transpose(leaf(F32, (C, xs.shape[2]),
                                                                              xs[0].T.copy())), 0)
            return gb.ssm_conv(cat, leaf(F32, c.shape[::-1], c))
        return build

    for runner in (lambda b: run_graph(b, CpuBackend()), lambda b: run_htp(b, "robust")):
        first = runner(step(state, x[:, :, :T1]))
        st2 = np.concatenate([state, x[:, :, :T1]], axis=2)[:, :, -3:]
        second = runner(step(st2, x[:, :, T1:]))
        assert_nmse(np.concatenate([first, second], axis=2), whole, NMSE_DEFAULT, "two micro-batches")


# ---------------------------------------------------------------------------------------------------
# GATED_DELTA_NET


def gdn_oracle(q, k, v, g, beta, state, K=1):
    """Per (sequence, head), per token, with the state as a (k dim, v dim) matrix S (ggml stores S^T):
    S *= exp(g); delta = beta (v - S^T k); S += k delta^T; o = S^T q / sqrt(d). q/k head h % H_k (tiled), sequence
    s // (n_seqs / their n_seqs). Returns the flat dst: outputs (s, t, h, :), then K state snapshots (S^T)."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    n_seqs, T, H, S = v.shape
    st = np.asarray(state, np.float64).reshape(n_seqs, K, H, S, S)  # [s][slot][h] = S^T
    out = np.zeros((n_seqs, T, H, S))
    snaps = np.zeros((K, n_seqs, H, S, S))
    for s in range(n_seqs):
        for h in range(H):
            m = st[s, 0, h].T.copy()  # S (k index, v index)
            qs, ks = s // (n_seqs // q.shape[0]), s // (n_seqs // k.shape[0])
            for t in range(T):
                qv, kv = q[qs, t, h % q.shape[2]], k[ks, t, h % k.shape[2]]
                gv = g[s, t, h]
                m = m * (np.exp(gv)[:, None] if gv.size > 1 else np.exp(gv[0]))
                delta = beta[s, t, h, 0] * (v[s, t, h] - m.T @ kv)
                m = m + np.outer(kv, delta)
                out[s, t, h] = m.T @ qv / np.sqrt(S)
                slot = t - (T - K)
                if 0 <= slot < K:
                    snaps[slot, s, h] = m.T
    return np.concatenate([out.reshape(-1), snaps.reshape(-1)])


def l2n(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)).astype(np.float32)


def gdn_inputs(rng, S, H, Hk, T, n_seqs, kda=False, K=1, qk_seqs=None):
    qk_seqs = qk_seqs or n_seqs
    q = l2n(U(rng, (qk_seqs, T, Hk, S)))
    k = l2n(U(rng, (qk_seqs, T, Hk, S)))
    v = U(rng, (n_seqs, T, H, S), -0.3, 5.0)
    g = U(rng, (n_seqs, T, H, S if kda else 1), -20.0, -1e-4)
    beta = U(rng, (n_seqs, T, H, 1), 0.0, 1.0)
    state = U(rng, (n_seqs, K, S * S * H), -0.5, 0.5)
    return q, k, v, g, beta, state


def gdn_build(q, k, v, g, beta, state):
    def build():
        return gb.gated_delta_net(*(leaf(F32, x.shape[::-1], x) for x in (q, k, v, g, beta, state)))
    return build


GDN_CASES = [  # S, H, H_k, T, n_seqs, kda, K, q/k sequences
    (16, 4, 2, 5, 2, False, 1, None),  # GQA-style tiled q/k heads, two sequences
    (32, 2, 2, 1, 1, False, 1, None),  # decode: the HTP keeps the state in VTCM
    (8, 6, 3, 7, 1, True, 1, None),  # KDA: a decay per key dim
    (16, 4, 4, 5, 1, False, 3, None),  # 3 state snapshots (the last 3 tokens)
    (16, 2, 1, 2, 1, False, 3, None),  # fewer tokens than snapshot slots
    (8, 2, 2, 3, 4, False, 1, 2),  # q/k shared by pairs of sequences
    (128, 2, 1, 3, 1, False, 1, None),  # the largest head the HTP takes
]


@pytest.mark.parametrize("S,H,Hk,T,n_seqs,kda,K,qks", GDN_CASES, ids=str)
def test_gated_delta_net(S, H, Hk, T, n_seqs, kda, K, qks):
    rng = rng_for("gdn", S, H, Hk, T, n_seqs, kda, K, qks)
    ins = gdn_inputs(rng, S, H, Hk, T, n_seqs, kda, K, qks)
    want = gdn_oracle(*ins, K=K)
    build = gdn_build(*ins)
    if K > 1:  # slots before the last min(T, K) tokens are left as they were: compare the written part only
        written = S * H * T * n_seqs + min(T, K) * S * S * H * n_seqs
        n_att = S * H * T * n_seqs
        sl = np.r_[0:n_att, n_att + (K - min(T, K)) * S * S * H * n_seqs:n_att + K * S * S * H * n_seqs]
        assert sl.size == written
        cpu, ref = cpu_and_ref(build)
        assert_nmse(ref.reshape(-1)[sl], want[sl], NMSE_FLOAT64, "ref vs oracle")
        assert_nmse(cpu.reshape(-1)[sl], ref.reshape(-1)[sl], NMSE_DEFAULT, "cpu vs ref")
        for profile in PROFILES:
            assert_nmse(run_htp(build, profile).reshape(-1)[sl], ref.reshape(-1)[sl], NMSE_DEFAULT, profile)
        return
    check_all(build, want.reshape(1, 1, -1, S * H))


def test_gated_delta_net_state_carried_across_micro_batches():
    """T1 tokens, then T2 tokens from the state the first call returned == T1 + T2 tokens at once (cpu, ref and
    htp: decode-sized and prefill-sized pieces)."""
    S, H, Hk = 16, 4, 2
    rng = rng_for("gdn_carry")
    q, k, v, g, beta, state = gdn_inputs(rng, S, H, Hk, 9, 1)
    whole = gdn_oracle(q, k, v, g, beta, state)
    n_out = S * H * 9
    for split in (1, 4, 8):
        pieces = []
        st = state
        for a, b in ((0, split), (split, 9)):
            ins = [x[:, a:b] for x in (q, k, v, g, beta)]
            build = gdn_build(*ins, st)
            for label, res in (("cpu", run_graph(build, CpuBackend())), ("htp", run_htp(build, "robust")),
                               ("htp 2026-05", run_htp(build, "2026-05"))):
                flat = res.reshape(-1)
                if label == "cpu":
                    pieces.append(flat[:S * H * (b - a)])
                    new_state = flat[S * H * (b - a):].reshape(st.shape).astype(np.float32)
                else:
                    assert_nmse(flat, np.concatenate([pieces[-1], new_state.reshape(-1)]), NMSE_DEFAULT, label)
            st = new_state
        assert_nmse(np.concatenate(pieces), whole[:n_out], NMSE_DEFAULT, f"split at {split}: outputs")
        assert_nmse(st.reshape(-1), whole[n_out:], NMSE_DEFAULT, f"split at {split}: final state")


# ---------------------------------------------------------------------------------------------------
# L2_NORM, SIGMOID, SOFTPLUS, CONCAT, multi-section ROPE


@pytest.mark.parametrize("layout", ["contiguous", "strided_heads"])
def test_l2_norm(layout):
    rng = rng_for("l2", layout)
    eps = 1e-6
    if layout == "contiguous":
        x = U(rng, (1, 3, 5, 32), -10, 10)
        x[0, 0, 0] = 0  # a zero row: max(norm, eps) keeps it 0, not NaN

        def build():
            return gb.l2_norm(leaf(F32, x.shape[::-1], x), eps)
        logical = x
    else:  # q of the conv output: heads of 16 inside rows of 96 channels
        base = U(rng, (1, 1, 7, 96), -10, 10)

        def build():
            b = leaf(F32, (96, 7), base)
            return gb.l2_norm(gb.view_4d(b, 16, 2, 7, 1, 64, 384, 384 * 7, 0), eps)
        logical = base[0, 0].reshape(7, 6, 16)[:, :2][None]
    x64 = logical.astype(np.float64)
    want = x64 / np.maximum(np.sqrt(np.sum(x64 * x64, axis=-1, keepdims=True)), eps)
    check_all(build, want)


@pytest.mark.parametrize("op", ["SIGMOID", "SOFTPLUS"])
def test_unary(op):
    rng = rng_for("unary", op)
    x = U(rng, (1, 2, 3, 37), -150, 150)
    x[0, 0, 0, :4] = [20.0, 20.5, -20.0, 0.0]  # softplus' threshold
    fn = gb.sigmoid if op == "SIGMOID" else gb.softplus
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-x64)) if op == "SIGMOID" else np.where(x64 > 20, x64, np.log1p(np.exp(x64)))
    check_all(lambda: fn(leaf(F32, x.shape[::-1], x)), want)


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_concat(dim):
    rng = rng_for("concat", dim)
    shape_a = [2, 3, 4, 5]
    shape_b = list(shape_a)
    shape_b[3 - dim] = 2  # numpy axis of ggml dim
    a, b = U(rng, shape_a), U(rng, shape_b)
    want = np.concatenate([a, b], axis=3 - dim)
    check_all(lambda: gb.concat(leaf(F32, a.shape[::-1], a), leaf(F32, b.shape[::-1], b), dim), want, exact=True)


def test_concat_transposed_src1_like_the_conv_input():
    """The conv input: the conv state [3, C] then the new columns, a transposed view of qkv [C, T] (the HTP's
    VTCM path)."""
    rng = rng_for("concat_t")
    C, T = 70, 37
    st, qkv = U(rng, (1, 1, C, 3)), U(rng, (1, 1, T, C))
    want = np.concatenate([st, np.swapaxes(qkv, 2, 3)], axis=3)
    check_all(lambda: gb.concat(leaf(F32, (3, C), st), gb.transpose(leaf(F32, (C, T), qkv)), 0), want, exact=True)


def mrope_oracle(x: np.ndarray, pos4: np.ndarray, n_dims: int, sections, imrope: bool, base: float) -> np.ndarray:
    """x (1, T, H, D); NEOX pairs (i, i + n_dims/2) turn by pos[stream(i)] * base^(-2i/n_dims); stream by
    ggml_mrope_cache_init's sector rule."""
    T = x.shape[1]
    out = x.astype(np.float64).copy()
    total = sum(sections)
    for t in range(T):
        for i in range(n_dims // 2):
            sec = i % total
            if imrope:
                st = 1 if sec % 3 == 1 and sec < 3 * sections[1] else 2 if sec % 3 == 2 and sec < 3 * sections[2] \
                    else 0 if sec % 3 == 0 and sec < 3 * sections[0] else 3
            else:
                st = 0 if sec < sections[0] else 1 if sec < sections[0] + sections[1] else \
                    2 if sec < sum(sections[:3]) else 3
            th = pos4[st, t] * base ** (-2 * i / n_dims)
            a, b = x[0, t, :, i].astype(np.float64), x[0, t, :, i + n_dims // 2].astype(np.float64)
            out[0, t, :, i] = a * np.cos(th) - b * np.sin(th)
            out[0, t, :, i + n_dims // 2] = a * np.sin(th) + b * np.cos(th)
    return out


@pytest.mark.parametrize("mode", [gb.ROPE_IMROPE, gb.ROPE_MROPE])
@pytest.mark.parametrize("sections,n_dims", [((11, 11, 10, 0), 64), ((3, 3, 2, 0), 16), ((4, 2, 2, 1), 16),
                                             ((1, 1, 0, 0), 4)])
def test_rope_multi(mode, sections, n_dims):
    """Distinct streams (not just text positions), partial rotation, and sections that leave pairs to the 4th
    stream (its position 0: no rotation for text)."""
    rng = rng_for("mrope", mode, sections, n_dims)
    T, H, D = 6, 3, max(n_dims, 16) * 2
    x = U(rng, (1, T, H, D))
    pos4 = rng.integers(0, 500, size=(4, T)).astype(np.int32)

    def build():
        return gb.rope_multi(leaf(F32, (D, H, T), x), leaf(I32, (4 * T,), pos4.reshape(-1)), n_dims, sections, mode,
                             1e6)

    check_all(build, mrope_oracle(x, pos4, n_dims, sections, mode == gb.ROPE_IMROPE, 1e6))


# ---------------------------------------------------------------------------------------------------
# the HTP's host-side checks


def test_ssm_conv_gate_refuses_what_upstream_refuses():
    """ggml_hexagon_supported_ssm_conv: F32 only, and sx rows contiguous; refused ops run on the CPU."""
    s = HtpSettings()
    rng = rng_for("gate")
    sx, c = U(rng, (1, 40, 8)), U(rng, (40, 4))
    assert supports_op(gb.ssm_conv(leaf(F32, (8, 40), sx), leaf(F32, (4, 40), c)), s)
    assert not supports_op(gb.ssm_conv(leaf(F32, (8, 40), sx), leaf(F16, (4, 40), c.astype(np.float16))), s)
    wide = leaf(F32, (16, 40), U(rng, (1, 40, 16)))  # sx rows with gaps (nb1 != ne0 * 4)
    assert not supports_op(gb.ssm_conv(gb.view_3d(wide, 8, 40, 1, wide.nb[1], wide.nb[2]), leaf(F32, (4, 40), c)), s)

    def gated():
        return gb.ssm_conv(leaf(F32, (8, 40), sx), leaf(F16, (4, 40), c.astype(np.float16)))
    got = run_htp(gated, "robust", expect_htp=False)
    assert_nmse(got, conv_oracle(sx, c.astype(np.float16).astype(np.float32)), NMSE_DEFAULT, "CPU fallback")


def test_gdn_and_rope_checks():
    s = HtpSettings()
    rng = rng_for("gdn_check")
    ok = gdn_build(*gdn_inputs(rng, 128, 2, 2, 2, 1))()
    assert supports_op(ok, s)
    too_wide = gdn_build(*gdn_inputs(rng, 160, 1, 1, 2, 1))()  # S_v > 128 (HTP_GDN_MAX_SV)
    assert not supports_op(too_wide, s)
    x, pos = leaf(F32, (16, 2, 3)), leaf(I32, (12,))
    assert supports_op(gb.rope_multi(x, pos, 8, (2, 1, 1, 0), gb.ROPE_IMROPE, 1e4), s)
    vision = gb.rope_multi(x, pos, 8, (2, 1, 1, 0), gb.ROPE_IMROPE, 1e4)
    vision.params["mode"] = gb.ROPE_VISION
    assert not supports_op(vision, s)


# ---------------------------------------------------------------------------------------------------
# the src1 "already quantized in VTCM" shortcut around these ops


def _q4_weight(rng, n: int, k: int):
    from gguf.quants import quantize

    w = quantize(U(rng, (n, k)) / np.float32(np.sqrt(k)), GGMLType.Q4_0)
    return leaf(GGMLType.Q4_0, (k, n), w, name="w", flags=TFlag.WEIGHT)


STALE_OPS = {  # op -> a node that reads `x` or its own inputs and writes VTCM from its base on the HTP
    "L2_NORM": lambda x, rng: gb.l2_norm(x, 1e-6),
    "SIGMOID": lambda x, rng: gb.sigmoid(x),
    "SOFTPLUS": lambda x, rng: gb.softplus(x),
    "GATED_DELTA_NET": lambda x, rng: gdn_build(*gdn_inputs(rng, 128, 4, 4, 1, 1))(),
    "CONCAT": lambda x, rng: gb.concat(leaf(F32, (3, 256)), gb.transpose(leaf(F32, (256, 40), U(rng, (40, 256)))), 0),
}


@pytest.mark.parametrize("op", list(STALE_OPS))
def test_ops_that_leave_the_src1_shortcut_stale(op):
    """MUL_MAT(w1, x) (HVX: 1 token, quantizes x into VTCM), then `op` (writes VTCM from base), then MUL_MAT(w2,
    x): 2026-05 trusts the shortcut and multiplies the other op's bytes; robust re-quantizes. Upstream cleared the
    pointer in these ops later (#23989). The hybrid's own graph order never gives them the chance (see
    test_qwen35_htp.py)."""
    rng = rng_for("stale", op)
    x_np = U(rng, (1, 1, 1, 2560))
    w1, w2 = _q4_weight(rng, 64, 2560), _q4_weight(rng, 64, 2560)

    def second(profile: str) -> np.ndarray:
        x = leaf(F32, (2560, 1), x_np, name="x")
        g = Graph()
        g.expand(gb.mul_mat(w1, x, name="first"))
        g.expand(STALE_OPS[op](leaf(F32, (2560, 1), x_np * 3), rng))
        out = g.expand(gb.mul_mat(w2, x, name="second"))
        GraphAllocator().allocate(g)
        sched = Scheduler([HtpBackend(HtpSettings(profile=profile)), CpuBackend()])
        sched.compute(g)
        assert {p.backend for p in sched.placements} == {"HTP0"}
        return np.array(array(out), dtype=np.float64)

    ref = run_graph(lambda: gb.mul_mat(w2, leaf(F32, (2560, 1), x_np)), CpuBackend())
    assert_nmse(second("robust"), ref, 5e-4, "robust re-quantizes x")
    stale = second("2026-05")  # the other op's bytes read as int8 quants and fp16 scales: garbage, often NaN
    assert not np.isfinite(stale).all() or np.sum((stale - ref) ** 2) / np.sum(ref ** 2) > 1e-2, op
