"""kazeia investigate: the whole procedure the original team did by hand, automated.

reproduce -> localise the faulting op with one-op batches (and show what the default and the team's logs
would have blamed) -> trace the run up to the fault (NaN-aware statistics) -> check determinism -> dump the
faulting op (at completion and, for contrast, at enqueue time) and replay it alone and with its batch context
-> route op classes away to confirm -> predict the failing prompt lengths from the VTCM plan arithmetic and
confirm the boundaries -> evaluate each standard hypothesis (hypotheses.py) -> propose a gate and validate it
by rerunning -> write the report (report.py). Numeric faults (wrong numbers, no death) take the compare
branch instead. Every run is in process (a device death is an exception here) and reuses the loaded weights.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kazeia.backends.base import Hook, OpInfo
from kazeia.debug.report import Investigation, Step, write_report
from kazeia.debug.runner import RunResult, RunSpec
from kazeia.debug.stats import Stats, nmse, tensor_stats
from kazeia.graph.tensor import Tensor, type_name

SYNC_ENV = {"GGML_HEXAGON_OPBATCH": "1", "GGML_HEXAGON_OPQUEUE": "1"}


@dataclass
class OpFacts:
    """What we know about one node of the run: shapes, weight, input/output statistics."""

    index: int
    name: str
    op: str
    dst: str
    srcs: list[str]
    weight: str | None
    m: int | None = None  # MUL_MAT: src1 rows
    k: int | None = None
    n: int | None = None
    wtype: str | None = None
    in_stats: list[Stats | None] = field(default_factory=list)
    out_stats: Stats | None = None
    path: str | None = None
    faulted: bool = False
    fault: dict = field(default_factory=dict)


class FactsHook(Hook):
    """Records every op's shapes and NaN-aware statistics at start (inputs) and completion (output)."""

    def __init__(self) -> None:
        self.ops: dict[str, OpFacts] = {}
        self.order: list[str] = []
        self.fault: OpFacts | None = None

    def _facts(self, node: Tensor, info: OpInfo) -> OpFacts:
        f = self.ops.get(node.name)
        if f is None:
            w = node.src[0] if node.op == "MUL_MAT" else None
            f = OpFacts(info.index, node.name, node.desc(), _label(node), [_label(s) if s else "" for s in node.src],
                        w.weight_name if w is not None else None)
            if node.op == "MUL_MAT":
                f.m, f.k, f.n, f.wtype = node.src[1].ne[1], w.ne[0], w.ne[1], type_name(w.type)
            self.ops[node.name] = f
            self.order.append(node.name)
        return f

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        f = self._facts(node, info)
        f.in_stats = [tensor_stats(s) if s is not None and not s.weight_name else None for s in node.src]

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        f = self._facts(node, info)
        f.out_stats = tensor_stats(node)
        f.path = f"{info.backend}/{info.path}"

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        f = self._facts(node, info)
        f.faulted, f.fault, f.path = True, dict(info.extra), f"{info.backend}/dsp"
        self.fault = f


def _label(t: Tensor) -> str:
    return f"{t.name} {type_name(t.type)}[{','.join(str(x) for x in t.ne)}]"


class Progress:
    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total, self.i, self.t0, self.stream = total, 0, time.perf_counter(), stream

    def __call__(self, msg: str) -> None:
        self.i += 1
        el = time.perf_counter() - self.t0
        if self.stream is not None:
            self.stream.write(f"[investigate {min(self.i, self.total)}/{self.total} {el:5.1f}s] {msg}\n")
            self.stream.flush()


@dataclass
class Context:
    """State shared by the steps of one investigation."""

    spec: RunSpec
    out_dir: str
    inv: Investigation
    progress: Callable[[str], None]
    reference_logits: np.ndarray | None = None
    first: RunResult | None = None
    facts: FactsHook | None = None
    findings: dict = field(default_factory=dict)

    def step(self, name: str, fn: Callable[[], tuple[str, str]]) -> None:
        """Run one step; fn returns (summary, reproduce command)."""
        self.progress(name)
        t0 = time.perf_counter()
        try:
            summary, cmd = fn()
        except Exception as e:  # a failing step is reported, never the end of the investigation
            summary, cmd = f"step failed: {type(e).__name__}: {e}", ""
        self.inv.steps.append(Step(name, time.perf_counter() - t0, summary, cmd))


def investigate(spec: RunSpec, out_dir: str, progress: Callable[[str], None] | None = None) -> Investigation:
    from kazeia.debug import investigate_steps as S

    inv = Investigation(title=f"kazeia investigation: {os.path.basename(spec.model_path)} on {spec.device}"
                              f"{' (' + spec.htp_profile + ')' if spec.htp_profile else ''}",
                        command=spec.command(), outcome="", fault_found=False)
    cx = Context(spec, out_dir, inv, progress or Progress(14))
    cx.step("reproduce", lambda: S.reproduce(cx))
    r = cx.first
    if r is not None and r.death:
        S.death_branch(cx)
    elif r is not None and (r.error or cx.findings.get("wrong_logits")):
        S.numeric_branch(cx)
    else:
        S.healthy_branch(cx)
    paths = write_report(inv, out_dir)
    inv.notes.append(f"report files: {', '.join(paths.values())}")
    return inv


def op_regex(name: str) -> str:
    return "^" + re.escape(name) + "$"


def logits_nmse(a: np.ndarray | None, ref: np.ndarray | None) -> float | None:
    if a is None or ref is None:
        return None
    return nmse(a[-1:], ref[-1:])
