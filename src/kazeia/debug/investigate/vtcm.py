"""The VTCM plan of the faulting op (the backend's own plan_for_node), the prompt lengths for which the plan
arithmetic predicts a death, and their confirmation by real runs."""

from __future__ import annotations

import re
from dataclasses import replace

from kazeia.backends.htp import MAX_SRC1_ROWS, MatmulPlan, get_profile, plan_for_node
from kazeia.backends.htp.forensics import HMX_SCALES_BYTES, HMX_TILE_BYTES
from kazeia.debug.investigate.common import prefix_spec, ran, through
from kazeia.debug.investigate.facts import OpPlan, dies
from kazeia.debug.investigate.figures import plot_plan_vs_m
from kazeia.debug.investigate.table import Context, StepDef
from kazeia.debug.plan_view import plan_svg

_OUTCOME = {"reenter": "op_matmul re-enters itself without an HVX fallback", "fallback": "falls back to HVX",
            "dropped": "the op is dropped (dst keeps stale contents)", "runs": "runs"}


def faulting_plan(cx: Context) -> OpPlan | None:
    """The faulting op's plan in this run (the first micro-batch where it dies, else its first one)."""
    f = cx.findings
    mine = [p for p in f.matmul_plans or () if p.name == f.faulting]
    return next((p for p in mine if p.dies), mine[0] if mine else None)


def m_limit(cx: Context) -> int:
    """The largest M a micro-batch can give a MUL_MAT the HTP takes (supports_op's src1 limit, -ub)."""
    return min(MAX_SRC1_ROWS, cx.spec.ubatch)


def runs(ms: list[int]) -> list[tuple[int, int]]:
    """Sorted integers as (first, last) runs of consecutive values."""
    out: list[tuple[int, int]] = []
    for m in ms:
        if out and out[-1][1] == m - 1:
            out[-1] = (out[-1][0], m)
        else:
            out.append((m, m))
    return out


def failing_ranges(op: OpPlan, cx: Context, limit: int) -> list[tuple[int, int]]:
    """The M ranges (1..limit) whose plan for this node makes the DSP die, by the plan arithmetic alone."""
    return runs([m for m in range(1, limit + 1) if dies(plan_for_node(op.node, cx.settings, m=m))])


def why_it_fails(p: MatmulPlan) -> str:
    """A failed HMX plan in words, every number from the plan and the code that made it."""
    if p.status == "overflow":
        s = f"the HMX plan ({p.profile}) uses {p.used} B of {p.vtcm} B: over by {p.overflow} B (mc={p.mc}, nc={p.nc})"
        if not get_profile(p.profile).plan_counts_rounding:
            s += (f"; its chunk search estimated {p.estimate} B, budgeting {HMX_SCALES_BYTES} B of overhead beyond "
                  f"the areas, while the allocator rounds every area but the scales up to {HMX_TILE_BYTES} B")
    else:
        s = f"the HMX chunk search ({p.profile}) found no (mc, nc) chunking that fits {p.vtcm} B"
    return f"{s} -> the kernel returns -1 -> {_OUTCOME.get(p.outcome, p.outcome)}"


def describe(p: MatmulPlan) -> str:
    chunks = f", mc={p.mc} nc={p.nc}" if p.mc is not None else ""
    return f"{p.profile}: path {p.path}{chunks}, used {p.used} B of {p.vtcm} B ({p.status}, outcome {p.outcome})"


def plan_step(cx: Context) -> tuple[str, str]:
    f = cx.findings
    op = faulting_plan(cx)
    if op is None:
        return f"{f.faulting} is not a MUL_MAT the HTP takes: no matmul plan", ""
    f.plan = op.plan
    f.plan_robust = plan_for_node(op.node, replace(cx.settings, profile="robust"))
    cx.fact("HMX plan of the faulting op", describe(f.plan))
    cx.fact("same op under robust", describe(f.plan_robust))
    shown = f.plan if f.plan.path == "hmx" else (f.plan.hmx_attempt or f.plan)
    cx.inv.svgs[f"VTCM map of {op.name} (M={f.plan.m}, {f.plan.profile})"] = plan_svg(shown)
    f.dsp_log = [line for line in f.first.dsp_log if " ERROR] " in line]
    if f.dsp_log:
        cx.fact("DSP log (FARF; on a device only with root)", f"{len(f.dsp_log)} error lines, e.g. {f.dsp_log[0]}")
    w = op.node.src[0]
    cmd = (f"kazeia htp plan --m {f.plan.m} --k {w.ne[0]} --n {w.ne[1]} --type {f.plan.qtype} --htp-profile "
           f"{f.plan.profile} --vtcm {f.plan.vtcm}")
    head = why_it_fails(f.plan) if dies(f.plan) else describe(f.plan)
    return f"{head}; the same op under {describe(f.plan_robust)}", cmd


def threshold_step(cx: Context) -> tuple[str, str]:
    """Predict the failing M from the plan arithmetic, then confirm the boundaries with real runs."""
    from kazeia.debug.bisect import OracleJudge, bisect_m

    f = cx.findings
    op = faulting_plan(cx)
    if op is None:
        return "no HTP matmul to scan", ""
    f.m_limit = limit = m_limit(cx)
    f.predicted_ranges = failing_ranges(op, cx, limit)
    plot_plan_vs_m(cx, op, min(limit, 256), f.predicted_ranges)
    m = f.plan.m
    here = next(((lo, hi) for lo, hi in f.predicted_ranges if lo <= m <= hi), None)
    if here is None:
        return (f"plan arithmetic predicts failures for M in {f.predicted_ranges or 'none'} up to {limit}; the run's "
                f"M={m} is not in them"), ""
    death = f.death or f.first.death
    judge = OracleJudge(fail_regex=re.escape(death["message"]), isolate=False)  # the death this run showed
    # whether the faulting op dies at an M is decided by the layers up to its own: prefix runs (debug/prefix.py)
    spec = prefix_spec(cx.spec.with_(n_prompt=m, prompt=None, tokens=None), through(cx, f.faulting))
    f.m_ran = ran(cx, spec) or None
    f.m_result = bisect_m(spec, judge, fail_m=m, predicted=here, limit=limit)
    runs = f"runs of {f.m_ran}" if f.m_ran else "runs"
    if f.m_result.confirmed:
        f.failing_range = here
        cx.fact("failing prompt lengths (M)", f"{here[0]}..{here[1]} (predicted by the plan, boundaries confirmed by "
                                              f"{runs})")
    stop = f" --stop-after {spec.stop_after}" if spec.stop_after else ""
    return (f"predicted {f.predicted_ranges}; {runs}: {f.m_result.message}",
            f"kazeia bisect m ... --n-prompt {m}{stop}")


PLAN = StepDef("VTCM plan of the faulting op", plan_step, needs=("faulting", "matmul_plans"),
               gives=("plan", "plan_robust", "dsp_log"))
THRESHOLD = StepDef("failing prompt lengths", threshold_step, needs=("plan",),
                    gives=("m_limit", "predicted_ranges", "m_result", "failing_range", "m_ran"))
