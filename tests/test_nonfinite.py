"""Non-finite logits stop generation with exit status 4 and a one-line error naming the first op whose output
went non-finite and the command that stops at it (--stop-on-nonfinite), under greedy and sampling alike.

Two sources of NaN: a NaN planted in one weight (the expected op is the first node that reads that weight,
found by a plain recording hook), and the HTP model's DMA fault under the 2026-05 profile (the expected op is
the one `--stop-on-nonfinite`'s trace names). Before, sampling crashed with numpy's "probabilities contain
NaN" traceback and greedy stopped silently with "stop: eos".
"""

from __future__ import annotations

import shlex

import pytest

from conftest import POISONED_WEIGHT as POISONED
from kazeia.backends.base import Hook
from kazeia.backends.cpu import CpuBackend
from kazeia.cli.main import main
from kazeia.engine.context import Context, Model
from kazeia.engine.scheduler import Scheduler
from kazeia.gguf.writer import preset, write_model


class _Readers(Hook):
    """Names of the nodes that read a given weight, in execution order."""

    def __init__(self, weight: str) -> None:
        self.weight, self.names = weight, []

    def on_start(self, node, info) -> None:
        if any(s is not None and s.weight_name == self.weight for s in node.src):
            self.names.append(node.name)


def _first_reader(path: str, weight: str) -> str:
    m = Model.load(path)
    sched = Scheduler([CpuBackend()])
    rec = _Readers(weight)
    sched.add_hook(rec)
    Context(m, sched, n_ctx=32).decode([1, 2, 3])
    return rec.names[0]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("sampling", [["--temp", "0"], ["--temp", "0.8", "--seed", "7"]], ids=["greedy", "sampling"])
def test_a_nan_weight_stops_generation_naming_the_op(nan_weight_model, capsys, sampling):
    expected = _first_reader(nan_weight_model, POISONED)
    rc, out, err = _run(capsys, "run", "-m", nan_weight_model, "-p", "hello", "-n", "8", *sampling)
    assert rc == 4, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: non-finite logits after the prompt of ")
    assert f"the first op whose output went non-finite: {expected} (MUL_MAT, node #" in lines[0]
    assert "on CPU: 1 NaN of " in lines[0]
    # the suggested command stops at that op and names it (the trace's own judgement)
    cmd = shlex.split(lines[0].split("; see it with: ", 1)[1])
    assert cmd[:2] == ["kazeia", "run"] and cmd[-1] == "--stop-on-nonfinite"
    rc2, _, err2 = _run(capsys, *cmd[1:])
    assert rc2 == 1 and f"first non-finite output: {expected} (MUL_MAT" in err2, err2


def test_without_nan_generation_is_unchanged(tiny_qwen3, capsys):
    rc, out, err = _run(capsys, "run", "-m", tiny_qwen3, "-p", "hello", "-n", "4", "--temp", "0")
    assert rc == 0 and "generation: 4 tokens" in err, err


@pytest.fixture(scope="module")
def tiny_q35_q4(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("q35") / "q35.gguf")
    write_model(preset("tiny", arch="qwen35", wtype="q4_0"), path)
    return path


@pytest.mark.parametrize("sampling", [["--temp", "0"], ["--temp", "0.8", "--seed", "7"]], ids=["greedy", "sampling"])
def test_htp_nan_stops_generation_naming_the_op(tiny_q35_q4, capsys, sampling):
    """The DMA fault under 2026-05 (a stale completion: a weight row read before it arrived) makes NaN on HTP0."""
    dev = ["-m", tiny_q35_q4, "-dev", "HTP0", "--htp-profile", "2026-05", "--fault", "dma-unbalanced",
           "--n-prompt", "40", "-n", "4"]
    rc, _, err = _run(capsys, "run", *dev, *sampling, "--stop-on-nonfinite")
    assert rc == 1, err
    trace_says = err.split("first non-finite output: ", 1)[1].split(" (", 1)[0]
    rc, out, err = _run(capsys, "run", *dev, *sampling)
    assert rc == 4, err
    line = err.strip().splitlines()[-1]
    assert f"the first op whose output went non-finite: {trace_says} (" in line and "on HTP0" in line, line
    assert line.endswith("--stop-on-nonfinite") and out.endswith("\n")


def test_a_decode_rerun_names_the_same_op_as_a_watched_one(tiny_qwen3_narrow_heads, tmp_path):
    """On CPU the tracker watches only a decode call whose logits came out non-finite, by running it again from
    the same position (engine/generate.py _Steps). A NaN in one row of the (untied) embedding table appears
    only when that token is fed: the rerun names the same op as a tracker watching from the start, and leaves
    the context where one decode call would (n_past one further, the cells before it untouched)."""
    import shutil

    import numpy as np

    from kazeia.engine.generate import _Steps
    from kazeia.engine.nonfinite import NonFiniteLogitsError, NonFiniteTracker
    from kazeia.gguf.reader import load_gguf

    path = str(tmp_path / "nan_row.gguf")
    shutil.copy(tiny_qwen3_narrow_heads, path)
    info = load_gguf(path).tensors["token_embd.weight"]
    bad = 77
    with open(path, "r+b") as f:
        f.seek(info.offset + 4 * (256 * bad + 5))
        f.write(np.float32(np.nan).tobytes())
    model = Model.load(path)

    watched = Context(model, Scheduler([CpuBackend()]), n_ctx=32)
    tracker = NonFiniteTracker()
    watched.scheduler.add_hook(tracker)
    watched.decode([1, 2, 3])
    tracker.reset()
    assert not np.isfinite(watched.decode([bad])).all()
    assert tracker.first is not None

    ctx = Context(model, Scheduler([CpuBackend()]), n_ctx=32)
    steps = _Steps(ctx)
    assert steps.rerun and not ctx.scheduler.hooks  # nothing watches a finite decode
    steps.decode([1, 2, 3], "after the prompt")
    before = ctx.kv.buffer.data.copy()
    with pytest.raises(NonFiniteLogitsError) as e:
        steps.decode([bad], "at generated token 2")
    assert e.value.first == tracker.first
    assert e.value.first.op == "GET_ROWS" and "at generated token 2" in str(e.value)
    assert ctx.n_past == 4 and not ctx.scheduler.hooks
    cells = ctx.kv.layers[0].k  # the prompt's cells are as the prompt left them
    row_bytes = cells.nb[1]
    assert ctx.kv.buffer.data[cells.offset:cells.offset + 3 * row_bytes].tobytes() == \
        before[cells.offset:cells.offset + 3 * row_bytes].tobytes()
