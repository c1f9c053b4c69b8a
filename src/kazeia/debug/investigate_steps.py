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

    cx.step("localise with one-op batches (sync)", lambda: D.localise(cx))
    cx.step("what the logs would have blamed", lambda: D.misattribution(cx))
    cx.step("trace up to the fault", lambda: D.trace_summary(cx))
    cx.step("determinism", lambda: D.determinism(cx))
    cx.step("dump the faulting op (completion vs enqueue time)", lambda: D.dump(cx))
    cx.step("replay alone and with batch context", lambda: D.replay(cx))
    cx.step("route op classes away", lambda: D.routing(cx))
    cx.step("VTCM plan of the faulting op", lambda: D.plan(cx))
    cx.step("failing prompt lengths", lambda: D.threshold(cx))
    cx.step("rows: values or row count?", lambda: D.rows(cx))
    cx.step("gate", lambda: D.gate(cx))
    from kazeia.debug.hypotheses import evaluate_death

    evaluate_death(cx)


# ----------------------------------------------------------------------------------------------------------
# wrong numbers


def numeric_branch(cx: Context) -> None:
    from kazeia.debug import investigate_numeric as N

    cx.step("compare against the float64 reference (isolated and cumulative)", lambda: N.compare(cx))
    cx.step("determinism", lambda: N.determinism(cx))
    cx.step("dump and replay the first bad op", lambda: N.replay(cx))
    cx.step("route the first bad op away", lambda: N.routing(cx))
    cx.step("gate", lambda: N.gate(cx))
    from kazeia.debug.hypotheses import evaluate_numeric

    evaluate_numeric(cx)


# ----------------------------------------------------------------------------------------------------------
# nothing wrong


def healthy_branch(cx: Context) -> None:
    def det():
        from kazeia.debug.determinism import check_determinism

        rep = check_determinism(cx.spec, n_runs=2)
        cx.findings["determinism"] = rep
        return rep.message, cx.spec.command()

    cx.step("determinism", det)
    rep = cx.findings.get("determinism")
    e = cx.findings.get("logits_nmse")
    cx.inv.verdict = (f"No fault: the run completes on {cx.spec.device}"
                      f"{' (' + cx.spec.htp_profile + ')' if cx.spec.htp_profile else ''}, its logits match the CPU "
                      f"backend (NMSE {e:.3g}), and it is "
                      f"{'deterministic' if rep is not None and rep.deterministic else 'NOT deterministic'}.")
    cx.inv.facts["logits NMSE vs CPU"] = e


def model_args(spec: RunSpec):
    from kazeia.debug.runner import load_model

    return load_model(spec.model_path).args


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
