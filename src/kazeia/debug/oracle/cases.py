"""Oracle cases: one op with named parameters, its test-backend-ops style name, and the grid options.

`MUL_MAT(type_a=q4_0,type_b=f32,m=2560,n=38,k=9728,bs=[1,1],nr=[1,1],view=contig)`: m = output features =
weight rows, n = tokens, k = inner dimension, as in test-backend-ops. A name parses back to the same case.
`OpDef` ties an op to its case grid and its graph builder (the op modules define them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazeia.debug.oracle.inputs import Leaves
from kazeia.errors import KazeiaError
from kazeia.graph.tensor import Tensor

Value = int | float | str | tuple


def _fmt(v: Value) -> str:
    if isinstance(v, tuple):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)  # exact round trip through parse_case
    return str(v)


def _parse_value(s: str) -> Value:
    if s.startswith("[") and s.endswith("]"):
        inner = s[1:-1].strip()
        return tuple(_parse_value(x) for x in inner.split(",")) if inner else ()
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    try:
        return float(s)
    except ValueError:
        return s


@dataclass(frozen=True)
class Case:
    """One op with its parameters, in order; `name` is the test-backend-ops style identity of the case."""

    op: str
    params: tuple[tuple[str, Value], ...]

    @classmethod
    def make(cls, op: str, **params: Value) -> Case:
        return cls(op, tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))

    def get(self, key: str, default: Value | None = None) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        return default

    def __getitem__(self, key: str) -> Any:
        v = self.get(key)
        if v is None:
            raise KeyError(f"{self.op} case has no parameter {key!r}")
        return v

    @property
    def vars(self) -> str:
        return ",".join(f"{k}={_fmt(v)}" for k, v in self.params)

    @property
    def name(self) -> str:
        return f"{self.op}({self.vars})"

    def __str__(self) -> str:
        return self.name

    def weight_key(self) -> tuple | None:
        """Cases with the same key use the same weight tensor (scheduling groups them on one worker)."""
        if self.op == "MUL_MAT" and self.get("view") != "permuted":
            return ("MUL_MAT", self["type_a"], self["m"], self["k"], self.get("bs"), self.get("init"))
        if self.op == "GET_ROWS":
            return ("GET_ROWS", self["type"], self["ne"])
        return None


def case_from_name(name: str) -> Case:
    """'OP(k=v,k=[a,b],...)' -> Case (the inverse of Case.name), checking the syntax only."""
    m = re.fullmatch(r"\s*([A-Z_0-9]+)\((.*)\)\s*", name)
    if not m:
        raise KazeiaError(f"not a case name: {name!r} (expected OP(key=value,...))")
    op, body = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    params = []
    for p in parts:
        if "=" not in p:
            raise KazeiaError(f"bad parameter {p!r} in case {name!r}")
        k, v = p.split("=", 1)
        params.append((k.strip(), _parse_value(v.strip())))
    return Case(op, tuple(params))


@dataclass(frozen=True)
class GridOptions:
    quick: bool = False
    types: tuple[str, ...] | None = None  # MUL_MAT type_a / GET_ROWS table types to keep
    vtcm: int | None = None  # VTCM size for the plan-change points of the MUL_MAT grid (default 8 MiB)

    def want(self, t: str) -> bool:
        return self.types is None or t in self.types


def dedup(cases: list[Case]) -> list[Case]:
    return list(dict.fromkeys(cases))


@dataclass(frozen=True)
class OpDef:
    name: str
    grid: Callable[[GridOptions], list[Case]]
    build: Callable[[Case, Leaves], Tensor]
    aliases: tuple[str, ...] = ()
