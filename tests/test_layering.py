"""The import graph of src/kazeia, read with ast (every import, lazy ones inside functions included): no cycles
between files, and the layers' rules (debug never imports cli, the backends never import the models, the debug
tools reach the HTP backend through its public methods only)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(mod: str, path: Path) -> set[str]:
    """The kazeia modules `mod` imports (a `from pkg import name` counts as pkg.name when that is a module)."""
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            deps.update(r for a in node.names if (r := _resolve(a.name)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                r = full if full in MODULES else _resolve(base)
                if r:
                    deps.add(r)
    deps.discard(mod)
    return deps


GRAPH = {m: _imports(m, p) for m, p in MODULES.items() if m.startswith("kazeia")}


def _cycles() -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    assert len(GRAPH) > 100
    assert "kazeia.debug.judge" in GRAPH["kazeia.debug.compare.verdict"]  # from-imports
    assert "kazeia.backends.htp" in GRAPH["kazeia.engine.gates"]


def test_a_cycle_would_be_found(monkeypatch):
    monkeypatch.setitem(GRAPH, "kazeia.errors", GRAPH["kazeia.errors"] | {"kazeia.gguf.reader"})
    assert any({"kazeia.errors", "kazeia.gguf.reader"} <= c for c in _cycles())


def test_no_import_cycles_between_files():
    cycles = [sorted(c) for c in _cycles()]
    assert not cycles, cycles


@pytest.mark.parametrize("lower,upper", [("kazeia.debug", "kazeia.cli"), ("kazeia.backends", "kazeia.models"),
                                         ("kazeia.backends", "kazeia.debug"), ("kazeia.backends", "kazeia.cli"),
                                         ("kazeia.models", "kazeia.backends"), ("kazeia.graph", "kazeia.models")])
def test_lower_layers_never_import_upper_ones(lower, upper):
    bad = sorted((m, d) for m, deps in GRAPH.items() if m.startswith(lower) for d in deps if d.startswith(upper))
    assert not bad, bad


def test_debug_tools_use_the_htp_backends_public_methods():
    """No debug module reads the backend's executor, DSP or host, or writes VTCM bytes itself."""
    private = ("executor", "dsp", "host", "matmul", "on_batch_start", "mem")
    bad = []
    for mod, path in MODULES.items():
        if not mod.startswith("kazeia.debug"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                bad.append(f"{os.path.relpath(path, SRC)}:{node.lineno} .{node.attr}")
    assert not bad, bad
