"""Error signatures on outputs of the emulator's real HMX/HVX numerics, judged against a float64 reference
computed independently (gguf-py's dequantization, float64 GEMM). Each injected pattern is made the way the
device would make it (a read-out scale, weight tiles replaced by stale VTCM bytes, rows offset), and the
classifier must name it, with its constant / tiles / source; a clean HMX output must show no class at all."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from kazeia.backends.htp.hmx import tiles as hmx
from kazeia.backends.htp.host.repack import RepackedWeight
from kazeia.backends.htp.kernels.rounding import shuffled_fp16
from kazeia.debug.signature import classify, ranges

M, K, N = 40, 512, 96


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(7)
    raw = gq.quantize(rng.standard_normal((N, K)).astype(np.float32), T.Q4_0).reshape(N, -1)
    w = RepackedWeight.from_ggml(raw, T.Q4_0, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    ref = x.astype(np.float64) @ gq.dequantize(raw, T.Q4_0).reshape(N, K).astype(np.float64).T
    return w, x, ref


def hmx_out(w, x, scale=1.0, patch=None):
    return hmx.hmx_matmul_weight(shuffled_fp16(x, None), w, patch, scale).astype(np.float64)


def test_clean_hmx_output_has_no_class(case):
    w, x, ref = case
    sig = classify(hmx_out(w, x), ref)
    assert sig.classes == [] and sig.n_wrong == 0


def test_reset_scale_is_all_zeros(case):
    w, x, ref = case
    sig = classify(hmx_out(w, x, scale=0.0), ref)
    assert sig.names() == ["zeros"]
    assert "all outputs are exactly 0" in sig.headline()


@pytest.mark.parametrize("c", [128 ** -0.5, 0.5, 3.0, 0.3])
def test_constant_scale_and_which(case, c):
    w, x, ref = case
    sig = classify(hmx_out(w, x, scale=c), ref)
    s = sig.get("scaled")
    assert s is not None and sig.names()[0] == "scaled"
    assert abs(s.value - c) < 2e-3 * c
    if c == 128 ** -0.5:
        assert "1/sqrt(128)" in s.summary
    assert "region" not in sig.names()


def test_stale_weight_tiles_localised_to_column_tile_and_prior(case):
    w, x, ref = case
    stale = np.random.default_rng(3).standard_normal((32, K)).astype(np.float32)
    cols = np.r_[64:96, 256:288]  # K tiles 2 and 8 of column tile 0 read before their scatter drained

    def patch(r0, t):
        t = t.copy()
        t[:32, cols] = stale[:, cols]
        return t
    out = hmx_out(w, x, patch=patch)
    sig = classify(out, ref)
    reg = sig.get("region")
    assert reg is not None and reg.where["col_tiles"] == [0]
    assert set(reg.where["cols"]) <= set(range(32)) and len(reg.where["rows"]) == M
    # wrong outputs equal to what the memory held before are named with that memory
    prior = hmx_out(w, x)  # a prior that is NOT what the wrong outputs hold: must not be claimed
    sig2 = classify(out, ref, priors={"previous output contents": prior})
    assert sig2.get("prior bytes") is None
    sig3 = classify(out, ref, priors={"previous output contents": out.copy()})
    assert sig3.get("prior bytes").where["prior"] == "previous output contents"


def test_nonfinite_positions_and_saturation(case):
    w, x, ref = case
    out = hmx_out(w, x)
    out[5, 40] = np.nan
    out[7, 3] = np.inf
    sig = classify(out, ref)
    nf = sig.get("non-finite")
    assert nf is not None and nf.where["rows"] == [5, 7] and nf.where["cols"] == [3, 40]
    big = ref * 1e4  # beyond fp16: HMX read-out saturates
    sat = np.clip(big, -65504.0, 65504.0)
    assert "fp16 saturation" in classify(sat, big).names()


def test_shifted_rows(case):
    w, x, ref = case
    out = hmx_out(w, x)
    out[10:] = ref[9:-1]  # rows read one row early
    sh = classify(out, ref).get("shifted rows")
    assert sh is not None and sh.value == -1


def test_hvx_row_groups_and_noise(case):
    w, x, ref = case
    out = ref.copy()
    out[:, 48:64] += 5.0
    groups = [(0, 48), (48, 96)]
    reg = classify(out, ref, hvx_row_groups=groups).get("region")
    assert reg.where["hvx_groups"] == [1]
    noisy = ref * (1 + np.random.default_rng(1).normal(0, 0.03, ref.shape))
    assert classify(noisy, ref).names() in ([], ["small noise"])


def test_ranges():
    assert ranges([0, 1, 2, 5, 7, 8]) == "0..2, 5, 7..8"
    assert ranges([]) == "none"
