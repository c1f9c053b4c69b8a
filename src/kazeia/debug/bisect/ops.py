"""Which op: the first one whose running on the device makes the run fail.

Candidates are the nodes the device runs, in graph order. F(k) = "the first k candidates on the device, every
node from candidate k on routed to the CPU" (one `--cpu-node-range` A: rule). F(n) is the unmodified run (it
must fail) and F(0) is all-CPU (assumed to pass, checked only if the answer would be candidate 0), so the first
failing op is candidate k-1 for the smallest failing k: O(log n) runs. Node indices count ALL graph nodes (views
included), as the KZOP trace's #N and the Router's `cpu_node_ranges` do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from kazeia.debug.bisect.judges import FAIL, OTHER, Judge
from kazeia.debug.bisect.state import SearchState, spec_config, step_line, table
from kazeia.debug.trace import tensor_label
from kazeia.engine.session import RunSpec, build_context, close_backends, prompt_ids
from kazeia.errors import KazeiaError


@dataclass
class OpNode:
    index: int  # position in graph.nodes (all nodes counted)
    name: str
    op: str
    dst: str
    src: list[str]
    backend: str

    def label(self) -> str:
        return f"#{self.index} {self.name} {self.op} {self.dst} <- {', '.join(self.src)}"


def device_ops(spec: RunSpec) -> list[OpNode]:
    """The nodes the device would run, without running anything: build the first micro-batch's graph and ask
    the scheduler where each computed node goes (with the spec's own routing rules applied)."""
    ctx = build_context(spec)
    ids = prompt_ids(spec, ctx.model)
    n_tok = min(len(ids), ctx.n_ubatch)
    graph = ctx._graph_for(n_tok, ctx._n_kv(n_tok), 1).graph
    fallback = ctx.scheduler.router.fallback
    out = []
    for i, node in enumerate(graph.nodes):
        if not node.is_computed:
            continue
        backend, _ = ctx.scheduler.place(node, i)
        if backend.name != fallback:
            out.append(OpNode(i, node.name, node.desc(), tensor_label(node),
                              [tensor_label(s) for s in node.src if s is not None], backend.name))
    close_backends(ctx)
    return out


@dataclass
class OpsResult:
    verdict: str  # found | baseline-passes | fails-without-device
    message: str
    found: OpNode | None
    candidates: list[OpNode]
    steps: list[dict]
    runs: int  # bisect steps run (this invocation and earlier ones)
    new_runs: int  # steps run by this invocation
    reference_runs: int
    spec: RunSpec | None = None

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "message": self.message,
                "found": asdict(self.found) if self.found else None, "n_candidates": len(self.candidates),
                "steps": self.steps, "runs": self.runs, "new_runs": self.new_runs,
                "reference_runs": self.reference_runs, "spec": self.spec.command() if self.spec else None}


def ops_routing(candidates: list[OpNode], k: int) -> str:
    """Routing for F(k): every node from candidate k on goes to the CPU ('' = none: the unmodified run)."""
    return "" if k >= len(candidates) else f"{candidates[k].index}:"


def bisect_ops(spec: RunSpec, judge: Judge, state_path: str | None = None, max_steps: int | None = None,
               candidates: list[OpNode] | None = None, log: Callable[[str], None] | None = None) -> OpsResult:
    """Find the first op whose running on the device makes the run fail (see the module docstring)."""
    spec = spec.with_(cpu_node_range=None)
    cands = candidates if candidates is not None else device_ops(spec)
    if not cands:
        raise KazeiaError(f"nothing to bisect: no op of this run is placed on {spec.device} "
                          f"(all already run on the CPU)")
    config = {"spec": spec_config(spec), "judge": judge.describe()}
    state = SearchState(state_path, "ops", config, max_steps)
    cand_dicts = [asdict(c) for c in cands]
    if state.extra.get("candidates") not in (None, cand_dicts):
        raise KazeiaError(f"{state_path}: the graph differs from the one in the state file: use another --state")
    state.extra["candidates"] = cand_dicts
    n = len(cands)

    def probe(k: int) -> dict:
        routing = ops_routing(cands, k)
        dev = f"#{cands[0].index}..#{cands[k - 1].index} ({k} op{'s' if k > 1 else ''})" if k > 0 else "none"
        step = state.probe(f"cpu={routing}", lambda: judge(spec.with_(cpu_node_range=routing or None)), k=k,
                           device_nodes=dev, cpu_node_range=routing or "(none)")
        if log:
            log(step_line(step))
        return step

    def result(verdict: str, message: str, found: OpNode | None) -> OpsResult:
        state.result = {"verdict": verdict, "found": asdict(found) if found else None}
        state.save()
        return OpsResult(verdict, message, found, cands, list(state.steps), len(state.steps), state.new_steps,
                         judge.reference_runs if hasattr(judge, "reference_runs") else 0, spec)

    base = probe(n)
    if base["outcome"] != FAIL:
        how = "fails differently (other)" if base["outcome"] == OTHER else "passes"
        return result("baseline-passes", f"the unmodified run {how}: {base['detail']}; nothing to bisect", None)
    lo, hi = 0, n  # invariant: F(lo) passes (F(0) assumed), F(hi) fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe(mid)["outcome"] == FAIL:
            hi = mid
        else:
            lo = mid
    if hi == 1 and probe(0)["outcome"] == FAIL:
        return result("fails-without-device", "the run fails even with every candidate op on the CPU: the "
                                              "failure does not come from an op on the device", None)
    found = cands[hi - 1]
    return result("found", f"first failing op: {found.label()} on {found.backend}", found)


def format_ops(res: OpsResult) -> str:
    lines = [res.message]
    if res.found:
        lines.append(f"  index {res.found.index}  name {res.found.name}  op {res.found.op}  dst {res.found.dst}  "
                     f"src {', '.join(res.found.src)}")
    lines.append(f"runs: {res.runs} bisect step(s) over {len(res.candidates)} device ops "
                 f"(+{res.reference_runs} reference run(s)); this invocation ran {res.new_runs}")
    lines.append("")
    lines.append(table(["step", "device ops", "--cpu-node-range", "outcome", "seconds", "detail"],
                       [[s["step"], s["device_nodes"], s["cpu_node_range"], s["outcome"], f"{s['seconds']:.1f}",
                         s["detail"]] for s in res.steps]))
    if res.spec is not None and res.found is not None:
        lines.append("")
        routing = ops_routing(res.candidates, res.candidates.index(res.found) + 1) or None
        lines.append(f"reproduce the first failing step:  {res.spec.with_(cpu_node_range=routing).command()}")
    return "\n".join(lines)
