"""native.py's object-code cache key covers every kazeia module an emitter is built from, not only its own file:
an edit of simd_hvx.py (emitted into simd_htp's library) or irkit.py must compile the library again."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kazeia.backends import native


def _names(module: str) -> list[str]:
    return sorted(s.split(b"\0", 1)[0].decode() for s in native._emitter_sources(module))


def test_the_key_reads_the_emitter_parts_it_imports():
    assert _names("kazeia.backends.htp.simd_htp") == ["kazeia.backends.htp",  # (the package: its __init__)
        "kazeia.backends.htp.simd_blocks", "kazeia.backends.htp.simd_htp", "kazeia.backends.htp.simd_hvx",
        "kazeia.backends.irkit"]
    assert _names("kazeia.backends.simd_pool") == ["kazeia.backends.irkit", "kazeia.backends.simd_pool"]


def test_the_sources_are_the_files_bytes():
    srcs = dict(s.split(b"\0", 1) for s in native._emitter_sources("kazeia.backends.htp.simd_htp"))
    part = Path(importlib.util.find_spec("kazeia.backends.htp.simd_hvx").origin)
    assert srcs[b"kazeia.backends.htp.simd_hvx"] == part.read_bytes()
