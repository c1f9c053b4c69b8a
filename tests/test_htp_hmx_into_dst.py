"""The HMX matmul computed straight into dst (hmx_matmul_weight(..., out=)) and the activation image made from the
converted rows (stage_a16) give the bits of the fresh-array forms they replace (hmx_matmul_weight into its own y,
stage_activations converting the f32 rows again), NaN/inf rows and stale pad rows included."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from kazeia.backends.htp.hmx import tiles as hm
from kazeia.backends.htp.host.repack import RepackedWeight
from kazeia.backends.htp.kernels.rounding import shuffled_fp16


def test_matmul_into_out_is_the_fresh_result():
    rng = np.random.default_rng(2)
    k, n, m = 256, 96, 37
    raw = gq.quantize(rng.standard_normal((n, k)).astype(np.float32), T.Q4_0).reshape(n, -1)
    w = RepackedWeight.from_ggml(raw, T.Q4_0, k)
    x = (rng.standard_normal((m, k)) * 300).astype(np.float32)
    x[3, 5], x[4, 6], x[5, 7] = np.nan, np.inf, 70000.0
    a16 = shuffled_fp16(x)
    out = np.full((m, n), 7.0, np.float32)
    with np.errstate(all="ignore"):
        want = hm.hmx_matmul_weight(a16, w, scale=0.5)
        got = hm.hmx_matmul_weight(a16, w, scale=0.5, out=out)
    assert got is out and np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_stage_a16_is_stage_activations():
    rng = np.random.default_rng(3)
    for m in (32, 45):
        x = (rng.standard_normal((m, 64)) * 1e5).astype(np.float32)
        x[0, :3] = (np.nan, -np.inf, 65519.0)
        prev = rng.integers(0, 256, -(-m // 32) * 32 * 64 * 2, dtype=np.uint16).astype(np.uint8)
        for p in (None, prev):
            assert np.array_equal(hm.stage_a16(shuffled_fp16(x), p), hm.stage_activations(x, prev=p))
