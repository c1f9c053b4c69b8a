"""The object-code cache key of a kernel family (native/compile.py) covers every kazeia module its IR is built from,
not only its own file: an edit of the IR kit, of a shared idiom or of another family whose emitters it calls must
compile the family again; and a family's key does not follow what it never imports (editing the CPU GEMM does not
recompile the HTP flash attention)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kazeia.native import compile as C


def _names(module: str) -> set[str]:
    return {s.split(b"\0", 1)[0].decode() for s in C._emitter_sources(module)}


def test_the_key_reads_the_emitter_parts_it_imports():
    hmx = _names("kazeia.backends.htp.kernels.hmx")
    assert {"kazeia.backends.htp.kernels.hmx", "kazeia.backends.htp.kernels.rounding", "kazeia.native.irkit",
            "kazeia.native.idioms", "kazeia.native.compile", "kazeia.gguf.quants"} <= hmx
    hvx = _names("kazeia.backends.htp.kernels.hvx")  # a family that is a folder: its parts
    assert {"kazeia.backends.htp.kernels.hvx", "kazeia.backends.htp.kernels.hvx.ir",
            "kazeia.backends.htp.kernels.hvx.portable", "kazeia.native.idioms"} <= hvx
    assert {"kazeia.native.pool_ir", "kazeia.native.compile"} <= _names("kazeia.native.pool_ir")
    assert "kazeia.backends.cpu.kernels.quantize" in _names("kazeia.backends.cpu.kernels.gemv")


def test_the_key_does_not_reach_other_families():
    fa = _names("kazeia.backends.htp.kernels.fa")
    assert not any(m.startswith("kazeia.backends.cpu") for m in fa), sorted(fa)
    gemm = _names("kazeia.backends.cpu.kernels.gemm")
    assert not any(m.startswith("kazeia.backends.htp") for m in gemm), sorted(gemm)


def test_the_sources_are_the_files_bytes():
    srcs = dict(s.split(b"\0", 1) for s in C._emitter_sources("kazeia.backends.htp.kernels.hvx"))
    part = Path(importlib.util.find_spec("kazeia.backends.htp.kernels.hvx.ir").origin)
    assert srcs[b"kazeia.backends.htp.kernels.hvx.ir"] == part.read_bytes()
