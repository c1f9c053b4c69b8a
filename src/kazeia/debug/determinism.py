"""Determinism check: run the same configuration N times and name the first op whose output differs.

Every run gets a fresh context (fresh backends, device session, KV cache and weight cache) with the same
spec and prompt. A hook hashes every op's output when the op has completed on its device
(`stats.tensor_hash`, i.e. on the HTP when the DSP finished it, not when it was queued), keyed by node index
and occurrence (the n-th time node #i completes: one per micro-batch). The runs are then compared op by op
in execution order: the first op whose hash is not the same in every run is where the non-determinism
starts (its inputs, the outputs of earlier ops, were identical). The final logits are compared bitwise.
Runs happen in this process by default; `isolate=True` runs each in a child process (a fresh interpreter:
process-level state such as seeding from entropy cannot leak between runs, and a crash is contained).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field

import numpy as np

from kazeia.backends.base import Hook, OpInfo
from kazeia.backends.ref import WeightCache
from kazeia.debug.outcome import classify
from kazeia.debug.runner import RunResult, run
from kazeia.debug.runner import load_array as _load_array
from kazeia.debug.stats import tensor_hash
from kazeia.engine.session import RunSpec, build_context, close_backends, shared_cache
from kazeia.errors import KazeiaError
from kazeia.graph.tensor import Tensor
from kazeia.limits import read_json_object
from kazeia.native.threads import apply_threads, child_threads


class HashHook(Hook):
    """Records a content hash of every op output at completion (and the op the device died in, if any)."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self._occ: dict[int, int] = {}

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        occ = self._occ.get(info.index, 0)
        self._occ[info.index] = occ + 1
        self.records.append({"key": f"{info.index}.{occ}", "index": info.index, "occurrence": occ,
                             "name": node.name, "op": node.desc(), "backend": info.backend, "path": info.path,
                             "hash": tensor_hash(node)})

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        occ = self._occ.get(info.index, 0)
        self.records.append({"key": f"{info.index}.{occ}", "index": info.index, "occurrence": occ,
                             "name": node.name, "op": node.desc(), "backend": info.backend, "path": "FAULT",
                             "hash": f"FAULT:{info.extra.get('kind')}"})


@dataclass
class HashedRun:
    ok: bool
    signature: str  # "ok" or the error / host death line
    records: list[dict]
    logits: np.ndarray | None = None


def hashed_run(spec: RunSpec, hooks: tuple = (), share_weights: bool = False) -> HashedRun:
    """One run in this process with a fresh context, hashing every op output. The dequantized-weight cache is
    fresh too unless `share_weights` (faster; it would hide a non-deterministic weight conversion)."""
    hook = HashHook()
    try:
        ctx = build_context(spec, cache=shared_cache() if share_weights else WeightCache())
        res = run(spec, hooks=(*hooks, hook), ctx=ctx)
        close_backends(ctx)
    except KazeiaError as e:
        res = RunResult(ok=False, error=str(e))
    return HashedRun(res.ok, _signature(res), hook.records, res.logits)


def _signature(res: RunResult) -> str:
    """How the run ended, by the one classification (debug/outcome.py): "ok", the host's error line, or "wrong
    numbers: N of M logits are not finite" (bitwise-identical NaNs say nothing about the arithmetic being right)."""
    if not res.ok:
        return res.signature()
    o = classify(res)
    return "ok" if o.ok else f"{o.kind}: {o.summary}"


def hashed_run_child(spec: RunSpec, timeout: float = 600.0) -> HashedRun:
    """`hashed_run` in a fresh Python process; a crash or a timeout is a failed run without records."""
    with tempfile.TemporaryDirectory(prefix="kazeia-det-") as tmp:
        job = os.path.join(tmp, "job.json")
        out = os.path.join(tmp, "out.json")
        with open(job, "w") as f:
            json.dump({"spec": asdict(spec), "out": out, "threads": child_threads()}, f)
        try:
            proc = subprocess.run([sys.executable, "-m", "kazeia.debug.determinism", job], capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return HashedRun(False, f"child timed out after {timeout:g} s (hang)", [])
        if not os.path.exists(out):
            tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])
            return HashedRun(False, f"child exited with status {proc.returncode}: {tail}", [])
        d = read_json_object(out, "child result", max_bytes=256 << 20)
        logits = _load_array(d["logits"]) if d.get("logits") else None
        return HashedRun(d["ok"], d["signature"], d["records"], logits)


