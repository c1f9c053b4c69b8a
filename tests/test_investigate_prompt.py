"""investigate tells a prompt-independent output (GenieX #1429: the NPU's output "does not depend on the input prompt
at all", no crash, no error) from non-finite numbers (#26123's inf): the prompt step reruns another prompt of the same
length on the device and on the CPU and judges from those logits only."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia.debug.investigate import investigate
from kazeia.debug.investigate.prompt import other_prompt, relative_change
from kazeia.engine.session import RunSpec


def test_the_other_prompt_differs_and_keeps_its_length():
    assert other_prompt([5, 6, 7], 100) == [7, 6, 5]
    assert other_prompt([5, 6, 5], 100) == [6, 7, 6]  # a palindrome: each shifted
    assert other_prompt([99], 100) == [0]
    a = np.array([[0.0, 0.0], [3.0, 4.0]])
    assert relative_change(a, a) == 0.0 and relative_change(np.zeros((1, 2)), np.zeros((1, 2))) == 0.0
    assert relative_change(a, np.array([[3.0, 0.0]])) == pytest.approx(16 / 25)


def _hyp(inv, name):
    return next((h for h in inv.hypotheses if h.name == name), None)


@pytest.mark.slow
def test_names_a_prompt_independent_output_not_a_non_finite_one(q4b2, tmp_path):
    spec = RunSpec(model=q4b2, n_prompt=38, device="HTP0", faults=["v73-input-stale"],
                   env={"GGML_HEXAGON_ARCH": "v73"})
    inv = investigate(spec, str(tmp_path / "a"), progress=lambda _: None)
    assert inv.fault_found and "The output is prompt-independent" in inv.verdict, inv.verdict
    assert _hyp(inv, "prompt-independent output").status == "confirmed"
    assert "not finite" not in inv.verdict
    assert "no gate by op kind was validated here; the CPU (-dev CPU) computes it" in inv.verdict
    # the same arch without the fault: the output follows the prompt (and nothing is wrong)
    clean = investigate(spec.with_(faults=[]), str(tmp_path / "b"), progress=lambda _: None)
    assert not clean.fault_found and "prompt-independent" not in clean.verdict


@pytest.mark.slow
def test_non_finite_logits_are_not_called_prompt_independent(q4b2, tmp_path):
    spec = RunSpec(model=q4b2, n_prompt=38, device="HTP0", faults=["v73-hmx-quant-inf"],
                   env={"GGML_HEXAGON_ARCH": "v73"})
    inv = investigate(spec, str(tmp_path), progress=lambda _: None)
    assert "prompt-independent" not in inv.verdict and _hyp(inv, "prompt-independent output") is None
    step = next(s for s in inv.steps if s.name == "does the output follow the prompt")
    assert step.summary.startswith("skipped"), step.summary
