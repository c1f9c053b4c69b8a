"""Investigation steps when the run completes (or an op reports an error) but the numbers are wrong."""

from __future__ import annotations

from kazeia.debug.investigate import Context, logits_nmse
from kazeia.debug.investigate_steps import cpu_nodes_spec, dump_op, out, validate_gate
from kazeia.debug.runner import run


def compare(cx: Context) -> tuple[str, str]:
    from kazeia.debug.compare import compare as do_compare
    from kazeia.debug.compare import compare_command, plot_errors

    rep = do_compare(cx.spec, mode="both")
    cx.findings["compare"] = rep
    first = rep.first_failure
    if first is not None:
        cx.findings["first_bad"] = first.name
        cx.inv.facts["first op out of tolerance"] = (f"{first.name} ({first.op}, {first.backend}/{first.path}): "
                                                    f"{first.reason}")
    if rep.logits_nmse is not None:
        cx.inv.facts["logits NMSE vs float64 reference"] = rep.logits_nmse
    try:
        cx.inv.images["Error along the graph (isolated and cumulative)"] = plot_errors(rep, out(cx, "errors.png"))
    except Exception as e:  # plotting is optional (matplotlib)
        cx.inv.notes.append(f"no error plot: {e}")
    return (f"first op out of tolerance: {first.name} ({first.reason})" if first else "no op out of tolerance"), \
        compare_command(cx.spec)


def replay(cx: Context) -> tuple[str, str]:
    from kazeia.debug.replay import replay as do_replay

    name = cx.findings.get("first_bad")
    if not name:
        return "no op to dump", ""
    d, dumps = dump_op(cx, name, "complete")
    if not dumps:
        return f"{name} was not captured", ""
    res = do_replay(dumps[0], with_context=True)
    cx.findings["replay"] = res
    return f"{res.verdict()} -> {res.diagnosis()}", f"kazeia replay {d} --with-context"


def routing(cx: Context) -> tuple[str, str]:
    name = cx.findings.get("first_bad")
    if not name:
        return "nothing to route", ""
    spec = cpu_nodes_spec(cx, [name])
    r = run(spec)
    e = logits_nmse(r.logits, cx.reference_logits)
    cx.findings["route_first_bad"] = {"ok": r.ok, "nmse": e}
    return (f"with {name} on the CPU: {'completes' if r.ok else r.signature()}"
            + (f", logits NMSE vs CPU {e:.3g}" if e is not None else "")), spec.command()


def gate(cx: Context) -> tuple[str, str]:
    """Route every op like the first bad one (same op on the same path) to the CPU, and validate."""
    rep = cx.findings.get("compare")
    first = rep.first_failure if rep else None
    if first is None:
        return "no gate needed", ""
    same = [r.name for r in rep.rows.get("isolated", []) if r.op == first.op and r.path == first.path]
    spec = cpu_nodes_spec(cx, same or [first.name])
    ok = validate_gate(cx, spec, f"route the {len(same) or 1} {first.op} ops that ran on {first.backend}/"
                                 f"{first.path} to the CPU")
    return f"{'validated' if ok else 'NOT validated'}", spec.command()


def verdict(cx: Context) -> None:
    f = cx.findings
    first = f.get("first_bad")
    det = f.get("determinism")
    rp = f.get("replay")
    parts = [cx.inv.outcome + "."]
    if first:
        parts.append(f"The first op out of tolerance (each op fed the float64 reference's inputs) is {first}.")
    if det is not None:
        parts.append("The run is deterministic." if det.deterministic else
                     f"The run is NOT deterministic: {det.message}.")
    if rp is not None and rp.diagnosis():
        parts.append(f"Replay: {rp.diagnosis()}.")
    if cx.inv.gate:
        parts.append(f"Gate: {cx.inv.gate['description']} "
                     f"({'validated' if cx.inv.gate.get('validated') else 'NOT validated'}).")
    cx.inv.verdict = " ".join(parts)
