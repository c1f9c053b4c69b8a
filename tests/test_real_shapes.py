"""Real-shape presets of the architectures kazeia runs, 2 layers each (issue 23's acceptance): on HTP0 under
2026-05, robust and 2026-10 at 38 and 200 tokens, each run completes as `kazeia check` predicts from the header,
and `kazeia compare` under robust finds no op out of tolerance."""

from __future__ import annotations

import pytest

from kazeia.debug.check import check_model
from kazeia.debug.compare import compare
from kazeia.debug.runner import run
from kazeia.engine.session import RunSpec
from kazeia.gguf.writer import preset, write_model

pytestmark = pytest.mark.slow  # a 190 MB file and eight runs of a 1536-wide model

PROFILES = ("2026-05", "robust", "2026-10")


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("q25") / "qwen2.5-1.5b-l2.gguf")
    write_model(preset("qwen2.5-1.5b", n_layer=2), path)
    return path


@pytest.mark.parametrize("n", [38, 200])
def test_qwen25_runs_on_htp0_as_check_predicts(qwen25, n):
    report = check_model(qwen25, profiles=PROFILES, archs=(79,), ubatches=(512,))
    for profile in PROFILES:
        predicted = report.result(profile, 79).verdict
        r = run(RunSpec(model=qwen25, n_prompt=n, device="HTP0", htp_profile=profile, n_predict=2))
        assert r.ok == (predicted not in ("death", "dropped", "no-session")), (profile, predicted, r.signature())


def test_qwen25_compare_is_clean_under_robust(qwen25):
    r = compare(RunSpec(model=qwen25, n_prompt=38, device="HTP0", htp_profile="robust"), "both")
    assert r.ok, r.first_failure
