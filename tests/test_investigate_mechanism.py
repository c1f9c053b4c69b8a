"""`kazeia investigate` names the mechanism of each HTP fault injection, on shapes and VTCM sizes no other test
uses, with a gate validated by a rerun; the class (state / race / address) and the state or address come from
the run's own experiments, never from the injection's name (the investigation is not told which fault runs)."""

from __future__ import annotations

import os

import pytest

from kazeia.debug.investigate import investigate
from kazeia.engine.policy import Policy
from kazeia.engine.session import RunSpec


def _investigate(model, tmp_path, fault, n, vtcm):
    spec = RunSpec(model=model, n_prompt=n, device="HTP0", htp_profile="robust", vtcm=vtcm, faults=[fault])
    return investigate(spec, str(tmp_path), progress=lambda msg: None)


def _gate_ok(inv, action="hvx"):
    assert inv.gate["validated"], inv.gate
    pol = Policy.load(inv.gate["policy"])
    assert pol.rules and all(r.action == action for r in pol.rules)
    assert "--gates" in inv.gate["flags"]


@pytest.mark.slow
def test_stale_hmx_scale_is_named_a_state_fault(tiny_qwen3_q4, tmp_path):
    inv = _investigate(tiny_qwen3_q4, tmp_path, "hmx-bias-stale", 37, 6 << 20)
    assert inv.facts["mechanism class"] == "state (HMX output scale)"
    assert "state fault in Qcur-0" in inv.verdict and "HMX output scale" in inv.verdict
    assert "1/sqrt(" in inv.verdict  # the flash attention's scale, measured in the experiment
    _gate_ok(inv)


@pytest.mark.slow
def test_unretired_scatter_is_named_a_race_on_vtcm(tiny_qwen3_q4, tmp_path):
    inv = _investigate(tiny_qwen3_q4, tmp_path, "scatter-unretired", 37, 6 << 20)
    assert inv.facts["mechanism class"].startswith("race (VTCM bytes of wt0 ")
    assert "column tile 0" in inv.verdict and "bit for bit" in inv.verdict
    assert "weight operand" in inv.verdict
    _gate_ok(inv)


@pytest.mark.slow
def test_bank_crossing_is_named_an_address_fault(q4b2, tmp_path):
    inv = _investigate(q4b2, tmp_path, "vtcm-bank-crossing", 45, 10 << 20)
    assert inv.facts["mechanism class"].startswith("address (the ")
    assert "address fault in" in inv.verdict and "Bad VA 0x" in inv.verdict
    assert "crosses it" in inv.verdict and "(error code 0x2601)" in inv.verdict
    _gate_ok(inv)
    assert os.path.exists(os.path.join(tmp_path, "report.md"))


@pytest.mark.slow
def test_a_defect_of_the_older_code_is_checked_against_the_later_code(tmp_path):
    """No injection: 2026-05's HVX SSM_CONV strides its staged conv weights by the unpadded per-thread row count
    (#24470 fixed it), so from 32 tokens conv_output_raw-0 is wrong. The investigation replays that op's dump under
    2026-10's code, finds it right there, and says so as a defect of the older code."""
    from kazeia.gguf.writer import preset, write_model

    model = str(tmp_path / "tiny35.gguf")
    write_model(preset("tiny", arch="qwen35", wtype="q4_0"), model)
    spec = RunSpec(model=model, n_prompt=40, device="HTP0", htp_profile="2026-05")
    inv = investigate(spec, str(tmp_path / "inv"), progress=lambda msg: None)
    assert "is conv_output_raw-0" in inv.verdict
    assert "the 2026-10 code computes conv_output_raw-0 right" in inv.verdict
    assert "defect of this version's code" in inv.verdict
    step = next(s for s in inv.steps if s.name == "the same op under the later code")
    assert step.summary.startswith("under 2026-10's code the op is right")
