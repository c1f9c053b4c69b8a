"""One row per compared op: the verdict on its output against REF's, with the threshold that applied."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from kazeia.backends.base import Backend, OpInfo
from kazeia.debug.compare.op_io import as_storable, output_raw
from kazeia.debug.compare.reference import Reference
from kazeia.debug.compare.verdict import DEATH, FAIL
from kazeia.debug.json_safe import json_safe
from kazeia.debug.judge import Verdict, judge, judge_logits, node_threshold, nonfinite
from kazeia.errors import DeviceDeathError, KazeiaError
from kazeia.graph.tensor import GGMLType, Tensor


@dataclass
class OpRow:
    mode: str
    ubatch: int
    index: int  # node index in the graph
    name: str
    op: str
    backend: str
    path: str
    shape: str
    layer: int | None
    threshold: float
    status: str  # OK | FAIL | DRIFT | REF-INVALID | DEATH
    reason: str = ""
    nmse: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    judged: bool = True  # False: cumulative row whose inputs already differed (threshold shown, not applied)
    input_nmse: float | None = None  # cumulative: largest NMSE of the op's inputs against REF's
    base_threshold: float | None = None  # the per-op threshold before the MUL_MAT allowance
    quant_floor: float | None = None  # MUL_MAT: NMSE of ggml's own activation conversion on these inputs
    extra: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in (FAIL, DEATH)

    @property
    def min_tolerance(self) -> float | None:
        """The smallest NMSE threshold this row would have passed (Polygraphy's 'minimum required tolerance')."""
        return self.nmse if self.failed else None

    @property
    def where(self) -> str:
        return f"{self.backend}/{self.path}"

    def label(self) -> str:
        ub = f"ub{self.ubatch} " if self.ubatch else ""
        return f"{ub}#{self.index} {self.name} ({self.op}, {self.where})"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["min_tolerance"] = self.min_tolerance
        for k in ("nmse", "max_abs", "max_rel", "input_nmse", "min_tolerance", "quant_floor"):
            d[k] = json_safe(d[k])
        d["extra"] = {k: v for k, v in d["extra"].items() if isinstance(v, str | int | float | bool | type(None))}
        return d


def make_row(mode: str, ub: int, node: Tensor, info: OpInfo | None, backend: Backend | None, threshold: float,
             status: str, **kw) -> OpRow:
    """The row of `node`, with where and how it ran as `info` (or, without it, `backend`) says."""
    index = kw.pop("index", -1)
    if info is not None and info.index >= 0:
        index = info.index
    be = info.backend if info else (backend.name if backend else "?")
    path = info.path if info else "?"
    extra = dict(info.extra) if info else {}
    if info and info.batch is not None:
        extra["batch"] = info.batch
    return OpRow(mode, ub, index, node.name, node.desc(), be, path, node.shape_str(), node.layer, threshold, status,
                 extra=extra, **kw)


def compare_output(node: Tensor, ref: np.ndarray, threshold: float, backend: str) -> tuple[Verdict, bool]:
    """The verdict on the node's output (run on `backend`), and whether that output holds NaN or inf."""
    a = output_raw(node).astype(np.float64)
    return judge(a, as_storable(ref, node.type), threshold, name_a=backend), nonfinite(a)


def signature_line(node: Tensor, ref: np.ndarray) -> str:
    """The error signature of a failing output against REF, in one line (kazeia.debug.signature)."""
    from kazeia.debug.signature import classify

    try:
        return classify(output_raw(node).astype(np.float64), as_storable(ref, node.type)).headline()
    except ValueError:
        return ""


def reference_for(reference: Reference, key: tuple[int, int], node: Tensor) -> np.ndarray:
    """REF's output of the node at `key`, after checking that REF ran the same node there."""
    if key not in reference.outputs:
        raise KazeiaError(f"the REF run has no node #{key[1]} in micro-batch {key[0]} ({node.name}): "
                          "graphs differ")
    name, op = reference.names[key]
    if name != node.name or op != node.desc():
        raise KazeiaError(f"graph mismatch at node #{key[1]}: REF ran {name} ({op}), the backend {node.name} "
                          f"({node.desc()})")
    return reference.outputs[key]


def row_threshold(reference: Reference, key: tuple[int, int], node: Tensor, strict: bool) -> tuple[float, dict]:
    """(threshold applied, row fields): the per-op threshold plus, unless strict, the MUL_MAT allowance."""
    base = node_threshold(node)
    floor = None if strict else reference.floors.get(key)
    return base + (floor or 0.0), {"base_threshold": base, "quant_floor": floor}


def death_fields(e: DeviceDeathError) -> dict:
    return {**e.to_dict(), "batch": getattr(e, "batch_seq", None)}


def logits_nmse(got: np.ndarray | None, want: np.ndarray | None) -> float | None:
    """NMSE of a run's logits against REF's (None when either is missing); inf for NaN or unmatched inf."""
    if got is None or want is None or got.shape != want.shape:
        return None
    return judge_logits(got, as_storable(want, GGMLType.F32)).nmse
