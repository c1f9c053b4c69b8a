"""Issue 39: May's HMX job queue taking a job whose worker's address ends in 0x00 for HMX_QUEUE_NOOP (fault
hmx-queue-narrowing, backends/htp/build_layout.py): the build layout, what a skipped job leaves, and the tools."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia.backends.htp import HtpSettings, build_skips
from kazeia.backends.htp import build_layout as queue
from kazeia.backends.htp.ops.fa_pipeline import _Pipeline
from kazeia.debug.determinism import build_seeded, check_determinism
from kazeia.debug.runner import run
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError

FAULT = "hmx-queue-narrowing"


def test_only_a_low_byte_of_zero_is_taken_for_a_signal():
    # the cast keeps the low byte (one-byte enum); aligned functions never end in 1 (SUSPEND) or 2 (KILL)
    assert queue.taken_for_noop(0x1234_5600)
    assert not any(queue.taken_for_noop(0x1234_5600 + k * queue.ENTRY_ALIGN) for k in range(1, 16))


def test_a_build_skips_each_worker_one_time_in_sixteen():
    n = 4000
    skips = [queue.skipped_in(s, bad_only=False) for s in range(n)]
    bad = sum(any(s.values()) for s in skips) / n
    assert abs(bad - (1 - (15 / 16) ** 4)) < 0.03  # 0.2275: 4 workers, each 1/16
    for w in queue.QUEUE_WORKERS:
        assert abs(sum(s[w] for s in skips) / n - 1 / 16) < 0.015
    # the fault is a bad build: every seed names at least one skipped worker, the same where its first draw was bad
    for s in range(200):
        assert any(queue.skipped_in(s).values())
        if any(skips[s].values()):
            assert queue.skipped_in(s) == skips[s]


def test_the_switches_are_checked_and_the_fixed_code_skips_nothing():
    with pytest.raises(KazeiaError, match="unknown HMX queue worker"):
        HtpSettings.from_env({"KAZEIA_HTP_NARROWED": "qk,bogus"})
    with pytest.raises(KazeiaError, match="KAZEIA_HTP_BUILD_SEED"):
        HtpSettings.from_env({"KAZEIA_HTP_BUILD_SEED": "-3"})
    env = {"KAZEIA_HTP_NARROWED": "hmx_fa_qk_dot_worker,matmul"}
    may = HtpSettings.from_env(env, profile="2026-05", faults=[FAULT])
    assert build_skips(may) == {"qk", "matmul"}
    for fixed in ("2026-10", "robust"):  # #25677's full-width compare (robust: the same fix)
        assert build_skips(HtpSettings.from_env(env, profile=fixed, faults=[FAULT])) == frozenset()
    assert build_skips(HtpSettings.from_env(env, profile="2026-05")) == frozenset()  # no fault, no bad build
    unpinned = HtpSettings.from_env({}, profile="2026-05", faults=[FAULT])
    assert build_skips(unpinned) is None  # drawn once per process: the tools pin it


def _pipe(skipped: set[str], g_br: int, bc: int, dv: int, stale_s: float = 0.0, stale_o: float = 7.0) -> _Pipeline:
    p = _Pipeline.__new__(_Pipeline)
    p.g_br, p.bc, p.skipped = g_br, bc, frozenset(skipped)
    p.s = np.full((g_br, bc), stale_s, dtype=np.float32)
    p.o = [np.full((g_br, dv), stale_o, dtype=np.float32) for _ in range(2)]
    return p


def _case(rows=32, n_kv=256, d=64, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((rows, d)).astype(np.float16).astype(np.float32)
    k = rng.standard_normal((n_kv, d)).astype(np.float16).astype(np.float32)
    v = rng.standard_normal((n_kv, d)).astype(np.float16).astype(np.float32)
    mask = np.zeros((rows, n_kv), dtype=np.float32)
    mask[:, 200:] = -np.inf  # padded cells
    mask[0, 100:] = -np.inf
    return q, k, v, mask


def _reference(q, k, v, mask, scale, s=None):
    """float64 softmax attention (s: the scores to use instead of q k^T * scale)."""
    x = (q.astype(np.float64) @ k.T.astype(np.float64)) * scale if s is None else s.astype(np.float64)
    x = x + mask
    p = np.exp(x - x.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


def test_the_pipeline_with_every_job_run_is_flash_attention():
    q, k, v, mask = _case()
    scale = np.float32(0.125)
    o = _pipe(set(), 32, 64, 64).q_block(q, k, v, mask, scale)
    ref = _reference(q, k, v, mask, scale)
    assert np.abs(o - ref).max() < 2e-2 * np.abs(ref).max()


def test_a_skipped_qk_attends_with_the_stale_scores():
    q, k, v, mask = _case()
    # S never written: every block reads the constant VTCM held, so each row averages its unmasked V rows
    o = _pipe({"qk"}, 32, 64, 64, stale_s=1.5).q_block(q, k, v, mask, np.float32(0.125))
    ref = _reference(q, k, v, mask, 0.125, s=np.full((32, 256), 1.5))
    assert np.abs(o - ref).max() < 2e-2 * np.abs(ref).max()
    assert np.allclose(ref[1], v[:200].mean(axis=0)) and np.allclose(ref[0], v[:100].mean(axis=0))


@pytest.mark.parametrize("n_kv, expect_zero", [(256, True), (192, False)])  # 4 KV blocks, then 3
def test_a_skipped_o_update_leaves_zeros_or_the_other_buffer(n_kv, expect_zero):
    q, k, v, mask = _case(n_kv=n_kv)
    mask = mask[:, :n_kv]
    o = _pipe({"o_update"}, 32, 64, 64, stale_o=7.0).q_block(q, k, v, mask, np.float32(0.125))
    if expect_zero:  # an even number of swaps: O_prev is the zeroed buffer
        assert not o.any()
    else:  # odd: the never-written buffer, divided by l (l >= 1: the row max contributes exp(0))
        assert (o > 0).all() and (o <= 7.0).all()


def test_a_skipped_o_norm_stores_the_unnormalised_output_before_the_last_block():
    q, k, v, mask = _case()
    scale = np.float32(0.125)
    o = _pipe({"o_norm"}, 32, 64, 64).q_block(q, k, v, mask, scale)
    x = (q.astype(np.float64) @ k.T.astype(np.float64)) * scale + mask
    m3 = x[:, :192].max(axis=-1, keepdims=True)  # the running max after block 2 (blocks 0..2 of 64)
    unnormalised = np.exp(x[:, :192] - m3) @ v[:192].astype(np.float64)
    assert np.abs(o - unnormalised).max() < 3e-2 * np.abs(unnormalised).max()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (stale fp16 bytes hold NaN patterns: they flow on)
def test_the_matmul_worker_skip_changes_only_hmx_quantized_matmuls(q4b2):
    # M = 70: May's HMX takes the quantized matmuls (M >= 32) and ffn_down's plan fits again past 64
    base = RunSpec(model=q4b2, device="HTP0", htp_profile="2026-05", n_prompt=70, flash_attn=False)
    env = {"KAZEIA_HTP_NARROWED": "matmul"}
    clean = run(base)
    skipped = run(base.with_(faults=[FAULT], env=env))
    assert clean.ok and clean.logits is not None
    assert not (skipped.ok and np.array_equal(skipped.logits, clean.logits))
    fixed = run(base.with_(htp_profile="2026-10"))
    fixed_faulted = run(base.with_(htp_profile="2026-10", faults=[FAULT], env=env))
    assert np.array_equal(fixed.logits, fixed_faulted.logits)
    below = base.with_(n_prompt=29)  # below 32 May's op_matmul runs HVX: the queue never sees a matmul
    assert np.array_equal(run(below).logits, run(below.with_(faults=[FAULT], env=env)).logits)


def test_determinism_names_the_builds_and_stays_quiet_without_them(q4b2):
    spec = RunSpec(model=q4b2, device="HTP0", htp_profile="2026-05", n_prompt=29, faults=[FAULT])
    specs = build_seeded(spec, 8)
    assert [s.env["KAZEIA_HTP_BUILD_SEED"] for s in specs] == [str(i) for i in range(1, 9)]
    rep = check_determinism(spec, 8, specs=specs)
    assert not rep.deterministic and len(rep.first_tokens) > 1
    assert "the first token changes" in rep.message and rep.mechanism and "#25677" in rep.mechanism
    assert "with GGML_HEXAGON_USE_HMX=0 runs" in rep.mechanism and rep.mechanism.endswith("HMX queue)")
    # the mechanism's grouping is the builds': runs whose builds skip the same FA workers agree
    fa = [build_skips(s.htp_settings()) & set(queue.FA_WORKERS) for s in specs]
    for i in range(8):
        for j in range(8):
            if fa[i] == fa[j]:
                assert any(i in ix and j in ix for ix in rep.logits_groups.values())
    for quiet in (spec.with_(faults=[]), spec.with_(htp_profile="2026-10")):
        r = check_determinism(quiet, 2, specs=build_seeded(quiet, 2))
        assert r.deterministic and r.mechanism is None, r.message
    one_build = spec.with_(env={"KAZEIA_HTP_BUILD_SEED": "4"})  # runs of one build agree: no per-run race
    assert check_determinism(one_build, 3, specs=build_seeded(one_build, 3)).deterministic


def test_check_names_the_exposed_ops_under_may_only(q4b2):
    from kazeia.debug.check import check_model
    from kazeia.debug.check.report import text

    may = text(check_model(q4b2, profiles=("2026-05",), archs=(79,)))
    assert "HMX job queue (2026-05; llama.cpp #25677)" in may
    assert "quantized MUL_MAT on HMX (Q4_0), M 32..512" in may and "FLASH_ATTN_EXT on HMX" in may
    for fixed in (("2026-10",), ("robust",)):
        assert "HMX job queue" not in text(check_model(q4b2, profiles=fixed, archs=(79,)))


def test_investigate_pins_and_names_the_build(q4b2, tmp_path):
    from kazeia.debug.investigate import Context, Investigation
    from kazeia.debug.investigate.verdicts import _build_sentence

    spec = RunSpec(model=q4b2, device="HTP0", htp_profile="2026-05", n_prompt=29, faults=[FAULT],
                   env={"KAZEIA_HTP_BUILD_SEED": "4"})
    cx = Context(spec, str(tmp_path), Investigation("t", "", "", False), spec.htp_settings())
    (line,) = _build_sentence(cx)
    assert "KAZEIA_HTP_BUILD_SEED=4" in line and "hmx_fa_o_update_worker" in line and "#25677" in line
    clean = spec.with_(faults=[])
    assert _build_sentence(Context(clean, str(tmp_path), Investigation("t", "", "", False), clean.htp_settings())) == []
    from kazeia.backends.htp import pin_build

    unpinned = spec.with_(env={})
    pinned = pin_build(unpinned.env, unpinned.htp_settings())
    assert pinned["KAZEIA_HTP_BUILD_SEED"] == pin_build({}, unpinned.htp_settings())["KAZEIA_HTP_BUILD_SEED"]
    assert pin_build({}, clean.htp_settings()) == {}
