"""Bisecting a failure: which op (`bisect_ops`), which prompt lengths (`bisect_m`), which input rows (`ddmin_rows`).

Every step is a run judged pass / fail / other by a `Judge`: the built-in `OracleJudge` (the run must not die
and its logits must match the CPU within the whole-model NMSE threshold) or a `CommandJudge` (a shell
command, exit status 0 = pass, like Polygraphy's `--check`). Runs happen in child processes by default, so a
crash or a hang in one step becomes a failed step, not a dead search. A `--fail-regex` pins the failure
signature: a step that fails with another message counts as "other" (treated as passing, and reported), so
the search cannot drift to a different bug.

Searches are resumable: `SearchState` memoizes every finished step by a key that names the run exactly (the
routing string, the prompt length, the row subset) and rewrites its JSON file after each one; a search
restarted on the same file replays its decisions from the memo and only runs steps it has not finished.

ops: candidates are the nodes the device runs, in graph order. F(k) = "the first k candidates on the device,
every node from candidate k on routed to the CPU" (one `--cpu-node-range` A: rule). F(n) is the unmodified
run (it must fail) and F(0) is all-CPU (assumed to pass, checked only if the answer would be candidate 0), so
the first failing op is candidate k-1 for the smallest failing k: O(log n) runs. Node indices count ALL
graph nodes (views included), as the KZOP trace's #N and the Router's `cpu_node_ranges` do.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Protocol

import numpy as np

from kazeia.backends.weights import WeightCache
from kazeia.debug.runner import RunResult, RunSpec, build_context, prompt_ids, run, run_child
from kazeia.debug.stats import nmse
from kazeia.debug.trace import tensor_label
from kazeia.errors import KazeiaError

PASS, FAIL, OTHER = "pass", "fail", "other"
WHOLE_MODEL_NMSE = 2e-3  # test-backend-ops style threshold for whole-model outputs (logits)
STATE_VERSION = 1

# What a numeric (logits) failure says; a --fail-regex that matches none of these cannot pin a numeric
# failure, so runs that complete need no reference run.
_NUMERIC_SAMPLES = ("logits mismatch: NMSE 1 > 0.002", "logits hold NaN", "logits inf sign mismatch")


@dataclass
class Verdict:
    outcome: str  # PASS, FAIL or OTHER (failed, but not with the pinned signature)
    detail: str = ""
    seconds: float = 0.0


class Judge(Protocol):
    def __call__(self, spec: RunSpec) -> Verdict: ...

    def describe(self) -> dict: ...


def classify(text: str, fail_regex: re.Pattern | None) -> str:
    """A failed step is FAIL if it carries the pinned signature (or none is pinned), else OTHER."""
    if fail_regex is None or fail_regex.search(text):
        return FAIL
    return OTHER


def _first_line(text: str, limit: int = 160) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def failure_text(res: RunResult) -> str:
    """Everything a person could see of a failed run: the host error line, the error, the DSP's FARF log."""
    parts = []
    if res.death:
        parts.append(res.death.get("message") or "")
    if res.error:
        parts.append(res.error)
    parts += res.dsp_log
    return "\n".join(p for p in parts if p)


