"""kazeia investigate on the Qwen3-4B-shaped model: the 2026-05 crash explained, robust reported healthy."""

from __future__ import annotations

import json
import os

import pytest

from kazeia.debug.investigate import investigate
from kazeia.debug.runner import RunSpec


@pytest.fixture(scope="module")
def crash_report(q4b1, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("inv"))
    inv = investigate(RunSpec(model=q4b1, n_prompt=38, device="HTP0", htp_profile="2026-05"), out,
                      progress=lambda msg: None)
    return inv, out


def _hyp(inv, name):
    return next(h for h in inv.hypotheses if h.name == name)


def test_names_ffn_down_with_its_shape_not_attn_output(crash_report):
    inv, _ = crash_report
    assert inv.fault_found
    assert inv.facts["faulting op (one-op batches)"] == "ffn_down-0"
    assert "K=9728" in inv.facts["faulting op"] and "N=2560" in inv.facts["faulting op"]
    assert inv.verdict.startswith("The faulting op is ffn_down-0")
    assert "attn_out" not in inv.facts["faulting op (one-op batches)"]


def test_mechanism_range_and_gate(crash_report):
    inv, _ = crash_report
    assert inv.mechanism.startswith("HMX VTCM plan overflow by 256 B → re-entry without HVX fallback → DSP death")
    assert inv.facts["failing prompt lengths (M)"].startswith("33..64")
    assert inv.gate and inv.gate["validated"], inv.gate


def test_rules_out_fp16_overflow_and_nonfinite_with_measurements(crash_report):
    inv, _ = crash_report
    fp16 = _hyp(inv, "fp16 overflow")
    nonfinite = _hyp(inv, "non-finite inputs")
    assert fp16.status == "ruled out" and any("amax=" in e for e in fp16.evidence_against)
    assert nonfinite.status == "ruled out" and any("0 NaN" in e for e in nonfinite.evidence_against)
    assert _hyp(inv, "VTCM budget").status == "confirmed"
    assert _hyp(inv, "context / device state").status == "ruled out"


def test_says_an_enqueue_time_dump_is_not_the_consumed_data(crash_report):
    inv, _ = crash_report
    ct = _hyp(inv, "capture timing")
    assert ct.status == "explains a symptom"
    assert "enqueue time would not be the data the op consumed" in inv.verdict


def test_writes_markdown_html_and_json(crash_report):
    inv, out = crash_report
    md = open(os.path.join(out, "report.md")).read()
    html = open(os.path.join(out, "report.html")).read()
    assert "ffn_down-0" in md and "<svg" in html and "data:image/png;base64," in html
    data = json.loads(open(os.path.join(out, "investigation.json")).read())
    assert data["mechanism"] == inv.mechanism


def test_robust_reports_no_fault(q4b1, tmp_path):
    inv = investigate(RunSpec(model=q4b1, n_prompt=38, device="HTP0", htp_profile="robust"), str(tmp_path),
                      progress=lambda msg: None)
    assert not inv.fault_found
    assert inv.verdict.startswith("No fault")
