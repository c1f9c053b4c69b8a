"""Isolated mode, test-backend-ops style: each node runs alone on the backend under test after REF's values of
the sources it reads were written into their storage (through ne/nb, so views, in-place ops and KV-cache views
get exactly what REF consumed), and is waited for (on the HTP: one op per batch). The first row out of
tolerance is the culprit; a device death inside an op is that op failing."""

from __future__ import annotations

import math

from kazeia.backends.base import Hook, OpInfo
from kazeia.debug.compare.reference import Reference
from kazeia.debug.compare.report import CompareReport
from kazeia.debug.compare.rows import (
    OpRow,
    compare_output,
    death_fields,
    logits_nmse,
    make_row,
    reference_for,
    row_threshold,
    signature_line,
)
from kazeia.debug.compare.verdict import DEATH, FAIL
from kazeia.debug.runner import run
from kazeia.debug.tensors import write_elements
from kazeia.engine.scheduler import Placement, Scheduler
from kazeia.engine.session import RunSpec, build_context, close_backends
from kazeia.errors import DeviceDeathError, DeviceOpError, KazeiaError
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import Tensor


class _InfoHook(Hook):
    """Remembers how the last op ran (the backend only says so through its hooks)."""

    def __init__(self) -> None:
        self.info: OpInfo | None = None
        self.fault: OpInfo | None = None

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        self.info = info

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        self.fault = info


class _IsolatedScheduler(Scheduler):
    """Runs each node alone on the backend the normal placement picks, after writing REF's values into the
    storage of every source it reads, and compares its output with REF's."""

    def __init__(self, base: Scheduler, reference: Reference, rows: list[OpRow], report: CompareReport,
                 strict: bool, only: set[str] | None = None) -> None:
        super().__init__(base.backends, base.router)
        self.reference, self.rows, self.report, self.strict = reference, rows, report, strict
        self.only = only  # the node names to run (None: every node; each op reads REF's inputs, so none needs another)
        self.ubatch = 0
        self.info_hook = _InfoHook()
        self.add_hook(self.info_hook)

    def compute(self, graph: Graph) -> None:
        self.placements = []
        self.graph = graph
        for b in self.backends:
            b.begin_graph(graph)
        for i, node in enumerate(graph.nodes):
            if node.is_computed and (self.only is None or node.name in self.only):
                self._one(i, node)
        for b in self.backends:
            b.end_graph()
        self.ubatch += 1

    def _feed(self, key: tuple[int, int], node: Tensor) -> None:
        srcs = (self.reference.sources or {}).get(key)
        if srcs is None:
            raise KazeiaError(f"the reference has no captured inputs for node #{key[1]} ({node.name})")
        for i, raw in srcs:
            s = node.src[i]
            write_elements(s, raw)
            for b in self.backends:  # a host write: no backend may keep a cached copy of the old contents
                b.foreign_write(s.root)

    def _one(self, i: int, node: Tensor) -> None:
        key = (self.ubatch, i)
        ref = reference_for(self.reference, key, node)
        backend, reason = self.place(node, i)
        self.placements.append(Placement(node.name, node.desc(), backend.name, reason, i))
        threshold, tinfo = row_threshold(self.reference, key, node, self.strict)
        self._feed(key, node)
        self.info_hook.info = self.info_hook.fault = None
        try:
            backend.compute(node)
            backend.synchronize()  # one op per batch on the HTP: it has finished (or died) when this returns
        except DeviceDeathError as e:
            info = self.info_hook.fault or OpInfo(backend.name, "fault", index=i)
            why = f"device died inside this op: {e.cause or e}" if e.faulting in (None, node.name) else \
                f"device died ({e}) while this op ran alone; DSP says faulting op: {e.faulting}"
            self.rows.append(make_row("isolated", self.ubatch, node, info, backend, threshold, DEATH, index=i,
                                      reason=why, nmse=math.inf, **tinfo))
            self.report.deaths["isolated"] = death_fields(e)
            self.report.not_run["isolated"] = self._not_run_after(i)
            raise
        except DeviceOpError as e:
            info = self.info_hook.info or OpInfo(backend.name, "?", index=i)
            self.rows.append(make_row("isolated", self.ubatch, node, info, backend, threshold, FAIL, index=i,
                                      reason=f"op error: {e}", nmse=math.inf, **tinfo))
            return
        info = self.info_hook.info or OpInfo(backend.name, getattr(backend, "path_name", "?"), index=i)
        v, _ = compare_output(node, ref, threshold, info.backend)
        row = make_row("isolated", self.ubatch, node, info, backend, threshold, v.status, index=i,
                       reason=v.reason, nmse=v.nmse, max_abs=v.max_abs, max_rel=v.max_rel, **tinfo)
        if row.failed:
            row.extra["signature"] = signature_line(node, ref)
        self.rows.append(row)

    def _not_run_after(self, i: int) -> int:
        """Computed nodes after node i in this micro-batch, plus those of the micro-batches not reached."""
        here = sum(1 for n in self.graph.nodes[i + 1:] if n.is_computed)
        return here + sum(1 for (ub, _idx) in self.reference.outputs if ub > self.ubatch)


def run_isolated(spec: RunSpec, reference: Reference, report: CompareReport, hooks, strict: bool,
                 only: set[str] | None = None) -> None:
    if reference.sources is None:
        raise KazeiaError("isolated mode needs a reference captured with sources=True")
    rows: list[OpRow] = []
    ctx = build_context(spec)
    ctx.scheduler = _IsolatedScheduler(ctx.scheduler, reference, rows, report, strict, only)
    report.deaths["isolated"] = None
    res = run(spec, hooks=list(hooks), ctx=ctx)
    close_backends(ctx)
    report.rows["isolated"] = rows
    if res.error and not res.death:
        report.deaths["isolated"] = {"message": res.error, "kind": "op-error"}
    report.logits_nmse["isolated"] = logits_nmse(res.logits, reference.logits)