def _child_main(argv: list[str]) -> int:
    job = read_json_object(argv[0], "child job")
    apply_threads(job)
    r = hashed_run(RunSpec(**job["spec"]))
    logits_path = None
    if r.logits is not None:
        logits_path = os.path.join(os.path.dirname(job["out"]), "logits.npy")
        np.save(logits_path, r.logits)
    with open(job["out"], "w") as f:
        json.dump({"ok": r.ok, "signature": r.signature, "records": r.records, "logits": logits_path}, f)
    return 0


@dataclass
class OpDiff:
    key: str
    index: int
    occurrence: int
    name: str
    op: str
    backend: str
    path: str
    groups: dict[str, list[int]]  # hash (or "missing") -> runs giving it

    def describe(self) -> str:
        where = f"#{self.index} {self.name} ({self.op} on {self.backend}/{self.path})"
        if self.occurrence:
            where += f" [micro-batch/graph {self.occurrence}]"
        parts = [f"runs {','.join(map(str, r))} -> {h}" for h, r in self.groups.items()]
        return f"{where}: " + "; ".join(parts)


@dataclass
class DeterminismReport:
    deterministic: bool
    message: str
    runs: int
    n_ops: int  # op outputs compared (those of run 0)
    n_diff: int  # op outputs whose hash differs between runs
    first_diff: OpDiff | None
    logits_equal: bool | None  # bitwise; None when no run produced logits
    logits_groups: dict[str, list[int]] = field(default_factory=dict)
    signatures: list[str] = field(default_factory=list)  # per run: "ok" or how it failed
    spec: str = ""
    # the prompt's first greedy token -> runs giving it ("non-finite": logits with NaN or inf)
    first_tokens: dict[str, list[int]] = field(default_factory=dict)
    mechanism: str | None = None  # the modelled mechanism the runs' differences follow, when the evidence fits

    def to_dict(self) -> dict:
        d = asdict(self)
        d["first_diff"] = asdict(self.first_diff) if self.first_diff else None
        return d


def _logits_digest(a: np.ndarray | None) -> str:
    if a is None:
        return "none"
    import hashlib

    return hashlib.blake2b(np.ascontiguousarray(a).view(np.uint8).tobytes(), digest_size=12).hexdigest()


def _nonfinite_note(runs: list[HashedRun]) -> str:
    """" (but N of M logits are NaN/inf)" for runs whose signature says ok while their (first) logits are not all
    finite (runs made elsewhere; hashed_run's own signature already says wrong numbers)."""
    a = next((np.asarray(r.logits) for r in runs if r.logits is not None), None)
    if a is None or np.isfinite(a).all() or any(r.signature != "ok" for r in runs):
        return ""
    return f" (but {int((~np.isfinite(a)).sum())} of {a.size} logits are NaN/inf)"


def _first_token(logits: np.ndarray | None) -> str | None:
    """The prompt's first greedy token (argmax of the last logits row), "non-finite" when that row is not."""
    if logits is None:
        return None
    a = np.asarray(logits)
    row = a.reshape(-1, a.shape[-1])[-1]
    return str(int(np.argmax(row))) if np.isfinite(row).all() else "non-finite"


def _runs(ix: list[int]) -> str:
    return f"run{'s' if len(ix) > 1 else ''} {','.join(map(str, ix))}"


