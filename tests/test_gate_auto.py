"""`kazeia gate --auto` (issue 11): the op classes, their validation in child processes, the policy routing only the
failing classes by modeled time, its cache; and the gated run of a Qwen3-4B-shaped model under 2026-05."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia import settings as kazeia_settings
from kazeia.backends.htp.cost import graph_seconds
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_matmul
from kazeia.cli.common import open_session
from kazeia.cli.main import build_parser
from kazeia.debug.gate.auto import auto_policy, explain
from kazeia.debug.gate.classes import enumerate_classes
from kazeia.debug.judge import nmse
from kazeia.engine.context import Model

Q4B_SHAPES = [(2560, 4096), (2560, 1024), (4096, 2560), (2560, 9728), (9728, 2560)]  # (K, N) of the projections


def session(*argv: str):
    return open_session(build_parser("run").parse_args(["run", *argv]))


def failing_by_arithmetic(settings: HtpSettings, ub: int) -> set[tuple[int, int, int]]:
    """(K, N, M) whose plan does not run, from plan_matmul alone (no graph, no model file)."""
    return {(k, n, m) for k, n in Q4B_SHAPES for m in range(1, ub + 1)
            if plan_matmul(m, k, n, "q4_0", vtcm_size=settings.vtcm_bytes, profile=settings.profile).outcome
            != "runs"}


@pytest.mark.parametrize("vtcm", [8 << 20, 6 << 20, 4 << 20])
def test_classes_are_the_plans_of_the_model(q4b2, vtcm):
    """Every M of 1..ub lands in exactly one class per weight shape, and the classes whose plan does not run are
    exactly the (K, N, M) the plan arithmetic says fail."""
    settings = HtpSettings(profile="2026-05", vtcm_bytes=vtcm)
    classes, others = enumerate_classes(Model.load(q4b2), settings, 96)
    for k, n in Q4B_SHAPES:
        ms = sorted(m for c in classes if (c.k, c.n) == (k, n) for m in c.ms)
        assert ms == list(range(1, 97)), (k, n)
    bad = {(c.k, c.n, m) for c in classes if c.plan[2] != "runs" for m in c.ms}
    assert bad == failing_by_arithmetic(settings, 96)
    if vtcm == 8 << 20:
        assert bad == {(9728, 2560, m) for m in range(33, 65)}  # the design note's arithmetic
    assert "FLASH_ATTN_EXT" in others and "RMS_NORM" in others


@pytest.mark.slow
def test_auto_policy_routes_only_the_failing_class_and_caches(q4b2, tmp_path, monkeypatch):
    monkeypatch.setenv("KAZEIA_GATE_CACHE", str(tmp_path))
    kazeia_settings.reload()
    settings = HtpSettings(profile="2026-05")
    res = auto_policy(q4b2, settings, 64)
    assert not res.cached and res.child_runs > 0 and res.cases > 0
    (rule,) = res.policy.rules
    assert (rule.op, rule.type, rule.k, rule.n, rule.m) == ("MUL_MAT", "q4_0", (9728, 9728), (2560, 2560), (33, 64))
    # by the cost model: a 32-row piece on HMX and the rest on HVX beats HVX for all, the phone CPU, and splitting
    # the whole micro-batch
    assert rule.action == "split-op"
    assert any("FAILED" in e and "device death" in e for e in rule.evidence)
    again = auto_policy(q4b2, settings, 64)
    assert again.cached and again.child_runs == 0 and again.cases == 0
    assert [r.name for r in again.policy.rules] == [rule.name]
    text = explain(again.policy)
    assert rule.name in text and "tok/s" in text and "all-HMX" in text
    other = auto_policy(q4b2, HtpSettings(profile="robust"), 64)  # another key: validated again, nothing fails
    assert not other.cached and other.policy.rules == []


@pytest.mark.slow
def test_gated_run_and_recovery_acceptance(q4b2, tmp_path, monkeypatch):
    """Issue 11's acceptance on the 2-layer Qwen3-4B shape: 2026-05, 38 tokens, --gates auto completes with only
    the overflowing class routed, modeled prefill >= 90 % of robust's, logits within 5e-4 NMSE of cpu; the
    recovery run without gates gives the gated run's tokens."""
    monkeypatch.setenv("KAZEIA_GATE_CACHE", str(tmp_path))
    kazeia_settings.reload()
    ids = list(range(1000, 1038))
    common = ("-m", q4b2, "-ub", "64")
    gated = session(*common, "-dev", "HTP0", "--htp-profile", "2026-05", "--gates", "auto")
    logits = np.array(gated.ctx.decode(ids)[-1])
    routed = {p.node for p in gated.scheduler.placements if "rule " in p.reason}
    assert routed == {"ffn_out-0"}  # the last layer's FFN runs on the one output row (M = 1)
    settings = gated.scheduler.backends[0].settings
    gated_s = graph_seconds(gated.ctx.last_graph.nodes, settings)[0]
    robust = session(*common, "-dev", "HTP0", "--htp-profile", "robust")
    robust.ctx.decode(ids)
    robust_s = graph_seconds(robust.ctx.last_graph.nodes, robust.scheduler.backends[0].settings)[0]
    assert (38 / gated_s) >= 0.9 * (38 / robust_s)
    cpu = session(*common, "-dev", "CPU")
    assert nmse(logits, np.array(cpu.ctx.decode(ids)[-1])) <= 5e-4
    tokens = [int(np.argmax(logits))]
    for _ in range(3):
        tokens.append(int(np.argmax(gated.ctx.decode([tokens[-1]])[-1])))
    rec = session(*common, "-dev", "HTP0", "--htp-profile", "2026-05", "--recover")
    rec.ctx.recovery.warn = lambda s: None
    rt = [int(np.argmax(rec.ctx.decode(ids)[-1]))]
    for _ in range(3):
        rt.append(int(np.argmax(rec.ctx.decode([rt[-1]])[-1])))
    assert rec.ctx.recovery.recoveries == 1 and len(rec.ctx.recovery.rules_added) == 1
    assert rt == tokens


