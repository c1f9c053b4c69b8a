"""Cumulative mode: the backend under test runs the whole prefill feeding itself; every op's output is compared at
completion with REF's, and judged by its per-op threshold only when the inputs it consumed were REF's own
(or when it turned finite inputs into NaN/inf); the other rows show drift."""

from __future__ import annotations

import math

import numpy as np

from kazeia.backends.base import Hook, OpInfo
from kazeia.debug.compare.op_io import read_sources
from kazeia.debug.compare.reference import Reference
from kazeia.debug.compare.report import CompareReport
from kazeia.debug.compare.rows import OpRow, compare_output, logits_nmse, make_row, reference_for, row_threshold
from kazeia.debug.compare.verdict import DEATH, DRIFT, FAIL, OK
from kazeia.debug.judge import WHOLE_MODEL_NMSE, judge, node_threshold, nonfinite
from kazeia.debug.runner import run
from kazeia.debug.tensors import logical_values
from kazeia.engine.session import RunSpec, build_context, close_backends
from kazeia.graph.tensor import Tensor, TFlag


class _CumulativeHook(Hook):
    def __init__(self, reference: Reference, rows: list[OpRow], strict: bool) -> None:
        self.reference = reference
        self.rows = rows
        self.strict = strict
        self.ubatch = 0
        self._inputs: dict[Tensor, tuple[bool, bool, float | None]] = {}  # node -> (identical, finite, nmse)

    def next_ubatch(self, *_args) -> None:
        self.ubatch += 1

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        refs = dict((self.reference.sources or {}).get((self.ubatch, info.index), []))
        identical, finite, worst = True, True, 0.0
        for i in read_sources(node):
            got = logical_values(node.src[i])
            if nonfinite(got):
                finite = False
            want = refs.get(i)
            if want is None or want.shape != got.shape:
                identical, worst = False, None
                continue
            if not np.array_equal(got, want, equal_nan=np.issubdtype(got.dtype, np.floating)):
                identical = False
                if worst is not None:
                    v = judge(got.astype(np.float64), want.astype(np.float64), math.inf).nmse
                    worst = max(worst, v if v is not None else math.inf)
        self._inputs[node] = (identical, finite, worst)

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        key = (self.ubatch, info.index)
        ref = reference_for(self.reference, key, node)
        identical, finite, in_nmse = self._inputs.pop(node, (False, True, None))
        is_output = bool(node.flags & TFlag.OUTPUT)
        threshold, tinfo = row_threshold(self.reference, key, node, self.strict)
        if is_output:
            threshold, tinfo = WHOLE_MODEL_NMSE, {"base_threshold": WHOLE_MODEL_NMSE, "quant_floor": None}
        v, nonfinite_out = compare_output(node, ref, threshold, info.backend)
        status, reason, judged = v.status, v.reason, True
        if status == FAIL and not identical:
            nonfinite_new = finite and nonfinite_out and v.kind in ("nan", "inf")
            if is_output:
                # the whole-model bound passed by the drift its inputs brought is no fault at this op; non-finite
                # logits (never a drift) and logits made wrong here (far past what that drift explains) stay FAIL
                if not (nonfinite_out or in_nmse is None or _beyond_drift(v.nmse, in_nmse)):
                    status, judged = DRIFT, False
                    reason = (f"{v.reason}: accumulated drift (its inputs were already at NMSE {in_nmse:.3g}; no op "
                              f"is out of tolerance on its own inputs)")
            elif _beyond_drift(v.nmse, in_nmse):
                reason = (f"{v.reason}, from inputs at NMSE {in_nmse:.3g}: over {AMPLIFICATION:.0e} times what "
                          "their drift explains")
            elif not nonfinite_new:
                status, judged = DRIFT, False
                reason = f"{v.reason} (inputs already differed: input NMSE {in_nmse:.3g})" if in_nmse is not None \
                    else f"{v.reason} (inputs already differed)"
            else:
                reason = f"{v.reason}; its inputs were finite"
        elif status == OK and not (is_output or identical):
            judged = False
        if is_output:
            reason = reason or "whole-model output"
        self.rows.append(make_row("cumulative", self.ubatch, node, info, None, threshold, status, reason=reason,
                                  nmse=v.nmse, max_abs=v.max_abs, max_rel=v.max_rel, judged=judged,
                                  input_nmse=0.0 if identical else in_nmse, **tinfo))

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        cause = f"device died inside this op: {info.extra.get('kind')}: {info.extra.get('cause')}"
        self.rows.append(make_row("cumulative", self.ubatch, node, info, None, node_threshold(node), DEATH,
                                  reason=cause, nmse=math.inf))


# An op whose output error exceeds its inputs' by more than this factor made the error itself, drifted inputs or not
# (one rounding of every element, a matmul's or a softmax's conditioning, stay orders of magnitude below; a stale or
# wrong read does not: #25876's ADD measured 6e7).
AMPLIFICATION = 1e4


def _beyond_drift(nmse: float | None, in_nmse: float | None) -> bool:
    """The output's NMSE is more than AMPLIFICATION times its inputs' (both finite, the inputs' above zero)."""
    if nmse is None or in_nmse is None or not math.isfinite(in_nmse) or in_nmse <= 0:
        return False
    return nmse > AMPLIFICATION * in_nmse


def run_cumulative(spec: RunSpec, reference: Reference, report: CompareReport, hooks, strict: bool) -> None:
    rows: list[OpRow] = []
    ctx = build_context(spec)
    hook = _CumulativeHook(reference, rows, strict)
    ctx.on_ubatch = hook.next_ubatch
    res = run(spec, hooks=[*hooks, hook], ctx=ctx)  # user hooks first: they may alter the output
    close_backends(ctx)
    # an async backend may finish an op after a later CPU op: list rows in graph order
    report.rows["cumulative"] = sorted(rows, key=lambda r: (r.ubatch, r.index))
    report.deaths["cumulative"] = res.death
    if res.error and not res.death:
        report.deaths["cumulative"] = {"message": res.error, "kind": "op-error"}
    report.logits_nmse["cumulative"] = logits_nmse(res.logits, reference.logits)
    if res.death:
        report.not_run["cumulative"] = max(0, _n_computed(reference) - len(rows))


def _n_computed(reference: Reference) -> int:
    return len(reference.outputs)
