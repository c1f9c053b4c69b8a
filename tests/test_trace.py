"""The op trace: one record per executed op, NaN-aware statistics measured at start/completion, JSONL, stop
on the first non-finite output, and that an HTP op's statistics describe what the DSP actually consumed."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from kazeia.backends.base import Hook
from kazeia.debug.runner import run
from kazeia.debug.stats import values_stats
from kazeia.debug.trace import NonFiniteStop, TraceHook
from kazeia.engine.session import RunSpec
from kazeia.graph.tensor import array


def test_stats_count_nan_and_inf_that_amax_would_hide():
    a = np.array([1.0, -3.0, np.nan, np.inf, -np.inf, 0.0, 2.5], dtype=np.float32)
    s = values_stats(a)
    assert (s.nan, s.pinf, s.ninf, s.zeros) == (1, 1, 1, 1)
    assert s.amax == 3.0 and s.min == -3.0 and s.max == 2.5  # over finite values
    assert s.nonfinite == 3
    assert values_stats(np.full(4, np.nan)).amax == 0.0  # no finite value: amax 0, never NaN


@pytest.mark.parametrize("device", ["CPU", "HTP0"])
def test_trace_one_line_per_executed_op(tiny_qwen3_q4, device):
    stream, jsonl = io.StringIO(), io.StringIO()
    hook = TraceHook(stream, jsonl)
    res = run(RunSpec(model=tiny_qwen3_q4, n_prompt=40, device=device), hooks=(hook,))
    assert res.ok
    computed = [p for p in res.placements]
    lines = [ln for ln in stream.getvalue().splitlines() if ln.startswith("KZOP")]
    assert len(lines) == len(computed) == len(hook.records)
    recs = [json.loads(x) for x in jsonl.getvalue().splitlines()]
    assert [r["name"] for r in recs] == [p["node"] for p in computed]
    by = {r["name"]: r for r in recs}
    if device == "HTP0":
        assert by["ffn_out-0"]["path"] == "hmx" and by["ffn_out-0"]["batch"] is not None
        assert by["embd"]["backend"] == "CPU"
    assert by["ffn_out-0"]["dst_stats"]["amax"] > 0


def test_input_nan_is_reported_and_stops_the_run(tiny_qwen3_q4):
    """Poison one activation with a NaN: the trace must show it (amax alone would not) and stop there."""

    class Poison(Hook):
        def on_complete(self, node, info):
            if node.name == "ffn_swiglu-0":
                array(node)[0, 0, 0, 0] = np.nan

    stream = io.StringIO()
    hook = TraceHook(stream, None, stop_on_nonfinite=True)
    with pytest.raises(NonFiniteStop) as e:
        run(RunSpec(model=tiny_qwen3_q4, n_prompt=8, device="CPU"), hooks=(hook, Poison()))
    assert e.value.node == "ffn_out-0"  # the first op whose output holds NaN (the mask's -inf cast is not one)
    rec = hook.records[-1]
    assert rec["name"] == "ffn_out-0"
    assert rec["src_stats"][1]["nan"] == 1 and rec["src_stats"][1]["amax"] > 0


def test_htp_trace_sees_what_the_dsp_consumed(tiny_qwen3_q4):
    """At enqueue time the input of an HTP op produced in the same batch is not written yet; the trace's input
    statistics (taken when the DSP starts the op) match the producer's output instead."""
    got = {}

    class Enq(Hook):
        def on_enqueue(self, node, info):
            if node.name == "ffn_out-0":
                got["enqueue"] = values_stats(np.array(array(node.src[1])))

    hook = TraceHook(None, None)
    run(RunSpec(model=tiny_qwen3_q4, n_prompt=40, device="HTP0"), hooks=(Enq(), hook))
    by = {r["name"]: r for r in hook.records}
    consumed = by["ffn_out-0"]["src_stats"][1]
    produced = by["ffn_swiglu-0"]["dst_stats"]
    assert consumed["amax"] == produced["amax"] and consumed["mean"] == produced["mean"]
    assert got["enqueue"].amax != consumed["amax"]
