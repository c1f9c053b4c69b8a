"""Comparing two captures of the same op execution (enqueue-time against completion-time): is what a host-side
dump saw when the op was queued what the op consumed?"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kazeia.debug.dump.load import Dump, TensorRecord
from kazeia.debug.judge import nmse
from kazeia.debug.stats import Stats, values_stats
from kazeia.errors import KazeiaError
from kazeia.graph.tensor import SCALAR_DTYPES


@dataclass
class TensorDiff:
    what: str  # "src1 (activations)" or "output"
    name: str
    identical: bool
    n: int
    n_diff: int
    nmse: float | None  # a vs b, b = the completion-time capture
    stats_a: Stats | None
    stats_b: Stats | None

    def line(self, label_a: str, label_b: str) -> str:
        if self.identical:
            return f"{self.what} {self.name}: identical in both captures"
        s = (f"{self.what} {self.name}: DIFFERS in {self.n_diff}/{self.n} elements "
             f"({100.0 * self.n_diff / max(self.n, 1):.1f}%)")
        if self.nmse is not None:
            s += f", NMSE {self.nmse:.3g}"
        if self.stats_a is not None and self.stats_b is not None:
            s += f"; {label_a}: {self.stats_a.short()}; {label_b}: {self.stats_b.short()}"
        return s


@dataclass
class CaptureDiff:
    a: str  # entry ids
    b: str
    label_a: str
    label_b: str
    tensors: list[TensorDiff]

    @property
    def identical(self) -> bool:
        return all(t.identical for t in self.tensors)

    @property
    def inputs_identical(self) -> bool:
        return all(t.identical for t in self.tensors if t.what != "output")

    def describe(self) -> list[str]:
        head = (f"{self.label_a} capture ({self.a}) vs {self.label_b} capture ({self.b}): "
                + ("identical" if self.identical else
                   "inputs identical, output differs" if self.inputs_identical else
                   "the inputs DIFFER: the earlier capture is not what the op consumed"))
        return [head] + ["  " + t.line(self.label_a, self.label_b) for t in self.tensors]


def _diff(what: str, a: TensorRecord | None, b: TensorRecord | None) -> TensorDiff | None:
    if a is None or b is None or a.values is None or b.values is None:
        return None
    va, vb = a.values, b.values
    if va.shape != vb.shape or va.dtype != vb.dtype:
        return TensorDiff(what, b.name, False, int(vb.size), int(vb.size), None, None, None)
    if va.dtype.kind == "f":
        differs = ~((va == vb) | (np.isnan(va) & np.isnan(vb)))
        with np.errstate(all="ignore"):
            e = nmse(va, vb)
        n_diff = int(differs.sum())
        return TensorDiff(what, b.name, n_diff == 0, int(va.size), n_diff, e, values_stats(va), values_stats(vb))
    if b.type in SCALAR_DTYPES:  # integer elements
        n_diff = int((va != vb).sum())
        return TensorDiff(what, b.name, n_diff == 0, int(va.size), n_diff, None, None, None)
    # raw block rows: count rows that differ
    n_diff = int((va != vb).any(axis=-1).sum())
    return TensorDiff(what, b.name, n_diff == 0, int(np.prod(va.shape[:-1])), n_diff, None, None, None)


def compare_captures(a: Dump, b: Dump) -> CaptureDiff:
    """Tensor by tensor: is capture `a` (e.g. enqueue-time) the same as `b` (e.g. completion-time)?"""
    if a.name != b.name or a.node["ne"] != b.node["ne"]:
        raise KazeiaError(f"{a.id} and {b.id} are not captures of the same op")
    diffs = []
    for i, (sa, sb) in enumerate(zip(a.sources, b.sources)):
        d = _diff(sb.role if sb is not None else f"src{i}", sa, sb)
        if d is not None:
            diffs.append(d)
    d = _diff("output", a.output, b.output)
    if d is not None:
        diffs.append(d)
    return CaptureDiff(a.id, b.id, a.capture, b.capture, diffs)
