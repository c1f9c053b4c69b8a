"""The investigation's figures (matplotlib, optional): activation magnitude along the graph, and the HMX plan's
VTCM headroom against M. Missing matplotlib means no figure, never a failed step."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kazeia.backends.htp import PROFILES, plan_for_node
from kazeia.debug.investigate.facts import OpFacts, OpPlan
from kazeia.debug.investigate.table import Context
from kazeia.debug.plots import new_figure
from kazeia.errors import KazeiaError

FP16_MAX = float(np.finfo(np.float16).max)


def _axes(width: float, height: float):
    try:
        fig = new_figure(width, height)
    except KazeiaError:
        return None
    return fig, fig.subplots()


def _save(cx: Context, fig, name: str, caption: str) -> None:
    fig.tight_layout()
    path = cx.out(name)
    fig.savefig(path, dpi=110)
    cx.inv.images[caption] = path


def plot_amax(cx: Context, ops: list[OpFacts], fault: OpFacts | None) -> None:
    drawn = _axes(9, 3.2)
    if drawn is None:
        return
    fig, ax = drawn
    xs = [o.index for o in ops if o.out_stats]
    ys = [max(o.out_stats.amax, 1e-12) for o in ops if o.out_stats]
    ax.semilogy(xs, ys, ".-", label="max |output| (finite values)")
    ax.axhline(FP16_MAX, color="r", ls="--", label=f"fp16 max {FP16_MAX:g}")
    if fault is not None:
        ax.axvline(fault.index, color="k", ls=":", label=f"fault: {fault.name}")
    ax.set_xlabel("node index")
    ax.set_ylabel("|x|")
    ax.legend(fontsize=8)
    _save(cx, fig, "amax.png", "Activation magnitude along the graph" + (", up to the fault" if fault else ""))


def plot_plan_vs_m(cx: Context, op: OpPlan, limit: int, ranges: list[tuple[int, int]]) -> None:
    """VTCM minus what the HMX plan uses, for every M up to `limit`, under each profile."""
    drawn = _axes(9, 3.4)
    if drawn is None:
        return
    fig, ax = drawn
    ms = list(range(1, limit + 1))
    for prof, style in zip(PROFILES, ("r.-", "g.--")):
        settings = replace(cx.settings, profile=prof)
        head = []
        for m in ms:
            p = plan_for_node(op.node, settings, m=m)
            head.append(p.vtcm - (p.hmx_attempt.used if p.hmx_attempt is not None else p.used))
        ax.plot(ms, head, style, ms=3, lw=0.8, label=f"VTCM headroom of the plan, {prof}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_yscale("symlog", linthresh=1024)
    for lo, hi in ranges:
        ax.axvspan(lo - 0.5, hi + 0.5, color="r", alpha=0.12, label=f"fails: M={lo}..{hi}")
    w = op.node.src[0]
    ax.set_xlabel("M (tokens in the micro-batch)")
    ax.set_ylabel("VTCM - used (bytes, symlog)")
    ax.set_title(f"{op.name}: K={w.ne[0]} N={w.ne[1]} {op.plan.qtype}, VTCM {op.plan.vtcm} B")
    ax.legend(fontsize=8)
    _save(cx, fig, "plan_vs_m.png", f"HMX VTCM plan size vs M for {op.name}")
