"""The steps of `kazeia investigate` (see investigate.py for the order and the shared Context)."""

from __future__ import annotations

import os

import numpy as np

from kazeia.debug.investigate import SYNC_ENV, Context, FactsHook, logits_nmse, op_regex
from kazeia.debug.runner import RunSpec, run
from kazeia.debug.thresholds import WHOLE_MODEL_NMSE


def _outcome(r) -> str:
    if r.death:
        return r.death["message"]
    if r.error:
        return f"op error: {r.error}"
    return "completed"


# ----------------------------------------------------------------------------------------------------------
# common first step


def reproduce(cx: Context) -> tuple[str, str]:
    spec = cx.spec
    ref = run(spec.with_(device="CPU", htp_profile=None, faults=[], env={}, gates=[]))
    cx.reference_logits = ref.logits
    cx.facts = FactsHook()
    r = run(spec, hooks=(cx.facts,))
    cx.first = r
    cx.inv.facts["prompt tokens (M)"] = r.n_prompt
    if r.death:
        cx.inv.outcome = f"the run died: host printed `{r.death['message']}` (from flush_pending)"
        cx.inv.fault_found = True
        return f"reproduced: {r.death['message']}; host's last enqueued op: {r.death['last_enqueued']}", \
            spec.command()
    if r.error:
        cx.inv.outcome = f"an op failed on the device: {r.error}"
        cx.inv.fault_found = True
        return cx.inv.outcome, spec.command()
    e = logits_nmse(r.logits, ref.logits)
    finite = r.logits is not None and bool(np.isfinite(r.logits).all())
    cx.findings["logits_nmse"] = e
    if not finite or e is None or e > WHOLE_MODEL_NMSE:
        cx.findings["wrong_logits"] = True
        cx.inv.fault_found = True
        cx.inv.outcome = (f"completed, but the logits are wrong: NMSE {e:.3g} vs the CPU backend "
                          f"(whole-model threshold {WHOLE_MODEL_NMSE:g})" if finite else
                          "completed, but the logits hold NaN/inf")
    else:
        cx.inv.outcome = f"completed; logits match the CPU backend (NMSE {e:.3g} <= {WHOLE_MODEL_NMSE:g})"
    return cx.inv.outcome, spec.command()


# ----------------------------------------------------------------------------------------------------------
# device death


def death_branch(cx: Context) -> None:
    from kazeia.debug import investigate_death as D
    from kazeia.debug.hypotheses import evaluate_death

    run_steps(cx, [("localise with one-op batches (sync)", D.localise),
                   ("what the logs would have blamed", D.misattribution),
                   ("trace up to the fault", D.trace_summary),
                   ("determinism", lambda c: determinism(c, 2)),
                   ("dump the faulting op (completion vs enqueue time)", D.dump),
                   ("replay alone and with batch context", D.replay),
                   ("route op classes away", D.routing),
                   ("VTCM plan of the faulting op", D.plan),
                   ("failing prompt lengths", D.threshold),
                   ("rows: values or row count?", D.rows),
                   ("gate", D.gate)])
    evaluate_death(cx)


# ----------------------------------------------------------------------------------------------------------
# wrong numbers


def numeric_branch(cx: Context) -> None:
    from kazeia.debug import investigate_numeric as N
    from kazeia.debug.hypotheses import evaluate_numeric

    run_steps(cx, [("compare against the float64 reference (isolated and cumulative)", N.compare),
                   ("determinism", lambda c: determinism(c, 3)),
                   ("dump and replay the first bad op", N.replay),
                   ("route the first bad op away", N.routing),
                   ("gate", N.gate)])
    evaluate_numeric(cx)


# ----------------------------------------------------------------------------------------------------------
# nothing wrong


def healthy_branch(cx: Context) -> None:
    cx.step("determinism", lambda: determinism(cx, 2))
    rep = cx.findings.get("determinism")
    e = cx.findings.get("logits_nmse")
    cx.inv.verdict = (f"No fault: the run completes on {cx.spec.device}"
                      f"{' (' + cx.spec.htp_profile + ')' if cx.spec.htp_profile else ''}, its logits match the CPU "
                      f"backend (NMSE {e:.3g}), and it is "
                      f"{'deterministic' if rep is not None and rep.deterministic else 'NOT deterministic'}.")
    cx.inv.facts["logits NMSE vs CPU"] = e


# ----------------------------------------------------------------------------------------------------------
# steps shared by the branches


def run_steps(cx: Context, steps) -> None:
    for title, fn in steps:
        cx.step(title, lambda fn=fn: fn(cx))


def determinism(cx: Context, n_runs: int) -> tuple[str, str]:
    from kazeia.debug.determinism import check_determinism

    rep = check_determinism(cx.spec, n_runs=n_runs)
    cx.findings["determinism"] = rep
    if not rep.deterministic and rep.first_diff is not None:
        cx.inv.facts["first op whose output differs between runs"] = rep.first_diff.name
    return rep.message, cx.spec.command()


def validate_gate(cx: Context, spec: RunSpec, description: str) -> bool:
    """Rerun the investigated configuration with the gate: it must complete and its logits must match the CPU
    reference within the whole-model threshold. Records the gate, its command and the evidence."""
    r = run(spec)
    e = logits_nmse(r.logits, cx.reference_logits)
    ok = bool(r.ok and e is not None and e <= WHOLE_MODEL_NMSE and np.isfinite(r.logits).all())
    cx.inv.gate = {"description": description, "flags": spec.command(), "validated": ok,
                   "evidence": (f"rerun with the gate {'completes' if r.ok else 'still fails: ' + r.signature()}"
                                + (f", logits NMSE vs CPU {e:.3g} (<= {WHOLE_MODEL_NMSE:g})" if e is not None else ""))}
    return ok


def out(cx: Context, *parts: str) -> str:
    p = os.path.join(cx.out_dir, *parts)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    return p


def dump_op(cx: Context, name: str, at: str) -> tuple[str, list]:
    """Rerun the spec dumping the node `name` (captures `at`) under <out>/dumps: (the directory, its dumps)."""
    from kazeia.debug.dump import DumpHook, load_dumps

    d = out(cx, "dumps", "x")[:-2]
    run(cx.spec, hooks=(DumpHook(op_regex(name), d, at=at),))
    return d, load_dumps(d)


def cpu_nodes_spec(cx: Context, names: list[str]) -> RunSpec:
    return cx.spec.with_(cpu_nodes="|".join(op_regex(n) for n in names))


def sync_spec(cx: Context) -> RunSpec:
    return cx.spec.with_(env={**cx.spec.env, **SYNC_ENV})
