"""The HMX weight dequant of the 4-bit kinds by table look-up (simd_htp._lut_block: the 16 values of a block are
rounded once each and pshufb picks them per element) gives, bit for bit, NaN payloads included, the numpy form of
what the HMX dequant computes per element: fp16_hw(float32(code value) * d) widened to float32. The scales are
drawn from every class of fp16 (zeros, subnormals, the overflow edge of 8*|d| and 127*|d|, +-65504, +-inf,
quiet and signalling NaNs), so products overflow, round to subnormals and meet 0 * inf."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from kazeia import native
from kazeia.backends.htp.fp16 import round_fp16_hw
from kazeia.backends.htp.host.repack import F16_LUT, IQ4_NL_VALUES, RepackedWeight

pytestmark = pytest.mark.skipif(not native.available(), reason="no AVX2/FMA/F16C on this host")

SPECIAL = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7C01, 0xFC01, 0x7E00,
           0xFE55, 0x7DFF, 0x3C00, 0x7000, 0x7001, 0x6FFF, 0x6FFE, 0x77FF, 0x7400, 0x73FF, 0x5800, 0x57FF, 0x0200]


def rows_with_scales(qtype: T, n: int, nb: int, seed: int) -> np.ndarray:
    """Random ggml rows whose block scales are random fp16 bit patterns, special ones, or near the overflow edge."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, nb * 18), dtype=np.uint16).astype(np.uint8)
    blk = raw.reshape(n, nb, 18)
    d = blk[..., 0:2].copy().view(np.uint16)[..., 0]
    pick = rng.integers(0, 3, d.shape)
    d[pick == 0] = rng.choice(np.array(SPECIAL, dtype=np.uint16), size=int((pick == 0).sum()))
    d[pick == 1] = rng.integers(0x6C00, 0x7C00, int((pick == 1).sum())) | (rng.integers(0, 2, int((pick == 1).sum()))
                                                                           << 15).astype(np.uint16)
    blk[..., 0:2] = d[..., None].view(np.uint8).reshape(n, nb, 2)
    return raw


def numpy_weights(raw: np.ndarray, qtype: T, nb: int) -> np.ndarray:
    """fp16_hw(value * d) per element, in numpy float32."""
    blk = raw.reshape(raw.shape[0], nb, 18)
    d = F16_LUT[np.ascontiguousarray(blk[..., 0:2]).view(np.uint16)[..., 0]]
    qs = blk[..., 2:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1)  # ggml: elements 0..15 low nibbles, 16..31 high
    values = (codes.astype(np.int32) - 8) if qtype == T.Q4_0 else IQ4_NL_VALUES[codes].astype(np.int32)
    with np.errstate(all="ignore"):
        return round_fp16_hw(values.astype(np.float32) * d[..., None]).reshape(raw.shape[0], nb * 32)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.IQ4_NL], ids=lambda t: t.name)
def test_lut_dequant_is_the_per_element_formula(qtype):
    n, nb = 97, 24
    raw = rows_with_scales(qtype, n, nb, seed=int(qtype))
    w = RepackedWeight.from_ggml(raw, qtype, nb * 32)
    want = numpy_weights(raw, qtype, nb)
    with np.errstate(all="ignore"):
        got = w.w16_rows()
        assert np.isnan(want).any() and np.isinf(want).any()  # the classes the test is about are there
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        part = w.w16_rows(5, 11)
    assert np.array_equal(part.view(np.uint32), want[5:11].view(np.uint32))
