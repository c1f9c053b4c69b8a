"""The AVX2 HTP kernels (htp/kernels/) give the bits of their portable twins (numba, beside them; numpy fp16.py),
which tests/test_htp_numerics.py checks against lane-by-lane transcriptions:

- fp16 rounding with the hw overflow rule on every class of float32 (random bit patterns, the overflow and
  subnormal boundaries, ties), in-place shapes with a tail shorter than a kernel row;
- HMX weight values of Q4_0 / Q4_1 / Q8_0 / IQ4_NL rows with scales spread over fp16's whole range (products
  that overflow fp16, Q4_1 sums of terms far apart in magnitude);
- the HVX dot for every weight type, K with partial chunks and partial groups of 8 sub-blocks, odd and even N
  (the adjacent tree of the last row), M up to 38, well-formed and garbage activation images, 1 or 2 threads.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from kazeia import native
from kazeia.backends.htp.fp16 import round_fp16_hw
from kazeia.backends.htp.host.repack import RepackedWeight
from kazeia.backends.htp.hvx import dot as hvx
from kazeia.backends.htp.hvx import quant as hq
from kazeia.backends.htp.kernels import hvx as hvx_kernels
from kazeia.backends.htp.kernels.hvx import ir as hvx_ir
from kazeia.backends.htp.kernels.rounding import round_hw
from kazeia.native.threads import set_kernel_threads as set_threads

pytestmark = pytest.mark.skipif(not native.available(), reason="no AVX2/FMA/F16C on this host")
QTYPES = [T.Q4_0, T.Q4_1, T.Q8_0, T.IQ4_NL]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equal, except that any NaN matches any NaN (payloads are not modelled)."""
    nan = np.isnan(b)
    return np.array_equal(np.isnan(a), nan) and np.array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan])


def portable(monkeypatch, fn, *args):
    with native.portable_only():
        return fn(*args)


def test_rounding_is_round_fp16_hw():
    rng = np.random.default_rng(4)
    bits = rng.integers(0, 1 << 32, 300_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65505.0, 65519.99, 65520.0, -65520.0,
                        2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14 - 2.0 ** -25,
                        1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 2049.0, 2051.0, -2051.0], dtype=np.float32)
    small = (rng.standard_normal(50_000) * 1e-5).astype(np.float32)
    x = np.concatenate([bits.view(np.float32), special, small, (rng.standard_normal(50_001) * 300).astype(np.float32)])
    with np.errstate(all="ignore"):
        want = round_fp16_hw(x)
    assert same_bits(round_hw(x), want)
    assert same_bits(round_hw(x[:3000].reshape(30, 100)), want[:3000].reshape(30, 100))  # tail of 952


