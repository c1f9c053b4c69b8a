"""The op table (each op's grid and graph builder), one case's one-op graph, and the case list."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kazeia.debug.oracle import mul_mat, other_ops
from kazeia.debug.oracle.cases import Case, GridOptions, OpDef, case_from_name, dedup
from kazeia.debug.oracle.inputs import Leaves
from kazeia.debug.oracle.mul_mat import MM_TYPES
from kazeia.errors import KazeiaError
from kazeia.graph import builder as gb
from kazeia.graph.tensor import Tensor, TFlag
from kazeia.limits import safe_regex

OPS: dict[str, OpDef] = {d.name: d for d in [*mul_mat.OP_DEFS, *other_ops.OP_DEFS]}


def op_def(name: str) -> OpDef:
    key = name.strip().upper()
    for d in OPS.values():
        if key == d.name or key in d.aliases:
            return d
    raise KazeiaError(f"unknown op '{name}' (available: {', '.join(OPS)})")


def make_cases(ops: Iterable[str] | None = None, types: Iterable[str] | None = None, quick: bool = False,
               pattern: str | None = None, vtcm: int | None = None) -> list[Case]:
    """The case list: the grids of `ops` (default: all), MUL_MAT/GET_ROWS types restricted to `types`, names
    filtered by the regex `pattern` (re.search, like test-backend-ops -p)."""
    want_types = None
    if types is not None:
        want_types = tuple(t.strip().lower() for t in types if t.strip())
        bad = [t for t in want_types if t not in MM_TYPES]
        if bad:
            raise KazeiaError(f"unknown type(s) {', '.join(bad)} (available: {', '.join(MM_TYPES)})")
    opts = GridOptions(quick=quick, types=want_types, vtcm=vtcm)
    defs = list(OPS.values()) if ops is None else list(dict.fromkeys(op_def(o) for o in ops))
    rx = safe_regex(pattern, "-p") if pattern else None
    cases = [c for d in defs for c in d.grid(opts)]
    return [c for c in dedup(cases) if rx is None or rx.search(c.name)]


def parse_case(name: str) -> Case:
    """'OP(k=v,k=[a,b],...)' -> Case (the inverse of Case.name), checked by building its graph structure."""
    case = case_from_name(name)
    try:
        build_case(case)  # the graph structure only (no data): unknown ops, missing or bad parameters
    except KazeiaError:
        raise
    except Exception as e:
        raise KazeiaError(f"case {name!r} cannot be built: {type(e).__name__}: {e}") from None
    return case


@dataclass
class BuiltCase:
    graph: gb.Graph
    out: Tensor
    leaves: Leaves


def build_case(case: Case) -> BuiltCase:
    lv = Leaves()
    out = op_def(case.op).build(case, lv)
    out.flags |= TFlag.OUTPUT
    out.name = out.name or "out"
    g = gb.Graph()
    g.expand(out)
    return BuiltCase(g, out, lv)
