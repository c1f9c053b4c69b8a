"""The device model's product order (kernels/gemm.py, docs/hmx-numerics.md) against an element-wise numpy statement of
the rule (oracle_utils.ordered_products): the native HMX kernel (every weight source, the dequantization into its own
blocks included), its portable twin, any thread count, shapes off every tiling boundary, special values.
(backends/ordered.py, the float32 products: tests/test_ordered.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from kazeia.backends.htp.host.repack import RepackedWeight
from kazeia.backends.htp.kernels import gemm
from kazeia.native.compile import available, portable_only
from kazeia.native.threads import set_threads, threads
from oracle_utils import ordered_products
from test_htp_numerics import ggml_blocks

QTYPES = (T.Q4_0, T.Q4_1, T.Q8_0, T.IQ4_NL, T.F16)


def _fp16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)


def _weight(qtype, n, k, rng) -> RepackedWeight:
    return RepackedWeight.from_ggml(ggml_blocks(qtype, n, k, rng), qtype, k)


@pytest.mark.parametrize("m,n,k", [(1, 1, 32), (5, 7, 64), (31, 50, 288), (33, 97, 512), (38, 150, 1024),
                                   (64, 13, 2560), (129, 61, 320), (200, 49, 256)])
def test_f32_rows_follow_the_rule(m, n, k):
    rng = np.random.default_rng(m * 1000 + n)
    a, w = _fp16(rng, (m, k), 3.0), _fp16(rng, (n, k))
    want = ordered_products(a, w)
    got = gemm.hmx_products(a, n, "f32", w, w.strides[0])[:, :m].T
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    with portable_only():
        twin = gemm.hmx_products(a, n, "f32", w, w.strides[0])[:, :m].T
    assert np.array_equal(twin.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("qtype", QTYPES)
def test_fused_dequantization_gives_the_rows_products(qtype):
    """The kernel dequantizing the weight into its blocks: the bits of the rule on the weight's fp16 rows."""
    if not available():
        pytest.skip("no native kernels on this host")
    rng = np.random.default_rng(int(qtype))
    n, k, m = 103, 768, 45
    w = _weight(qtype, n, k, rng)
    rows = w.ggml if qtype == T.F16 else w.blocks()[0]
    a = _fp16(rng, (m, k), 2.0)
    got = gemm.hmx_products(a, n, "f16" if qtype == T.F16 else qtype.name.lower(), rows, rows.strides[0])
    assert np.array_equal(got[:, :m].T.view(np.uint32), ordered_products(a, w.w16).view(np.uint32))


def test_bits_do_not_depend_on_threads_or_m():
    rng = np.random.default_rng(5)
    n, k = 300, 1536
    w = _weight(T.Q4_0, n, k, rng)
    b8 = w.blocks()[0]
    a = _fp16(rng, (130, k), 2.0)
    old = threads()
    try:
        runs = []
        for t in (1, 2, 3):
            set_threads(t)
            runs.append(gemm.hmx_products(a, n, "q4_0", b8, b8.strides[0])[:, :130].copy())
    finally:
        set_threads(old)
    assert all(np.array_equal(r.view(np.uint32), runs[0].view(np.uint32)) for r in runs)
    few = gemm.hmx_products(a[:7], n, "q4_0", b8, b8.strides[0])[:, :7]
    assert np.array_equal(few.view(np.uint32), runs[0][:, :7].view(np.uint32))  # a row's bits whatever M


def test_special_values():
    k = 64
    a = np.ones((4, k), dtype=np.float32)
    w = np.ones((4, k), dtype=np.float32)
    a[0, 5] = np.inf
    a[1, 7] = np.nan
    a[2] = 0.0
    a[2, 9] = np.inf            # inf * 0 against weight row 2: NaN
    w[2, 9] = 0.0
    a[3] = 0.0                  # +0 * -0 = -0 products: the sum starts at +0
    w[3] = -0.0
    got = gemm.hmx_products(a, 4, "f32", w, w.strides[0])[:, :4].T
    want = ordered_products(a, w)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isposinf(got[0, 0]) and got[1, 0].view(np.uint32) == 0x7FC00000
    assert got[2, 2].view(np.uint32) == 0x7FC00000 and got[3, 3].view(np.uint32) == 0


def test_native_panel_packing_moves_the_bytes_numpy_moves():
    """pack_panels' native kernel (8 x 8 register transposes, panels over the threads) gives numpy's layout: every
    row edge of a panel, K not a multiple of 8, rows past M zero, a NaN's payload kept."""
    rng = np.random.default_rng(5)
    for m, kdim in [(1, 8), (5, 13), (31, 64), (32, 7), (33, 100), (38, 2560), (130, 257)]:
        a = rng.standard_normal((m, kdim)).astype(np.float32)
        a.reshape(-1)[:: 7] = np.uint32(0x7FC01234).view(np.float32)
        got = gemm.pack_panels(a).copy()
        with portable_only():
            want = gemm.pack_panels(a).copy()
        assert got.tobytes() == want.tobytes(), (m, kdim)