def _build_mechanism(specs: list[RunSpec], lgroups: dict[str, list[int]]) -> str | None:
    """The queue-narrowing builds, named when the runs' logits follow their builds' skipped HMX queue workers (runs
    that skip the same workers agree) and the runs did not all skip the same."""
    from kazeia.backends.htp import build_skips, describe_skips

    skips = []
    for sp in specs:
        st = sp.htp_settings()
        sk = build_skips(st) if st is not None else frozenset()
        if sk is None:
            return None
        skips.append(sk)
    runs_of: dict[frozenset, list[int]] = {}
    for i, sk in enumerate(skips):
        runs_of.setdefault(sk, []).append(i)
    digest_of = {i: d for d, ix in lgroups.items() for i in ix}
    if len(runs_of) < 2 or any(len({digest_of.get(i, "none") for i in ix}) > 1 for ix in runs_of.values()):
        return None  # (runs of one build differ: something else moves them; two builds may agree where a skipped
        # worker had no job, e.g. the matmul worker below M = 32)
    per = "; ".join(f"{_runs(ix)} skip{'' if len(ix) > 1 else 's'} {describe_skips(sk)}" for sk, ix in runs_of.items())
    return ("the runs' outputs follow their builds: fault hmx-queue-narrowing (May's hmx-queue.c: "
            "hmx_queue_process casts a job's function pointer to a one-byte enum, so a worker whose address ends in "
            "0x00 is taken for HMX_QUEUE_NOOP, skipped and marked done; fixed by llama.cpp #25677): " + per +
            ". Each run models another clean build of the same code (a per-build layout, not a per-run race: "
            "runs of one build agree); that #24389's good and bad builds are this defect is kazeia's hypothesis")


def compare_runs(runs: list[HashedRun], spec: RunSpec | None = None,
                 specs: list[RunSpec] | None = None) -> DeterminismReport:
    """The op-by-op comparison of hashed runs (run 0's execution order; ops only other runs have come last);
    `specs`: each run's own spec (its seeds), to name the mechanism the differences follow."""
    order: list[dict] = []
    seen: set[str] = set()
    for r in runs:
        for rec in r.records:
            if rec["key"] not in seen:
                seen.add(rec["key"])
                order.append(rec)
    by_run = [{rec["key"]: rec["hash"] for rec in r.records} for r in runs]
    diffs: list[OpDiff] = []
    for rec in order:
        groups: dict[str, list[int]] = {}
        for i, hashes in enumerate(by_run):
            groups.setdefault(hashes.get(rec["key"], "missing"), []).append(i)
        if len(groups) > 1:
            diffs.append(OpDiff(rec["key"], rec["index"], rec["occurrence"], rec["name"], rec["op"], rec["backend"],
                                rec["path"], groups))
    lgroups: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        lgroups.setdefault(_logits_digest(r.logits), []).append(i)
    have_logits = any(r.logits is not None for r in runs)
    logits_equal = (len(lgroups) == 1) if have_logits else None
    tgroups: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        tok = _first_token(r.logits)
        if tok is not None:
            tgroups.setdefault(tok, []).append(i)
    sigs = [r.signature for r in runs]
    same_end = len(set(sigs)) == 1
    det = not diffs and logits_equal is not False and same_end
    mechanism = None
    n_ops = len(runs[0].records) if runs else 0
    if det:
        how = ("every run finished with finite logits, not judged against a reference" if sigs and sigs[0] == "ok"
               else f"every run ended: {sigs[0]}")
        msg = (f"deterministic: {len(runs)} runs, {n_ops} op outputs bitwise identical"
               + (", logits bitwise identical" + _nonfinite_note(runs) if logits_equal else "") + f" ({how})")
    else:
        parts = [f"NON-DETERMINISTIC over {len(runs)} runs"]
        if diffs:
            parts.append(f"first differing op: {diffs[0].describe()}")
            parts.append(f"{len(diffs)} of {len(order)} op outputs differ")
        if logits_equal is None:
            parts.append("no logits")
        elif logits_equal:
            parts.append("logits bitwise identical" + _nonfinite_note(runs))
        else:
            parts.append("logits differ (" + "; ".join(f"runs {','.join(map(str, r))}" for r in lgroups.values())
                         + ")")
        if len(tgroups) > 1:
            parts.append("the first token changes: " + "; ".join(f"{_runs(ix)} -> {t}" for t, ix in tgroups.items()))
        if not same_end:
            parts.append("runs end differently: " + "; ".join(f"run {i}: {s}" for i, s in enumerate(sigs)))
        mechanism = _build_mechanism(specs, lgroups) if specs and have_logits else None
        if mechanism:
            parts.append(mechanism)
        msg = "\n  ".join(parts)
    return DeterminismReport(det, msg, len(runs), n_ops, len(diffs), diffs[0] if diffs else None, logits_equal,
                             lgroups if have_logits else {}, sigs, spec.command() if spec else "", tgroups,
                             None if det else mechanism)


