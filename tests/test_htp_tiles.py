"""The HTP emulator computes from the (memory-mapped) ggml blocks, per tile, with no weight copies.

- a RepackedWeight is a view of the rows it was made from (a model's mapped weights included) and gives the
  x4x2 bytes of any row range on demand, equal to the host repack of the whole matrix;
- built from x4x2 bytes instead (a stale VTCM row) it computes the same as from the ggml rows;
- the HMX weight of a row range is that range of the whole-matrix weight, and the tiled HMX matmul equals
  the one-GEMM form when the weight fits one tile, and per-tile one-GEMM products otherwise;
- the numba fp16 rounding is bitwise numpy's round_fp16_hw on every class of float32 input;
- the HVX kernel's results do not depend on the thread count.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from kazeia.backends.htp.fp16 import f32_to_f16_shuffled, round_fp16_hw
from kazeia.backends.htp.hmx import tiles as hmx
from kazeia.backends.htp.host.repack import RepackedWeight, repack_x4x2
from kazeia.backends.htp.hvx import dot as hvx
from kazeia.backends.htp.hvx import quant as hq
from kazeia.backends.htp.kernels.rounding import round_f16_f32
from kazeia.backends.htp.ops.matmul import WeightStore
from kazeia.engine.context import Model
from kazeia.native.threads import set_kernel_threads as set_threads

QTYPES = [T.Q4_0, T.Q4_1, T.Q8_0]


def ggml_rows(qtype, n, k, seed=0):
    rng = np.random.default_rng(seed)
    return gq.quantize((rng.standard_normal((n, k)) * 2).astype(np.float32), qtype).reshape(n, -1)


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_view_and_x4x2_rows_on_demand(qtype):
    k, n = 800, 37
    raw = ggml_rows(qtype, n, k)
    w = RepackedWeight.from_ggml(raw, qtype, k)
    assert np.shares_memory(w.ggml, raw)
    full = repack_x4x2(raw, qtype, k)
    assert np.array_equal(w.data, full)
    assert np.array_equal(w.x4x2_rows(5, 19), full[5:19])
    again = RepackedWeight(qtype, k, n, full)  # from x4x2 bytes, as a stale VTCM row is
    img = hq.quantize_activations(np.random.default_rng(1).standard_normal((3, k)).astype(np.float32), qtype)
    assert np.array_equal(hvx.hvx_matmul(again, img, 3), hvx.hvx_matmul(w, img, 3))
    assert np.array_equal(again.w16, w.w16)


def test_store_keeps_views_of_the_mapped_model(tiny_qwen3_q4):
    m = Model.load(tiny_qwen3_q4)
    t = m.weights["blk.0.ffn_up.weight"]
    rw = WeightStore().get(t)
    assert np.shares_memory(rw.ggml, m.file.data)


@pytest.mark.parametrize("qtype", QTYPES + [T.F16], ids=lambda t: t.name)
def test_hmx_tiles(qtype, monkeypatch):
    k, n, m = 256, 200, 9
    if qtype == T.F16:
        raw = np.random.default_rng(2).standard_normal((n, k)).astype(np.float16).view(np.uint8).reshape(n, -1)
    else:
        raw = ggml_rows(qtype, n, k, seed=2)
    w = RepackedWeight.from_ggml(raw, qtype, k)
    w16 = hmx.hmx_weight_fp16(w)
    assert np.array_equal(w.w16_rows(64, 130), w16[64:130])
    a16 = f32_to_f16_shuffled(np.random.default_rng(3).standard_normal((m, k)).astype(np.float32) * 3)
    assert np.array_equal(hmx.hmx_matmul_weight(a16, w), hmx.hmx_matmul(a16, w16))  # one tile
    monkeypatch.setattr(hmx, "TILE_WEIGHT_BYTES", 64 * k * 4)  # 64-row tiles
    want = np.concatenate([hmx.hmx_matmul(a16, w16[r:r + 64]) for r in range(0, n, 64)], axis=1)
    assert np.array_equal(hmx.hmx_matmul_weight(a16, w), want)


def test_numba_fp16_rounding_is_round_fp16_hw():
    rng = np.random.default_rng(4)
    bits = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65505.0, 65519.99, 65520.0, -65520.0,
                        2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14 - 2.0 ** -25,
                        1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 2049.0, 2051.0, -2051.0], dtype=np.float32)
    small = (rng.standard_normal(50_000) * 1e-5).astype(np.float32)  # the fp16 subnormal range
    x = np.concatenate([bits.view(np.float32), special, small, (rng.standard_normal(50_000) * 300).astype(np.float32)])
    got = np.empty_like(x)
    for i, v in enumerate(x):
        got[i] = round_f16_f32(v)
    with np.errstate(all="ignore"):
        want = round_fp16_hw(x)
    assert np.array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_hvx_thread_count_does_not_matter(qtype):
    k, n, m = 1024, 33, 4
    w = RepackedWeight.from_ggml(ggml_rows(qtype, n, k, seed=5), qtype, k)
    img = hq.quantize_activations(np.random.default_rng(6).standard_normal((m, k)).astype(np.float32), qtype)
    try:
        set_threads(1)
        one = hvx.hvx_matmul(w, img, m)
        set_threads(2)
        assert np.array_equal(one, hvx.hvx_matmul(w, img, m))
    finally:
        set_threads(2)
