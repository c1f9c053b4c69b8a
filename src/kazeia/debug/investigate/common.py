"""Helpers the steps share: rerun specs (one-op batches, nodes on the CPU), op dumps, the run outcome in
words, and a rerun judged against the CPU reference."""

from __future__ import annotations

import re

from kazeia.debug.investigate.table import Context
from kazeia.debug.judge import WHOLE_MODEL_NMSE, Verdict, judge, judge_logits
from kazeia.debug.runner import RunResult, run
from kazeia.engine.prefix import layer_end, layers_text
from kazeia.engine.session import RunSpec, reference_spec

SYNC_ENV = {"GGML_HEXAGON_OPBATCH": "1", "GGML_HEXAGON_OPQUEUE": "1"}


def op_regex(name: str) -> str:
    return "^" + re.escape(name) + "$"


def sync_spec(cx: Context) -> RunSpec:
    return cx.spec.with_(env={**cx.spec.env, **SYNC_ENV})


def cpu_ops_spec(cx: Context, op: str) -> RunSpec:
    """The run with `op` on the CPU too, beside the user's own --cpu-ops."""
    ops = [o for o in (cx.spec.cpu_ops or "").split(",") if o]
    return cx.spec.with_(cpu_ops=",".join(sorted({*ops, op})))


def cpu_nodes_spec(cx: Context, names: list[str]) -> RunSpec:
    return cx.spec.with_(cpu_nodes="|".join(op_regex(n) for n in names))


def logits_verdict(cx: Context, r: RunResult) -> Verdict | None:
    """The run's logits judged against the CPU reference run (None if either is missing)."""
    return judge_logits(r.logits, cx.findings.reference_logits, name=cx.spec.device)


def judge_arrays(got, ref, op: str, name: str) -> Verdict | None:
    """A prefix run's stop output against the CPU's, by the whole-run threshold (None if either is missing)."""
    if got is None or ref is None:
        return None
    return judge(got, ref, WHOLE_MODEL_NMSE, op=op, name_a=name)


def rerun(cx: Context, spec: RunSpec) -> tuple[RunResult, Verdict | None]:
    """Run `spec`; its logits judged against the CPU reference, or for a prefix run (stop_after) its stop node's
    output against the CPU's through the same node."""
    r = run(spec)
    if spec.stop_after:
        ref = prefix_reference(cx, spec)
        return r, judge_arrays(r.stop_output, ref, op=spec.stop_after, name=spec.device)
    return r, logits_verdict(cx, r)


def through(cx: Context, *ops: str | None) -> str | None:
    """The layer end (l_out-<il>) a prefix run needs to decide what happens to `ops` (the latest of them in graph
    order): a death is decided by the ops enqueued up to it, so later layers cannot change a death's verdict.
    None (run the whole graph) when the graph order is unknown, an op is not in it, or the run generates tokens."""
    order = cx.findings.graph_order
    names = [op for op in ops if op]
    if not order or not names or cx.spec.n_predict or any(op not in order for op in names):
        return None
    return layer_end(order, max(names, key=order.index))


def prefix_spec(spec: RunSpec, stop: str | None) -> RunSpec:
    return spec.with_(stop_after=stop) if stop else spec


def ran(cx: Context, spec: RunSpec) -> str:
    """What a run covered, for the report: '' for a whole run, else 'layers 0..k of n (through l_out-k)'."""
    return layers_text(spec.stop_after, cx.findings.graph_order or []) if spec.stop_after else ""


def prefix_reference(cx: Context, spec: RunSpec):
    """The CPU reference's output of spec.stop_after (a CPU prefix run of the same prompt, made once per node)."""
    key = (spec.stop_after, spec.n_prompt, spec.prompt, tuple(spec.tokens or ()))
    refs = cx.prefix_refs
    if key not in refs:
        r = run(reference_spec(spec, device="CPU", htp_profile=None, faults=[], env={}, gates=[], policy=None,
                               cpu_ops=None, cpu_nodes=None, cpu_node_range=None))
        refs[key] = r.stop_output
    return refs[key]


def dump_op(cx: Context, name: str, at: str) -> tuple[str, list]:
    """Rerun the spec dumping the node `name` (captures `at`) under <out>/dumps: (the directory, its dumps)."""
    from kazeia.debug.dump import DumpHook, load_dump

    d = cx.out("dumps", "x")[:-2]
    hook = DumpHook(op_regex(name), d, at=at)
    run(cx.spec, hooks=(hook,))
    if not hook.entries:
        return d, []
    # this run's captures only: an output directory used before keeps the dumps of earlier investigations
    return d, [load_dump(d, op=entry) for entry in hook.entries]
