"""Smoke tests of `kazeia bench` on a tiny synthetic model: output shape only, never timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kazeia.cli import bench
from kazeia.cli.main import main
from kazeia.gguf.writer import preset, write_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("bench") / "tiny.gguf"
    write_model(preset("tiny"), path)
    return str(path)


def _table_rows(out: str) -> list[list[str]]:
    lines = [ln for ln in out.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def test_md_table(tiny, capsys):
    assert main(["bench", "-m", tiny, "-p", "8", "-n", "2", "-r", "1"]) == 0
    out = capsys.readouterr().out
    rows = _table_rows(out)
    assert rows[0] == ["model", "size", "params", "backend", "threads", "test", "t/s"]
    assert set(rows[1][0]) <= {"-", ":"}
    assert [r[5] for r in rows[2:]] == ["pp8", "tg2"]
    for r in rows[2:]:
        assert r[0].startswith("qwen3 ") and r[0].endswith("Q4_0")
        assert r[1].endswith("MiB") and r[2].endswith("M")
        assert r[3] == "CPU"
        assert int(r[4]) >= 1
        mean, sd = r[6].split(" ± ")
        assert float(mean) > 0 and float(sd) == 0.0  # one repetition: no spread
    assert "peak memory (RSS):" in out


def test_json_records(tiny, capsys):
    assert main(["bench", "-m", tiny, "-p", "4,8", "-n", "0", "-r", "2", "--json"]) == 0
    recs = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in recs] == ["pp4", "pp8"]
    for r in recs:
        assert len(r["samples_ts"]) == 2 and r["avg_ts"] > 0
        assert r["n_gen"] == 0 and r["n_prompt"] in (4, 8)
        assert r["peak_rss_bytes"] > 0


def test_csv(tiny, capsys):
    assert main(["bench", "-m", tiny, "-p", "4", "-n", "1", "-r", "1", "-o", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split(",")[:2] == ["model_filename", "model_type"]
    assert len(lines) == 3


def test_nothing_to_measure(tiny, capsys):
    assert main(["bench", "-m", tiny, "-p", "0", "-n", "0"]) != 0
    assert "nothing to measure" in capsys.readouterr().err


class _Modeled:
    """A backend-like object with the extension hook."""

    def __init__(self) -> None:
        self.t = 0.0

    def modeled_seconds(self) -> float:
        self.t += 0.5
        return self.t


def test_backend_columns():
    b = _Modeled()
    assert bench.backend_counters([b]) == {"modeled": 0.5}
    info = bench.ModelInfo("x.gguf", "llama 1M Q4_0", 2**20, 10**6)
    r = bench.BenchResult(info, "HTP0", "HTP0,CPU", 2, 512, True, "f16", "f16", bench.BenchTest("pp", 8),
                          seconds=[1.0, 2.0], extra_seconds={"modeled": [0.5, 0.5]})
    out = bench.format_md([r], 2**20)
    rows = _table_rows(out)
    assert rows[0][-1] == "modeled t/s"
    assert rows[2][-1].startswith("16.00 ± 0.00")
    assert rows[2][-2].startswith("6.00 ± ")
    rec = bench.record(r, 0)
    assert rec["modeled_avg_ts"] == 16.0


def test_depth(tiny, capsys):
    assert main(["bench", "-m", tiny, "-p", "4", "-n", "2", "-d", "0,8", "-r", "1", "-o", "jsonl"]) == 0
    recs = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [(r["test"], r["n_depth"]) for r in recs] == [("pp4", 0), ("pp4 @ d8", 8), ("tg2", 0), ("tg2 @ d8", 8)]


@pytest.mark.slow
def test_bench_cpu_script_without_peer(tiny):
    """bench/bench_cpu.py runs (and says so) without llama.cpp: CI never depends on the peer."""
    script = Path(__file__).resolve().parent.parent / "bench" / "bench_cpu.py"
    r = subprocess.run([sys.executable, str(script), "--no-peer", "-m", tiny, "-p", "8", "-n", "2", "-r", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "peer: not available" in r.stdout
    rows = [ln for ln in _table_rows(r.stdout) if ln[1] in ("pp8", "tg2")]
    assert len(rows) == 2 and all(row[3] == "-" for row in rows)
