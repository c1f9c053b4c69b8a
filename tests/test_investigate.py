"""kazeia investigate on the Qwen3-4B-shaped model: the 2026-05 crash explained, a second overflow scenario the
test chooses (another VTCM size, so another op), robust reported healthy; and the step tables' mechanics.

The expected ops come from an independent transcription of hmx_matmul_q_f32's layout (oracle_utils), applied to
the shapes of the model's own graph; the report must name exactly those."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from kazeia.backends.base import Hook
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.matmul.dispatch import matmul_node, plan_for_node
from kazeia.debug.investigate import DEATH, HEALTHY, Context, Findings, Investigation, StepDef, investigate
from kazeia.debug.investigate.table import run_table
from kazeia.debug.investigate.verdicts import mechanism
from kazeia.debug.investigate.vtcm import why_it_fails
from kazeia.debug.runner import run
from kazeia.engine.session import RunSpec
from oracle_utils import hmx_q_layout_bytes

M = 38
MAX_WEIGHT_ROWS = 16 * 1024  # ggml-hexagon.cpp supports_op: larger weights (the lm_head) stay on the CPU


class Calls:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, msg: str) -> None:
        self.lines.append(msg)


class Matmuls(Hook):
    """(node, weight family, K, N, M) of every weight MUL_MAT, in graph order (the last layer's FFN sees only the
    output row: M = 1, as in llama.cpp's graph)."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, str, int, int, int]] = []

    def on_start(self, node, info):
        w = node.src[0] if node.op == "MUL_MAT" else None
        if w is not None and w.weight_name and w.ne[1] <= MAX_WEIGHT_ROWS:
            fam = w.weight_name.split(".", 2)[-1].removesuffix(".weight")
            self.ops.append((node.name, fam, w.ne[0], w.ne[1], node.src[1].ne[1]))


@pytest.fixture(scope="module")
def matmuls(q4b2):
    hook = Matmuls()
    run(RunSpec(model=q4b2, n_prompt=M, device="CPU"), hooks=(hook,))
    return hook.ops


def overflowing(ops, vtcm: int) -> dict[str, int]:
    """family -> bytes over VTCM of its HMX layout at its M, by the independent transcription."""
    return {fam: used - vtcm for _, fam, k, n, m in ops if (used := hmx_q_layout_bytes(m, k, n, "q4_0", vtcm)) > vtcm}


def investigated(model: str, out: str, vtcm: int | None = None, profile: str = "2026-05"):
    calls = Calls()
    inv = investigate(RunSpec(model=model, n_prompt=M, device="HTP0", htp_profile=profile, vtcm=vtcm), out,
                      progress=calls)
    return inv, calls


@pytest.fixture(scope="module")
def crash_report(q4b2, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("inv"))
    inv, calls = investigated(q4b2, out)
    return inv, out, calls


@pytest.fixture(scope="module")
def other_vtcm(matmuls) -> int:
    """The largest VTCM size below 8 MiB (in 2 KiB steps) at which some weight matmul of the model overflows at
    M tokens and ffn_down (the seed's op) does not: chosen by the arithmetic, never written down."""
    vt = 8 * 1024 * 1024
    while vt > 4 * 1024 * 1024:
        vt -= 2048
        over = overflowing(matmuls, vt)
        if over and "ffn_down" not in over:
            return vt
    pytest.fail("no such VTCM size")


@pytest.fixture(scope="module")
def other_report(q4b2, other_vtcm, tmp_path_factory):
    inv, _ = investigated(q4b2, str(tmp_path_factory.mktemp("inv2")), vtcm=other_vtcm)
    return inv


def _hyp(inv, name):
    return next(h for h in inv.hypotheses if h.name == name)


@pytest.mark.slow
def test_names_ffn_down_with_its_shape_not_attn_output(crash_report, matmuls):
    inv, _, _ = crash_report
    assert set(overflowing(matmuls, 8 * 1024 * 1024)) == {"ffn_down"}  # the seed: only ffn_down overflows
    assert inv.fault_found
    assert inv.facts["faulting op (one-op batches)"] == "ffn_out-0"
    assert "K=9728" in inv.facts["faulting op"] and "N=2560" in inv.facts["faulting op"]
    assert inv.verdict.startswith("The faulting op is ffn_out-0")
    assert "attn_out" not in inv.facts["faulting op (one-op batches)"]


@pytest.mark.slow
def test_mechanism_range_and_gate(crash_report, matmuls):
    inv, _, _ = crash_report
    over = overflowing(matmuls, 8 * 1024 * 1024)["ffn_down"]
    assert inv.mechanism.startswith(f"HMX VTCM plan overflow by {over} B → re-entry without HVX fallback → DSP death")
    assert "0x2e" in inv.mechanism  # the code of the death this run showed
    assert inv.facts["failing prompt lengths (M)"].startswith("33..64")
    assert inv.gate and inv.gate["validated"], inv.gate
    assert "ffn_down (ffn_out-0)" in inv.gate["description"]


@pytest.mark.slow
def test_the_death_trials_and_m_runs_say_which_layers_they_ran(crash_report):
    """The routing trials and the M confirmation run the graph through the faulting op's layer only (a prefix):
    the report says so wherever it quotes them."""
    inv, _, _ = crash_report
    ran = "layers 0..0 of 2 (through l_out-0)"
    route = next(s for s in inv.steps if s.name == "route op classes away")
    assert f"HMX off (GGML_HEXAGON_USE_HMX=0): completes {ran}, [l_out-0] NMSE" in route.summary
    assert f"FLASH_ATTN_EXT on the CPU: still dies (in ffn_out-0; ran {ran})" in route.summary
    assert f"boundaries confirmed by runs of {ran}" in inv.facts["failing prompt lengths (M)"]
    assert any(f"real runs ({ran}) confirm the boundaries" in e for e in _hyp(inv, "shape alone").evidence_for)


@pytest.mark.slow
def test_rules_out_fp16_overflow_and_nonfinite_with_measurements(crash_report):
    inv, _, _ = crash_report
    fp16 = _hyp(inv, "fp16 overflow")
    nonfinite = _hyp(inv, "non-finite inputs")
    assert fp16.status == "ruled out" and any("amax=" in e for e in fp16.evidence_against)
    assert nonfinite.status == "ruled out" and any("0 NaN" in e for e in nonfinite.evidence_against)
    assert _hyp(inv, "VTCM budget").status == "confirmed"
    assert _hyp(inv, "context / device state").status == "ruled out"


@pytest.mark.slow
def test_says_an_enqueue_time_dump_is_not_the_consumed_data(crash_report):
    inv, _, _ = crash_report
    ct = _hyp(inv, "capture timing")
    assert ct.status == "explains a symptom"
    assert "enqueue time would not be the data the op consumed" in inv.verdict


@pytest.mark.slow
def test_steps_and_progress_come_from_the_step_table(crash_report):
    inv, _, calls = crash_report
    titles = ["reproduce", *(s.title for s in DEATH.steps)]
    assert [s.name for s in inv.steps] == titles == calls.lines
    assert not [n for n in inv.notes if "does not declare" in n], inv.notes
    assert all(not s.summary.startswith("step failed") for s in inv.steps), [s.summary for s in inv.steps]


@pytest.mark.slow
def test_writes_markdown_html_and_json(crash_report):
    inv, out, _ = crash_report
    md = open(os.path.join(out, "report.md")).read()
    html = open(os.path.join(out, "report.html")).read()
    assert "ffn_out-0" in md and "<svg" in html and "data:image/png;base64," in html
    data = json.loads(open(os.path.join(out, "investigation.json")).read())
    assert data["mechanism"] == inv.mechanism
    assert all(f"| {s.title} |" in md for s in DEATH.steps)


@pytest.mark.slow
def test_another_vtcm_size_names_the_ops_that_overflow_there(other_report, other_vtcm, matmuls):
    inv = other_report
    over = overflowing(matmuls, other_vtcm)
    first = next(name for name, fam, k, n, m in matmuls if fam in over and hmx_q_layout_bytes(m, k, n, "q4_0",
                 other_vtcm) > other_vtcm)  # graph order: the first to run dies
    assert inv.facts["faulting op (one-op batches)"] == first
    assert inv.verdict.startswith(f"The faulting op is {first}")
    fam = next(f for n, f, *_ in matmuls if n == first)
    assert inv.mechanism.startswith(f"HMX VTCM plan overflow by {over[fam]} B")
    gate = inv.gate["description"]
    assert inv.gate["validated"], inv.gate
    for _, f, *_ in matmuls:
        assert (f"{f} (" in gate) == (f in over), (f, gate)  # exactly the overflowing ones, ffn_down not
    assert _hyp(inv, "VTCM budget").status == "confirmed"


@pytest.mark.slow
def test_robust_reports_no_fault(q4b2, tmp_path):
    inv, calls = investigated(q4b2, str(tmp_path), profile="robust")
    assert not inv.fault_found
    assert inv.verdict.startswith("No fault")
    assert [s.name for s in inv.steps] == ["reproduce", *(s.title for s in HEALTHY.steps)] == calls.lines


# ---------------------------------------------------------------------------------------------------------
# the mechanics, without runs


def _context(**findings) -> Context:
    cx = Context(RunSpec(model="m.gguf", n_prompt=M, device="HTP0"), "/nonexistent",
                 Investigation("t", "c", "", False), HtpSettings())
    cx.findings = replace(Findings(), **findings)
    return cx


def test_a_step_without_its_needs_is_skipped_and_undeclared_findings_are_noted():
    ran = []

    def writes_faulting(cx):
        ran.append("w")
        cx.findings.faulting = "x"
        return "wrote", ""

    table = (StepDef("needs a plan", lambda cx: ran.append("p") or ("", ""), needs=("plan",)),
             StepDef("undeclared", writes_faulting, gives=("death",)),
             StepDef("raises", lambda cx: 1 / 0))
    cx = _context()
    calls = Calls()
    run_table(cx, table, calls)
    assert ran == ["w"] and calls.lines == [s.title for s in table]
    assert cx.inv.steps[0].summary == "skipped: no plan established"
    assert any("undeclared" in n and "faulting" in n for n in cx.inv.notes)
    assert cx.inv.steps[2].summary.startswith("step failed: ZeroDivisionError")
    with pytest.raises(ValueError, match="unknown findings"):
        StepDef("typo", lambda cx: ("", ""), gives=("falting",))


def test_a_failure_without_an_overflow_is_not_called_an_overflow():
    """The chunk search finding nothing (a VTCM far too small) is described as such: no "overflow by 0 B"."""
    settings = HtpSettings(profile="2026-05", vtcm_bytes=64 * 1024)
    p = plan_for_node(matmul_node(M, 9728, 2560), settings)
    assert p.status == "no_chunking" and p.overflow == 0
    text = why_it_fails(p)
    assert "no (mc, nc) chunking" in text and "overflow" not in text and "2048" not in text
    cx = _context(plan=p, death={"kind": "stack-overflow", "code": 0x2E})
    assert mechanism(cx).startswith(f"HMX chunk search finds no chunking for {64 * 1024} B")
    over = plan_for_node(matmul_node(M, 9728, 2560), replace(settings, vtcm_bytes=8 * 1024 * 1024))
    assert over.overflow > 0 and f"over by {over.overflow} B" in why_it_fails(over)


def test_a_hang_is_named_as_a_hang_not_a_death():
    """The reentry-tail-call build: the same chain ends in a DSP that never answers, not in a code the host reads."""
    over = plan_for_node(matmul_node(M, 9728, 2560), HtpSettings(profile="2026-05", vtcm_bytes=8 * 1024 * 1024))
    text = mechanism(_context(plan=over, death={"kind": "hang", "code": 0}))
    assert text.startswith(f"HMX VTCM plan overflow by {over.overflow} B")
    assert "compiled as a jump" in text and "hang" in text and "0x" not in text and "DSP death" not in text
    assert "kazeia's hypothesis" in text


def test_a_gate_past_the_node_list_limit_is_a_class_rule(tmp_path):
    """Issue 37, row 3: tiny Gemma 3 under 2026-05 (NaN logits; its MUL_MATs on HVX are the first bad op class) had
    no gate: the list of its 43 MUL_MAT nodes was a --cpu-nodes regex past kazeia's own 256-character limit, and the
    step failed. The gate is now a class rule (the mechanism's own, --cpu-ops FLASH_ATTN_EXT: see the next test; else
    --cpu-ops MUL_MAT), within kazeia's limits and validated by a rerun."""
    from kazeia.gguf.writer import preset, write_model

    path = str(tmp_path / "g3.gguf")
    write_model(preset("tiny", arch="gemma3", wtype="q4_0"), path)
    spec = RunSpec(model=path, prompt="The capital of France is", device="HTP0", htp_profile="2026-05")
    inv = investigate(spec, str(tmp_path / "out"), progress=Calls())
    flags = inv.gate.get("flags", "")
    assert inv.gate.get("validated") and "--cpu-ops " in flags and "--cpu-nodes" not in flags, inv.gate
    assert not any("step failed" in s.summary for s in inv.steps), [s.summary for s in inv.steps]


@pytest.mark.slow
def test_stale_shortcut_is_named_and_consequences_are_not_causes(tmp_path):
    """Issue 37 row 4: the tiny Gemma 3 under 2026-05 goes wrong at the MUL_MAT right after an HMX flash attention
    of its batch (May leaves the src1 shortcut stale there). investigate names that mechanism from the run's own
    evidence (one op per batch makes it correct; the flash attention precedes the op), labels the fp16 overflow and
    the NaNs that follow as consequences, and validates a gate that moves only FLASH_ATTN_EXT."""
    from cli_utils import kazeia_clean
    from kazeia.debug.investigate import investigate
    from kazeia.engine.session import RunSpec

    model = str(tmp_path / "g3.gguf")
    assert kazeia_clean("make-model", "--preset", "tiny", "--arch", "gemma3", "-o", model, "--quiet").returncode == 0
    spec = RunSpec(model=model, prompt="The capital of France is", device="HTP0", htp_profile="2026-05")
    inv = investigate(spec, str(tmp_path / "inv"), progress=lambda s: None)
    hyp = {h.name: h for h in inv.hypotheses}
    assert hyp["stale src1 shortcut"].status == "cause", hyp["stale src1 shortcut"]
    assert hyp["fp16 overflow"].status == "consequence" and hyp["non-finite inputs"].status == "consequence"
    assert inv.mechanism.startswith("stale src1 shortcut in ")
    assert inv.gate["validated"] and "--cpu-ops FLASH_ATTN_EXT" in inv.gate["flags"]