@pytest.mark.slow
def test_run_gates_auto_builds_then_reuses_the_cache(q4b2, tmp_path):
    """`kazeia run --gates auto` validates with a progress bar the first time; the second run does no validation
    work and says so; `kazeia gate --explain` prints the cached policy's reasons."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "KAZEIA_GATE_CACHE": str(tmp_path)}
    argv = [sys.executable, "-m", "kazeia.cli.main", "run", "-m", q4b2, "-dev", "HTP0", "--htp-profile", "2026-05",
            "--gates", "auto", "-ub", "64", "--n-prompt", "38", "-n", "1", "--temp", "0"]
    first = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1200)
    assert first.returncode == 0, first.stderr
    assert "gates: validating [" in first.stderr and "1 failing, 1 rule(s)" in first.stderr
    second = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1200)
    assert second.returncode == 0, second.stderr
    assert "validation work: 0 child runs, 0 cases" in second.stderr and "validating [" not in second.stderr
    assert first.stdout == second.stdout
    ex = subprocess.run([sys.executable, "-m", "kazeia.cli.main", "gate", "--explain", "-m", q4b2, "--htp-profile",
                         "2026-05", "-ub", "64"], capture_output=True, text=True, env=env, timeout=600)
    assert ex.returncode == 0, ex.stderr
    assert "split-op" in ex.stdout and "FAILED" in ex.stdout and "all-HMX" in ex.stdout


@pytest.mark.slow
def test_every_failing_class_gets_a_rule_from_its_verdicts(q4b2, tmp_path, monkeypatch):
    """The policy from given verdicts (here: every HVX class failing on the device, as a fault in the HVX kernel
    would make them): one rule per failing class, each to an alternative that passed, none for passing classes."""
    import kazeia.debug.gate.auto as A

    monkeypatch.setenv("KAZEIA_GATE_CACHE", str(tmp_path))

    kazeia_settings.reload()

    def verdicts(model_path, classes, settings, paths, jobs, progress, res):
        return {c.key: [{"m": m, "path": p or "default", "evidence": "given",
                         "ok": not (c.path == "hvx" and p in (None, "hvx"))}
                        for p in paths[c.key] for m in c.representatives()] for c in classes}

    monkeypatch.setattr(A, "_validate", verdicts)
    res = A.auto_policy(q4b2, HtpSettings(profile="robust"), 64, use_cache=False)
    classes, _ = enumerate_classes(Model.load(q4b2), HtpSettings(profile="robust"), 64)
    hvx = [c for c in classes if c.path == "hvx"]
    assert len(res.policy.rules) == len(hvx) > 0
    assert {r.action for r in res.policy.rules} == {"cpu"}  # HVX itself failed; no M below 1 to split to
    assert sorted((r.k, r.n, r.m) for r in res.policy.rules) == sorted(
        ((c.k, c.k), (c.n, c.n), (c.ms[0], c.ms[-1])) for c in hvx)


@pytest.mark.slow  # child processes
@pytest.mark.parametrize("profile", ["2026-05", "2026-10"])
def test_a_short_conv_class_is_validated_and_gated(tmp_path, monkeypatch, profile):
    """LFM2 (q8_0): its short convs are classes of their own, one per DSP kernel (op_scratch): under 2026-05 the
    scalar loop below 32 tokens and the HVX kernel from 32, whose shifted weight reads (#24470) fail against REF in
    the child's one-op run, so the policy routes SSM_CONV at M 32..ub to the host, validated there; under 2026-10
    (one HVX kernel, fixed) nothing is routed. A run with the policy then computes what the CPU does."""
    from kazeia.gguf.writer import preset, write_model

    monkeypatch.setenv("KAZEIA_GATE_CACHE", str(tmp_path / "cache"))
    kazeia_settings.reload()
    path = str(tmp_path / "lfm2_q8.gguf")
    write_model(preset("tiny", arch="lfm2", wtype="q8_0"), path)
    settings = HtpSettings(profile=profile)
    classes, _ = enumerate_classes(Model.load(path), settings, 48)
    convs = [c for c in classes if c.op == "SSM_CONV"]
    assert {c.plan[2]: (c.ms[0], c.ms[-1]) for c in convs} == (
        {"scalar": (1, 31), "hvx": (32, 48)} if profile == "2026-05" else {"hvx": (1, 48)})
    res = auto_policy(path, settings, ubatch=48, use_cache=False)
    rules = [r for r in res.policy.rules if r.op == "SSM_CONV"]
    if profile == "2026-10":
        assert not rules
        return
    (rule,) = rules
    assert rule.action == "cpu" and rule.m == (32, 48) and "the host validates" in rule.why
    tokens = list(range(3, 43))  # 40: the HVX kernel's sizes
    cpu = session("-m", path, "-dev", "CPU").ctx.decode(tokens)[-1]
    gated = session("-m", path, "-dev", "HTP0", "--htp-profile", "2026-05", "--gates", res.cache_path).ctx.decode(
        tokens)[-1]
    assert nmse(gated, cpu) < 1e-4
