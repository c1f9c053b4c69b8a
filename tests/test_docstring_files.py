"""Docstrings that name files name files that exist (issue 35): every `something.py` a docstring of src/kazeia
(module, class or function) mentions resolves to a file of this repository, or is one of the upstream files kazeia
cites by name (UPSTREAM). A file moved or renamed without its readers' docstrings fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "kazeia"
# files of other projects that docstrings cite by name (llama.cpp's converter, gguf-py's vocab)
UPSTREAM = {"convert_hf_to_gguf.py", "vocab.py", "conversion/base.py"}
NAME = re.compile(r"(?<![\w.])([\w./-]*\w\.py)\b")


def _docstrings(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc


def _exists(name: str, here: Path, basenames: set[str]) -> bool:
    """A path relative to the repository, to src/kazeia, to the module's folder or one above it; or, for a bare
    name, any file of that name in the repository."""
    if "/" not in name:
        return name in basenames or name in UPSTREAM
    bases = (ROOT, SRC, here, *here.parents)
    return any((b / name).is_file() for b in bases) or name in UPSTREAM


def test_every_file_a_docstring_names_exists():
    basenames = {p.name for d in ("src", "tests", "bench") for p in (ROOT / d).rglob("*.py")}
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        for line, doc in _docstrings(ast.parse(path.read_text(), str(path))):
            for m in NAME.finditer(doc):
                if not _exists(m.group(1), path.parent, basenames):
                    missing.append(f"{path.relative_to(ROOT)}:{line}: {m.group(1)}")
    assert not missing, "docstrings name files that do not exist:\n" + "\n".join(missing)


def test_the_check_sees_a_missing_file(tmp_path):
    """The resolver itself: a bare name and a path that exist pass, ones that do not fail."""
    basenames = {"device.py"}
    assert _exists("device.py", SRC, basenames)
    assert _exists("backends/htp/device.py", SRC, basenames)
    assert not _exists("hmx_matmul.py", SRC, basenames)
    assert not _exists("backends/htp/hmx_matmul.py", SRC, basenames)
