"""Several sequences side by side (`-np N -kvu`, Context.decode_seqs), and what they change on the HTP: llama.cpp
#26094, the hybrid's `ssm_out` MUL_MAT that May's host refuses once its src1 has a sequence dimension.

Oracle: a sequence decoded beside others must give the logits it gives alone (its own cells in the unified KV cache,
its own recurrent cell). The float64 oracle holds that exactly; the CPU within float32 rounding."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from cli_utils import kazeia_clean
from kazeia.engine.session import RunSpec, build_context
from kazeia.errors import KazeiaError
from kazeia.gguf.writer import preset, write_model

DATA = os.path.join(os.path.dirname(__file__), "data")
CONVERTED_QWEN35 = os.path.join(DATA, "qwen35_tiny_converted.gguf")  # llama.cpp's convert_hf_to_gguf.py output


@pytest.fixture(scope="module")
def tiny35_q4(tmp_path_factory) -> str:
    """Tiny Qwen3.5 hybrid with Q4_0 matrices (4 layers: three gated-delta-net, the last full attention)."""
    path = str(tmp_path_factory.mktemp("np35") / "tiny35_q4.gguf")
    write_model(preset("tiny", arch="qwen35", wtype="q4_0"), path)
    return path


def _prompts(n: int, k: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(10, 200, n) for _ in range(k)]


def _alone(path: str, device: str, ub: int, prompt, extra: int) -> tuple[np.ndarray, np.ndarray]:
    """The last logits after the prompt, then after one more token, with the sequence alone in its context."""
    ctx = build_context(RunSpec(model=path, device=device, ubatch=ub, ctx=256))
    first = ctx.decode(prompt)[-1]
    return first, ctx.decode([extra])[-1]


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a.astype(np.float64) - b) ** 2).sum() / (b.astype(np.float64) ** 2).sum())


@pytest.mark.parametrize("fixture", ["tiny_qwen3", "converted_qwen35"])
@pytest.mark.parametrize("device,ub", [("REF", 8), ("REF", 64), ("CPU", 8)])
def test_each_sequence_gets_what_it_gets_alone(fixture, device, ub, request):
    """Prompts of 13 tokens in 3 sequences: with -ub 8 split_equal gives 2 tokens per sequence per micro-batch (7
    micro-batches, the last a remainder of 1), so the KV mask, the cell order and the recurrent state's carry
    across micro-batches all count; then one decode step per sequence."""
    path = CONVERTED_QWEN35 if fixture == "converted_qwen35" else request.getfixturevalue(fixture)
    prompts, extra = _prompts(13, 3), [5, 7, 11]
    ctx = build_context(RunSpec(model=path, device=device, ubatch=ub, ctx=256, n_seq=3))
    together = ctx.decode_seqs(prompts)
    step = ctx.decode_seqs([[e] for e in extra])
    assert together.shape[0] == 3 and step.shape[0] == 3
    for s in range(3):
        first, second = _alone(path, device, ub, prompts[s], extra[s])
        if device == "REF":
            assert np.array_equal(together[s], first) and np.array_equal(step[s], second)
        else:
            assert _nmse(together[s], first) < 1e-6 and _nmse(step[s], second) < 1e-6
    assert ctx.n_past == 3 * 14 and ctx.seq_n_past == 14


def test_a_hybrid_micro_batch_is_split_equal(tiny35_q4):
    """llama.cpp's split_equal: every sequence in each micro-batch, n_ubatch // n_seq tokens each; the recurrent
    layers see n_seqs = 3 (GATED_DELTA_NET's v [S, H, T, 3]) and ssm_out's src1 is [K, T, 3]."""
    ctx = build_context(RunSpec(model=tiny35_q4, device="CPU", ubatch=8, ctx=256, n_seq=3))
    sizes = []
    ctx.on_ubatch = lambda i, n: sizes.append(n)
    ctx.decode_seqs(_prompts(5, 3))
    assert sizes == [6, 6, 3]  # 2 + 2 + 1 tokens per sequence
    nodes = {n.name: n for n in ctx.last_graph.nodes}
    gdn = next(n for n in ctx.last_graph.nodes if n.op == "GATED_DELTA_NET")
    assert gdn.src[2].ne[2:] == (1, 3)
    assert nodes["linear_attn_out-0"].src[1].ne[1:3] == (1, 3)


def test_a_reset_context_forgets_the_recurrent_state_on_the_oracle(tiny35_q4):
    """The float64 oracle keeps float64 copies of F32 state; a reset (the buffer zeroed on the host) must drop
    them, else the next run starts from the old sequence's recurrent state."""
    a, b = _prompts(12, 2, seed=4)
    fresh = build_context(RunSpec(model=tiny35_q4, device="REF", ubatch=8, ctx=256)).decode(b)[-1]
    ctx = build_context(RunSpec(model=tiny35_q4, device="REF", ubatch=8, ctx=256))
    ctx.decode(a)
    ctx.reset()
    assert np.array_equal(ctx.decode(b)[-1], fresh)


def test_decode_seqs_refusals(tiny35_q4):
    ctx = build_context(RunSpec(model=tiny35_q4, device="CPU", ubatch=8, ctx=32, n_seq=2))
    with pytest.raises(KazeiaError, match="same number of tokens"):
        ctx.decode_seqs([[1, 2], [3]])
    with pytest.raises(KazeiaError, match="2 sequences|1 sequences"):
        ctx.decode_seqs([[1, 2]])
    with pytest.raises(KazeiaError, match="do not fit in the context"):
        ctx.decode_seqs([list(range(10, 139))] * 2)  # 2 x 129 > 256 cells (-c 32, padded as llama.cpp pads it)
    with pytest.raises(KazeiaError, match="decode_seqs"):
        ctx.decode([1, 2])
    with pytest.raises(KazeiaError, match="raise -ub"):
        build_context(RunSpec(model=tiny35_q4, device="CPU", ubatch=2, ctx=32, n_seq=3))


def _placement(path: str, profile: str, n_seq: int) -> dict[str, str]:
    ctx = build_context(RunSpec(model=path, device="HTP0", htp_profile=profile, ubatch=64, ctx=256, n_seq=n_seq))
    if n_seq == 1:
        ctx.decode(_prompts(40, 1)[0])
    else:
        ctx.decode_seqs(_prompts(40, n_seq))
    return {p.node: p.backend for p in ctx.scheduler.placements}


@pytest.mark.parametrize("profile", ["2026-05", "2026-10"])
def test_ssm_out_with_several_sequences_is_refused_by_may_only(tiny35_q4, profile):
    """#26094: May's ggml_hexagon_supported_mul_mat refuses a quantized MUL_MAT whose src1 has ne[2] != 1 ("no
    huge batches or broadcasting (for now)"), so ssm_out goes to the CPU with two sequences; October accepts src1
    dims that are multiples of src0's. With one sequence both keep it on the HTP."""
    one, two = _placement(tiny35_q4, profile, 1), _placement(tiny35_q4, profile, 2)
    outs = [k for k in one if k.startswith("linear_attn_out-") and "(" not in k]
    assert len(outs) == 3
    assert all(one[k] == "HTP0" for k in outs)
    assert all(two[k] == ("CPU" if profile == "2026-05" else "HTP0") for k in outs)
    assert one["ffn_out-0"] == two["ffn_out-0"] == "HTP0"  # the 2-D MUL_MATs stay, in both versions


def test_cli_needs_a_unified_cache_for_several_sequences(tiny35_q4):
    r = kazeia_clean("bench", "-m", tiny35_q4, "-np", "2", "-p", "8", "-n", "0", "-r", "1")
    assert r.returncode == 2 and "-kvu" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = kazeia_clean("bench", "-m", tiny35_q4, "-np", "0", "-p", "8", "-n", "0", "-r", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = kazeia_clean("trace", "-m", tiny35_q4, "-np", "2", "--n-prompt", "4")
    assert r.returncode == 2 and "-kvu" in r.stderr


def test_bench_counts_every_sequence_and_models_the_fallback(tiny35_q4):
    """`kazeia bench -np 1,2 -kvu`: one row per test and sequence count, t/s over all sequences' tokens (json
    n_seq); under 2026-05 the modeled device time of the 2-sequence prefill prices ssm_out on the phone's CPU."""
    r = kazeia_clean("bench", "-m", tiny35_q4, "-dev", "HTP0", "--htp-profile", "2026-05", "-p", "16", "-n", "2",
                     "-np", "1,2", "-kvu", "-r", "1", "--no-warmup", "-o", "json")
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    assert [(x["test"], x["n_seq"]) for x in recs] == [("pp16", 1), ("tg2", 1), ("pp16 x2 seq", 2),
                                                      ("tg2 x2 seq", 2)]
    for x in recs:
        assert x["avg_ts"] == pytest.approx((x["n_prompt"] + x["n_gen"]) * x["n_seq"] * 1e9 / x["avg_ns"], rel=1e-6)
    assert all(x["modeled device_avg_ts"] > 0 for x in recs)


def test_a_refused_weight_from_the_repack_buffer_is_copied_every_compute(tiny35_q4):
    """cost.weight_copy_seconds: ssm_out refused with two sequences under May pays its weight's un-repack copy (the
    loader's [K, 512] probe put it in the REPACK buffer); with OPFILTER matching MUL_MAT the probe is refused too,
    the loader keeps the weight on the CPU and nothing is copied; an op the HTP runs pays nothing either."""
    from kazeia.backends.htp import HtpSettings
    from kazeia.backends.htp.cost import PHONE_CPU, op_seconds, weight_copy_seconds

    ctx = build_context(RunSpec(model=tiny35_q4, device="CPU", ubatch=64, ctx=256, n_seq=2))
    ctx.decode_seqs(_prompts(8, 2))
    node = next(n for n in ctx.last_graph.nodes if n.name == "linear_attn_out-0")
    may = HtpSettings.from_env({"KAZEIA_HTP_PROFILE": "2026-05"})
    w = node.src[0]
    assert weight_copy_seconds(node, may) == w.nbytes / PHONE_CPU.unrepack_bytes_per_s
    assert op_seconds(node, may).seconds == pytest.approx(PHONE_CPU.op_seconds(node) + w.nbytes / 2e9)
    filtered = HtpSettings.from_env({"KAZEIA_HTP_PROFILE": "2026-05", "GGML_HEXAGON_OPFILTER": "MUL_MAT"})
    assert weight_copy_seconds(node, filtered) == 0.0
    ffn = next(n for n in ctx.last_graph.nodes if n.name == "ffn_out-0")
    assert op_seconds(ffn, may).where.startswith("HTP0")


def test_check_predicts_where_ssm_out_runs_with_several_sequences(tiny35_q4):
    """`kazeia check -np 2` from the header alone against the emulator's placement of the same micro-batch (two
    sequences of 32 tokens at -ub 64: M = 64): under May ssm_out is left to the CPU and tagged #26094, under
    October it stays on the HTP; its M ranges step by the number of sequences."""
    from kazeia.debug.check import check_model

    report = check_model(tiny35_q4, profiles=("2026-05", "2026-10"), archs=(79,), ubatches=(64,), n_seqs=(1, 2))
    for profile in ("2026-05", "2026-10"):
        placed = _placement(tiny35_q4, profile, 2)["linear_attn_out-0"]
        two = next(r for r in report.results if r.config.profile == profile and r.config.n_seq == 2)
        one = next(r for r in report.results if r.config.profile == profile and r.config.n_seq == 1)
        label = next(k for k in two.ranges if "ssm_out" in k)
        ranges = two.ranges[label]
        assert all(r.m_lo % 2 == 0 and r.m_hi % 2 == 0 for r in ranges) and ranges[-1].m_hi == 64
        at_64 = next(r for r in ranges if r.m_lo <= 64 <= r.m_hi).step
        assert (at_64.path == "cpu") == (placed == "CPU")
        assert (at_64.report == "llama.cpp #26094") == (profile == "2026-05")
        assert all(r.step.path != "cpu" for r in one.ranges[label])  # one sequence: on the HTP in both
