"""bisect tells a child that died of the failure under search from one killed from outside (a signal, the
out-of-memory killer): the latter is retried once, then the step is "inconclusive" and the search stops without
a verdict; it never counts as the failure (before, a SIGKILL looked like the bug reproducing).

The children here kill themselves with SIGKILL (as the OOM killer would), directly or through the shell (which
then reports exit status 137), or raise MemoryError; a crash of the program itself (SIGSEGV) stays a failure
(tests/test_bisect.py), and so does a killed child whose output carries the pinned --fail-regex.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from kazeia.cli.main import main as cli_main
from kazeia.debug import bisect as B
from kazeia.debug.runner import external_kill
from kazeia.engine.session import RunSpec


@pytest.fixture(scope="module")
def tiny_candidates(tiny_qwen3):
    spec = RunSpec(model=tiny_qwen3, device="HTP0", n_prompt=8)
    return spec, B.device_ops(spec)


def _script(tmp_path, body: str) -> str:
    """A check command running `body` (python), each call logged to calls.log first."""
    p = tmp_path / "check.py"
    p.write_text(textwrap.dedent(f"""
        import os, signal, sys
        log = {str(tmp_path / "calls.log")!r}
        with open(log, "a") as f:
            f.write(os.environ.get("KAZEIA_CPU_NODE_RANGE", "") + "\\n")
        calls = len(open(log).read().splitlines())
        rng = os.environ.get("KAZEIA_CPU_NODE_RANGE", "")
        first_cpu = int(rng.split(":")[0]) if rng else 10**9
    """) + textwrap.dedent(body))
    return f"{sys.executable} {p}"


def _calls(tmp_path) -> int:
    p = tmp_path / "calls.log"
    return len(p.read_text().splitlines()) if p.exists() else 0


@pytest.mark.parametrize("how", ["self", "via-shell"])
def test_a_child_killed_twice_is_inconclusive_not_a_failure(tiny_candidates, tmp_path, how):
    spec, cands = tiny_candidates
    kill = _script(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)\n")
    check = kill if how == "self" else f"sh -c '{kill}'; exit $?"  # the shell reports 128 + 9
    with pytest.raises(B.StepInconclusive) as ei:
        B.bisect_ops(spec, B.CommandJudge(check), candidates=cands)
    msg = str(ei.value)
    assert msg.startswith("inconclusive: step 1 (cpu=): the child was killed by SIGKILL, and killed by SIGKILL on "
                          "the retry: an external kill or the out-of-memory killer, not the failure under search")
    assert "\n" not in msg and _calls(tmp_path) == 2  # the step and its one retry, nothing more


def test_one_kill_is_retried_and_the_search_goes_on(tiny_candidates, tmp_path):
    """Only the very first call is killed: the retry judges that step, and the op found is the scripted one."""
    spec, cands = tiny_candidates
    target = cands[len(cands) // 3]
    check = _script(tmp_path, f"""
        if calls == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(1 if {target.index} < first_cpu else 0)
    """)
    res = B.bisect_ops(spec, B.CommandJudge(check), candidates=cands)
    assert res.verdict == "found" and res.found.index == target.index
    assert all(s["outcome"] != B.INCONCLUSIVE for s in res.steps)
    assert _calls(tmp_path) == res.runs + 1  # one retry


def test_a_killed_child_that_printed_the_signature_is_the_failure(tiny_candidates, tmp_path):
    """--fail-regex pins what the failure under search prints: killed after printing it, it is that failure."""
    spec, cands = tiny_candidates
    target = cands[len(cands) // 2]
    check = _script(tmp_path, f"""
        if {target.index} < first_cpu:
            print("ggml-hex: dspqueue_read failed: 0x0000002e", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    res = B.bisect_ops(spec, B.CommandJudge(check, fail_regex="0x0000002e"), candidates=cands)
    assert res.verdict == "found" and res.found.index == target.index
    assert _calls(tmp_path) == res.runs  # no retries: every kill carried the signature


@pytest.mark.parametrize("sitecustomize, killed", [
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "killed by SIGKILL"),
    ("import kazeia.debug.runner as r\n\ndef oom(*a, **k):\n    raise MemoryError\n\nr.run = oom\n", "out of memory"),
])
def test_oracle_child_killed_or_out_of_memory_is_inconclusive(tiny_qwen3, tmp_path, monkeypatch, sitecustomize,
                                                               killed):
    (tmp_path / "sitecustomize.py").write_text(sitecustomize)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    judge = B.OracleJudge()
    v = judge(RunSpec(model=tiny_qwen3, device="CPU", n_prompt=8))
    assert v.outcome == B.INCONCLUSIVE and judge.runs == 2
    assert v.detail.startswith(f"the child was {killed}, and {killed} on the retry")


def test_cli_says_inconclusive_and_a_rerun_retries_the_step(tiny_qwen3, tiny_candidates, tmp_path, capsys):
    _, cands = tiny_candidates
    state = tmp_path / "s.json"
    argv = ["bisect", "ops", "-m", tiny_qwen3, "-dev", "HTP0", "--n-prompt", "8", "-q", "--state", str(state)]
    rc = cli_main([*argv, "--check", _script(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)\n")])
    err = capsys.readouterr().err
    assert rc == 4 and err.startswith("inconclusive: step 1 (cpu=)") and "rerun the same command" in err, err
    steps = json.loads(state.read_text())["steps"]
    assert [s["outcome"] for s in steps] == [B.INCONCLUSIVE]
    # the killer is gone: the same state file reruns the inconclusive step (it was not memoized) and finishes;
    # the state belongs to the check command, so the same command is rerun with the kill switched off
    (tmp_path / "check.py").write_text(f"import os, sys\nrng = os.environ.get('KAZEIA_CPU_NODE_RANGE', '')\n"
                                       f"sys.exit(1 if {cands[2].index} < (int(rng.split(':')[0]) if rng else "
                                       f"10**9) else 0)\n")
    rc = cli_main([*argv, "--json", "--check", f"{sys.executable} {tmp_path / 'check.py'}"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["found"]["index"] == cands[2].index
    assert out["steps"][0]["outcome"] == B.INCONCLUSIVE and out["steps"][1]["key"] == "cpu="


def test_external_kill_classification():
    assert external_kill(-9) == "killed by SIGKILL" and external_kill(137) == "killed by SIGKILL"
    assert external_kill(-15) == "killed by SIGTERM" and external_kill(143) == "killed by SIGTERM"
    assert external_kill(-11) is None and external_kill(139) is None  # SIGSEGV: the program's own crash
    assert external_kill(-6) is None and external_kill(1) is None and external_kill(0) is None
    assert external_kill(1, "Traceback ...\nMemoryError\n") == "out of memory"
