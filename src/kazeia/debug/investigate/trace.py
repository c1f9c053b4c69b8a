"""NaN-aware statistics of every op that completed (before the fault, if there was one), and of the faulting
op's inputs."""

from __future__ import annotations

from kazeia.debug.investigate.figures import FP16_MAX, plot_amax
from kazeia.debug.investigate.table import Context, StepDef


def trace_summary(cx: Context) -> tuple[str, str]:
    f = cx.findings
    facts = f.facts
    done = [facts.ops[n] for n in facts.order if facts.ops[n].out_stats is not None or facts.ops[n].in_stats]
    # the KQ mask holds -inf by design: count it apart from the activations, and its F16 cast (a copy of those
    # -inf) with it; an output counts when it holds a NaN or an infinity none of its inputs held
    f.nonfinite_before = [(o.name, s.nonfinite) for o in done
                          for s in [_new_nonfinite(o), *(x for x, nm in zip(o.in_stats, o.srcs) if "mask" not in nm)]
                          if s and s.nonfinite]
    f.amax_inputs = max((s.amax for o in done for s in o.in_stats if s), default=0.0)
    f.amax_outputs = max((o.out_stats.amax for o in done if o.out_stats), default=0.0)
    fault = f.faulting_facts or facts.fault
    f.fault_inputs = [s for s in (fault.in_stats if fault else []) if s]
    f.ops_completed = sum(1 for o in done if o.out_stats)
    where = "before the fault" if fault else "in the run"
    cx.fact(f"non-finite values {where}", len(f.nonfinite_before))
    cx.fact(f"largest |x| in any op input / output {where}", f"{f.amax_inputs:.4g} / {f.amax_outputs:.4g}")
    if f.fault_inputs:
        cx.fact("faulting op input", "; ".join(s.short() for s in f.fault_inputs))
    plot_amax(cx, done, fault)
    return (f"{f.ops_completed} ops completed {where}; {len(f.nonfinite_before)} non-finite tensors; max |input| "
            f"{f.amax_inputs:.4g}, max |output| {f.amax_outputs:.4g} (fp16 max {FP16_MAX:g})"), \
        cx.spec.command() + " --oplog"


def _new_nonfinite(o):
    """o's output statistics if they hold a non-finite value its inputs did not bring, else None."""
    out = o.out_stats
    if out is None or not out.nonfinite:
        return None
    inherited = any(s is not None and s.pinf + s.ninf for s in o.in_stats)
    return out if out.nan or not inherited else None


TRACE = StepDef("trace the run", trace_summary, needs=("facts",),
                gives=("nonfinite_before", "amax_inputs", "amax_outputs", "fault_inputs", "ops_completed"))