class OracleJudge:
    """Built-in check: the run must not die, and its logits must match the reference device (CPU) within
    `threshold` NMSE (NaN on the device side fails; NaN in the reference is an error: it cannot judge)."""

    def __init__(self, reference: str = "CPU", threshold: float = WHOLE_MODEL_NMSE, fail_regex: str | None = None,
                 timeout: float = 600.0, isolate: bool = True, cache_dir: str | None = None) -> None:
        self.reference = reference
        self.threshold = threshold
        self.fail_regex = re.compile(fail_regex) if fail_regex else None
        self.timeout = timeout
        self.isolate = isolate
        self.cache_dir = cache_dir  # reference logits are kept here (resumed searches do not redo them)
        self._refs: dict[str, np.ndarray] = {}
        self._weights = WeightCache()
        self.runs = 0  # every run made, reference runs included
        self.reference_runs = 0

    def describe(self) -> dict:
        return {"judge": "oracle", "reference": self.reference, "threshold": self.threshold,
                "fail_regex": self.fail_regex.pattern if self.fail_regex else None}

    @property
    def needs_reference(self) -> bool:
        return self.fail_regex is None or any(self.fail_regex.search(s) for s in _NUMERIC_SAMPLES)

    def _run(self, spec: RunSpec) -> RunResult:
        self.runs += 1
        if self.isolate:
            return run_child(spec, timeout=self.timeout)
        try:
            # in process, the CPU's dequantized weights (read-only) are shared between runs; device state is not
            return run(spec, ctx=build_context(spec, cache=self._weights))
        except Exception as e:  # noqa: BLE001 - in-process mode: any exception is this step's failure
            return RunResult(ok=False, error=f"{type(e).__name__}: {e}")

    def __call__(self, spec: RunSpec) -> Verdict:
        t0 = time.perf_counter()
        res = self._run(spec)
        if not res.ok:
            text = failure_text(res) or "failed"
            return Verdict(classify(text, self.fail_regex), _first_line(text), time.perf_counter() - t0)
        if not self.needs_reference or res.logits is None:
            return Verdict(PASS, "ok (death check only: the fail regex cannot match a numeric failure)",
                           time.perf_counter() - t0)
        problem = self.compare(res.logits, self.reference_logits(spec))
        if problem is None:
            return Verdict(PASS, "ok", time.perf_counter() - t0)
        return Verdict(classify(problem, self.fail_regex), problem, time.perf_counter() - t0)

    def compare(self, got: np.ndarray, ref: np.ndarray) -> str | None:
        """None if the logits pass, else why not (NaN first, then inf signs, then NMSE)."""
        got = np.asarray(got, dtype=np.float64).reshape(-1)
        ref = np.asarray(ref, dtype=np.float64).reshape(-1)
        if got.shape != ref.shape:
            return f"logits shape {got.shape} != reference {ref.shape}"
        if np.isnan(got).any():
            return f"logits hold NaN ({int(np.isnan(got).sum())} of {got.size})"
        if not np.array_equal(np.isposinf(got), np.isposinf(ref)) or not np.array_equal(np.isneginf(got),
                                                                                         np.isneginf(ref)):
            return "logits inf sign mismatch"
        fin = np.isfinite(got) & np.isfinite(ref)
        e = nmse(got[fin], ref[fin])
        if e > self.threshold:
            return f"logits mismatch: NMSE {e:.3g} > {self.threshold:g}"
        return None

    def reference_spec(self, spec: RunSpec) -> RunSpec:
        return RunSpec(model=spec.model, prompt=spec.prompt, n_prompt=spec.n_prompt, tokens=spec.tokens,
                       device=self.reference, ubatch=spec.ubatch, ctx=spec.ctx, flash_attn=spec.flash_attn,
                       n_predict=spec.n_predict)

    def reference_logits(self, spec: RunSpec) -> np.ndarray:
        rspec = self.reference_spec(spec)
        key = hashlib.blake2b(json.dumps(asdict(rspec), sort_keys=True).encode(), digest_size=8).hexdigest()
        if key in self._refs:
            return self._refs[key]
        path = os.path.join(self.cache_dir, f"ref-{key}.npy") if self.cache_dir else None
        if path and os.path.exists(path):
            self._refs[key] = np.load(path)
            return self._refs[key]
        self.reference_runs += 1
        res = self._run(rspec)
        if not res.ok or res.logits is None:
            raise KazeiaError(f"the reference run on {self.reference} failed ({res.signature()}): cannot judge; "
                              f"reproduce with: {rspec.command()}")
        if np.isnan(res.logits).any():
            raise KazeiaError(f"reference invalid: the {self.reference} logits hold NaN; reproduce with: "
                              f"{rspec.command()}")
        self._refs[key] = np.asarray(res.logits)
        if path:
            os.makedirs(self.cache_dir, exist_ok=True)
            np.save(path, self._refs[key])
        return self._refs[key]


