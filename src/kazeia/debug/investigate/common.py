"""Helpers the steps share: rerun specs (one-op batches, nodes on the CPU), op dumps, the run outcome in
words, and a rerun judged against the CPU reference."""

from __future__ import annotations

import re

from kazeia.debug.investigate.table import Context
from kazeia.debug.judge import Verdict, judge_logits
from kazeia.debug.runner import RunResult, RunSpec, run

SYNC_ENV = {"GGML_HEXAGON_OPBATCH": "1", "GGML_HEXAGON_OPQUEUE": "1"}


def op_regex(name: str) -> str:
    return "^" + re.escape(name) + "$"


def sync_spec(cx: Context) -> RunSpec:
    return cx.spec.with_(env={**cx.spec.env, **SYNC_ENV})


def cpu_nodes_spec(cx: Context, names: list[str]) -> RunSpec:
    return cx.spec.with_(cpu_nodes="|".join(op_regex(n) for n in names))


def logits_verdict(cx: Context, r: RunResult) -> Verdict | None:
    """The run's logits judged against the CPU reference run (None if either is missing)."""
    return judge_logits(r.logits, cx.findings.reference_logits, name=cx.spec.device)


def rerun(cx: Context, spec: RunSpec) -> tuple[RunResult, Verdict | None]:
    r = run(spec)
    return r, logits_verdict(cx, r)


def dump_op(cx: Context, name: str, at: str) -> tuple[str, list]:
    """Rerun the spec dumping the node `name` (captures `at`) under <out>/dumps: (the directory, its dumps)."""
    from kazeia.debug.dump import DumpHook, load_dumps

    d = cx.out("dumps", "x")[:-2]
    run(cx.spec, hooks=(DumpHook(op_regex(name), d, at=at),))
    return d, load_dumps(d)