def build_seeded(spec: RunSpec, n_runs: int, base: int = 1) -> list[RunSpec]:
    """`spec` once per run, run i with the build layout seed base + i where the spec injects a bad build whose
    layout nothing pins (fault hmx-queue-narrowing): each run then models another clean build of the same code,
    as the runs a team makes between rebuilds, and a report made from them is the same every time."""
    from kazeia.backends.htp import build_skips

    htp = spec.htp_settings()
    if htp is None or build_skips(htp) is not None:
        return [spec] * n_runs
    return [spec.with_(env={**spec.env, "KAZEIA_HTP_BUILD_SEED": str(base + i)}) for i in range(n_runs)]


def timing_seeded(spec: RunSpec, n_runs: int, base: int = 1) -> list[RunSpec]:
    """`spec` once per run, run i with the HTP timing (race) seed base + i unless the spec or the environment
    already pins one: the runs still differ by their timing, as free runs do, but a report made from them is
    the same every time it is made (free runs would make a race's evidence itself a matter of luck)."""
    htp = spec.htp_settings()  # (the environment and the spec's overrides, read as the HTP backend reads them)
    specs = build_seeded(spec, n_runs, base)
    if htp is None or htp.race_seed is not None:
        return specs
    return [s.with_(env={**s.env, "KAZEIA_HTP_RACE_SEED": str(base + i)}) for i, s in enumerate(specs)]


def check_determinism(spec: RunSpec, n_runs: int = 3, isolate: bool = False, timeout: float = 600.0,
                      hooks: tuple = (), share_weights: bool = False, log=None,
                      specs: list[RunSpec] | None = None) -> DeterminismReport:
    """Run `spec` n_runs times (fresh context each time) and compare every op output and the logits; `specs`:
    one spec per run in its place (e.g. timing_seeded(spec, n_runs))."""
    if n_runs < 2:
        raise KazeiaError("a determinism check needs at least 2 runs (-N)")
    if isolate and hooks:
        raise KazeiaError("extra hooks cannot reach child processes: use isolate=False")
    runs = []
    for i in range(n_runs):
        one = specs[i] if specs else spec
        r = hashed_run_child(one, timeout) if isolate else hashed_run(one, hooks, share_weights)
        runs.append(r)
        if log:
            log(f"run {i}: {r.signature}, {len(r.records)} op outputs hashed")
    rep = compare_runs(runs, spec, specs)
    if rep.mechanism and specs:
        named = rep.mechanism
        rep.mechanism += _without_hmx(rep, specs, hooks, share_weights)
        rep.message = rep.message.replace(named, rep.mechanism)
    return rep


def _without_hmx(rep: DeterminismReport, specs: list[RunSpec], hooks: tuple, share_weights: bool) -> str:
    """The builds' evidence checked once more: two runs whose logits differ, run again with HMX off
    (GGML_HEXAGON_USE_HMX=0: no job reaches the HMX queue), should then agree."""
    i, j = (ix[0] for ix in list(rep.logits_groups.values())[:2])
    off = [hashed_run(specs[x].with_(env={**specs[x].env, "GGML_HEXAGON_USE_HMX": "0"}), hooks, share_weights)
           for x in (i, j)]
    same = off[0].logits is not None and off[1].logits is not None and np.array_equal(off[0].logits, off[1].logits)
    return (f"; with GGML_HEXAGON_USE_HMX=0 runs {i} and {j} " +
            ("agree (no job goes through the HMX queue)" if same else "still differ: the builds do not explain it"))


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
