"""The decode shortcuts of the HTP model's Python around its kernels give the bits of the plain formulation:
flash attention's fp16 roundings by the native kernel (executor._round16 vs fp16.round_fp16), the HVX matmul's
src1 quantized in place in VTCM (hvx_quant.quantize_q8x4x2_into vs quantize_q8x4x2 over the previous bytes)."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia import native
from kazeia.backends.htp.fp16 import round_fp16
from kazeia.backends.htp.hvx.quant import q8x4x2_row_size, quantize_q8x4x2, quantize_q8x4x2_into
from kazeia.backends.htp.ops.flash_attn import _round16, _transposed
from kazeia.backends.htp.vtcm.arena import Vtcm, span_box

pytestmark = pytest.mark.skipif(not native.available(), reason="no native HTP kernels on this host")

ALL_FP16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_round16_is_round_fp16_bitwise():
    rng = np.random.default_rng(0)
    finite = ALL_FP16[np.isfinite(ALL_FP16)].astype(np.float32)
    # halfway and off-by-one-ulp float32 values around every fp16 value: the ties decide RNE
    ulp = np.spacing(finite)
    near = np.concatenate([finite, finite + ulp / 2, finite - ulp / 2, np.nextafter(finite + ulp / 2, np.inf)])
    cases = [rng.permutation(near)[: 32 * 256 * 4].reshape(4, 32, 256),
             (rng.standard_normal((32, 1, 128)) * 1e-6).astype(np.float32),          # fp16 subnormals
             np.full((32, 256), 65504.0, np.float32), np.full((32, 256), -0.0, np.float32),
             rng.standard_normal((8, 200)).astype(np.float32)]                       # not a multiple of a row
    for bad in (65504.5, 65519.0, 65520.0, np.inf, -np.inf, np.nan):                 # these go to numpy
        x = rng.standard_normal((32, 256)).astype(np.float32)
        x[3, 5] = bad
        cases.append(x)
    cases.append(rng.standard_normal((64, 256)).astype(np.float32)[::2])             # not C-contiguous
    cases.append(rng.standard_normal((16, 16)).astype(np.float32))                   # below one native row
    with np.errstate(all="ignore"):
        for x in cases:
            assert _same(_round16(x), round_fp16(x))


@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_in_place_is_the_image_over_the_previous_bytes(group):
    rng = np.random.default_rng(group)
    for m, k in ((1, 2560), (1, 9728), (3, 288), (2, 96), (7, 5120)):
        x = rng.standard_normal((m, k)).astype(np.float32) * rng.choice([1e-5, 1.0, 300.0])
        stride = q8x4x2_row_size(k)
        prev = rng.integers(0, 256, (m, stride), dtype=np.uint8)
        want = quantize_q8x4x2(x, group, prev=prev)
        area = prev.copy()
        ok = quantize_q8x4x2_into(x, group, area)
        assert ok == (k % 256 == 0)  # else the last row's padded quants would spill past its stride
        assert np.array_equal(area, want if ok else prev)


def test_quantize_in_place_refuses_without_touching_the_area():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    stride = q8x4x2_row_size(256)
    for bad_x, shape in ((x, (2, stride + 1)), (x, (3, stride)), (x[:, :250], (2, q8x4x2_row_size(250)))):
        area = rng.integers(0, 256, shape, dtype=np.uint8)
        keep = area.copy()
        assert not quantize_q8x4x2_into(bad_x, 128, area)
        assert np.array_equal(area, keep)
    for bad in (np.nan, np.inf, 65504.5):
        y = x.copy()
        y[1, 3] = bad
        area = rng.integers(0, 256, (2, stride), dtype=np.uint8)
        keep = area.copy()
        assert not quantize_q8x4x2_into(y, 128, area)
        assert np.array_equal(area, keep)


def test_span_box():
    assert span_box([(40, 8), (0, 0), (10, 5), (100, 0)]) == (10, 48)
    assert span_box([(7, 0)]) == (0, 0)


@pytest.mark.parametrize("seed", range(4))
def test_runs_and_views_with_a_box_are_the_plain_writes(seed):
    rng = np.random.default_rng(seed)
    size = 4096
    a, b = Vtcm(size, fill=None, seed=seed), Vtcm(size, fill=None, seed=seed)
    for _ in range(300):
        off = int(rng.integers(0, size - 600))
        data = rng.integers(0, 256, int(rng.integers(1, 300)), dtype=np.uint8)
        kind = rng.choice(["deferred", "lazy", "runs", "views", "read"])
        if kind in ("deferred", "lazy"):
            for vt in (a, b):
                if kind == "deferred":
                    vt.write_deferred(off, data)
                else:
                    vt.write_lazy(off, data.size, lambda d=data: d)
        elif kind == "read":
            assert a.read(off, 200) == b.read(off, 200)
        else:
            pieces = [(off + int(rng.integers(0, 300)), data[: int(rng.integers(0, data.size + 1))])
                      for _ in range(int(rng.integers(1, 6)))]
            spans = [(o, d.size) for o, d in pieces]
            box = span_box(spans)
            if kind == "runs":
                a.write_runs(pieces)
                b.write_runs(pieces, box)
            else:
                a.write_views(spans, list(zip(a.run_views(spans), (d for _, d in pieces))), (0, size))
                b.write_views(spans, list(zip(b.run_views(spans), (d for _, d in pieces))), box)
    assert np.array_equal(a.mem, b.mem)


def test_tiled_transpose_is_the_transposed_copy():
    rng = np.random.default_rng(2)
    for shape in ((8, 256, 128), (1, 1, 1), (3, 100, 72), (2, 64, 64), (4, 130, 65)):
        k = rng.standard_normal(shape).astype(np.float32)
        got, want = _transposed(k), np.ascontiguousarray(k.transpose(0, 2, 1))
        assert got.flags.c_contiguous and got.shape == want.shape and np.array_equal(got, want)
