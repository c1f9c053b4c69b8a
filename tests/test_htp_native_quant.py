"""The native (AVX2) q8x4x2 activation quantizer and fp16 KV widening of the HTP model give the numpy bits."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia import native
from kazeia.backends.htp.hvx import quant as hvx_quant
from kazeia.backends.htp.hvx.quant import q8x4x2_row_size, quantize_q8x4x2
from kazeia.backends.htp.kernels import quant as fast
from kazeia.backends.htp.kernels.rounding import f16_to_f32

pytestmark = pytest.mark.skipif(not native.available(), reason="no native HTP kernels on this host")

ALL_FP16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _numpy_quantize(monkeypatch, x, group, prev):
    with monkeypatch.context() as m:
        m.setattr(fast, "q8_groups", lambda *a: None)
        return quantize_q8x4x2(x, group, prev=prev)


def _native_taken(x, group) -> bool:
    k = x.shape[1]
    return fast.q8_groups(x, k, -(-k // 256) * 256, group, hvx_quant.fp16_table("inverse"),
                          hvx_quant.fp16_table("int8")) is not None


@pytest.mark.parametrize("group", [32, 64, 128])
def test_native_q8x4x2_is_bitwise_the_numpy_quantizer(monkeypatch, group):
    rng = np.random.default_rng(group)
    finite = ALL_FP16.astype(np.float32)[np.isfinite(ALL_FP16)]
    cases = [finite[:61440].reshape(-1, 2560),                       # every finite fp16 value (subnormals, 65504)
             rng.permutation(finite)[:9728 * 3].reshape(3, 9728),
             (rng.standard_normal((5, 288)) * 3e-5).astype(np.float32),  # scales in the fp16 subnormal range
             rng.standard_normal((4, 5120)).astype(np.float32)[:, ::2],  # a strided view
             np.zeros((2, 96), dtype=np.float32), np.full((1, 64), -65504.0, dtype=np.float32)]
    for x in cases:
        assert _native_taken(x, group)
        prev = rng.integers(0, 256, x.shape[0] * q8x4x2_row_size(x.shape[1]), dtype=np.uint8)
        for p in (None, prev):
            assert np.array_equal(quantize_q8x4x2(x, group, prev=p), _numpy_quantize(monkeypatch, x, group, p))


def test_values_the_kernel_does_not_take_go_to_numpy(monkeypatch):
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    for bad in (np.nan, np.inf, -np.inf, 65504.5, 1e9):
        y = x.copy()
        y[1, 7] = bad
        assert not _native_taken(y, 128)
        with np.errstate(all="ignore"):
            assert np.array_equal(quantize_q8x4x2(y), _numpy_quantize(monkeypatch, y, 128, None))


def test_f16_kv_widening_keeps_bits_and_layout():
    rng = np.random.default_rng(1)
    cache = rng.permutation(np.tile(ALL_FP16.view(np.uint16), 8)).view(np.float16).reshape(4096, 8, 16)  # every pattern
    views = [cache[:256].transpose(1, 0, 2)[None],            # a KV cache view (1, heads, cells, D)
             cache[None, 300:10:-1], cache[None, :512, :, :8], cache[None, :2048]]
    for v in views:
        got, want = f16_to_f32(v), np.asarray(v, dtype=np.float32)
        assert got.strides == want.strides
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # NaN payloads too
        # C order: rows walked in source order (a cache view: cells outer), the same bits in C layout
        got, want = f16_to_f32(v, order="C"), np.asarray(v, dtype=np.float32, order="C")
        assert got.flags.c_contiguous and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    wide = np.tile(cache, (1, 1, 4))[:1100].transpose(1, 0, 2)[None]  # 563k elements: the kernel threads widen it
    for order in ("K", "C"):
        got, want = f16_to_f32(wide, order=order), np.asarray(wide, dtype=np.float32, order=order)
        assert got.strides == want.strides and np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("cells,n,heads,d", [(4096, 256, 8, 16), (300, 37, 2, 64), (64, 64, 1, 256), (512, 19, 4, 8),
                                             (1024, 1023, 3, 24), (2048, 1021, 8, 64)])  # (the last: threaded)
def test_k_widened_and_transposed_in_one_pass(monkeypatch, cells, n, heads, d):
    """kt_from_f16 (flash attention's K^T from an F16 cache view) is numpy's widening, then the transposed copy:
    every fp16 pattern (NaN payloads, infinities, subnormals), cells not a multiple of 8, several heads and widths."""
    from kazeia.backends.htp.kernels import fa

    monkeypatch.setattr(fa, "F16_LOAD_MIN_ELEMS", 0)  # small shapes too (the front leaves them to numpy)
    rng = np.random.default_rng(n)
    bits = rng.choice(ALL_FP16.view(np.uint16), size=(cells, heads, d))
    view = bits.view(np.float16)[:n].transpose(1, 0, 2)[None]
    want = np.ascontiguousarray(np.asarray(view, dtype=np.float32)[0].transpose(0, 2, 1))
    got = fa.kt_from_f16(view)
    assert got is not None and got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
