"""The import graph of src/kazeia, read with ast (every import, lazy ones inside functions included): no cycles
between files, and the layers' rules (docs/architecture.md): no import runs up the house (debug never imports cli,
the backends never import the models or the engine, native/ imports nothing above it), the HTP model's units
import only downward, nothing outside htp/ imports past its face (htp/__init__.py), and the debug tools reach the
HTP backend through its public methods only."""

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
    assert "kazeia.backends.htp" in GRAPH["kazeia.debug.modeled"]


def test_a_cycle_would_be_found(monkeypatch):
    monkeypatch.setitem(GRAPH, "kazeia.errors", GRAPH["kazeia.errors"] | {"kazeia.gguf.reader"})
    assert any({"kazeia.errors", "kazeia.gguf.reader"} <= c for c in _cycles())


def test_no_import_cycles_between_files():
    cycles = [sorted(c) for c in _cycles()]
    assert not cycles, cycles


# the house from the ground up; a room may import only rooms on its floor or below (models and backends share one)
FLOORS = [("kazeia.errors", "kazeia.settings", "kazeia.identity", "kazeia.limits", "kazeia.outputs", "kazeia.memory"),
          ("kazeia.native", "kazeia.graph", "kazeia.gguf"),
          ("kazeia.models", "kazeia.backends"), ("kazeia.engine",), ("kazeia.debug",), ("kazeia.cli",)]
PAIRS = [("kazeia.debug", "kazeia.cli"), ("kazeia.backends", "kazeia.models"), ("kazeia.backends", "kazeia.debug"),
         ("kazeia.backends", "kazeia.cli"), ("kazeia.backends", "kazeia.engine"), ("kazeia.models", "kazeia.backends"),
         ("kazeia.graph", "kazeia.models"), ("kazeia.native", "kazeia.graph"), ("kazeia.native", "kazeia.backends"),
         ("kazeia.gguf", "kazeia.native"), ("kazeia.graph", "kazeia.native")]


def _room(mod: str) -> str:
    return next(r for floor in FLOORS for r in floor if mod == r or mod.startswith(r + "."))


def _floor(mod: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if _room(mod) in floor)


@pytest.mark.parametrize("lower,upper", PAIRS)
def test_lower_layers_never_import_upper_ones(lower, upper):
    bad = sorted((m, d) for m, deps in GRAPH.items() if m.startswith(lower) for d in deps if d.startswith(upper))
    assert not bad, bad


def test_no_import_runs_up_the_house():
    bad = sorted((m, d) for m, deps in GRAPH.items() if m != "kazeia" and m != "kazeia.__main__"
                 for d in deps if d != "kazeia" and _floor(d) > _floor(m))
    assert not bad, bad


HTP = "kazeia.backends.htp"
# the HTP model's units from the bottom up (htp/__init__.py): a unit imports only units below it (and itself)
HTP_UNITS = ["profiles", "build_layout", "archs", "settings", "fp16", "msg", "l2", "kernels", "vtcm", "host", "cost",
             "gates", "device", "hvx", "hmx", "ops", "backend", "forensics"]


def _unit(mod: str) -> str | None:
    rest = mod[len(HTP) + 1:] if mod.startswith(HTP + ".") else None
    return rest.split(".")[0] if rest else None


def test_htp_units_import_only_downward():
    order = {u: i for i, u in enumerate(HTP_UNITS)}
    order.update({"hmx": order["hvx"]})  # hvx and hmx: one floor, and neither imports the other
    bad = []
    for m, deps in GRAPH.items():
        u = _unit(m)
        if u is None:
            continue
        assert u in order, f"{m}: unit {u} is not in HTP_UNITS"
        for d in deps:
            v = _unit(d)
            if v is not None and v != u and order[v] >= order[u]:
                bad.append((m, d))
    assert not bad, bad


def test_the_engine_imports_nothing_of_the_htp():
    """The engine never asks "is this the NPU" (docs/architecture.md): a device's settings, gates and graph come
    through the device registry (backends/devices.py) and the Backend interface, not from backends.htp."""
    bad = sorted((m, d) for m, deps in GRAPH.items() if m.startswith("kazeia.engine") for d in deps
                 if d == HTP or d.startswith(HTP + "."))
    assert not bad, bad


FORENSICS = HTP + ".forensics"  # the second face: the internals the forensic tools read


def test_nothing_outside_htp_imports_past_its_face():
    bad = sorted((m, d) for m, deps in GRAPH.items() if not m.startswith(HTP) for d in deps
                 if d.startswith(HTP + ".") and d != FORENSICS)
    assert not bad, bad


def test_only_the_forensic_tools_use_the_forensic_face():
    bad = sorted(m for m, deps in GRAPH.items() if FORENSICS in deps and not m.startswith(HTP)
                 and not m.startswith(("kazeia.debug", "kazeia.cli")))
    assert not bad, bad


def test_the_htp_faces_name_what_they_promise():
    import kazeia.backends.htp as face
    import kazeia.backends.htp.forensics as forensics

    for f in (face, forensics):
        for name in f.__all__:
            assert getattr(f, name) is not None, name
    assert not set(face.__all__) & set(forensics.__all__)


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
