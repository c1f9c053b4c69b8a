"""The first step of every investigation: run the configuration (and the CPU reference), and say what happened."""

from __future__ import annotations

from kazeia.debug.investigate.common import logits_verdict
from kazeia.debug.investigate.facts import FactsHook, PlanScan
from kazeia.debug.investigate.table import Context, StepDef
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
    if r.death:
        cx.inv.outcome = f"the run died: host printed `{r.death['message']}` (from flush_pending)"
        cx.inv.fault_found = True
        return f"reproduced: {r.death['message']}; host's last enqueued op: {r.death['last_enqueued']}", \
            spec.command()
    if r.error:
        cx.inv.outcome = f"an op failed on the device: {r.error}"
        cx.inv.fault_found = True
        return cx.inv.outcome, spec.command()
    v = f.logits = logits_verdict(cx, r)
    if v is None or not v.ok:
        cx.inv.fault_found = True
        cx.inv.outcome = f"completed, but the logits are wrong against the CPU backend: {v.reason if v else 'none'}"
    else:
        cx.inv.outcome = f"completed; logits match the CPU backend ({v.reason})"
    return cx.inv.outcome, spec.command()


REPRODUCE = StepDef("reproduce", reproduce, gives=("reference_logits", "graph_order", "first", "facts", "matmul_plans",
                                                   "logits"))
