"""The upstream version as data (issue 35): a profile is its generation's Capabilities plus its defects, faults are
objects with one predicate, and nothing else names a version or a fault.

- A third, test-only profile (October's code with two capabilities changed: no op fusion, no lazy L2) runs the
  seed scenario, `kazeia check` and `kazeia upgrade` in process, and each capability it turned off is really off.
- An unknown code generation is refused in one line, from one place (profiles.capabilities).
- No module outside the fault table (htp/profiles.py) holds a fault's name as a string; the emulator's #26123
  fault and `kazeia check` ask the same predicate, which spares F16 and F32 weights on both sides."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from kazeia.backends.htp import profiles as P
from kazeia.cli.main import main
from kazeia.errors import KazeiaError

SRC = Path(__file__).resolve().parent.parent / "src" / "kazeia"


@pytest.fixture
def third_profile(monkeypatch):
    caps = dataclasses.replace(P.GENERATIONS["2026-10"], op_fusion=False, lazy_l2=False)
    prof = dataclasses.replace(P.PROFILES["2026-10"], name="test-oct", description="October, no fusion, no lazy L2",
                               caps=caps)
    monkeypatch.setitem(P.PROFILES, "test-oct", prof)
    return prof


@pytest.fixture(scope="module")
def seed_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("third") / "q.gguf"
    assert main(["make-model", "--preset", "qwen3-4b", "--layers", "2", "--vocab", "1024", "--type", "q4_0",
                 "-o", str(path)]) == 0
    return path


def test_a_third_profile_runs_the_seed_scenario_check_and_upgrade(third_profile, seed_model, tmp_path, capsys):
    from kazeia.backends.htp import HtpBackend, HtpSettings
    from kazeia.debug.check import check_model

    backend = HtpBackend(HtpSettings(profile="test-oct"))
    assert backend.host.fuser is None and backend.dsp.l2 is None      # the two capabilities turned off
    assert HtpBackend(HtpSettings(profile="2026-10")).dsp.l2 is not None
    assert main(["run", "-m", str(seed_model), "-dev", "HTP0", "--htp-profile", "test-oct", "--n-prompt", "38",
                 "-n", "2", "--temp", "0"]) == 0
    report = check_model(str(seed_model), profiles=("test-oct", "2026-10"), archs=(79,))
    assert report.result("test-oct", 79).verdict == report.result("2026-10", 79).verdict  # plans: host-solved
    capsys.readouterr()
    assert main(["upgrade", "-m", str(seed_model), "--n-prompt", "38", "--from", "2026-05", "--to", "test-oct",
                 "-o", str(tmp_path / "up")]) in (0, 1)
    out = capsys.readouterr().out
    assert "test-oct" in out


def test_an_unknown_generation_is_refused_in_one_line():
    with pytest.raises(KazeiaError, match=r"unknown ggml-hexagon code generation '2027-01' \(modelled: 2026-05, "):
        P.capabilities("2027-01")
    with pytest.raises(KazeiaError, match="2027-01"):
        dataclasses.replace(P.PROFILES["2026-10"], name="next", generation="2027-01", caps=None)


def test_no_module_outside_the_fault_table_names_a_fault():
    names = set(P.FAULTS)
    bad = []
    for path in SRC.rglob("*.py"):
        if path == SRC / "backends" / "htp" / "profiles.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                bad.append(f"{path.relative_to(SRC)}:{node.lineno} {node.value!r}")
    assert not bad, bad


@pytest.mark.parametrize("qtype,fires", [("q4_0", True), ("q4_k", True), ("f16", False), ("f32", False)])
def test_the_26123_fault_is_one_predicate(qtype, fires):
    f = P.V73_HMX_QUANT_INF
    assert f.fires(73, "hmx", qtype) is fires
    assert not f.fires(79, "hmx", qtype) and not f.fires(73, "hvx", qtype)
    assert f.exists_in("2026-10") and not f.exists_in("2026-05")
