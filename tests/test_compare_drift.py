"""compare tells an accumulated drift from a fault at one op (issue 37 row 9): the tiny Qwen3.5 under robust ends
with logits past the whole-model bound while every op is within its threshold on its own inputs (isolated) and
the output's inputs had already drifted (cumulative): no "first op out of tolerance", the run's logits are still
wrong numbers (exit 1), and the line says it is a drift."""

from __future__ import annotations

import pytest

from cli_utils import kazeia_clean, tiny_model
from kazeia.debug.compare import compare
from kazeia.engine.session import RunSpec

pytestmark = pytest.mark.slow  # runs of the emulator (make test runs them; the quick loop does not)


@pytest.fixture(scope="module")
def tiny_qwen35(tmp_path_factory) -> str:
    return tiny_model(str(tmp_path_factory.mktemp("qwen35") / "tiny_qwen35.gguf"), "qwen35")


def test_drift_is_not_blamed_on_the_output(tiny_qwen35):
    spec = RunSpec(model=tiny_qwen35, prompt="The capital of France is", device="HTP0", htp_profile="robust")
    r = compare(spec, "both")
    assert r.first_failure is None and not r.ok and r.drift == ["cumulative"], (r.drift, r.logits_nmse)
    out = next(x for x in r.rows["cumulative"] if x.name == "result_output")
    assert out.status == "DRIFT" and "accumulated drift" in out.reason and out.input_nmse > 1e-3
    cli = kazeia_clean("compare", "-m", tiny_qwen35, "-p", "The capital of France is", "-dev", "HTP0",
                       "--htp-profile", "robust")
    assert cli.returncode == 1 and "an accumulated drift, not a fault at one op" in cli.stdout
    assert "first op out of tolerance" not in cli.stdout
    # labelled: May's HVX MUL_MAT below M = 32 (2026-10 puts those on HMX and ends within the bound)
    assert "upstream numerics, modelled: the largest error on REF's inputs is MUL_MAT on HTP0/hvx" in cli.stdout


def test_a_visible_error_within_the_bound_is_labelled_too(tmp_path):
    """Issue 37's other drift: 2026-10 on the tiny LFM2 picks another greedy token than the CPU at its third. The
    logits end within the bound (NMSE ~7e-4 after 12 single-token batches, each HVX MUL_MAT ~1e-4 on REF's
    inputs: its own int8 activations, as upstream's), and compare says where the error comes from."""
    lfm2 = tiny_model(str(tmp_path / "tiny_lfm2.gguf"), "lfm2")
    cli = kazeia_clean("compare", "-m", lfm2, "--n-prompt", "12", "-ub", "1", "-dev", "HTP0", "--htp-profile",
                       "2026-10", "--mode", "both")
    assert cli.returncode == 0, cli.stdout[-2000:]
    line = next(ln for ln in cli.stdout.splitlines() if ln.startswith("the logits' NMSE"))
    assert "is within the bound; it comes from upstream numerics, modelled" in line
    assert "MUL_MAT on HTP0/hvx" in line and "op_matmul_hvx" in line
