"""hmx_matmul_weight's tile products: past TRANSPOSED_MIN_MACS a tile is computed as (W_tile @ A^T)^T, below it as
A @ W_tile^T. The HMX numerics are the bits of the A @ W_tile^T form (fp32 sums of exact fp16 products in BLAS's
order, then one fp16 rounding), so the transposed form must give exactly those bits: checked here tile by tile
against A @ W_tile^T written out independently, and against float64 within the fp32 accumulation's bound."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from kazeia.backends.htp.fp16 import round_fp16_hw
from kazeia.backends.htp.hmx import tiles as hm
from kazeia.backends.htp.host.repack import RepackedWeight
from kazeia.backends.htp.kernels.rounding import round_hw, round_hw_transposed, shuffled_fp16


def _reference(a16: np.ndarray, w: RepackedWeight, step: int) -> np.ndarray:
    """The A @ W_tile^T form, one tile of `step` weight rows at a time, then the fp16 read-out."""
    w16 = w.w16
    y = np.empty((a16.shape[0], w.n), np.float32)
    with np.errstate(all="ignore"):
        for r0 in range(0, w.n, step):
            np.matmul(a16, w16[r0:r0 + step].T, out=y[:, r0:r0 + step])
        return round_hw(y)


@pytest.mark.parametrize("m, k, n", [(5, 2560, 1400), (38, 2560, 700), (64, 1024, 2000), (129, 768, 400),
                                     (38, 640, 300), (37, 2560, 1403)])
def test_transposed_tiles_give_the_bits_of_the_plain_product(m, k, n, monkeypatch):
    rng = np.random.default_rng(m * 7 + k)
    raw = gq.quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), T.Q4_0).reshape(n, -1)
    w = RepackedWeight.from_ggml(raw, T.Q4_0, k)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.5, 40, (m, 1))).astype(np.float32)
    a16 = shuffled_fp16(x)
    monkeypatch.setattr(hm, "TILE_WEIGHT_BYTES", 4 * k * 320)  # several tiles, the last one partial
    step = hm.weight_tile_rows(k)
    transposed = m * min(step, n) * k > hm.TRANSPOSED_MIN_MACS
    got = hm.hmx_matmul_weight(a16, w)
    assert np.array_equal(got.view(np.uint32), _reference(a16, w, step).view(np.uint32)), (m, k, n, transposed)
    exact = round_hw((a16.astype(np.float64) @ w.w16.astype(np.float64).T).astype(np.float32))
    bound = np.abs(a16).astype(np.float64) @ np.abs(w.w16).astype(np.float64).T * k * 2.0 ** -24
    assert np.all(np.abs(got.astype(np.float64) - exact) <= bound + np.abs(exact) * 2.0 ** -10)


def test_the_transposed_form_is_taken_at_real_sizes():
    """Qwen3-4B's ffn_up at M = 38 is past the threshold (else the test above checks only the plain form)."""
    assert 38 * hm.weight_tile_rows(2560) * 2560 > hm.TRANSPOSED_MIN_MACS
    assert 5 * 96 * 64 <= hm.TRANSPOSED_MIN_MACS


@pytest.mark.parametrize("r, m", [(1632, 128), (1632, 38), (37, 5), (1000, 13), (8, 8), (96, 7), (3, 200)])
def test_round_hw_transposed_is_the_read_out_of_the_transpose(r, m):
    """The transposed tiles are rounded as they are written into y: the bits of numpy's fp16 read-out
    (fp16.round_fp16_hw) of x.T, specials included (NaN with an fp16 payload, -inf, past 65504, subnormal, the
    rounding edge just under 65520), and nothing written outside the column range it is given."""
    rng = np.random.default_rng(r * 31 + m)
    x = (rng.standard_normal((r, m)) * 3e4).astype(np.float32)
    x.flat[::97], x.flat[5::101], x.flat[7::89], x.flat[9::83], x.flat[13::71] = np.nan, -np.inf, 7e4, 1e-7, 65519.99
    x.view(np.uint32).flat[11::79] = 0xFFC02000
    y = np.zeros((m, r + 50), np.float32)
    round_hw_transposed(x, y[:, 20:20 + r])
    assert np.array_equal(y[:, 20:20 + r].view(np.uint32), round_fp16_hw(x.T).view(np.uint32))
    assert not y[:, :20].any() and not y[:, 20 + r:].any()