def weight_rows(qtype: T, n: int, k: int, seed: int, spread: bool) -> np.ndarray:
    """ggml rows; with `spread`, the fp16 scales (and Q4_1 minimums) are redrawn over e^-12 .. e^12."""
    rng = np.random.default_rng(seed)
    src = T.Q4_0 if qtype == T.IQ4_NL else qtype  # IQ4_NL: the same block layout, other code values
    raw = gq.quantize((rng.standard_normal((n, k)) * 2).astype(np.float32), src).reshape(n, -1)
    if spread:
        bb = raw.shape[1] // (k // 32)
        blk = raw.reshape(n, k // 32, bb)
        for off in ((0, 2) if qtype == T.Q4_1 else (0,)):
            with np.errstate(over="ignore"):
                v = (rng.standard_normal(blk.shape[:2]) * np.exp(rng.uniform(-12, 12, blk.shape[:2])))
                v = v.astype(np.float16)
            v[~np.isfinite(v)] = 60000.0
            blk[..., off:off + 2] = v[..., None].view(np.uint8).reshape(*v.shape, 2)
    return raw


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("spread", [False, True])
def test_hmx_weight_rows(qtype, spread, monkeypatch):
    k, n = 800, 300
    w = RepackedWeight.from_ggml(weight_rows(qtype, n, k, seed=int(qtype), spread=spread), qtype, k)
    with np.errstate(all="ignore"):
        assert same_bits(w.w16_rows(), portable(monkeypatch, w.w16_rows))
        assert same_bits(w.w16_rows(37, 41), portable(monkeypatch, w.w16_rows, 37, 41))


def image_for(qtype: T, m: int, k: int, seed: int, garbage: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if garbage:
        return rng.integers(0, 256, (m, hq.activation_row_size(k, qtype)), dtype=np.uint16).astype(np.uint8)
    x = (rng.standard_normal((m, k)) * 2).astype(np.float32)
    return hq.quantize_activations(x, T.Q4_0 if qtype == T.IQ4_NL else qtype)


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k", [96, 800, 1312, 2560])
@pytest.mark.parametrize("n", [7, 8])
def test_hvx_dot(qtype, k, n, monkeypatch):
    w = RepackedWeight.from_ggml(weight_rows(qtype, n, k, seed=k + n, spread=False), qtype, k)
    for m in (1, 3, 38):
        for garbage in (False, True):
            img = image_for(qtype, m, k, seed=m, garbage=garbage)
            with np.errstate(all="ignore"):
                assert same_bits(hvx.hvx_matmul(w, img, m), portable(monkeypatch, hvx.hvx_matmul, w, img, m)), \
                    f"M={m} garbage={garbage}"


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1], ids=lambda t: t.name)
@pytest.mark.parametrize("sequential", [False, True], ids=["may", "october"])
def test_hvx_dot_on_threads(qtype, sequential, monkeypatch):
    """Row chunks claimed by the kernel threads, of 4 rows (fewer than the 8 rows hvx_dot_seq takes at once) and of
    the default size, odd N: the bits of the one-threaded twin."""
    k, n = 2560, 301  # large enough for the kernel threads; odd N
    w = RepackedWeight.from_ggml(weight_rows(qtype, n, k, seed=9, spread=False), qtype, k)
    img = image_for(qtype, 2, k, seed=10, garbage=False)
    parse = hq.parse_q8_1x4x2 if qtype == T.Q4_1 else hq.parse_q8x4x2
    b8, b16 = w.blocks()
    args = (b8, b16, qtype, img, 2, k, parse, hvx.IQ4_NL_VALUES, hvx.F16_LUT, sequential)
    want = portable(monkeypatch, hvx_kernels.hvx_dot, *args)
    try:
        for chunk in (4, hvx_kernels.HVX_CHUNK):
            monkeypatch.setattr(hvx_kernels, "HVX_CHUNK", chunk)
            for t in (1, 2):
                set_threads(t)
                assert same_bits(hvx_kernels.hvx_dot(*args), want), (chunk, t)
    finally:
        set_threads(2)


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k", [32, 96, 800, 2560, 64 * 256, 64 * 256 + 96, 128 * 256 + 32])
def test_hvx_dot_in_october_order(qtype, k, monkeypatch):
    """hvx_dot_seq (one accumulator per output, blocks in K order: October's tiled kernels) against its numba twin,
    every weight type, whole and partial groups of 8 blocks, well-formed and garbage images, odd N; K past one
    slice of the kernel's product buffer (SEQ_SLICE groups), ending on a slice, inside one, and on a partial group
    alone in its slice."""
    assert hvx_ir.SEQ_SLICE == 64  # the K list above is written for this slice
    w = RepackedWeight.from_ggml(weight_rows(qtype, 7, k, seed=k, spread=False), qtype, k)
    parse = hq.parse_q8_1x4x2 if qtype == T.Q4_1 else hq.parse_q8x4x2
    b8, b16 = w.blocks()
    for m in ((1, 3, 38) if k <= 2560 else (1, 3)):
        for garbage in (False, True):
            img = image_for(qtype, m, k, seed=m, garbage=garbage)
            args = (b8, b16, qtype, img, m, k, parse, hvx.IQ4_NL_VALUES, hvx.F16_LUT, True)
            with np.errstate(all="ignore"):
                got = hvx_kernels.hvx_dot(*args)
                assert same_bits(got, portable(monkeypatch, hvx_kernels.hvx_dot, *args)), f"M={m} garbage={garbage}"
            if k == 32 and not garbage:  # one block per output: May's lanes and tree add only zeros to it
                assert same_bits(got, hvx_kernels.hvx_dot(*args[:-1]))
