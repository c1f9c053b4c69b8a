"""The Q4_0 / Q4_1 HVX dot reads the activation quants in pair order (simd_hvx._nibble_pair: blocks j and j+4 of
a group share a ymm), laid out once per call by the native `hvx_pairs`. Checked here: that layout and the
per sub-block sums against numpy, and the dot against the portable numba kernel, bitwise, on the shapes
that exercise its edges: K of 1 block, K a multiple of 256 but not of 1024 (whole groups in the tail), K one
block past a chunk, M from 1 to 8, odd N, the scratch reused by another type or K of the same padded size.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from kazeia import native
from kazeia.backends.htp.host.repack import RepackedWeight
from kazeia.backends.htp.hvx import dot as hvx
from kazeia.backends.htp.kernels.hvx import PAIRS
from kazeia.native.buffers import ptr
from test_htp_simd import image_for, portable, same_bits, weight_rows

pytestmark = pytest.mark.skipif(not native.available(), reason="no AVX2/FMA/F16C on this host")


def pair_order(x8: np.ndarray, npad: int) -> np.ndarray:
    """numpy's transcription of the layout: per group of 8 sub-blocks, pair j = (block j, block j+4):
    elements 0..15 of j, of j+4, then 16..31 of j, of j+4; zero past K."""
    m, k = x8.shape
    z = np.zeros((m, npad * 32), dtype=np.int8)
    z[:, :k] = x8
    return z.reshape(m, npad // 8, 2, 4, 2, 16).transpose(0, 1, 3, 4, 2, 5).reshape(m, npad * 32)


@pytest.mark.parametrize("k", [32, 288, 768, 1056])
def test_pair_layout_and_sums(k):
    m, nb = 3, k // 32
    npad = -(-nb // 8) * 8
    rng = np.random.default_rng(k)
    img = rng.integers(0, 256, (m, k + 100), dtype=np.uint8)  # bytes past K (scales) must not leak in
    xp = np.full((m, npad * 32), 77, dtype=np.int8)
    xs = np.full((m, npad), 77, dtype=np.int32)
    PAIRS.fn(ptr(img), img.strides[0], nb, npad, ptr(xp), ptr(xs), 0, m)
    x8 = img[:, :k].view(np.int8)
    assert np.array_equal(xp, pair_order(x8, npad))
    want = np.zeros((m, npad), dtype=np.int32)
    want[:, :nb] = x8.reshape(m, nb, 32).sum(axis=2, dtype=np.int32)
    assert np.array_equal(xs, want)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q8_0, T.IQ4_NL], ids=lambda t: t.name)
@pytest.mark.parametrize("k", [32, 768, 1056])
def test_hvx_dot_edges(qtype, k, monkeypatch):
    n = 5
    w = RepackedWeight.from_ggml(weight_rows(qtype, n, k, seed=k + 1, spread=True), qtype, k)
    for m in range(1, 9):
        for garbage in (False, True):
            img = image_for(qtype, m, k, seed=10 * m + garbage, garbage=garbage)
            with np.errstate(all="ignore"):
                assert same_bits(hvx.hvx_matmul(w, img, m), portable(monkeypatch, hvx.hvx_matmul, w, img, m)), \
                    f"M={m} garbage={garbage}"


def test_scratch_shared_by_types_and_k(monkeypatch):
    """K=96 and K=256 pad to the same 8 sub-blocks; Q4_0, Q4_1 and Q8_0 one after another on one thread."""
    for k in (256, 96, 256):
        for qtype in (T.Q4_0, T.Q8_0, T.Q4_1, T.Q4_0):
            w = RepackedWeight.from_ggml(weight_rows(qtype, 3, k, seed=k, spread=False), qtype, k)
            img = image_for(qtype, 2, k, seed=k + int(qtype), garbage=False)
            assert same_bits(hvx.hvx_matmul(w, img, 2), portable(monkeypatch, hvx.hvx_matmul, w, img, 2)), \
                f"K={k} {qtype.name}"
