"""`kazeia upgrade`: the user's scenario under two upstream versions of ggml-hexagon (`--from`, `--to`), side by side.

What it runs, all in this process: the REF oracle (float64) once, for the logits and every op's output, watched by
a plan scan per version (investigate's PlanScan: every MUL_MAT the HTP would take, planned), the scenario on
HTP0 under each version, and under each version the MUL_MATs whose path the versions change, alone on REF's inputs
(compare's isolated mode, those ops only).
What it says: each run's outcome and the op and mechanism behind it; the plans of the op that failed, in both
versions (path, chunks, bytes against VTCM); the MUL_MATs whose path changed (HMX <-> HVX <-> CPU), with each
version's NMSE against REF for them; the logits against REF; the modeled prefill and decode rates; the switches
whose meaning changed between the versions.

Verdict and exit status: "fixed" (0) the `--from` run failed and the `--to` run completes; "unchanged" (0) both
complete; "left" (1) both fail; "new fault" (4) only the `--to` run fails. Each run's outcome is debug/outcome.py's
(the one classification every tool uses): it fails when it dies, hangs, stops on an op status, or finishes with
logits that are not finite or past the whole-model bound against REF ("wrong numbers").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kazeia.debug.compare import capture_reference, compare
from kazeia.debug.compare.reference import fix_tokens
from kazeia.debug.investigate.facts import OpPlan, PlanScan
from kazeia.debug.markdown_html import page
from kazeia.debug.modeled import ScenarioCost
from kazeia.debug.outcome import COMPLETES, DEATH, HANG, OP_ERROR, WRONG, classify
from kazeia.debug.runner import RunResult, run
from kazeia.engine.session import RunSpec, reference_spec
from kazeia.outputs import ensure_folder, write_text

EXIT = {"fixed": 0, "unchanged": 0, "left": 1, "new fault": 4}

# switches whose meaning changed from the May snapshot to October (ggml-hexagon.cpp env parsing of each)
SWITCH_CHANGES = [
    ("GGML_HEXAGON_USE_HMX", "turns MUL_MAT and FA HMX off", "no longer read (use GGML_HEXAGON_NHMX=0 or MM_SELECT=1)"),
    ("GGML_HEXAGON_OPSTAGE", "stages ops (debug)", "no longer read"),
    ("GGML_HEXAGON_OPBATCH", "default 1024 ops per batch", "default 1280"),
    ("GGML_HEXAGON_OPQUEUE", "default 16 batches in flight", "default 32"),
    ("GGML_HEXAGON_NHMX", "(did not exist)", "0: no HMX at all"),
    ("GGML_HEXAGON_MM_SELECT", "(did not exist)", "2 HMX -> HVX -> CPU, 1 HVX -> CPU, 0 CPU"),
    ("GGML_HEXAGON_FA_SELECT", "(did not exist)", "the same choice for FLASH_ATTN_EXT"),
    ("GGML_HEXAGON_OPFUSION", "(did not exist; RMS_NORM+MUL only)", "0 off, 1 all, else a bitmask of fusions"),
    ("GGML_HEXAGON_DEVICES", "(GGML_HEXAGON_NDEV)", "a count or a list of device groups; NDEV deprecated"),
    ("route rule action hvx", "HMX off for the op (as USE_HMX=0)", "HMX off for the op (as NHMX=0)"),
]


@dataclass
class Side:
    profile: str
    outcome: str  # debug/outcome.py's KINDS
    message: str = ""
    op: str | None = None  # the op behind a failure (the faulting op, or the one that set the status)
    mechanism: str = ""
    logits_nmse: float | None = None
    prefill_tps: float | None = None
    decode_tps: float | None = None
    plans: dict[str, OpPlan] = field(default_factory=dict)  # by node name, first micro-batch
    per_op: dict[str, Any] = field(default_factory=dict)  # compare's isolated rows (OpRow) by node name

    @property
    def ok(self) -> bool:
        return self.outcome == COMPLETES


@dataclass
class Upgrade:
    command: str
    before: Side
    after: Side
    verdict: str
    why: list[str]
    changed_paths: list[dict[str, Any]]
    switches: list[tuple[str, str, str, bool]]  # (name, before, after, set by the user)
    notes: list[str] = field(default_factory=list)  # what the comparison had to adapt (a fault one version lacks)

    @property
    def exit_status(self) -> int:
        return EXIT[self.verdict]


def _outcome(side: Side, r: RunResult, reference: np.ndarray | None) -> None:
    """The side's outcome from the one classification (debug/outcome.py), with the mechanism upgrade shows."""
    o = classify(r, reference)
    side.outcome, side.op, side.message, side.logits_nmse = o.kind, o.op, o.host_line or "", o.nmse
    if o.kind in (DEATH, HANG):
        d = r.death or {}
        side.mechanism = f"DSP {'hang' if o.kind == HANG else 'death'} ({d.get('kind')}): {d.get('cause')}"
    elif o.kind == OP_ERROR:
        det = r.error_detail or {}
        side.mechanism = (f"the op returned {det['status']} on the DSP; the host kept it sticky and aborted in "
                          f"{det.get('aborted_in')}")
    elif o.kind == WRONG:
        side.mechanism = (f"{o.summary} (not identified here: kazeia compare --mode both says whether one op or an "
                          f"accumulated drift does it)")


