"""docs/field-reports.md cannot rot: every `<!-- check -->` block runs, as in docs/seed.md (tests/test_seed_doc.py's
rules: consecutive lines in order, `...` for anything between, `{*}` inside a line, `(exit status N)`)."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = pytest.mark.slow  # some twelve runs of the 2-layer 4B-shaped model

HERE = os.path.dirname(__file__)
DOC = os.path.join(HERE, "..", "docs", "field-reports.md")


def _seed_doc():
    spec = importlib.util.spec_from_file_location("seed_doc_rules", os.path.join(HERE, "test_seed_doc.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_checked_command_shows_what_the_document_says(q4b2_real, tmp_path):
    rules = _seed_doc()
    os.symlink(q4b2_real, tmp_path / "q4b2.gguf")
    blocks = rules.checked_blocks(open(DOC, encoding="utf-8").read())
    assert len(blocks) >= 4
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_HEXAGON_", "KAZEIA_HTP_"))}
    failures = rules.run_blocks(blocks, tmp_path, env)
    assert not failures, "\n".join(failures)
