"""Non-finite values during generation: a cheap always-on tracker of the first op whose output went non-finite,
and the error that stops generation when the logits are not finite.

The tracker is an ordinary execution hook: at each op's completion (on its device, inside the batch for the
HTP) it checks the op's output for a NaN, or for an infinity that none of its sources held (the -inf of a KQ
mask that an op copies is no new value), as `--stop-on-nonfinite` judges. An op that writes rows into a
persistent buffer (SET_ROWS/CPY into the KV cache or a recurrent state) is judged by the values it writes,
converted to the destination type, not by the whole cache. Only the first such op of each decode call is
kept, so once found the rest of the micro-batch costs one branch per op.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kazeia.backends.base import Hook, OpInfo
from kazeia.errors import WRONG, KazeiaError
from kazeia.graph.tensor import SCALAR_DTYPES, BufferUsage, Tensor, array


@dataclass(frozen=True)
class FirstNonFinite:
    """The first op of a decode call whose output went non-finite."""

    name: str
    op: str
    index: int | None
    backend: str
    nan: int
    inf: int
    total: int

    def describe(self) -> str:
        where = f"node #{self.index}, " if self.index is not None else ""
        what = ", ".join(f"{n} {k}" for n, k in ((self.nan, "NaN"), (self.inf, "inf")) if n)
        return f"{self.name} ({self.op}, {where}on {self.backend}: {what} of {self.total})"


def _floats(t: Tensor) -> np.ndarray | None:
    if t is None or t.buffer is None or t.type not in SCALAR_DTYPES:
        return None
    a = array(t)
    return a if a.dtype.kind == "f" else None


def _written(node: Tensor) -> np.ndarray | None:
    """The values an op leaves: its output, or for a row write into a persistent buffer the rows it writes."""
    if node.op in ("SET_ROWS", "CPY") and node.buffer is not None and node.buffer.usage != BufferUsage.COMPUTE:
        src, dst = _floats(node.src[0]), _floats(node)
        if src is None or dst is None:
            return None
        with np.errstate(over="ignore"):
            return src.astype(dst.dtype)  # an F16 cache turns values beyond 65504 into infinities
    return _floats(node)


def _has_inf(t: Tensor | None) -> bool:
    a = _floats(t) if t is not None else None
    return a is not None and bool(np.isinf(a).any())


class NonFiniteTracker(Hook):
    """Remembers the first op since `reset` whose output holds a NaN or a new infinity (see the module doc)."""

    def __init__(self) -> None:
        self.first: FirstNonFinite | None = None

    def reset(self) -> None:
        self.first = None

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        if self.first is not None:
            return
        v = _written(node)
        if v is None or np.isfinite(v).all():
            return
        nan = int(np.isnan(v).sum())
        inf = int(v.size - nan - np.isfinite(v).sum())
        if not nan and any(_has_inf(s) for s in node.src if s is not node and not s.weight_name):
            return  # an infinity its sources held (a mask's -inf, copied or added)
        self.first = FirstNonFinite(node.name, node.desc(), info.index, info.backend, nan, inf, int(v.size))


class NonFiniteLogitsError(KazeiaError):
    """The logits hold NaN or infinities: generation stops (greedy would pick the NaN, sampling cannot)."""

    exit_code = 4
    outcome = WRONG
    rerun_with = "--stop-on-nonfinite"  # the CLI says the command that stops at that op and shows its inputs

    def __init__(self, where: str, logits: np.ndarray, first: FirstNonFinite | None) -> None:
        nan = int(np.isnan(logits).sum())
        inf = int(np.isinf(logits).sum())
        what = ", ".join(f"{n} {k}" for n, k in ((nan, "NaN"), (inf, "inf")) if n)
        cause = (f"the first op whose output went non-finite: {first.describe()}" if first is not None else
                 "no op output was seen going non-finite")
        super().__init__(f"non-finite logits {where} ({what} of {logits.size}): {cause}")
        self.first = first


def check_logits(logits: np.ndarray, where: str, tracker: NonFiniteTracker | None) -> None:
    """Raise NonFiniteLogitsError unless every logit is finite."""
    if not np.isfinite(logits).all():
        raise NonFiniteLogitsError(where, np.asarray(logits), tracker.first if tracker is not None else None)
