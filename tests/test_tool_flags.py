"""The tools check what they are given before any work, and take what a user pastes from their own printed
scenarios (issue 37, "validate before working"): upgrade refuses another device and an output folder that cannot
be made, in one line and at once; a fault that one version's code does not have runs on the other side only, and
the report says so; llama-cli's sampling flags are accepted and ignored by the greedy tools; a tool leaves no
writer lock behind; `check` writes each reason whole."""

from __future__ import annotations

import json
import os
import time

import pytest

from cli_utils import kazeia_clean
from kazeia.debug.upgrade import faults_by_side
from kazeia.errors import KazeiaError


def _one_line_error(r, exit_code: int = 2) -> str:
    assert r.returncode == exit_code, (r.returncode, r.stderr[-500:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_upgrade_refuses_another_device(tiny_gemma3, tmp_path):
    t0 = time.monotonic()
    r = kazeia_clean("upgrade", "-m", tiny_gemma3, "-p", "hi", "-dev", "CPU", "-o", str(tmp_path / "u"), "--quiet")
    line = _one_line_error(r)
    assert "-dev CPU does not apply" in line and "HTP0" in line
    assert not (tmp_path / "u").exists() and time.monotonic() - t0 < 60


def test_an_output_folder_that_cannot_be_made_is_refused_before_the_work(tiny_gemma3, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cases = [(["upgrade"], str(blocker / "sub"), "Not a directory"),  # a file in the way
             (["investigate", "-dev", "HTP0"], "/proc/kazeia-no/such", "cannot create")]  # a pseudo file system
    for tool, path, why in cases:
        r = kazeia_clean(*tool, "-m", tiny_gemma3, "-p", "hi", "-o", path)
        line = _one_line_error(r)
        assert why in line and "-o/--output" in line, line
    ok = tmp_path / "a" / "b" / "c"  # creatable: the probe leaves nothing behind
    r = kazeia_clean("upgrade", "--help")
    assert r.returncode == 0 and "--htp-profile" not in r.stdout  # (refused by upgrade: not listed)
    from kazeia.cli.validate_paths import output_dir

    assert output_dir(str(ok)) == str(ok) and not (tmp_path / "a").exists()


def test_a_fault_of_one_version_runs_on_that_side_only():
    sides, notes = faults_by_side(["v73-hmx-quant-inf"], "2026-05", "2026-10")
    assert sides == {"2026-05": [], "2026-10": ["v73-hmx-quant-inf"]}
    assert len(notes) == 1 and "2026-05 run is without it" in notes[0]
    sides, notes = faults_by_side(["hmx-bias-stale"], "2026-05", "2026-10")  # both versions have it
    assert sides == {"2026-05": ["hmx-bias-stale"], "2026-10": ["hmx-bias-stale"]} and not notes
    with pytest.raises(KazeiaError, match="neither"):
        faults_by_side(["dma-unbalanced"], "2026-10", "2026-10")
    with pytest.raises(KazeiaError, match="unknown HTP fault"):
        faults_by_side(["no-such-fault"], "2026-05", "2026-10")


@pytest.mark.slow
def test_upgrade_reports_the_one_sided_fault(tiny_qwen3_q4, tmp_path):
    out = tmp_path / "u"
    r = kazeia_clean("upgrade", "-m", tiny_qwen3_q4, "--n-prompt", "5", "--htp-arch", "v73", "--fault",
                     "v73-hmx-quant-inf", "-o", str(out), "--quiet")
    assert r.returncode in (0, 1, 4), r.stderr[-800:]
    rep = json.loads((out / "upgrade.json").read_text())
    assert any("v73-hmx-quant-inf" in n and "2026-05 run is without it" in n for n in rep["notes"])
    assert "Note: fault v73-hmx-quant-inf" in (out / "upgrade.md").read_text()
    page = (out / "upgrade.html").read_text()  # real tables, not the markdown inside <pre>
    assert "<pre>| " not in page and page.count("<table>") >= 2 and "<th>" in page
    assert "<td>outcome</td>" in page and "<td>host&#x27;s line</td>" in page


@pytest.mark.slow
@pytest.mark.parametrize("tool", [["upgrade", "--quiet"], ["compare", "-dev", "HTP0"], ["bench", "-n", "0"]])
def test_sampling_flags_are_accepted_and_ignored(tool, tiny_gemma3, tmp_path):
    extra = ["-p", "8"] if tool[0] == "bench" else ["-p", "hi"]
    out = ["-o", str(tmp_path / "u")] if tool[0] == "upgrade" else []
    r = kazeia_clean(tool[0], "-m", tiny_gemma3, *extra, *tool[1:], *out, "--temp", "0.7", "--top-k", "5",
                     "--top-p", "0.9", "--min-p", "0.1", "-s", "3")
    assert r.returncode == 0, r.stderr[-800:]
    bad = kazeia_clean(tool[0], "-m", tiny_gemma3, *extra, *tool[1:], *out, "--top-p", "2")
    assert "--top-p" in _one_line_error(bad)  # checked as kazeia run checks it


def test_a_tool_leaves_no_writer_lock(tiny_gemma3, tmp_path):
    out = tmp_path / "inv"
    r = kazeia_clean("investigate", "-m", tiny_gemma3, "-p", "hi", "-dev", "HTP0", "-o", str(out))
    assert r.returncode in (0, 1), r.stderr[-800:]
    assert (out / "report.md").exists() and not (out / ".kazeia-writer.lock").exists(), os.listdir(out)


def test_check_writes_each_reason_whole(tiny_qwen3_q4):
    r = kazeia_clean("check", "-m", tiny_qwen3_q4)
    assert r.returncode in (0, 1), r.stderr[-500:]
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| ") and ln.count("|") >= 7]
    assert rows and all(ln.rstrip().endswith("|") for ln in rows)
    assert any(len(ln) > 200 for ln in rows) or all("(t |" not in ln for ln in rows)


@pytest.mark.parametrize("tool", ["run", "investigate", "upgrade", "trace", "gate", "crashlog", "compare",
                                  "determinism", "check", "bench"])
def test_help_says_what_the_tool_does_and_its_exit_statuses(tool):
    r = kazeia_clean(tool, "--help")
    assert r.returncode == 0
    head = r.stdout.split("\n\n")[1]  # the paragraph after usage
    assert head.startswith(f"kazeia {tool}"), head[:200]
    assert "exit status" in r.stdout.lower(), tool


def test_check_html_puts_every_bar_on_one_m_axis(tiny_qwen3_q4, tmp_path):
    """check --html: a bar per weight class whose segments sit at their M on a log2 axis shared by every bar of the
    configuration (issue 37 row 6: table cells let one row's `M 33..64` land under another row's M = 512)."""
    import re

    out = tmp_path / "c.html"
    r = kazeia_clean("check", "-m", tiny_qwen3_q4, "--html", str(out))
    assert r.returncode in (0, 1), r.stderr[-500:]
    page = out.read_text()
    assert "<td title" not in page and "class=axis" in page
    segs = re.findall(r"title='[^']*: M (\d+)(?:\.\.(\d+))?: [^']*' style='left:([\d.]+)%;width:([\d.]+)%", page)
    assert segs
    for lo, hi, left, width in segs:
        left, width = float(left), float(width)
        assert 0 <= left <= 100 and 0 < width <= 100.001 and left + width <= 100.001
        assert (left == 0.0) == (int(lo) == 1)  # M = 1 starts every bar
        if hi and int(hi) > 2 * int(lo):  # log2 axis: a range spanning more than a doubling is wider than 1/span
            assert width > 0
    assert re.search(r"class=tick style='left:0\.000%'>1<", page)


@pytest.mark.slow
def test_make_model_header_only_is_what_check_reads(tmp_path):
    """make-model --header-only writes the header, metadata and tensor table without data: `check` gives the same
    report as on the whole file; `run` refuses it in one line."""
    full, head = str(tmp_path / "full.gguf"), str(tmp_path / "head.gguf")
    common = ["--preset", "tiny", "--arch", "qwen3", "--type", "q4_k_m", "--layers", "3"]
    assert kazeia_clean("make-model", *common, "-o", full, "--quiet").returncode == 0
    r = kazeia_clean("make-model", *common, "-o", head, "--header-only")
    assert r.returncode == 0, r.stderr[-500:]
    assert os.path.getsize(head) < os.path.getsize(full) / 2
    a, b = (kazeia_clean("check", "-m", p, "--n-prompt", "20", "--json") for p in (full, head))
    assert a.returncode == b.returncode and a.returncode in (0, 1), b.stderr[-500:]
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    ja.pop("model"), jb.pop("model")
    assert ja == jb
    bad = kazeia_clean("run", "-m", head, "-p", "hi", "-n", "1")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
