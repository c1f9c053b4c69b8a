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
