"""check predicts what the emulator does to the ops that are not a weight's MUL_MAT (issue 37 deliverable 2, row 5):
May's HVX SSM_CONV (#24470) gives wrong numbers exactly from the prompt length its kernel runs at (32 tokens), which
compare finds op by op on the emulator; a profile whose flash attention leaves the src1 shortcut stale is "depends",
never "runs"; robust and 2026-10 have neither."""

from __future__ import annotations

import pytest

from cli_utils import tiny_model
from kazeia.debug.check import check_model
from kazeia.debug.compare import compare
from kazeia.engine.session import RunSpec

pytestmark = pytest.mark.slow  # runs of the emulator (make test runs them; the quick loop does not)


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory) -> str:
    return tiny_model(str(tmp_path_factory.mktemp("lfm2") / "tiny_lfm2.gguf"), "lfm2")


def test_ssm_conv_prediction_is_the_emulators(lfm2):
    report = check_model(lfm2, profiles=("2026-05", "robust"), archs=(79,))
    may = report.result("2026-05", 79)
    conv = next(o for o in may.ops if o.op == "SSM_CONV")
    assert conv.outcome == "wrong" and conv.m_lo == 32 and may.verdict == "wrong"
    assert any(o.op == "FLASH_ATTN_EXT" and o.outcome == "depends" for o in may.ops)
    assert not report.result("robust", 79).ops and report.result("robust", 79).verdict != "wrong"
    for n, predicted in ((conv.m_lo - 1, False), (conv.m_lo, True), (conv.m_lo + 9, True)):
        spec = RunSpec(model=lfm2, n_prompt=n, device="HTP0", htp_profile="2026-05")
        rows = [r for r in compare(spec, "isolated").rows["isolated"] if r.op == "SSM_CONV"]
        assert rows and any(r.failed for r in rows) == predicted, (n, [(r.name, r.reason) for r in rows])


def test_fused_qkv_attention_is_seen_too(tmp_path):
    """Phi-3's fused attn_qkv projection: its flash attention is May's stale-shortcut risk as well."""
    path = tiny_model(str(tmp_path / "phi3.gguf"), "phi3")
    may = check_model(path, profiles=("2026-05",), archs=(79,)).result("2026-05", 79)
    assert any(o.op == "FLASH_ATTN_EXT" and o.outcome == "depends" for o in may.ops) and may.verdict == "depends"
