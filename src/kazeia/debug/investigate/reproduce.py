"""The first step of every investigation: run the configuration (and the CPU reference), and say what happened."""

from __future__ import annotations

from kazeia.debug.investigate.common import logits_verdict
from kazeia.debug.investigate.facts import FactsHook, PlanScan
from kazeia.debug.investigate.table import Context, StepDef
from kazeia.debug.outcome import classify
from kazeia.debug.runner import run
from kazeia.engine.session import reference_spec


def reproduce(cx: Context) -> tuple[str, str]:
    f, spec = cx.findings, cx.spec
    scan = PlanScan(cx.settings) if cx.settings is not None else None
    ref = run(reference_spec(spec, device="CPU", htp_profile=None, faults=[], env={}, gates=[]),
              hooks=(scan,) if scan is not None else ())
    f.reference_logits = ref.logits
    f.graph_order = [p["node"] for p in ref.placements]
    f.matmul_plans = scan.plans if scan is not None else None
    f.facts = FactsHook()
    r = f.first = run(spec, hooks=(f.facts,))
    cx.fact("prompt tokens (M)", r.n_prompt)
    o = f.outcome = classify(r, ref.logits)  # the one classification every tool uses (debug/outcome.py)
    cx.inv.fault_found = o.failed
    if r.death:
        cx.inv.outcome = f"the run died ({o.kind}): host printed `{r.death['message']}` (from flush_pending)"
        return f"reproduced: {r.death['message']}; host's last enqueued op: {r.death['last_enqueued']}", \
            spec.command()
    if r.error:
        cx.inv.outcome = f"an op failed on the device ({o.kind}): {r.error}"
        return cx.inv.outcome, spec.command()
    v = f.logits = logits_verdict(cx, r)
    if o.failed:
        cx.inv.outcome = (f"completed, but with wrong numbers against the CPU backend: {o.summary}"
                          + (f" ({v.reason})" if v is not None else ""))
    else:
        cx.inv.outcome = f"completed; logits match the CPU backend ({v.reason if v else o.summary})"
    return cx.inv.outcome, spec.command()


REPRODUCE = StepDef("reproduce", reproduce, gives=("reference_logits", "graph_order", "first", "facts", "matmul_plans",
                                                   "logits", "outcome"))