def upgrade(spec: RunSpec, before: str, after: str, progress=lambda s: None) -> Upgrade:
    from kazeia.gguf.reader import load_gguf

    # both versions run the llama.cpp graph of the scenario as given (the May graph's extra mask cast would shift
    # every later node_<index> name, and the comparison goes op by op by name): what changes is ggml-hexagon's code
    base = reference_spec(spec, device="HTP0")
    faults, notes = faults_by_side(spec.faults, before, after)
    cost: ScenarioCost | None = None  # the modeled rates' graphs, once the prompt's length is known
    settings = {p: base.with_(htp_profile=p, faults=faults[p]).htp_settings() for p in (before, after)}
    progress("REF (float64): logits, every op's output, every MUL_MAT planned under both versions")
    scans = {p: PlanScan(s) for p, s in settings.items()}
    ref_spec = fix_tokens(base.with_(n_predict=0))
    reference = capture_reference(ref_spec, sources=True, hooks=tuple(scans.values()))
    sides = []
    plans = {p: {op.name: op for op in scans[p].plans if op.ubatch == 0} for p in (before, after)}
    changed = _changed(plans[before], plans[after])
    moved = {row["op"] for row in changed}  # the only ops whose alone-on-REF's-inputs error the report shows
    for p in (before, after):
        progress(f"the scenario on HTP0 under {p}")
        r = run(base.with_(htp_profile=p, faults=faults[p]))
        side = Side(p, "")
        _outcome(side, r, reference.logits)
        if cost is None:
            cost = ScenarioCost(load_gguf(spec.model_path, header_only=True), r.n_prompt, spec.ubatch or 512)
        side.prefill_tps, side.decode_tps = cost.rates(settings[p])
        side.plans = plans[p]
        if moved:
            progress(f"the {len(moved)} MUL_MATs whose path changed, alone on REF's inputs under {p}")
            rep = compare(ref_spec.with_(htp_profile=p, faults=faults[p]), "isolated", reference=reference,
                          only=moved)
            side.per_op = {row.name: row for row in rep.rows.get("isolated", []) if row.ubatch == 0}
        sides.append(side)
    b, a = sides
    verdict = ("fixed" if not b.ok and a.ok else "left" if not b.ok else "new fault" if not a.ok else "unchanged")
    for row in changed:
        row["nmse_before"], row["nmse_after"] = (_nmse_of(s.per_op.get(row["op"])) for s in (b, a))
    return Upgrade(base.command(), b, a, verdict, _why(b, a), changed, _switches(spec), notes)


def faults_by_side(names: list[str], before: str, after: str) -> tuple[dict[str, list[str]], list[str]]:
    """The injected faults each version's run takes: a fault that models one version's code (profiles.Fault.only_in)
    runs on that side only, and a note says so; a fault neither version has is refused (before any work)."""
    from kazeia.backends.htp import FAULTS, get_profile
    from kazeia.errors import KazeiaError

    gens = {p: get_profile(p).caps.generation for p in (before, after)}
    sides: dict[str, list[str]] = {p: [] for p in (before, after)}
    notes = []
    for n in names:
        f = FAULTS.get(n)
        if f is None:
            raise KazeiaError(f"unknown HTP fault '{n}' (have: {', '.join(FAULTS)})")
        where = [p for p in (before, after) if f.exists_in(gens[p])]
        if not where:
            raise KazeiaError(f"HTP fault '{n}' models {f.only_in} code; neither {before} nor {after} has it")
        for p in where:
            sides[p].append(n)
        for p in (before, after):
            if p not in where:
                notes.append(f"fault {n} models {f.only_in} code, which {p} does not have: the {p} run is without "
                             f"it, the {where[0]} run injects it")
    return sides, notes


def _nmse_of(row) -> float | None:
    return None if row is None else row.nmse


def _plan_line(op: OpPlan | None) -> str:
    if op is None:
        return "not on the HTP"
    p = op.plan
    chunks = f" mc={p.mc} nc={p.nc}" if p.mc is not None and p.path == "hmx" else ""
    over = f", {p.used - p.vtcm:,} B over" if p.used > p.vtcm else ""
    return f"{p.path}{chunks}, {p.used:,} of {p.vtcm:,} B{over} ({p.status}: {p.outcome})"


def _cell(text: str) -> str:
    """A table cell: '-' for nothing, no '|' or line break inside."""
    return text.replace("|", "/").replace("\n", " ") if text else "-"


