"""The routing gate the evidence points at, validated by rerunning the investigated configuration with it: the
run must complete and its logits must pass the judge against the CPU reference."""

from __future__ import annotations

from kazeia.backends.htp import MAX_SRC1_ROWS
from kazeia.debug.investigate.common import cpu_nodes_spec, cpu_ops_spec, rerun
from kazeia.debug.investigate.facts import OpPlan, dies
from kazeia.debug.investigate.table import Context, StepDef
from kazeia.debug.investigate.vtcm import failing_ranges, m_limit, runs
from kazeia.engine.session import RunSpec
from kazeia.limits import MAX_PATTERN


def validate(cx: Context, spec: RunSpec, description: str) -> bool:
    r, v = rerun(cx, spec)
    ok = bool(r.ok and v is not None and v.ok)
    evidence = f"rerun with the gate {'completes' if r.ok else 'still fails: ' + r.signature()}"
    if v is not None:
        evidence += f", logits vs CPU: {v.reason}"
    cx.inv.gate = {"description": description, "flags": spec.command(), "validated": ok, "evidence": evidence}
    return ok


def _ranges_text(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(f"{lo}..{hi}" if lo != hi else str(lo) for lo, hi in ranges) or "none"


def overflow_groups(cx: Context) -> list[tuple[str, list[str], list[tuple[int, int]]]]:
    """(weight, its nodes in this run, the M ranges whose plan dies) for every MUL_MAT family of the run whose HMX
    plan dies at the run's M: from the plans, never from a story."""
    by_family: dict[str, list[OpPlan]] = {}
    for p in cx.findings.dying_plans():
        by_family.setdefault(p.family, []).append(p)
    limit = m_limit(cx)
    return [(fam, list(dict.fromkeys(p.name for p in ops)), failing_ranges(ops[0], cx, limit))
            for fam, ops in by_family.items()]


def death_gate(cx: Context) -> tuple[str, str]:
    f = cx.findings
    if cx.inv.gate.get("validated"):  # a narrower gate (by address) already validated
        return f"kept the validated gate: {cx.inv.gate['description'].split('. ')[0]}", cx.inv.gate.get("flags", "")
    if f.plan is not None and dies(f.plan):
        groups = overflow_groups(cx)
        by_range: dict[str, list[str]] = {}
        for fam, nodes, r in groups:
            by_range.setdefault(_ranges_text(r), []).append(f"{fam} ({', '.join(nodes)})")
        which = "; ".join(f"{', '.join(fams)} at M {r}" for r, fams in by_range.items())
        union = sorted({m for _, _, r in groups for lo, hi in r for m in range(lo, hi + 1)})
        desc = ("Before enqueueing a MUL_MAT, compute its HMX VTCM plan on the host (plan_for_node: the arithmetic "
                "the DSP runs) and keep on the CPU every MUL_MAT whose plan would not fit. In this run that is "
                f"{which}. On a device the equivalent is routing those matmuls to HVX/CPU at those M, or choosing "
                f"-ub so that no micro-batch has M in {_ranges_text(runs(union))}.")
        spec = cx.spec.with_(gates=["vtcm-plan"])
        ok = validate(cx, spec, desc)
        return f"gate vtcm-plan: {'validated' if ok else 'NOT validated'}", spec.command()
    weight = f.faulting_facts.weight if f.faulting_facts is not None else None
    if weight:
        g = f"weight=^{weight}$,m=1-{MAX_SRC1_ROWS}"
        spec = cx.spec.with_(gates=[g])
    else:
        g, spec = f"--cpu-nodes {f.faulting}", cpu_nodes_spec(cx, [f.faulting])
    ok = validate(cx, spec, f"route {f.faulting} to the CPU")
    return f"gate {g}: {'validated' if ok else 'NOT validated'}", spec.command()


def numeric_gate(cx: Context) -> tuple[str, str]:
    """Route every op like the first bad one (same op on the same path) to the CPU."""
    rep = cx.findings.compare
    first = rep.first_failure
    # the compared rows of every micro-batch: a node of several micro-batches is one node to route
    same = list(dict.fromkeys(r.name for r in rep.rows.get("isolated", []) if r.op == first.op
                              and r.path == first.path)) or [first.name]
    spec = cpu_nodes_spec(cx, same)
    what = f"the {len(same)} {first.op} node{'s' if len(same) > 1 else ''} that ran on {first.backend}/{first.path}"
    if len(spec.cpu_nodes) > MAX_PATTERN:  # a node list past kazeia's own regex limit: the class rule instead
        spec = cpu_ops_spec(cx, first.op)  # (beside the user's own --cpu-ops)
        what = (f"every {first.op} node (a class rule: a list of its {len(same)} nodes would exceed the "
                f"{MAX_PATTERN} characters of --cpu-nodes)")
    ok = validate(cx, spec, f"route {what} to the CPU")
    return f"{'validated' if ok else 'NOT validated'}", spec.command()



DEATH_GATE = StepDef("gate", death_gate, needs=("faulting",))
NUMERIC_GATE = StepDef("gate", numeric_gate, needs=("first_bad", "compare"))
