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

pytestmark = pytest.mark.slow  # files of 190-400 MB and eight runs of each model

PROFILES = ("2026-05", "robust", "2026-10")


# preset -> overrides for its 2-layer cut: LFM2-1.2B's first two layers are both short convs (attention starts at
# layer 2), so its cut takes one of each
PRESETS = {"qwen2.5-1.5b": {}, "gemma3-1b": {}, "phi-4-mini": {}, "lfm2-1.2b": {"layer_pattern": (True, False)}}


@pytest.fixture(scope="module", params=list(PRESETS))
def model(request, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("real") / f"{request.param}-l2.gguf")
    write_model(preset(request.param, n_layer=2, **PRESETS[request.param]), path)
    return path


@pytest.mark.parametrize("n", [38, 200])
def test_runs_on_htp0_as_check_predicts(model, n):
    report = check_model(model, profiles=PROFILES, archs=(79,), ubatches=(512,))
    for profile in PROFILES:
        predicted = report.result(profile, 79).verdict
        r = run(RunSpec(model=model, n_prompt=n, device="HTP0", htp_profile=profile, n_predict=2))
        assert r.ok == (predicted not in ("death", "dropped", "no-session")), (profile, predicted, r.signature())


def test_compare_is_clean_under_robust(model):
    r = compare(RunSpec(model=model, n_prompt=38, device="HTP0", htp_profile="robust"), "both")
    assert r.ok, r.first_failure