def _why(b: Side, a: Side) -> list[str]:
    """The evidence for the change: each failing op's plan in both versions."""
    out = []
    for side in (b, a):
        if side.ok or side.op is None:
            continue
        out.append(f"{side.profile}: {side.op} {side.outcome}: {side.mechanism}")
        for s in (b, a):
            out.append(f"  {side.op} under {s.profile}: {_plan_line(s.plans.get(side.op))}")
    return out


def _changed(before: dict[str, OpPlan], after: dict[str, OpPlan]) -> list[dict[str, Any]]:
    """MUL_MATs whose path differs between two versions' plans by op name (an op one version leaves to the CPU has
    no plan there: "cpu")."""
    rows = []
    for name in dict.fromkeys([*before, *after]):
        old, new = before.get(name), after.get(name)
        was, now = (old.plan.path if old else "cpu"), (new.plan.path if new else "cpu")
        if was != now:
            p = (old or new).plan
            rows.append({"op": name, "weight": (old or new).weight, "m": p.m, "k": p.k, "n": p.n,
                         "before": was, "after": now})
    return rows


def _switches(spec: RunSpec) -> list[tuple[str, str, str, bool]]:
    env = {**os.environ, **spec.env}
    return [(n, was, now, n in env) for n, was, now in SWITCH_CHANGES]


def render_markdown(u: Upgrade) -> str:
    b, a = u.before, u.after

    def num(v, f="{:.3g}"):
        return "-" if v is None else f.format(v)

    lines = [f"# Upgrade {b.profile} -> {a.profile}: {u.verdict}", "", f"Scenario: `{u.command}`", "",
             "| | " + b.profile + " | " + a.profile + " |", "| --- | --- | --- |",
             f"| outcome | {b.outcome} | {a.outcome} |",
             f"| op | {b.op or '-'} | {a.op or '-'} |",
             f"| host's line | {_cell(b.message)} | {_cell(a.message)} |",
             f"| mechanism | {b.mechanism or '-'} | {a.mechanism or '-'} |",
             f"| logits NMSE vs REF | {num(b.logits_nmse)} | {num(a.logits_nmse)} |",
             f"| modeled prefill t/s | {num(b.prefill_tps, '{:.1f}')} | {num(a.prefill_tps, '{:.1f}')} |",
             f"| modeled decode t/s | {num(b.decode_tps, '{:.1f}')} | {num(a.decode_tps, '{:.1f}')} |", ""]
    if u.notes:
        lines += [*[f"Note: {n}." for n in u.notes], ""]
    if u.why:
        lines += ["## Why", "", *[f"    {w}" for w in u.why], ""]
    lines += ["## MUL_MATs whose path changed", ""]
    if u.changed_paths:
        lines += ["Per op: NMSE against REF of the op run alone on REF's inputs (`compare --mode isolated`).", "",
                  "| op | weight | M | K | N | before | after | NMSE before | NMSE after |",
                  "| --- | --- | --- | --- | --- | --- | --- | ---: | ---: |"]
        lines += [f"| {r['op']} | {r['weight'] or '-'} | {r['m']} | {r['k']} | {r['n']} | {r['before']} | "
                  f"{r['after']} | {num(r.get('nmse_before'), '{:.2e}')} | {num(r.get('nmse_after'), '{:.2e}')} |"
                  for r in u.changed_paths]
    else:
        lines.append("none")
    lines += ["", "## Switches whose meaning changed", "", "| switch | before | after | set here |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {n} | {was} | {now} | {'yes' if s else ''} |" for n, was, now, s in u.switches]
    return "\n".join(lines) + "\n"


def render_html(u: Upgrade) -> str:
    """The report as a page with real tables (debug/markdown_html.py)."""
    return page(f"kazeia upgrade: {u.verdict}", render_markdown(u))


def to_json(u: Upgrade) -> str:
    def side(s: Side) -> dict:
        return {"profile": s.profile, "outcome": s.outcome, "message": s.message, "op": s.op,
                "mechanism": s.mechanism, "logits_nmse": s.logits_nmse, "prefill_tps": s.prefill_tps,
                "decode_tps": s.decode_tps,
                "plans": {n: op.plan.to_dict() for n, op in s.plans.items()}}
    return json.dumps({"command": u.command, "verdict": u.verdict, "exit_status": u.exit_status,
                       "before": side(u.before), "after": side(u.after), "why": u.why,
                       "changed_paths": u.changed_paths, "notes": u.notes,
                       "switches": [{"name": n, "before": b, "after": a, "set": s} for n, b, a, s in u.switches]},
                      indent=1)


def write(u: Upgrade, out_dir: str) -> None:
    ensure_folder(out_dir, "upgrade report")
    write_text(os.path.join(out_dir, "upgrade.md"), render_markdown(u))
    write_text(os.path.join(out_dir, "upgrade.html"), render_html(u))
    write_text(os.path.join(out_dir, "upgrade.json"), to_json(u))