class CommandJudge:
    """`--check CMD`: a shell command per step, exit status 0 = pass. The step's configuration reaches it as
    placeholders `{cpu_node_range}`, `{m}`, `{run}` (the step's full `kazeia run` command) and as environment
    variables KAZEIA_CPU_NODE_RANGE (which `kazeia run` also reads as its --cpu-node-range default),
    KAZEIA_BISECT_M and KAZEIA_RUN_CMD. A timeout kills the command's whole process group."""

    def __init__(self, command: str, fail_regex: str | None = None, timeout: float = 600.0) -> None:
        self.command = command
        self.fail_regex = re.compile(fail_regex) if fail_regex else None
        self.timeout = timeout
        self.runs = 0
        self.reference_runs = 0

    def describe(self) -> dict:
        return {"judge": "command", "command": self.command,
                "fail_regex": self.fail_regex.pattern if self.fail_regex else None}

    def step_env(self, spec: RunSpec) -> dict[str, str]:
        return {"KAZEIA_CPU_NODE_RANGE": spec.cpu_node_range or "",
                "KAZEIA_BISECT_M": "" if spec.n_prompt is None else str(spec.n_prompt),
                "KAZEIA_RUN_CMD": spec.command()}

    def __call__(self, spec: RunSpec) -> Verdict:
        env = self.step_env(spec)
        cmd = (self.command.replace("{cpu_node_range}", env["KAZEIA_CPU_NODE_RANGE"])
               .replace("{m}", env["KAZEIA_BISECT_M"]).replace("{run}", env["KAZEIA_RUN_CMD"]))
        self.runs += 1
        t0 = time.perf_counter()
        # own session: on a timeout the whole group (the shell and what it started) is killed, not just the shell
        proc = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **env}, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=self.timeout)
            status = _exit_status(proc.returncode)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, _ = proc.communicate()
            status = f"timed out after {self.timeout:g} s (hang)"
        except BaseException:  # Ctrl-C: its own session does not get the SIGINT, so end it before leaving
            _kill_group(proc.pid)
            proc.wait()
            raise
        seconds = time.perf_counter() - t0
        if proc.returncode == 0 and not status.startswith("timed out"):
            return Verdict(PASS, "exit status 0", seconds)
        text = f"{status}\n{out or ''}"
        tail = [x for x in (out or "").strip().splitlines() if x.strip()][-1:]
        detail = status + (f": {tail[0].strip()[:140]}" if tail else "")
        return Verdict(classify(text, self.fail_regex), detail, seconds)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _exit_status(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    if rc > 128:  # a shell reports a child killed by signal N as 128+N
        try:
            return f"exit status {rc} ({signal.Signals(rc - 128).name})"
        except ValueError:
            pass
    return f"exit status {rc}"


# ---------------------------------------------------------------------------------------------------------
# resumable state


class BisectInterrupted(KazeiaError):
    """The step budget (--max-steps) ran out; the state file holds every finished step."""

    exit_code = 4


class SearchState:
    """Finished steps of one search, memoized by key and rewritten to `path` (JSON) after every step."""

    def __init__(self, path: str | None, kind: str, config: dict, max_new_steps: int | None = None) -> None:
        self.path = path
        self.kind = kind
        self.config = config
        self.max_new_steps = max_new_steps
        self.steps: list[dict] = []
        self.new_steps = 0
        self.resumed = 0
        self.result: dict | None = None
        self.extra: dict = {}
        if path and os.path.exists(path):
            self._load(path)

    def _load(self, path: str) -> None:
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise KazeiaError(f"{path}: not a readable bisect state file ({e})") from None
        if d.get("version") != STATE_VERSION or d.get("kind") != self.kind:
            raise KazeiaError(f"{path}: state of a '{d.get('kind')}' search (version {d.get('version')}), "
                              f"not of this '{self.kind}' search: use another --state file")
        if d.get("config") != _jsonable(self.config):
            raise KazeiaError(f"{path}: the state was written for a different configuration (model, device, "
                              f"check or regex differ): use another --state file or delete it")
        self.steps = d.get("steps", [])
        self.extra = d.get("extra", {})
        self.resumed = len(self.steps)

    @property
    def memo(self) -> dict[str, dict]:
        return {s["key"]: s for s in self.steps}

    def probe(self, key: str, judge: Callable[[], Verdict], **info) -> dict:
        """The step for `key`: from the memo if finished before, else judged now and saved."""
        done = self.memo.get(key)
        if done is not None:
            return {**done, "resumed": True}  # a copy: the saved step stays as it was
        if self.max_new_steps is not None and self.new_steps >= self.max_new_steps:
            self.save()
            raise BisectInterrupted(f"stopped after {self.new_steps} new step(s) (--max-steps); "
                                    f"resume with the same --state {self.path or '(none)'}")
        v = judge()
        step = {"step": len(self.steps) + 1, "key": key, **info, "outcome": v.outcome, "detail": v.detail,
                "seconds": round(v.seconds, 3)}
        self.steps.append(step)
        self.new_steps += 1
        self.save()
        return step

    def save(self) -> None:
        if not self.path:
            return
        d = {"version": STATE_VERSION, "kind": self.kind, "config": _jsonable(self.config), "steps": self.steps,
             "extra": self.extra, "result": self.result}
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(d, f, indent=1)
        os.replace(tmp, self.path)  # atomic: an interrupted write never leaves a half state


def _jsonable(x):
    return json.loads(json.dumps(x))


def _spec_config(spec: RunSpec) -> dict:
    """The spec's non-default fields: a field added to RunSpec later (with a default) keeps old states valid."""
    defaults = {f.name: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
                for f in fields(RunSpec)}
    return {k: v for k, v in asdict(spec).items() if k not in defaults or v != defaults[k]}


# ---------------------------------------------------------------------------------------------------------
# ops


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
    for b in ctx.scheduler.backends:
        b.close()
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
    config = {"spec": _spec_config(spec), "judge": judge.describe()}
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
            log(_step_line(step))
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


def _step_line(step: dict) -> str:
    done = " (from the state file)" if step.get("resumed") else ""
    return f"step {step['step']}: {step['key']} -> {step['outcome']} ({step['detail']}){done}"


def format_ops(res: OpsResult) -> str:
    lines = [res.message]
    if res.found:
        lines.append(f"  index {res.found.index}  name {res.found.name}  op {res.found.op}  dst {res.found.dst}  "
                     f"src {', '.join(res.found.src)}")
    lines.append(f"runs: {res.runs} bisect step(s) over {len(res.candidates)} device ops "
                 f"(+{res.reference_runs} reference run(s)); this invocation ran {res.new_runs}")
    lines.append("")
    lines.append(_table(["step", "device ops", "--cpu-node-range", "outcome", "seconds", "detail"],
                        [[s["step"], s["device_nodes"], s["cpu_node_range"], s["outcome"], f"{s['seconds']:.1f}",
                          s["detail"]] for s in res.steps]))
    if res.spec is not None and res.found is not None:
        lines.append("")
        routing = ops_routing(res.candidates, res.candidates.index(res.found) + 1) or None
        lines.append(f"reproduce the first failing step:  {res.spec.with_(cpu_node_range=routing).command()}")
    return "\n".join(lines)


def _table(head: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in r] for r in [head, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head) - 1)]
    out = []
    for r in cells:
        out.append("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1])
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------
# prompt length M


@dataclass
class MResult:
    verdict: str  # found | confirmed | no-failure
    message: str
    smallest: int | None
    largest: int | None
    largest_capped: bool  # the largest failing M reached the search limit
    confirmed: bool | None  # predicted range: confirmed (True), refuted (False), not asked (None)
    steps: list[dict]
    runs: int
    new_runs: int
    reference_runs: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def bisect_m(spec: RunSpec, judge: Judge, fail_m: int | None = None, pass_m: int = 1, limit: int = 1024,
             predicted: tuple[int, int] | None = None, state_path: str | None = None,
             max_steps: int | None = None, log: Callable[[str], None] | None = None) -> MResult:
    """The smallest and largest failing prompt length around `fail_m` (default: the spec's --n-prompt).

    Below: from `pass_m` (halved while it fails) binary search up to the boundary. Above: double from the
    failing M until a run passes or `limit` (capped by the context) is reached, then binary search. With
    `predicted=(lo, hi)` only M-1, M, M+1 at both ends are run; if they do not show exactly that range the
    full search continues from what they showed. The memo is shared: steps already run are never rerun."""
    base = spec.with_(prompt=None, tokens=None, n_prompt=None)
    limit = max(1, min(limit, spec.ctx))
    config = {"spec": _spec_config(base), "judge": judge.describe()}
    state = SearchState(state_path, "m", config, max_steps)

    def fails(m: int) -> bool:
        step = state.probe(f"m={m}", lambda: judge(base.with_(n_prompt=m)), m=m)
        if log:
            log(_step_line(step))
        return step["outcome"] == FAIL

    def result(verdict: str, message: str, lo: int | None, hi: int | None, capped: bool = False,
               confirmed: bool | None = None) -> MResult:
        state.result = {"verdict": verdict, "smallest": lo, "largest": hi, "confirmed": confirmed}
        state.save()
        return MResult(verdict, message, lo, hi, capped, confirmed, list(state.steps), len(state.steps),
                       state.new_steps, getattr(judge, "reference_runs", 0))

    confirmed = None
    if predicted is not None:
        lo, hi = predicted
        if not 1 <= lo <= hi <= limit:
            raise KazeiaError(f"predicted range {lo}..{hi} is not within 1..{limit}")
        if _confirm(fails, lo, hi, limit):
            return result("confirmed", f"predicted range confirmed: M = {lo}..{hi} fail, "
                                       f"{lo - 1 if lo > 1 else '-'} and {hi + 1 if hi < limit else '-'} pass",
                          lo, hi, confirmed=True)
        confirmed = False
        if fail_m is None:  # search from a failing point the confirmation found
            fail_m = next((s["m"] for s in state.steps if s["outcome"] == FAIL), None)
    if fail_m is None:
        fail_m = spec.n_prompt
    if fail_m is None:
        raise KazeiaError("bisect m needs a failing prompt length: --n-prompt M (or --fail M)")
    if not fails(fail_m):
        return result("no-failure", f"M={fail_m} does not fail: give a failing --n-prompt", None, None,
                      confirmed=confirmed)
    smallest = _lower_boundary(fails, min(pass_m, fail_m - 1) if fail_m > 1 else 0, fail_m)
    largest, capped = _upper_boundary(fails, fail_m, limit)
    pre = "predicted range refuted; " if confirmed is False else ""
    above = f"{largest} (the limit {limit}: larger M not tried)" if capped else f"{largest}"
    return result("found", f"{pre}failing prompt lengths: smallest M = {smallest}, largest M = {above}",
                  smallest, largest, capped, confirmed)


def _confirm(fails: Callable[[int], bool], lo: int, hi: int, limit: int) -> bool:
    expect: dict[int, bool] = {}
    for m in (lo - 1, lo, lo + 1, hi - 1, hi, hi + 1):
        if 1 <= m <= limit:
            expect[m] = lo <= m <= hi
    for m, want in sorted(expect.items()):
        if fails(m) != want:
            return False
    return True


def _lower_boundary(fails: Callable[[int], bool], p: int, f: int) -> int:
    """Smallest failing M of the failing run containing f; p < f is a first guess at a passing M (0 = none)."""
    while p >= 1 and fails(p):  # the guess fails too: look further down
        f, p = p, p // 2
    while f - p > 1:  # p passes (or is 0), f fails
        mid = (p + f) // 2
        if fails(mid):
            f = mid
        else:
            p = mid
    return f


def _upper_boundary(fails: Callable[[int], bool], f: int, limit: int) -> tuple[int, bool]:
    p = None
    while p is None:
        nxt = min(2 * f, limit)
        if nxt <= f:
            return f, True
        if fails(nxt):
            f = nxt
        else:
            p = nxt
    while p - f > 1:
        mid = (p + f) // 2
        if fails(mid):
            f = mid
        else:
            p = mid
    return f, False


def format_m(res: MResult) -> str:
    lines = [res.message, f"runs: {res.runs} step(s) (+{res.reference_runs} reference run(s)); this invocation "
                          f"ran {res.new_runs}", ""]
    lines.append(_table(["step", "M", "outcome", "seconds", "detail"],
                        [[s["step"], s["m"], s["outcome"], f"{s['seconds']:.1f}", s["detail"]] for s in res.steps]))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# rows (delta debugging over the rows of an op's activation)


# replay(rows_subset [m, K], indices into the original rows or None for synthetic values) -> verdict
Replay = Callable[[np.ndarray, "list[int] | None"], Verdict]


@dataclass
class RowsResult:
    verdict: str  # found | full-passes
    message: str
    minimal: list[int]  # row indices of the minimal failing subset (into the original rows)
    n_rows: int
    depends_on: str | None  # "row count" | "values" | None
    method: str = ""  # "row count" (prefix bisection after the value checks) or "ddmin"
    value_checks: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    runs: int = 0
    new_runs: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _rows_key(idx: list[int]) -> str:
    """A compact, exact key for a subset: runs of consecutive indices as a-b."""
    parts, i = [], 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        parts.append(str(idx[i]) if i == j else f"{idx[i]}-{idx[j]}")
        i = j + 1
    return "rows=" + ",".join(parts)


def ddmin(items: list[int], fails: Callable[[list[int]], bool]) -> list[int]:
    """Zeller's delta debugging: a 1-minimal failing subset of `items` (which must fail as a whole): removing
    any single item from the result makes it pass. Subsets keep the original order."""
    c = list(items)
    n = 2
    while len(c) >= 2:
        chunks = _split(c, n)
        reduced = False
        for ch in chunks:  # a chunk alone fails: keep only it
            if fails(ch):
                c, n, reduced = ch, 2, True
                break
        if not reduced:
            for ch in chunks:  # the rest without a chunk fails: drop the chunk
                drop = set(ch)
                comp = [x for x in c if x not in drop]
                if fails(comp):
                    c, n, reduced = comp, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(c):
                break
            n = min(len(c), 2 * n)
    return c


def _split(c: list[int], n: int) -> list[list[int]]:
    n = min(n, len(c))
    k, r = divmod(len(c), n)
    out, start = [], 0
    for i in range(n):
        size = k + (1 if i < r else 0)
        out.append(c[start:start + size])
        start += size
    return out


def ddmin_rows(rows: np.ndarray, replay: Replay, state_path: str | None = None, config: dict | None = None,
               max_steps: int | None = None, seed: int = 0, shortcut: bool = True,
               log: Callable[[str], None] | None = None) -> RowsResult:
    """Minimal failing subset of the rows of an op's activation (`rows`: [n_rows, K], what src1 held).

    With `shortcut`, the values are tested first: if all-zero rows and random rows (same count, same scale)
    fail like the real ones, the failure looks value-independent and the smallest failing row count is found
    by bisection over prefixes (O(log n) replays, confirmed with zeros and random rows at that count);
    otherwise, or if the confirmation fails, ddmin (Zeller) reduces the real rows, and the same value checks
    are made on its result. Every replay is a resumable step (see SearchState)."""
    rows = np.asarray(rows)
    n_rows = int(rows.shape[0])
    state = SearchState(state_path, "rows", config or {"n_rows": n_rows}, max_steps)
    scale = float(np.nanstd(rows.astype(np.float64))) if rows.size else 1.0
    scale = scale if np.isfinite(scale) and scale > 0 else 1.0

    def probe(key: str, data: Callable[[], np.ndarray], idx: list[int] | None, **info) -> dict:
        step = state.probe(key, lambda: replay(data(), idx), **info)
        if log:
            log(_step_line(step))
        return step

    def fails(idx: list[int]) -> bool:
        return probe(_rows_key(idx), lambda: rows[idx], idx, rows=len(idx))["outcome"] == FAIL

    def value_checks(m: int) -> list[dict]:
        rng = np.random.default_rng(seed + m)
        return [probe(f"zeros={m}", lambda: np.zeros((m, *rows.shape[1:]), rows.dtype), None, rows=m,
                      values="zeros"),
                probe(f"random={m}/{seed}",
                      lambda: (rng.standard_normal((m, *rows.shape[1:])) * scale).astype(rows.dtype), None,
                      rows=m, values="random")]

    def result(verdict: str, message: str, minimal: list[int], depends: str | None, method: str,
               checks: list[dict]) -> RowsResult:
        state.result = {"verdict": verdict, "minimal": minimal, "depends_on": depends, "method": method}
        state.save()
        return RowsResult(verdict, message, minimal, n_rows, depends, method, checks, list(state.steps),
                          len(state.steps), state.new_steps)

    everything = list(range(n_rows))
    if not fails(everything):
        return result("full-passes", "the replay with all rows does not fail: nothing to reduce", [], None, "", [])
    if shortcut and all(c["outcome"] == FAIL for c in value_checks(n_rows)):
        lo, hi = 0, n_rows  # a prefix of lo rows passes (0 rows: nothing to run), of hi rows fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fails(everything[:mid]):
                hi = mid
            else:
                lo = mid
        checks = value_checks(hi)
        if all(c["outcome"] == FAIL for c in checks):
            minimal = everything[:hi]
            return result("found", f"the failure depends on the row count only: any {hi} of the {n_rows} rows "
                                   f"fail (the first {hi}, {hi} zero rows and {hi} random rows all fail; "
                                   f"{hi - 1} rows pass)", minimal, "row count", "row count", checks)
    minimal = ddmin(everything, fails)
    m = len(minimal)
    checks = value_checks(m)
    count_only = all(c["outcome"] == FAIL for c in checks)
    why = ("the row count only (zeros and random rows of the same count fail too)" if count_only
           else "the values")
    msg = f"minimal failing subset: {m} of {n_rows} rows ({_rows_key(minimal)[5:]}); it depends on {why}"
    return result("found", msg, minimal, "row count" if count_only else "values", "ddmin", checks)


# --- wiring to op dumps (kazeia.debug.dump / kazeia.debug.replay) ---


ROW_WISE_OPS = frozenset({"MUL_MAT"})  # output row i depends only on src1 row i: a subset's reference is a slice


def _with_rows(dump, values: np.ndarray):
    """The dump with src1 replaced by `values` (ne3, ne2, m, ne0) and the output shrunk to m rows."""
    from kazeia.debug.dump import TensorRecord

    m = int(values.shape[2])

    def shrink(meta: dict) -> dict:
        ne, nb = list(meta["ne"]), list(meta["nb"])
        ne[1] = m
        nb[2] = nb[1] * ne[1]
        nb[3] = nb[2] * ne[2]
        return dict(meta, ne=ne, nb=nb)

    src1 = dump.sources[1]
    sources = list(dump.sources)
    sources[1] = TensorRecord(shrink(src1.meta), np.ascontiguousarray(values))  # gap bytes (span) dropped
    manifest = dict(dump.manifest, node=shrink(dump.node))
    return replace(dump, manifest=manifest, sources=sources, output=None, output_before=None)


def dump_rows_replay(dump, device: str | None = None, htp_profile: str | None = None, vtcm: int | None = None,
                     faults: list[str] | None = None, env: dict[str, str] | None = None,
                     fail_regex: str | None = None) -> tuple[np.ndarray, Replay, dict]:
    """(rows, replay, config) for `ddmin_rows` from a dumped op (a `kazeia.debug.dump.Dump` or its path).

    The op runs alone (fresh device, as `kazeia replay` does) with src1 cut to the chosen rows; it fails if
    the device dies or errs, or its output misses the float64 reference by more than the op's threshold (for
    row-wise ops the reference of a subset is the matching slice of the full one, computed once)."""
    from kazeia.debug import replay as R
    from kazeia.debug.dump import Dump, load_dump

    if not isinstance(dump, Dump):
        dump = load_dump(dump)
    if len(dump.sources) < 2 or dump.sources[1] is None or dump.sources[1].values is None:
        raise KazeiaError(f"{dump.id}: the op has no dumped src1 to reduce")
    vals = dump.sources[1].values
    if vals.ndim != 4 or vals.shape[0] != 1 or vals.shape[1] != 1 or dump.sources[1].type.name not in ("F32", "F16"):
        raise KazeiaError(f"{dump.id}: src1 must be a 2-D float matrix of rows (got {dump.sources[1].meta['type']}"
                          f"{dump.sources[1].meta['ne']})")
    if dump.node["ne"][1] != vals.shape[2]:
        raise KazeiaError(f"{dump.id}: the output does not have one row per src1 row: rows cannot be reduced")
    dev = (device or dump.backend).upper()
    dev = "HTP0" if dev == "HTP" else dev
    settings = R.htp_settings_for(dump, htp_profile, vtcm, faults, env) if dev == "HTP0" else None
    regex = re.compile(fail_regex) if fail_regex else None
    needs_ref = regex is None or any(regex.search(x) for x in ("wrong numbers: NMSE 1 > 0.0005", "NaN"))
    thr = R.dump_threshold(dump)
    full_ref: list[np.ndarray] = []

    def reference(variant, idx: list[int] | None) -> np.ndarray | None:
        if idx is not None and dump.op in ROW_WISE_OPS:
            if not full_ref:
                ex = R._alone(dump, "REF", None, mode="reference")
                if ex.output is None:
                    return None
                full_ref.append(ex.output)
            return full_ref[0][:, :, idx]
        return R._alone(variant, "REF", None, mode="reference").output

    def replay(sub: np.ndarray, idx: list[int] | None) -> Verdict:
        t0 = time.perf_counter()
        variant = _with_rows(dump, np.asarray(sub)[None, None])
        ex = R._alone(variant, dev, settings)
        if ex.died is not None or ex.error is not None or ex.status is not None:
            text = "\n".join(str(x) for x in (ex.verdict(), (ex.died or {}).get("message"), ex.error) if x)
            return Verdict(classify(text, regex), _first_line(text), time.perf_counter() - t0)
        if not needs_ref:
            return Verdict(PASS, "ok (death check only)", time.perf_counter() - t0)
        ref = reference(variant, idx)
        if ref is None:
            return Verdict(OTHER, "the float64 reference could not run", time.perf_counter() - t0)
        c = R.compare(ex.output, ref, thr, "ref")
        if c.reference_invalid:
            return Verdict(OTHER, c.reason, time.perf_counter() - t0)
        if not c.ok:
            text = f"wrong numbers: {c.short()}"
            return Verdict(classify(text, regex), text, time.perf_counter() - t0)
        return Verdict(PASS, f"ok ({c.reason})", time.perf_counter() - t0)

    config = {"dump": dump.id, "digest": dump.manifest.get("digest"), "device": dev,
              "settings": None if settings is None else {k: str(v) for k, v in asdict(settings).items()},
              "fail_regex": fail_regex}
    return np.asarray(vals[0, 0]), replay, config


def bisect_rows(dump, device: str | None = None, htp_profile: str | None = None, vtcm: int | None = None,
                faults: list[str] | None = None, fail_regex: str | None = None, state_path: str | None = None,
                max_steps: int | None = None, shortcut: bool = True, seed: int = 0,
                log: Callable[[str], None] | None = None) -> RowsResult:
    """`ddmin_rows` on a dumped op (a Dump or its path): see `dump_rows_replay` for how a subset is judged."""
    rows, replay, config = dump_rows_replay(dump, device, htp_profile, vtcm, faults, fail_regex=fail_regex)
    return ddmin_rows(rows, replay, state_path, config, max_steps, seed=seed, shortcut=shortcut, log=log)


def format_rows(res: RowsResult) -> str:
    lines = [res.message, f"runs: {res.runs} replay(s); this invocation ran {res.new_runs}", ""]
    lines.append(_table(["step", "rows", "outcome", "detail"],
                        [[s["step"], s["key"], s["outcome"], s["detail"]] for s in res.steps]))
    return "\n".join(lines)
