"""The `cpu` backend's weight matmuls on the quantized bytes (kazeia.backends.cpu.qmatmul), on both kernel sets:
the AVX2 ones (kernels/: gemv, gemm, dequant, quantize, "native") and their portable numba twins ("portable", what
a host without AVX2/F16C or KAZEIA_SIMD=0 runs).

- MUL_MAT on a 2-D weight, cpu vs ref (float64, exact weights) at test-backend-ops' 5e-4 NMSE, for
  Q4_0/Q4_1/Q8_0/F16/BF16/F32 with K not a multiple of 256, M from 1 to 600 (the GEMV path for small M and
  the tiled dequantize + BLAS path, with tiles smaller than N) and a non-contiguous src1;
- the GEMV's int16 activations stay far inside that: NMSE <= 1e-7 against the float64 product;
- the tile dequantizers give gguf-py's float32 values bitwise; the native activation quantizer gives the
  portable one's codes and scales bitwise (non-finite and all-zero blocks included);
- every GEMV output is computed by one thread in one order: bitwise the same at 1 and 2 threads, with any
  chunk size, alone or in a fused group of weights, and run to run;
- non-finite activations stay non-finite; no float copy of a weight is kept (traced allocations of a decode
  stay far below the weight's float32 size).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES

from kazeia import native
from kazeia.backends.cpu import CpuBackend
from kazeia.backends.cpu import qmatmul as Q
from kazeia.backends.cpu.kernels import gemm as G
from kazeia.backends.cpu.kernels.quantize import quantize_activations
from kazeia.gguf.quants import dequantize
from kazeia.graph import builder as gb
from kazeia.graph.tensor import GGMLType, TFlag
from kazeia.native.threads import set_kernel_threads as set_threads
from oracle_utils import _finite_f16_bits, assert_nmse, cpu_and_ref, leaf, random_blocks, run_graph

T = GGMLType
TYPES = [T.Q4_0, T.Q4_1, T.Q8_0, T.F16, T.BF16, T.F32]
HAVE_SIMD = native.available()


@pytest.fixture(params=["native", "portable"])
def kernels(request, monkeypatch):
    """Run the test on the AVX2 kernels, then on the portable numba ones."""
    if request.param == "native" and not HAVE_SIMD:
        pytest.skip("no AVX2/FMA/F16C on this host")
    with native.portable_only(request.param == "portable"):
        yield request.param


def weight_rows(qtype: T, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw rows (N, row_bytes) uint8, exact float64 values (N, K))."""
    rng = np.random.default_rng(seed)
    if qtype in (T.F32, T.F16):
        w = rng.standard_normal((n, k)).astype(np.float32 if qtype == T.F32 else np.float16)
        return w.view(np.uint8).reshape(n, -1), w.astype(np.float64)
    if qtype == T.BF16:
        bits = (rng.standard_normal((n, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits.view(np.uint8).reshape(n, -1), (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    bs, _ = GGML_QUANT_SIZES[qtype]
    raw = random_blocks(qtype, n, k // bs, seed, scale_kind="small")
    return raw, dequantize(raw, qtype, np.float64)


def weight_leaf(qtype: T, raw: np.ndarray, k: int, n: int):
    """A 2-D weight leaf holding `raw` (typed values for the scalar types, as `leaf` wants them)."""
    data = raw.view({T.F32: np.float32, T.F16: np.float16}[qtype]) if qtype in (T.F32, T.F16) else raw
    return leaf(qtype, (k, n), data, flags=TFlag.WEIGHT)


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(((np.asarray(a, np.float64) - b) ** 2).mean() / (b ** 2).mean())


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 2, 3, 37, 600])
def test_cpu_vs_ref_mul_mat(qtype, m, kernels, monkeypatch):
    monkeypatch.setattr(Q, "TILE_BYTES", 64 * 800 * 4)  # 64-row tiles: several per weight
    n, k = 150, 800  # K = 25 blocks of 32, not a multiple of 256; N not a multiple of the tile
    raw, wv = weight_rows(qtype, n, k, seed=m + int(qtype))
    rng = np.random.default_rng(m)
    x = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    cpu, ref = cpu_and_ref(lambda: gb.mul_mat(weight_leaf(qtype, raw, k, n), leaf(T.F32, (k, m), x)))
    assert_nmse(ref, (x.astype(np.float64) @ wv.T)[None, None], 1e-20, "ref vs float64")
    assert_nmse(cpu, ref, 5e-4, f"cpu vs ref {qtype.name} M={m}")


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_non_contiguous_src1(qtype, kernels):
    n, k, m = 64, 288, 5
    raw, wv = weight_rows(qtype, n, k, seed=3)
    rng = np.random.default_rng(4)
    xt = rng.uniform(-1, 1, (k, m)).astype(np.float32)  # stored K-major: the (M, K) view is transposed

    def build():
        base = leaf(T.F32, (m, k), xt)
        return gb.mul_mat(weight_leaf(qtype, raw, k, n), gb.transpose(base))
    cpu, ref = cpu_and_ref(build)
    assert_nmse(ref, (xt.T.astype(np.float64) @ wv.T)[None, None], 1e-20, "ref vs float64")
    assert_nmse(cpu, ref, 5e-4, "cpu vs ref")


@pytest.mark.parametrize("qtype", Q.GEMV_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k", [32, 800, 5120])
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_gemv_int16_activations_are_nearly_exact(qtype, k, m, kernels):
    raw, wv = weight_rows(qtype, 97, k, seed=k)
    x = (np.random.default_rng(k).standard_normal((m, k)) * np.linspace(0.1, 20, k)).astype(np.float32)
    y = Q.weight_matmul(raw, qtype, k, x)
    assert nmse(y, x.astype(np.float64) @ wv.T) <= 1e-7


@pytest.mark.skipif(not HAVE_SIMD, reason="no AVX2/FMA/F16C on this host")
@pytest.mark.parametrize("qtype", Q.GEMV_TYPES, ids=lambda t: t.name)
def test_native_gemm_every_m_and_partial_panels(qtype, monkeypatch):
    """The native GEMM (M > GEMV_MAX_M) for every M up to 20 (its 3-row micro-kernel and the 1-row tail),
    N = 16k + 1..15 (partial panels), K = 800 (not a multiple of 256), a strided x and a column view of the
    output: nearly exact against float64, and bitwise the rows of the same product computed by row subsets."""
    k = 800
    for n in (13, 16, 45):
        raw, wv = weight_rows(qtype, n, k, seed=n)
        xt = (np.random.default_rng(n).standard_normal((k, 20)) * np.linspace(0.1, 20, k)[:, None]).astype(np.float32)
        x = xt.T  # (20, K), not contiguous
        for m in range(Q.GEMV_MAX_M + 1, 21):
            out = np.full((m, n + 9), np.nan, dtype=np.float32)
            Q.weight_matmul(raw, qtype, k, x[:m], out[:, 4:4 + n])
            assert nmse(out[:, 4:4 + n], x[:m].astype(np.float64) @ wv.T) <= 1e-7, (n, m)
            assert np.isnan(out[:, :4]).all() and np.isnan(out[:, 4 + n:]).all()
            if m >= 2 * (Q.GEMV_MAX_M + 1):  # an output row does not depend on which rows share its call
                half = m // 2
                parts = [Q.weight_matmul(raw, qtype, k, x[a:b]) for a, b in ((0, half), (half, m))]
                assert np.array_equal(np.concatenate(parts), out[:, 4:4 + n])


@pytest.mark.skipif(not HAVE_SIMD, reason="no AVX2/FMA/F16C on this host")
@pytest.mark.parametrize("qtype", Q.GEMV_TYPES, ids=lambda t: t.name)
def test_native_gemm_k_chunks_keep_the_bits(qtype, monkeypatch):
    """The GEMM's K runs in chunks sized to keep x in L2 (gemm.k_chunk), each chunk resuming the sums the earlier
    ones stored in y: bitwise the product of one chunk, with uneven chunks (K = 1312: 41 blocks in chunks of
    21 + 20 or 6 x 7 - 1), partial panels (N = 45) and the 1-row tail (M = 23), on a column view of the output
    (the partial panel's loads must not read the neighbouring columns: they hold NaN here)."""
    k, n, m = 1312, 45, 23
    raw, wv = weight_rows(qtype, n, k, seed=7)
    x = (np.random.default_rng(7).standard_normal((m, k)) * np.linspace(0.1, 20, k)).astype(np.float32)
    got = {}
    for budget, kc in ((1 << 30, 41), (21 * G.QK * 2 * m, 21), (1, 7)):  # (the floor of 8 blocks: 6 chunks)
        monkeypatch.setattr(G, "X_CHUNK_BYTES", budget)
        assert G.k_chunk(m, k // G.QK) == kc
        out = np.full((m, n + 9), np.nan, dtype=np.float32)
        Q.weight_matmul(raw, qtype, k, x, out[:, 4:4 + n])
        assert np.isnan(out[:, :4]).all() and np.isnan(out[:, 4 + n:]).all()
        got[budget] = out[:, 4:4 + n].copy()
    one, *chunked = got.values()
    assert nmse(one, x.astype(np.float64) @ wv.T) <= 1e-7
    for c in chunked:
        assert np.array_equal(c, one)


@pytest.mark.skipif(not HAVE_SIMD, reason="no AVX2/FMA/F16C on this host")
def test_native_activation_codes_are_the_portable_ones(monkeypatch):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 800)) * np.linspace(0.01, 30, 800)).astype(np.float32)
    x[1, 5], x[2, 100], x[2, 300] = np.nan, -np.inf, np.inf
    x[0, 64:96] = 0
    x[2, 200:232] = 1e-30  # amax/32767 is subnormal
    native_codes = quantize_activations(x)
    with native.portable_only():
        portable = quantize_activations(x)
    for a, b in zip(native_codes, portable):
        assert np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q8_0, T.F16, T.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [33, 2000])  # 2000 rows of 800: over PARALLEL_MIN_BYTES for every type
def test_dequantize_rows_is_gguf_bitwise(qtype, n, kernels):
    if qtype == T.F16:  # every finite fp16 and the infinities
        bits = _finite_f16_bits(np.random.default_rng(n), n * 800)
        bits[::97] = 0x7C00
        raw = bits.view(np.uint8).reshape(n, -1)
    else:
        bs, _ = GGML_QUANT_SIZES[qtype]
        raw = random_blocks(qtype, n, 800 // bs, seed=n, scale_kind="any")  # any finite fp16 scale; BF16 bits
    want = dequantize(raw, qtype, np.float32)
    assert np.array_equal(Q.dequantize_rows(raw, qtype, 800).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [3, 700])
def test_dequantize_k_quant_rows_is_gguf_bitwise(qtype, n):
    """The K-quant tiles of the CPU's weight matmuls (numba, on threads): gguf-py's values, any finite fp16 scales and
    any scale/code bytes."""
    from gguf import quants as gq

    raw = random_blocks(qtype, n, 3, seed=n, scale_kind="any")  # K = 768
    got = Q.dequantize_rows(raw, qtype, 768)
    assert np.array_equal(got.view(np.uint32), dequantize(raw, qtype, np.float32).view(np.uint32))
    assert np.array_equal(got.view(np.uint32), gq.dequantize(raw, qtype).view(np.uint32))


@pytest.mark.parametrize("qtype", Q.GEMV_TYPES, ids=lambda t: t.name)
def test_bitwise_deterministic(qtype, kernels, monkeypatch):
    raw, _ = weight_rows(qtype, 1301, 2560, seed=7)  # 1.8-3.5 MB: the native GEMV runs on the threads
    rng = np.random.default_rng(8)
    x1, x64 = rng.standard_normal((1, 2560)).astype(np.float32), rng.standard_normal((64, 2560)).astype(np.float32)
    x5 = rng.standard_normal((5, 2560)).astype(np.float32)
    try:
        for x in (x1, x5, x64):  # the GEMV, and the native GEMM from M = 5
            set_threads(1)
            one = Q.weight_matmul(raw, qtype, 2560, x)
            set_threads(2)
            two = Q.weight_matmul(raw, qtype, 2560, x)
            monkeypatch.setattr(Q, "GEMV_CHUNK", 8)
            monkeypatch.setattr(G, "CHUNK", 16)
            small_chunks = Q.weight_matmul(raw, qtype, 2560, x)
            monkeypatch.setattr(Q, "GEMV_CHUNK", 64)
            monkeypatch.setattr(G, "CHUNK", 32)
            assert np.array_equal(one, two)  # each output: one thread, one order
            assert np.array_equal(one, small_chunks)
        assert np.array_equal(Q.weight_matmul(raw, qtype, 2560, x64), Q.weight_matmul(raw, qtype, 2560, x64))
    finally:
        set_threads(2)


@pytest.mark.parametrize("qtype", Q.GEMV_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3, 6])
def test_fused_group_is_each_weight_bitwise(qtype, m, kernels):
    """A WeightSet (Q/K/V-like: 3 weights of 200, 40 and 13 rows) writes each weight's product, bitwise
    what the weight alone gives, into its columns; a strided output view works too."""
    k = 288
    parts = [weight_rows(qtype, n, k, seed=n)[0] for n in (200, 40, 13)]
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    fused = Q.WeightSet([(raw, qtype, k) for raw in parts]).matmul(x)
    alone = np.concatenate([Q.weight_matmul(raw, qtype, k, x) for raw in parts], axis=1)
    assert np.array_equal(fused, alone)
    big = np.full((m, 260), np.nan, dtype=np.float32)
    Q.WeightSet([(parts[0], qtype, k)]).matmul(x, big[:, 7:207])
    assert np.array_equal(big[:, 7:207], alone[:, :200]) and np.isnan(big[:, :7]).all()


@pytest.mark.parametrize("qtype", Q.GEMV_TYPES, ids=lambda t: t.name)
def test_non_finite_activations_propagate(qtype, kernels):
    raw, _ = weight_rows(qtype, 8, 64, seed=2)
    x = np.ones((2, 64), dtype=np.float32)
    x[0, 3], x[1, 40] = np.nan, np.inf
    y = Q.weight_matmul(raw, qtype, 64, x)
    assert not np.isfinite(y).any()


def test_no_float_copy_of_the_weight(kernels):
    n, k = 4096, 1024  # 16 MiB as float32, 2.25 MiB as Q4_0
    raw, _ = weight_rows(T.Q4_0, n, k, seed=5)
    w = leaf(T.Q4_0, (k, n), raw, flags=TFlag.WEIGHT)
    x1 = leaf(T.F32, (k, 1), np.ones((1, k), np.float32))
    x64 = leaf(T.F32, (k, 64), np.ones((64, k), np.float32))
    be = CpuBackend()
    run_graph(lambda: gb.mul_mat(w, x1), be)  # compile / warm up outside the trace
    tracemalloc.start()
    try:
        run_graph(lambda: gb.mul_mat(w, x1), be)
        run_graph(lambda: gb.mul_mat(w, x64), be)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < n * k * 4 // 2, f"peak {peak} bytes: a float copy of the weight?"
