"""kazeia crashlog FILE: a pasted cDSP crash record read, its Bad VA placed on the VTCM plans the HTP makes for the
model and prompt length given; and a device death in `kazeia run` prints the record after the host's line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kazeia.backends.htp.host.crash_record import crash_record


def _kazeia(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kazeia.cli.main", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow  # its 2-layer 4B-shaped model takes ~7 s to write (CI runs it; the bisect tests share it)
def test_crashlog_places_bad_va_on_the_plans(q4b2, tmp_path):
    log = tmp_path / "logcat.txt"
    log.write_text("\n".join(f"12-01 10:00:00.000  2780  2902 V adsprpc : {ln}"
                             for ln in crash_record("bus-error", {"vtcm_offset": 0x400000})))
    r = _kazeia("crashlog", str(log), "-m", q4b2, "--n-prompt", "40")
    assert r.returncode == 1, r.stderr
    assert "fault PC: core_dot_chunk_fp16+0x" in r.stdout and "error code: 0x2601" in r.stdout
    assert "Qcur-0" in r.stdout and "crosses a 4 MiB bank boundary" in r.stdout
    alone = _kazeia("crashlog", str(log))
    assert alone.returncode == 0 and "Bad VA: 0xD8400000" in alone.stdout


def test_crashlog_without_a_record_is_one_line(tmp_path):
    log = tmp_path / "x.txt"
    log.write_text("ggml-hex: dspqueue_read failed: 0x0000002e\n")
    r = _kazeia("crashlog", str(log))
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "no cDSP crash record" in r.stderr


@pytest.mark.slow
def test_run_death_prints_the_record(q4b2):
    r = _kazeia("run", "-m", q4b2, "--n-prompt", "38", "-dev", "HTP0", "--htp-profile", "2026-05", "-n", "0")
    err = r.stderr.splitlines()
    i = next(k for k, ln in enumerate(err) if "dspqueue_read failed" in ln)
    assert err[i + 1].startswith("kazeia: last op enqueued")
    rest = "\n".join(err[i + 2:])
    assert "Process on cDSP0 CRASHED" in rest and "Error code :    0x2601" in rest
    assert "op_matmul+0x" in rest  # the stack overflow of the re-entering op_matmul
