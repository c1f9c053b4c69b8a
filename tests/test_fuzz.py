"""The fuzz run of issues 20 and 36 (tests/fuzz/run.py): every input class, 3,264 generated cases. No case may end
in a traceback, the last-resort line, a hang past 60 s, more than 2 GB of RSS (a refusal: 512 MB), a refusal of
more than one line or exit 0 on an input marked bad. The harness's own judgement is tested first, so that a fuzz
run cannot pass by mis-reading its cases."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fuzz"))

from harness import Case, classify  # noqa: E402

FUZZ = os.path.join(os.path.dirname(__file__), "fuzz", "run.py")


@pytest.mark.parametrize("code, stderr, outcome", [
    (0, "", "ok"),
    (2, "error: -m x: no such file\n", "refused"),
    (2, "warning: not UTF-8\nerror: no\n", "refused"),
    (2, "error: no\nmore text\n", "multi-line"),
    (1, "Traceback (most recent call last):\n  File x\nValueError: x\n", "traceback"),
    (0, "Exception ignored in: <stdout>\nBrokenPipeError\n", "traceback"),
    (70, "kazeia: internal error: ValueError: x (rerun with -v for the traceback)\n", "last-resort"),
    (None, "", "hang"),
    (1, "kazeia investigation ...\n", "finding"),
])
def test_the_harness_judges_outcomes(code, stderr, outcome):
    assert classify(Case("x", "x", []), code, 1.0, 1 << 20, stderr) == outcome


def test_the_harness_flags_exit_0_on_bad_input_and_too_much_memory():
    assert classify(Case("x", "x", [], bad=True), 0, 1.0, 1 << 20, "") == "silent"
    assert classify(Case("x", "x", []), 0, 1.0, 3 << 30, "") == "memory"
    assert classify(Case("x", "x", []), 2, 1.0, 600 << 20, "kazeia run: error: no") == "memory"  # a heavy refusal
    assert classify(Case("x", "x", []), 2, 1.0, 100 << 20, "kazeia run: error: no") == "refused"


@pytest.mark.slow
def test_fuzz_every_input_class(tmp_path):
    report = tmp_path / "failures.json"
    r = subprocess.run([sys.executable, FUZZ, "--report", str(report), "--show-failures"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    total = next(ln for ln in r.stdout.splitlines() if ln.startswith("| all |"))
    assert int(total.split("|")[2]) >= 3000, total
