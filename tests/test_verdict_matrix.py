"""The verdict matrix (issue 37 deliverable 4): 660 generated scenarios (6 archs x 3 versions x M in {1, 4, 5, 16,
32, 33, 38, 64, 65, 128} x VTCM {2, 4, 8} MiB, and four faults on the arch each names), the emulator's outcome
(debug/outcome.classify against REF: what `upgrade` says of each side) against `kazeia check`'s prediction from the
header: every row agrees, or check says "depends" with the reason the header cannot know."""

from __future__ import annotations

import pytest

from kazeia.debug.verdict_matrix import render, verdict_matrix
from kazeia.gguf.writer import preset, write_model

pytestmark = pytest.mark.slow  # 660 runs of a 2-layer Qwen3-4B-shaped model (~2 minutes)


def test_check_agrees_with_the_emulator_on_every_scenario(tmp_path):
    path = str(tmp_path / "q4b2v.gguf")
    write_model(preset("qwen3-4b", n_layer=2, n_vocab=1024, wtype="q4_0"), path)
    rows = verdict_matrix(path)
    assert len(rows) >= 600
    bad = [r for r in rows if not r.agrees]
    assert not bad, render(rows)
    kinds = {r.truth for r in rows}
    assert {"completes", "device death", "error"} <= kinds, kinds  # the matrix meets more than one outcome
    # exact where the header decides (the rest: the 2026-05 stale shortcut, public reports, injected faults)
    assert sum(r.predicted == r.truth for r in rows) >= 0.5 * len(rows)
