"""Gemma 3, Phi-3 and LFM2 on the emulated HTP: where upstream's supports_op puts their new ops, under each code
generation, and what the DSP computes there, on llama.cpp's own conversions (tests/data).

- GEGLU (Gemma 3's FFN, split form) and the one-source SWIGLU (Phi-3's fused gate/up) are HTP ops in both versions
  (ggml_hexagon_supported_activations); TANH (a logit softcap) has no case: the CPU's.
- ROPE with frequency factors (Phi-3's LongRoPE): May's supported_rope wants every tensor contiguous, so the strided
  Q/K views of a fused QKV stay on the CPU in prefill; October's takes rows of contiguous floats, so they run on the
  HTP. Decode (one token: the views are contiguous) runs them on the HTP in both.
- LFM2's short conv under 2026-05: from 32 tokens May's HVX SSM_CONV reads shifted weights (the defect #24470 fixed,
  already modelled for Qwen3.5), so a 35-token prompt's logits depart from the float64 reference; the scalar loop
  below 32 tokens is right; robust and 2026-10 are right at both.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from kazeia.backends.htp import HtpSettings
from kazeia.backends.htp.cost import DEFAULT as COST
from kazeia.backends.htp.cost import ssm_conv_seconds
from kazeia.backends.htp.host.support import supports_op
from kazeia.debug.investigate import investigate
from kazeia.engine.session import RunSpec, build_context
from kazeia.graph import builder as gb
from kazeia.graph.tensor import GGMLType, TFlag, make_tensor

DATA = os.path.join(os.path.dirname(__file__), "data")
FILE = {a: os.path.join(DATA, f"{a}_tiny_converted.gguf") for a in ("gemma3", "phi3", "lfm2")}


def _leaf(ne, t=GGMLType.F32):
    return make_tensor(t, ne, name="x", flags=TFlag.INPUT)


def _settings(profile: str) -> HtpSettings:
    return HtpSettings.from_env({}, profile=profile)


@pytest.mark.parametrize("profile", ["2026-05", "2026-10"])
def test_glu_variants_and_tanh(profile):
    s = _settings(profile)
    a, b = _leaf((64, 8)), _leaf((64, 8))
    assert supports_op(gb.geglu_split(a, b), s)
    assert supports_op(gb.swiglu(_leaf((128, 8))), s)
    assert not supports_op(gb.tanh(a), s)


def _phi3_ropes(n_tokens: int) -> list:
    ctx = build_context(RunSpec(model=FILE["phi3"], device="CPU", ctx=64))
    g = ctx._build(n_tokens, ctx._n_kv(n_tokens), 1).graph
    return [n for n in g.nodes if n.op == "ROPE"]


@pytest.mark.parametrize("profile", ["2026-05", "2026-10"])
def test_phi3_rope_with_factors_follows_each_versions_layout_rule(profile):
    s = _settings(profile)
    prefill, decode = _phi3_ropes(8), _phi3_ropes(1)
    assert prefill and all(len(n.src) == 3 and n.src[2].weight_name == "rope_factors_short.weight" for n in prefill)
    assert not any(n.src[0].is_contiguous() for n in prefill)  # views of the fused QKV
    assert all(supports_op(n, s) == (profile == "2026-10") for n in prefill)
    assert all(supports_op(n, s) for n in decode)


def test_ssm_conv_cost_follows_each_versions_kernel():
    """May's scalar loop below 32 tokens, October's HVX kernel always: one decode token costs what the HVX
    formula gives under 2026-10, what the scalar rate gives under May."""
    sx, c = _leaf((3, 2048, 1)), _leaf((3, 2048))
    node = gb.ssm_conv(sx, c)  # one token, 2048 channels, kernel 3
    macs = 2048 * 3
    assert ssm_conv_seconds(node, COST) == pytest.approx(macs / COST.dsp_scalar_macs_per_s + COST.op_overhead_s)
    assert ssm_conv_seconds(node, COST, always_hvx=True) == pytest.approx(
        macs / COST.hvx_f32_macs_per_s + 2 * sx.nbytes / COST.hvx_stream_bytes_per_s + COST.op_overhead_s)


def _nmse(a, b) -> float:
    return float(((a.astype(np.float64) - b) ** 2).sum() / (b.astype(np.float64) ** 2).sum())


@pytest.mark.parametrize("profile", ["2026-05", "robust", "2026-10"])
def test_lfm2_short_conv_under_each_version(profile):
    tokens = np.random.default_rng(1).integers(3, 270, 35).tolist()
    for n, may_defect in ((11, False), (35, True)):
        ref = build_context(RunSpec(model=FILE["lfm2"], device="REF", ctx=64)).decode(tokens[:n])[-1]
        got = build_context(RunSpec(model=FILE["lfm2"], device="HTP0", htp_profile=profile, ctx=64)).decode(
            tokens[:n])[-1]
        wrong = _nmse(got, ref) > 1e-3
        assert wrong == (may_defect and profile == "2026-05"), (n, profile, _nmse(got, ref))


@pytest.mark.slow  # an investigation: about ten runs
def test_investigate_names_lfm2s_short_conv_and_validates_its_gate(tmp_path):
    """`kazeia investigate` on llama.cpp's own LFM2 file, 2026-05, the 35-token prompt: the first op out of
    tolerance is layer 0's short conv (its llama.cpp name, `{}` included), 2026-10's code computes it right, and the
    gate that routes the SSM_CONV nodes to the CPU is validated by a rerun."""
    spec = RunSpec(model=FILE["lfm2"], prompt="Once upon a time there was a small model that", device="HTP0",
                   htp_profile="2026-05")
    inv = investigate(spec, str(tmp_path / "inv"), progress=lambda msg: None)
    assert "is model.layers.{}.conv.conv-0" in inv.verdict
    assert "the 2026-10 code computes model.layers.{}.conv.conv-0 right" in inv.verdict
    assert "SSM_CONV" in inv.verdict and "validated by a rerun" in inv.verdict


def test_hmx_outputs_of_a_width_not_a_multiple_of_32_left_in_vtcm(tmp_path):
    """2026-10 plans a quantized MUL_MAT of N = 16 on HMX (one KV head x 16; the solver pads N to 32). LFM2's short
    conv CONCAT then reads VTCM, which makes the image of the output tiles that matmul left there: whole tiles,
    not a 16-column image the packer refuses (it was an internal error)."""
    from kazeia.gguf.writer import preset, write_model

    path = str(tmp_path / "lfm2_q8.gguf")
    write_model(preset("tiny", arch="lfm2", wtype="q8_0", n_embd=64, n_ff=128, n_head=4, n_head_kv=1, head_dim=16,
                       n_vocab=512), path)
    tokens = list(range(3, 38))
    ref = build_context(RunSpec(model=path, device="REF", ctx=64)).decode(tokens)[-1]
    got = build_context(RunSpec(model=path, device="HTP0", htp_profile="2026-10", ctx=64)).decode(tokens)[-1]
    assert _nmse(got, ref) < 1e-3
