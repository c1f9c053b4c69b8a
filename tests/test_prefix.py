"""Prefix runs (debug/prefix.py, `kazeia run --stop-after NODE`): the graph's own nodes through one node, at the
same addresses, so the stop node's output is bitwise the full run's; a death in those layers is the full run's
death; what the investigation's prefix runs need (the layer end of an op) comes from the graph order."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia.backends.base import Hook
from kazeia.debug.runner import run
from kazeia.engine.prefix import layer_end, layers_text
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError
from kazeia.graph.tensor import array


class LayerOutputs(Hook):
    def __init__(self) -> None:
        self.out: dict[str, np.ndarray] = {}

    def on_complete(self, node, info):
        if node.name.startswith("l_out-"):
            self.out[node.name] = np.array(array(node))


@pytest.mark.parametrize("device,profile", [("CPU", None), ("HTP0", "robust")])
def test_the_stop_node_output_is_bitwise_the_full_runs(tiny_qwen3_q4, device, profile):
    spec = RunSpec(model=tiny_qwen3_q4, n_prompt=38, device=device, htp_profile=profile)
    hook = LayerOutputs()
    full = run(spec, hooks=(hook,))
    prefix = run(spec.with_(stop_after="l_out-0"))
    assert full.ok and prefix.ok
    assert prefix.logits is None  # the output head did not run
    assert prefix.stop_output.shape == hook.out["l_out-0"].shape
    assert np.array_equal(prefix.stop_output, hook.out["l_out-0"])
    assert not np.array_equal(prefix.stop_output, hook.out["l_out-1"])  # the second layer did not run into it


@pytest.mark.parametrize("vtcm", [65536, 262144])
def test_a_death_in_the_prefix_is_the_full_runs_death(tiny_qwen3_q4, vtcm):
    """Two VTCM sizes at which different ops' HMX plans overflow (ffn_down, then the q projection)."""
    spec = RunSpec(model=tiny_qwen3_q4, n_prompt=38, device="HTP0", htp_profile="2026-05", vtcm=vtcm)
    full, prefix = run(spec), run(spec.with_(stop_after="l_out-0"))
    assert full.death is not None and prefix.death is not None
    assert prefix.death["faulting"] == full.death["faulting"]
    assert prefix.death["message"] == full.death["message"]
    assert prefix.death["last_enqueued"] == "l_out-0"  # the host read the error where the prefix ended


def test_a_prefix_needs_a_node_of_the_graph_and_no_generation(tiny_qwen3_q4):
    spec = RunSpec(model=tiny_qwen3_q4, n_prompt=8)
    with pytest.raises(KazeiaError, match="no node of that name"):
        run(spec.with_(stop_after="l_out-9"))
    with pytest.raises(KazeiaError, match="-n 0"):
        run(spec.with_(stop_after="l_out-0", n_predict=2))
    assert "--stop-after l_out-0" in spec.with_(stop_after="l_out-0").command()


def test_layer_end_of_an_op_from_the_graph_order(tiny_qwen3_q4):
    order = [p["node"] for p in run(RunSpec(model=tiny_qwen3_q4, n_prompt=8)).placements]
    assert layer_end(order, "ffn_out-0") == "l_out-0"
    assert layer_end(order, "attn_norm-1") is None  # in the last layer: its prefix is the whole run
    assert layer_end(order, "no-such-op") is None
    assert layers_text("l_out-0", order) == "layers 0..0 of 2 (through l_out-0)"


def test_kazeia_run_stop_after(tiny_qwen3_q4, capsys):
    from kazeia.cli.main import main

    assert main(["run", "-m", tiny_qwen3_q4, "--n-prompt", "8", "--stop-after", "l_out-0", "-n", "0"]) == 0
    assert "stopped after l_out-0 (8 prompt tokens): amax=" in capsys.readouterr().err
    assert main(["run", "-m", tiny_qwen3_q4, "--n-prompt", "8", "--stop-after", "l_out-0", "-n", "4"]) == 2
    assert "give -n 0" in capsys.readouterr().err


def _oracle_outcome(model: str, isolate: bool, **kw):
    from kazeia.debug.bisect import OracleJudge

    spec = RunSpec(model=model, n_prompt=1, device="HTP0", htp_profile="2026-05", stop_after="l_out-0", **kw)
    return OracleJudge(isolate=isolate)(spec)


def test_the_oracle_judges_a_prefix_on_its_stop_node(tiny_qwen3_q4):
    """With 64 KiB of VTCM the 2026-05 HVX path gets M=1 wrong already in layer 0 (the whole run's logits are wrong
    too); with the default VTCM layer 0 is right. The judge compares l_out-0 with a CPU prefix of the same prompt."""
    bad = _oracle_outcome(tiny_qwen3_q4, isolate=False, vtcm=65536)
    assert bad.outcome == "fail" and bad.detail.startswith("[l_out-0] NMSE")
    good = _oracle_outcome(tiny_qwen3_q4, isolate=False)
    assert good.outcome == "pass" and "[l_out-0] NMSE" in good.detail


@pytest.mark.slow
def test_a_prefix_in_a_child_process_brings_its_stop_output_back(tiny_qwen3_q4):
    bad = _oracle_outcome(tiny_qwen3_q4, isolate=True, vtcm=65536)
    assert bad.outcome == "fail" and bad.detail.startswith("[l_out-0] NMSE")
