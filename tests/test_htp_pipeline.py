"""The HMX matmul's 4-stage pipeline order and what it leaves in VTCM; host-side death attribution."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kazeia.backends.htp.hmx import pipeline


def test_program_order_for_three_chunks():
    assert pipeline.describe(3) == ("A0 act B0 A1 C0 B1 A2 waitC0 C1 D0 B2 waitC1 C2 D1 waitC2 D2")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16])
def test_each_chunk_goes_through_every_stage_once_in_dependency_order(n):
    ev = pipeline.schedule(n)
    pos = {e: i for i, e in enumerate(ev)}
    for i in range(n):
        assert pos[("A", i)] < pos[("B", i)] < pos[("C", i)] < pos[("waitC", i)] < pos[("D", i)]
        if i + 2 < n:  # the single qweight buffer: A(i+2) only after B(i+1) consumed A(i+1)
            assert pos[("B", i + 1)] < pos[("A", i + 2)]
            # wt[i%2] is rewritten by B(i+2) only after C(i) (its reader) finished
            assert pos[("waitC", i)] < pos[("B", i + 2)]
    assert len(ev) == 5 * n + 1


@pytest.mark.parametrize("n", [1, 2, 5, 6])
def test_final_contents_are_the_last_chunks(n):
    held = pipeline.final_contents(n)
    assert held["qweight"] == n - 1
    assert held[f"wt{(n - 1) % 2}"] == n - 1 and held[f"out{(n - 1) % 2}"] == n - 1
    if n > 1:
        assert held[f"wt{(n - 2) % 2}"] == n - 2


@pytest.mark.slow
def test_cli_names_last_enqueued_and_the_faulting_op_with_sync(q4b2):
    r = subprocess.run([sys.executable, "-m", "kazeia", "run", "-m", q4b2, "-dev", "HTP0", "--htp-profile", "2026-05",
                        "--n-prompt", "38", "-n", "1", "--sync"], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "last op enqueued when the error was read: l_out-0" in r.stderr
    assert "faulting op: ffn_out-0" in r.stderr
    r = subprocess.run([sys.executable, "-m", "kazeia", "run", "-m", q4b2, "-dev", "HTP0", "--htp-profile", "2026-05",
                        "--n-prompt", "38", "-n", "1"], capture_output=True, text=True, timeout=600)
    assert "rerun with --sync" in r.stderr and "faulting op" not in r.stderr
