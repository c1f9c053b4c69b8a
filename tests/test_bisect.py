"""kazeia bisect: node-index routing, the op bisection (O(log n) child runs), the prompt-length search, ddmin over
dumped rows, --check commands that crash or hang, --fail-regex pinning, and resuming from the state file.

Oracles independent of the bisect machinery: the emulator's ground truth (`death["faulting"]`: the op the DSP
died in), the VTCM plan arithmetic (`plan_matmul` over M for every Qwen3-4B matmul shape), brute-force
1-minimality for ddmin, and check scripts whose failing node is chosen by the test.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap

import numpy as np
import pytest

from kazeia import settings as kazeia_settings
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_matmul
from kazeia.cli.main import build_parser
from kazeia.cli.main import main as cli_main
from kazeia.debug import bisect as B
from kazeia.debug.runner import run
from kazeia.engine.scheduler import Router, format_node_ranges, parse_node_ranges
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError

QWEN3_4B_MATMULS = [(2560, 4096), (2560, 1024), (4096, 2560), (2560, 9728), (9728, 2560)]  # (K, N)


def crash_spec(model: str, m: int = 38) -> RunSpec:
    return RunSpec(model=model, device="HTP0", htp_profile="2026-05", n_prompt=m)


# ---------------------------------------------------------------------------------------------------------
# routing by node index


def test_parse_node_ranges():
    assert parse_node_ranges("3:5, 7 ,9:") == [(3, 5), (7, 8), (9, None)]
    assert parse_node_ranges(":4") == [(0, 4)]
    assert parse_node_ranges(None) == [] and parse_node_ranges("") == []
    assert format_node_ranges([(3, 5), (9, None)]) == "3:5,9:"
    for bad in ("a:b", "5:3", "-1", "1:2:3"):
        with pytest.raises(KazeiaError):
            parse_node_ranges(bad)


def test_router_forces_node_index_ranges_to_cpu(tiny_qwen3):
    r = Router.from_args(cpu_node_range="2:4,10:")
    assert r.forced(_FakeNode(), 1) is None
    assert r.forced(_FakeNode(), 2)[0] == "CPU"
    assert r.forced(_FakeNode(), 4) is None
    assert r.forced(_FakeNode(), 99)[0] == "CPU"
    assert r.forced(_FakeNode()) is None  # no index: the rule cannot apply
    res = run(RunSpec(model=tiny_qwen3, device="HTP0", n_prompt=8, cpu_node_range="2:4,30:"))
    assert res.ok
    by_index = {p["index"]: p for p in res.placements}
    assert by_index and all(p["index"] >= 0 for p in res.placements)
    for i, p in by_index.items():
        routed = 2 <= i < 4 or i >= 30
        assert (p["reason"].startswith("--cpu-node-range")) == routed, p
        if routed:
            assert p["backend"] == "CPU"
    assert any(p["backend"] == "HTP0" for p in res.placements)


class _FakeNode:
    op = "ADD"
    name = "x"

    def desc(self) -> str:
        return self.op


def test_cli_flag_and_env_default(monkeypatch):
    args = build_parser().parse_args(["run", "--n-prompt", "4", "--cpu-node-range", "5:"])
    assert args.cpu_node_range == "5:"
    monkeypatch.setenv("KAZEIA_CPU_NODE_RANGE", "7:9")
    kazeia_settings.reload()
    args = build_parser().parse_args(["run", "--n-prompt", "4"])
    assert args.cpu_node_range == "7:9"
    spec = RunSpec(n_prompt=4, device="HTP0", cpu_node_range="12:")
    assert spec.argv()[-6:-4] == ["--cpu-node-range", "12:"]


# ---------------------------------------------------------------------------------------------------------
# bisect ops on the 2026-05 crash (child runs)


@pytest.mark.slow
def test_bisect_ops_finds_ffn_down_not_attn_out(q4b2, tmp_path):
    spec = crash_spec(q4b2)
    truth = run(spec)  # the emulator's ground truth: the op the DSP died in
    assert truth.death and truth.death["faulting"] == "ffn_out-0"
    index = next(p["index"] for p in truth.placements if p["node"] == "ffn_out-0")
    judge = B.OracleJudge(fail_regex="0x0000002e")
    res = B.bisect_ops(spec, judge, state_path=str(tmp_path / "ops.json"))
    assert res.verdict == "found"
    assert res.found.name == "ffn_out-0" and res.found.op == "MUL_MAT" and res.found.index == index
    assert res.found.dst == "f32[2560,38,1,1]" and "blk.0.ffn_down.weight" in res.found.src[0]
    n = len(res.candidates)
    assert res.runs == judge.runs == len(res.steps) <= 2 + math.ceil(math.log2(n))  # O(log n), each a child run
    assert judge.reference_runs == 0  # the regex pins a death: no CPU reference needed
    # the decisive pair: ffn_down on the device fails, everything before it on the device passes
    by_k = {s["k"]: s for s in res.steps}
    pos = [c.name for c in res.candidates].index("ffn_out-0")
    assert by_k[pos + 1]["outcome"] == B.FAIL and by_k[pos]["outcome"] == B.PASS
    text = B.format_ops(res)
    assert "ffn_out-0" in text and f"--cpu-node-range {index + 1}:" in text
    saved = json.load(open(tmp_path / "ops.json"))
    assert saved["result"]["found"]["name"] == "ffn_out-0" and len(saved["steps"]) == res.runs


@pytest.mark.slow
def test_bisect_ops_numeric_failure_with_the_oracle(tiny_qwen3_q4):
    """hmx-bias-stale: wrong numbers (no death) from the first HMX matmul on; judged against CPU logits."""
    from kazeia.debug.trace import TraceHook

    spec = RunSpec(model=tiny_qwen3_q4, device="HTP0", n_prompt=40, faults=["hmx-bias-stale"])
    trace = TraceHook(stream=None, input_stats=False)
    assert run(spec.with_(faults=[]), hooks=[trace]).ok
    first_hmx = next(r for r in trace.records if r["path"] == "hmx")  # the fault's first site, from a clean run
    judge = B.OracleJudge()
    res = B.bisect_ops(spec, judge)
    assert res.verdict == "found" and res.found.name == first_hmx["name"] and res.found.index == first_hmx["index"]
    assert judge.reference_runs == 1  # one CPU reference for the whole search (same prompt)
    assert all("NMSE" in s["detail"] or "NaN" in s["detail"] for s in res.steps if s["outcome"] == B.FAIL)


# ---------------------------------------------------------------------------------------------------------
# bisect m: interrupted, resumed, then confirmation of a predicted range (all sharing one state file)


def _plan_failing_m(limit: int = 200) -> list[int]:
    return [m for m in range(1, limit) if any(plan_matmul(m, k, n, profile="2026-05").outcome == "reenter"
                                              for k, n in QWEN3_4B_MATMULS)]


@pytest.mark.slow
def test_bisect_m_resumes_and_finds_33_to_64(q4b2, tmp_path):
    """In-process runs (isolate=False) to keep the ~17 runs cheap; child runs are covered by the ops test."""
    expected = _plan_failing_m()
    assert expected == list(range(33, 65))  # what the plan arithmetic says, independently of any run
    state = str(tmp_path / "m.json")
    spec = crash_spec(q4b2)
    j1 = B.OracleJudge(fail_regex="0x0000002e", isolate=False)
    with pytest.raises(B.BisectInterrupted):
        B.bisect_m(spec, j1, state_path=state, max_steps=5)
    assert j1.runs == 5 and len(json.load(open(state))["steps"]) == 5
    j2 = B.OracleJudge(fail_regex="0x0000002e", isolate=False)
    res = B.bisect_m(spec, j2, state_path=state)
    assert (res.smallest, res.largest, res.largest_capped) == (33, 64, False)
    keys = [s["key"] for s in res.steps]
    assert len(keys) == len(set(keys)) == j1.runs + j2.runs  # nothing run twice across the interruption
    outcome = {s["m"]: s["outcome"] for s in res.steps}
    assert outcome[32] == B.PASS and outcome[33] == B.FAIL and outcome[64] == B.FAIL and outcome[65] == B.PASS
    assert all((o == B.FAIL) == (m in expected) for m, o in outcome.items())
    assert res.runs <= 2 * (2 + math.ceil(math.log2(64)))

    # the prediction `kazeia investigate` makes from the plan: confirming it costs only the missing neighbours
    j3 = B.OracleJudge(fail_regex="0x0000002e", isolate=False)
    conf = B.bisect_m(spec, j3, predicted=(33, 64), state_path=state)
    assert conf.verdict == "confirmed" and conf.confirmed and (conf.smallest, conf.largest) == (33, 64)
    assert j3.runs == len({32, 33, 34, 63, 64, 65} - set(outcome))
    # a wrong prediction is refuted and the search continues from what is known
    j4 = B.OracleJudge(fail_regex="0x0000002e", isolate=False)
    bad = B.bisect_m(spec, j4, predicted=(30, 64), state_path=state)
    assert bad.confirmed is False and (bad.smallest, bad.largest) == (33, 64)
    assert j4.runs <= 1  # only M=29 is new


@pytest.mark.slow
def test_cli_bisect_m_confirms_a_prediction(q4b2, tmp_path, capsys):
    rc = cli_main(["bisect", "m", "-m", q4b2, "-dev", "HTP0", "--htp-profile", "2026-05", "--n-prompt", "38",
                   "--predict", "33:64", "--fail-regex", "0x0000002e", "--no-isolate", "-q", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["verdict"] == "confirmed" and (out["smallest"], out["largest"]) == (33, 64)
    assert sorted(s["m"] for s in out["steps"]) == [32, 33, 34, 63, 64, 65]


# ---------------------------------------------------------------------------------------------------------
# --check commands: crashes, hangs, the fail regex, resuming (tiny model: the candidates come from its graph)


def _check_script(tmp_path, target: int, how: str) -> str:
    """A check that fails (crash / hang / exit 1) iff node #target runs on the device, and logs every call."""
    log = tmp_path / f"calls-{how}.log"
    script = tmp_path / f"check_{how}.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, time
        rng = os.environ.get("KAZEIA_CPU_NODE_RANGE", "")
        with open({str(log)!r}, "a") as f:
            f.write(rng + "\\n")
        first_cpu = int(rng.split(":")[0]) if rng else 10**9
        if {target} < first_cpu:
            print("boom: node {target} on the device", flush=True)
            if {how!r} == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            elif {how!r} == "hang":
                time.sleep(600)
            sys.exit(1)
        sys.exit(0)
    """))
    return f"{sys.executable} {script}"


def _calls(tmp_path, how: str) -> list[str]:
    p = tmp_path / f"calls-{how}.log"
    return p.read_text().splitlines() if p.exists() else []


@pytest.fixture(scope="module")
def tiny_candidates(tiny_qwen3):
    spec = RunSpec(model=tiny_qwen3, device="HTP0", n_prompt=8)
    return spec, B.device_ops(spec)


def test_check_command_that_crashes(tiny_candidates, tmp_path):
    spec, cands = tiny_candidates
    target = cands[len(cands) * 2 // 3]
    judge = B.CommandJudge(_check_script(tmp_path, target.index, "crash"), fail_regex="SIGSEGV")
    res = B.bisect_ops(spec, judge, candidates=cands)
    assert res.verdict == "found" and res.found.index == target.index
    fails = [s for s in res.steps if s["outcome"] == B.FAIL]
    assert fails and all("SIGSEGV" in s["detail"] for s in fails)
    assert len(_calls(tmp_path, "crash")) == res.runs <= 2 + math.ceil(math.log2(len(cands)))
    # pinned to another signature, the crash is "other": the unmodified run does not count as failing
    other = B.bisect_ops(spec, B.CommandJudge(_check_script(tmp_path, target.index, "crash"),
                                              fail_regex="0x0000002e"), candidates=cands)
    assert other.verdict == "baseline-passes" and other.steps[0]["outcome"] == B.OTHER


@pytest.mark.slow
def test_check_command_that_hangs_is_killed(tiny_candidates, tmp_path):
    spec, cands = tiny_candidates
    target = cands[-2]  # late: few steps put it on the device, so few steps wait for the timeout
    judge = B.CommandJudge(_check_script(tmp_path, target.index, "hang"), timeout=1.0)
    res = B.bisect_ops(spec, judge, candidates=cands)
    assert res.found.index == target.index
    assert any("timed out" in s["detail"] for s in res.steps if s["outcome"] == B.FAIL)


def test_first_candidate_and_device_independent_failures(tiny_candidates, tmp_path):
    spec, cands = tiny_candidates
    res = B.bisect_ops(spec, B.CommandJudge(_check_script(tmp_path, cands[0].index, "exit")), candidates=cands)
    assert res.found.index == cands[0].index
    assert any(s["k"] == 0 and s["outcome"] == B.PASS for s in res.steps)  # the all-CPU run was verified
    always = B.bisect_ops(spec, B.CommandJudge("exit 3"), candidates=cands)
    assert always.verdict == "fails-without-device" and always.found is None


def test_oracle_child_that_crashes_counts_as_failing(tiny_qwen3, tmp_path, monkeypatch):
    """A child interpreter killed by SIGSEGV before writing its result: the step fails (or is 'other' when a
    different signature is pinned), and the search process survives."""
    (tmp_path / "sitecustomize.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    spec = RunSpec(model=tiny_qwen3, device="CPU", n_prompt=8)
    v = B.OracleJudge()(spec)
    assert v.outcome == B.FAIL and "status -11" in v.detail
    assert B.OracleJudge(fail_regex="0x0000002e")(spec).outcome == B.OTHER


def test_oracle_child_timeout_counts_as_failing(tiny_qwen3):
    spec = RunSpec(model=tiny_qwen3, device="CPU", n_prompt=8)
    v = B.OracleJudge(timeout=0.01)(spec)
    assert v.outcome == B.FAIL and "timed out" in v.detail
    assert B.OracleJudge(timeout=0.01, fail_regex="0x0000002e")(spec).outcome == B.OTHER


def test_resume_gives_the_same_answer_without_repeating_steps(tiny_candidates, tmp_path):
    spec, cands = tiny_candidates
    target = cands[len(cands) // 3]
    (tmp_path / "full").mkdir()
    full = B.bisect_ops(spec, B.CommandJudge(_check_script(tmp_path / "full", target.index, "exit")),
                        candidates=cands)
    state = str(tmp_path / "state.json")
    check = _check_script(tmp_path, target.index, "exit")
    for _ in range(2):  # two interruptions, one step each
        with pytest.raises(B.BisectInterrupted):
            B.bisect_ops(spec, B.CommandJudge(check), state_path=state, max_steps=1, candidates=cands)
    res = B.bisect_ops(spec, B.CommandJudge(check), state_path=state, candidates=cands)
    assert res.found == full.found and res.runs == full.runs and res.new_runs == full.runs - 2
    calls = _calls(tmp_path, "exit")
    assert len(calls) == len(set(calls)) == full.runs
    again = B.bisect_ops(spec, B.CommandJudge(check), state_path=state, candidates=cands)
    assert again.new_runs == 0 and again.found == full.found
    with pytest.raises(KazeiaError, match="different configuration"):
        B.bisect_ops(spec, B.CommandJudge("true"), state_path=state, candidates=cands)


def test_cli_bisect_ops_with_check(tiny_qwen3, tiny_candidates, tmp_path, capsys):
    _, cands = tiny_candidates
    target = cands[3]
    rc = cli_main(["bisect", "ops", "-m", tiny_qwen3, "-dev", "HTP0", "--n-prompt", "8", "-q", "--json",
                   "--check", _check_script(tmp_path, target.index, "crash"), "--state", str(tmp_path / "s.json")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["found"]["index"] == target.index and out["found"]["name"] == target.name


# ---------------------------------------------------------------------------------------------------------
# ddmin over rows


def _one_minimal(sub: list[int], fails) -> bool:
    return fails(sub) and all(not fails([x for x in sub if x != y]) for y in sub)


@pytest.mark.parametrize("needed", [[5, 17], [0], [3, 4, 30, 31]])
def test_ddmin_finds_the_rows_that_matter(needed):
    def fails(s):
        return set(needed) <= set(s)

    got = B.ddmin(list(range(40)), fails)
    assert got == sorted(needed) and _one_minimal(got, fails)


def test_ddmin_count_threshold():
    def fails(s):
        return 33 <= len(s) <= 64

    got = B.ddmin(list(range(38)), fails)
    assert len(got) == 33 and _one_minimal(got, fails)


def _fake_replay(predicate):
    calls = []

    def replay(rows, idx):
        calls.append(None if idx is None else tuple(idx))
        return B.Outcome(B.FAIL if predicate(rows) else B.PASS, "fake")

    return replay, calls


def test_ddmin_rows_value_dependent_failure(tmp_path):
    rows = np.random.default_rng(1).standard_normal((24, 16)).astype(np.float32)
    rows[[4, 19], 3] = np.nan  # the op fails iff one of these NaN rows is fed

    replay, calls = _fake_replay(lambda r: bool(np.isnan(r).any()))
    res = B.ddmin_rows(rows, replay, state_path=str(tmp_path / "rows.json"))
    assert res.verdict == "found" and len(res.minimal) == 1 and res.minimal[0] in (4, 19)
    assert res.depends_on == "values" and res.method == "ddmin"
    replay2, calls2 = _fake_replay(lambda r: bool(np.isnan(r).any()))
    again = B.ddmin_rows(rows, replay2, state_path=str(tmp_path / "rows.json"))
    assert again.minimal == res.minimal and calls2 == []  # resumed: no replay repeated


def test_ddmin_rows_count_only_failure():
    rows = np.ones((38, 8), np.float32)
    replay, calls = _fake_replay(lambda r: 33 <= r.shape[0] <= 64)
    res = B.ddmin_rows(rows, replay)
    assert res.depends_on == "row count" and len(res.minimal) == 33 and res.method == "row count"
    assert len(calls) <= 3 + math.ceil(math.log2(38)) + 2
    res2 = B.ddmin_rows(rows, _fake_replay(lambda r: 33 <= r.shape[0] <= 64)[0], shortcut=False)
    assert len(res2.minimal) == 33 and res2.depends_on == "row count" and res2.method == "ddmin"


@pytest.mark.slow
def test_bisect_rows_on_the_dumped_ffn_down(q4b2, tmp_path, capsys):
    from kazeia.debug.dump import DumpHook

    ddir = tmp_path / "dump"
    hook = DumpHook("^ffn_out-0$", ddir)
    res = run(crash_spec(q4b2), hooks=[hook])
    assert res.death and hook.entries
    rc = cli_main(["bisect", "rows", str(ddir), "--json", "-q", "--state", str(tmp_path / "rows.json")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["n_rows"] == 38
    assert len(out["minimal"]) == 33 and out["depends_on"] == "row count"
    fails = {s["rows"] for s in out["steps"] if s["outcome"] == B.FAIL and "values" not in s}
    passes = {s["rows"] for s in out["steps"] if s["outcome"] == B.PASS}
    assert 33 in fails and 32 in passes
