"""Wrong numbers: every op against the float64 reference, isolated (each op fed REF's inputs) and cumulative."""

from __future__ import annotations

from kazeia.debug.investigate.table import Context, StepDef


def compare_step(cx: Context) -> tuple[str, str]:
    from kazeia.debug.compare import compare, compare_command
    from kazeia.debug.plots import plot_errors

    f = cx.findings
    rep = f.compare = compare(cx.spec, mode="both")
    first = rep.first_failure
    if first is not None:
        f.first_bad = first.name
        cx.fact("first op out of tolerance", f"{first.name} ({first.op}, {first.backend}/{first.path}): {first.reason}")
    for mode, e in rep.logits_nmse.items():
        if e is not None:
            cx.fact(f"logits NMSE vs float64 reference ({mode})", e)
    try:
        cx.inv.images["Error along the graph (isolated and cumulative)"] = plot_errors(rep, cx.out("errors.png"))
    except Exception as e:  # plotting is optional (matplotlib)
        cx.inv.notes.append(f"no error plot: {e}")
    summary = f"first op out of tolerance: {first.name} ({first.reason})" if first else "no op out of tolerance"
    return summary, compare_command(cx.spec)


COMPARE = StepDef("compare against the float64 reference (isolated and cumulative)", compare_step,
                  gives=("compare", "first_bad"))
