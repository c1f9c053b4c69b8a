"""Every tool that takes the model flags maps them as `kazeia run` does (cli/common.py spec_from_args): -ngl, -ctk
and -ctv reach the context each tool builds, and -ngl 0 really keeps every op off the device."""

from __future__ import annotations

import pytest

from kazeia.cli.main import main
from kazeia.engine import session
from kazeia.graph.tensor import GGMLType

FLAGS = ["-dev", "HTP0", "-ngl", "0", "-ctk", "f32", "-ctv", "f32", "-c", "256"]
TOOLS = {
    "run": ["run", "--n-prompt", "6", "-n", "1", "--temp", "0"],
    "trace": ["trace", "--n-prompt", "6", "--quiet"],
    "compare": ["compare", "--n-prompt", "6", "--mode", "cumulative"],
    "bisect ops": ["bisect", "ops", "--n-prompt", "6", "--no-isolate", "-q"],
    "bisect m": ["bisect", "m", "--fail", "6", "--pass", "1", "--no-isolate", "-q"],
    "determinism": ["determinism", "--n-prompt", "6", "-N", "2", "-q"],
    "bench": ["bench", "-p", "4", "-n", "1", "-r", "1"],
}


@pytest.fixture
def contexts(monkeypatch):
    """Every context the tools build, as they built it."""
    built = []

    class Spy(session.Context):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            built.append(self)
    monkeypatch.setattr(session, "Context", Spy)
    return built


@pytest.mark.parametrize("tool", list(TOOLS))
def test_tool_honours_ngl_and_kv_types(tool, tiny_qwen3, contexts, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # (trace writes its JSONL here)
    argv = TOOLS[tool] + ["-m", tiny_qwen3] + FLAGS
    if tool == "bisect m":
        argv += ["--n-prompt", "6"]
    status = main(argv)
    out = capsys.readouterr()
    assert status in (0, 1), out.err
    assert contexts, f"{tool} built no context"
    ran = 0
    for ctx in contexts:
        kv = [c for c in ctx.kv.layers if c is not None]
        assert {c.k.type for c in kv} == {GGMLType.F32} and {c.v.type for c in kv} == {GGMLType.F32}, tool
        if ctx.scheduler.backends[0].name == "HTP0":
            assert ctx.scheduler.router.n_gpu_layers == 0, tool
            placed = ctx.scheduler.placements
            assert {p.backend for p in placed} <= {"CPU"}, f"{tool}: -ngl 0 left ops on the device"
            ran += bool(placed)
    assert ran, f"{tool} ran no graph on the HTP0 device list"


def test_investigate_honours_ngl_and_kv_types(tiny_qwen3, contexts, tmp_path, capsys):
    status = main(["investigate", "--n-prompt", "6", "-m", tiny_qwen3, "-o", str(tmp_path / "inv"), "--quiet",
                   *FLAGS])
    assert status in (0, 1), capsys.readouterr().err
    device = [c for c in contexts if c.scheduler.backends[0].name == "HTP0"]
    assert device and all(c.scheduler.router.n_gpu_layers == 0 for c in device)
    assert all({c.k.type for c in ctx.kv.layers if c is not None} == {GGMLType.F32} for ctx in contexts)


def test_spec_argv_round_trip(tiny_qwen3):
    """The reproduction command a report prints carries the same flags back."""
    from kazeia.cli.common import spec_from_args
    from kazeia.cli.main import build_parser

    argv = ["run", "-m", tiny_qwen3, "--n-prompt", "6", *FLAGS, "--sync", "--cpu-node-range", "3:5", "--gate",
            "vtcm-plan", "-ub", "16", "--recover"]
    spec = spec_from_args(build_parser("run").parse_args(argv))
    again = spec_from_args(build_parser("run").parse_args(spec.argv()[spec.argv().index("run"):]))
    assert again.with_(env={}) == spec.with_(env={}) and spec.sync
    assert (spec.n_gpu_layers, spec.type_k, spec.type_v, spec.cpu_node_range, spec.gates, spec.ubatch) == \
        (0, "f32", "f32", "3:5", ["vtcm-plan"], 16)
