"""Move op classes, or single ops, off the device and see whether the fault follows them.

A device death is decided by the ops enqueued up to it, so a trial of a death runs the graph only through the end
of the layer of the last op it asks about (the faulting op, the op it moves, the op the death may move to: a
prefix run, engine/prefix.py); each trial says what it ran."""

from __future__ import annotations

from kazeia.debug.investigate.common import cpu_nodes_spec, prefix_spec, ran, rerun, through
from kazeia.debug.investigate.findings import (
    ALL_MATMUL_CPU,
    BLAMED_CPU,
    FAULTING_CPU,
    FIRST_BAD_CPU,
    FLASH_ATTN_CPU,
    HMX_OFF,
    RoutingTrial,
)
from kazeia.debug.investigate.table import Context, StepDef
from kazeia.engine.session import RunSpec


def _trial(cx: Context, kind: str, label: str, spec: RunSpec, node: str | None = None) -> RoutingTrial:
    r, logits = rerun(cx, spec)
    died_in = r.death.get("faulting") if r.death else None
    return RoutingTrial(kind, label, node, bool(r.death), died_in, None if r.death else r.error, logits,
                        spec.command(), ran(cx, spec))


def next_dying(cx: Context, after: str) -> str | None:
    """The first op after `after` in graph order whose HMX plan dies (where a death moves to when `after` leaves
    the device), or None."""
    order = cx.findings.graph_order or []
    if after not in order:
        return None
    dying = {p.name for p in cx.findings.dying_plans()}
    return next((n for n in order[order.index(after) + 1:] if n in dying), None)


def route_classes(cx: Context) -> tuple[str, str]:
    f, spec = cx.findings, cx.spec
    upto = through(cx, f.faulting)
    trials = [(HMX_OFF, "HMX off (GGML_HEXAGON_USE_HMX=0)",
               prefix_spec(spec.with_(env={**spec.env, "GGML_HEXAGON_USE_HMX": "0"}), upto), None),
              (ALL_MATMUL_CPU, "all MUL_MAT on the CPU", prefix_spec(spec.with_(cpu_ops="MUL_MAT"), upto), None),
              (FLASH_ATTN_CPU, "FLASH_ATTN_EXT on the CPU", prefix_spec(spec.with_(cpu_ops="FLASH_ATTN_EXT"), upto),
               None)]
    if f.faulting:
        moved = through(cx, f.faulting, next_dying(cx, f.faulting))
        trials.append((FAULTING_CPU, f"only {f.faulting} on the CPU",
                       prefix_spec(cpu_nodes_spec(cx, [f.faulting]), moved), f.faulting))
    team = f.last_enqueued_team
    if team and team != f.faulting and f.facts.ops.get(team) and f.facts.ops[team].op == "MUL_MAT":
        trials.append((BLAMED_CPU, f"only {team} on the CPU (what the logs blamed)",
                       prefix_spec(cpu_nodes_spec(cx, [team]), through(cx, f.faulting, team)), team))
    f.routing = [_trial(cx, *t) for t in trials]
    return "; ".join(f"{t.label}: {t.outcome()}" for t in f.routing), ""


def route_first_bad(cx: Context) -> tuple[str, str]:
    f = cx.findings
    spec = cpu_nodes_spec(cx, [f.first_bad])
    f.routing = [_trial(cx, FIRST_BAD_CPU, f"only {f.first_bad} on the CPU", spec, f.first_bad)]
    return f"with {f.first_bad} on the CPU the run {f.routing[0].outcome()}", spec.command()


ROUTE_CLASSES = StepDef("route op classes away", route_classes, needs=("facts",), gives=("routing",))
ROUTE_FIRST_BAD = StepDef("route the first bad op away", route_first_bad, needs=("first_bad",), gives=("routing",))
