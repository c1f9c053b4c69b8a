"""State versus value by experiment, and race localisation, on the tiny Q4_0 Qwen3 run on the HTP model at a
prompt length and VTCM size no other test uses (37 tokens, 6 MiB; 7 tokens for the HVX path).

- hmx-bias-stale: the replayed op follows the HMX output scale register the preceding op left (read through
  HtpBackend.snapshot()): 0 after reset or an HVX matmul, 1 after a clean HMX matmul, the flash attention's
  1/sqrt(head size) after an HMX flash attention (the head size is the preceding case's): a state fault;
- scatter-unretired: the output changes with the VTCM bytes and with timing alone: a race reading VTCM; the
  stale K tiles found reproduce each run's output bit for bit from the VTCM bytes the area held before the op;
- dma-unbalanced: wrong exactly after an HVX matmul that left a DMA descriptor outstanding: the DMA queue;
- no fault: every trial equals the clean output.
"""

from __future__ import annotations

import numpy as np
import pytest

from kazeia.debug.dump import DumpHook, load_dumps
from kazeia.debug.race import localise_race
from kazeia.debug.replay import htp_settings_for
from kazeia.debug.runner import run
from kazeia.debug.state_experiment import preceding_cases, state_experiment
from kazeia.engine.session import RunSpec

VTCM = 6 << 20


def _spec(model, faults, n=37):
    return RunSpec(model=model, n_prompt=n, device="HTP0", htp_profile="robust", faults=faults, vtcm=VTCM)


def _dump(spec, name, tmp_path):
    d = str(tmp_path / name)
    run(spec, hooks=(DumpHook(f"^{name}$", d, at="complete"),))
    return load_dumps(d)[0]


def test_stale_hmx_scale_is_a_state_fault_on_the_scale(tiny_qwen3_q4, tmp_path):
    dump = _dump(_spec(tiny_qwen3_q4, ["hmx-bias-stale"]), "Qcur-0", tmp_path)
    ex = state_experiment(dump, htp_settings_for(dump))
    assert (ex.mechanism_class, ex.state) == ("state", "HMX output scale"), ex.lines()
    by = {t.label: t for t in ex.trials}
    hs = next(c for label, c in preceding_cases(dump) if "flash" in label)["hs"]
    fa = by["after an HMX flash attention"]
    assert abs(fa.registers["hmx_scale"] - hs ** -0.5) < 1e-6
    assert abs(fa.scale - hs ** -0.5) < 1e-3 * hs ** -0.5
    assert by["from reset"].scale == 0.0 and by["after an HVX matmul"].scale == 0.0
    assert by["after a clean HMX matmul"].scale == 1.0
    assert "HMX output scale" in ex.verdict()


def test_unretired_scatter_is_a_race_on_vtcm_bytes_localised_to_tiles(tiny_qwen3_q4, tmp_path):
    spec = _spec(tiny_qwen3_q4, ["scatter-unretired"])
    dump = _dump(spec, "Qcur-0", tmp_path)
    ex = state_experiment(dump, htp_settings_for(dump))
    assert (ex.mechanism_class, ex.state) == ("race", "VTCM bytes"), ex.lines()
    rep = localise_race(spec, "Qcur-0", n_runs=2, dump=dump)
    assert rep.stage.startswith("weight operand")
    assert rep.area.startswith("wt0 ")
    for v in rep.runs:
        reg = v.signature.get("region")
        assert reg.where["col_tiles"] == [0] and set(reg.where["cols"]) <= set(range(32))
        assert v.stale_tiles and v.exact, rep.lines()


def test_unbalanced_dma_is_a_state_fault_on_the_dma_queue(tiny_qwen3_q4, tmp_path):
    dump = _dump(_spec(tiny_qwen3_q4, ["dma-unbalanced"], n=7), "Vcur-0", tmp_path)
    ex = state_experiment(dump, htp_settings_for(dump))
    assert (ex.mechanism_class, ex.state) == ("state", "DMA queue"), ex.lines()
    hvx = next(t for t in ex.trials if t.label == "after an HVX matmul")
    assert hvx.registers["dma_stale_pop"] and hvx.signature.classes


def test_no_fault_equals_clean_everywhere(tiny_qwen3_q4, tmp_path):
    dump = _dump(_spec(tiny_qwen3_q4, []), "Qcur-0", tmp_path)
    ex = state_experiment(dump, htp_settings_for(dump))
    assert ex.mechanism_class == "none", ex.lines()
    assert all(t.signature is not None and not t.signature.classes for t in ex.trials)
    assert all(np.array_equal(t.output, ex.trials[0].output) for t in ex.trials)


@pytest.mark.parametrize("n", [40])
def test_race_report_names_no_race_when_runs_agree(tiny_qwen3_q4, n):
    rep = localise_race(_spec(tiny_qwen3_q4, [], n=n), "Qcur-0")
    assert not rep.differ and rep.runs and not rep.runs[0].signature.classes


def test_compare_names_the_signature_of_the_first_bad_op(tiny_qwen3_q4):
    from kazeia.debug.compare import compare, summary_lines

    rep = compare(_spec(tiny_qwen3_q4, ["hmx-bias-stale"]), mode="isolated")
    first = rep.first_failure
    assert first.name == "Qcur-0" and first.extra["signature"].startswith("all outputs are exactly 0")
    assert any(line.startswith("isolated: error signature of Qcur-0: ") for line in summary_lines(rep))
