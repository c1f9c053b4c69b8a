"""The verdict matrix (issue 37): for generated scenarios (version x arch x M x VTCM size, and injected faults), the
emulator's outcome is the truth (debug/outcome.classify of a run judged against REF: the same classification
`upgrade` gives each side), and `kazeia check`'s prediction from the header must agree with it, or be "depends"
(what the header cannot know, with the reason: a stale shortcut the allocator decides, a public report with no
published cause, an injected fault of kazeia's own).

    rows = verdict_matrix("q4b2.gguf")          # 6 archs x 3 versions x 10 M x 3 VTCM sizes (+ 4 x 30 fault rows)
    print(render(rows))

check's outcome at M (the worst over every weight class at its rows for that M, and every other op's risk that
covers M) maps to the run's class: death -> device death; dropped, wrong -> wrong numbers; no-session -> error
(the session does not open); risk, depends -> depends; cpu, hvx, hmx -> completes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kazeia.backends.htp import FAULTS, HMX_BIAS_STALE, KNOWN_ARCHS, L2_LAZY_STALE, V73_HMX_QUANT_INF
from kazeia.debug.check import check_model
from kazeia.debug.check.outcomes import SEVERITY
from kazeia.debug.outcome import COMPLETES, DEATH, ERROR, WRONG, Outcome, classify
from kazeia.debug.runner import RunResult, run
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError

ARCHS = tuple(KNOWN_ARCHS)  # every arch kazeia models (v68 .. v81)
MS = (1, 4, 5, 16, 32, 33, 38, 64, 65, 128)
VTCMS = (2 << 20, 4 << 20, 8 << 20)
PROFILES = ("2026-05", "robust", "2026-10")
# (profile, arch, fault): the public reports' symptoms on the arch they name, and two of kazeia's own faults
FAULT_ROWS = (("2026-10", 73, V73_HMX_QUANT_INF.name), ("2026-10", 81, L2_LAZY_STALE.name),
              ("2026-05", 79, HMX_BIAS_STALE.name), ("robust", 79, HMX_BIAS_STALE.name))
TO_RUN = {"death": DEATH, "dropped": WRONG, "wrong": WRONG, "no-session": ERROR, "risk": "depends",
          "depends": "depends", "cpu": COMPLETES, "hvx": COMPLETES, "hmx": COMPLETES}


@dataclass(frozen=True)
class Row:
    profile: str
    arch: int
    vtcm: int
    m: int
    fault: str | None
    truth: str           # the emulator's outcome class
    predicted: str       # check's, mapped (TO_RUN)
    why: str             # check's reason for its prediction (the first failing item), or the run's summary

    @property
    def agrees(self) -> bool:
        return self.predicted in ("depends", self.truth)


def _predicted(report, profile: str, arch: int, vtcm: int, m: int) -> tuple[str, str]:
    try:
        r = report.result(profile, arch, vtcm, 512)
    except KeyError:
        return "depends", "check has no such configuration"
    if r.verdict == "no-session":
        return TO_RUN["no-session"], "no session on this arch under this version"
    worst, why = "hmx", ""
    for w in report.classes:
        rows = r.config.rows(w, m)
        for rg in r.ranges[w.label]:
            if rg.m_lo <= rows <= rg.m_hi and SEVERITY[rg.step.outcome] < SEVERITY[worst]:
                worst, why = rg.step.outcome, f"{w.label} at M {rows}: {rg.step.reason}"
    for o in r.ops:
        if o.m_lo <= m <= o.m_hi and SEVERITY[o.outcome] < SEVERITY[worst]:
            worst, why = o.outcome, f"{o.op}: {o.reason}"
    return TO_RUN[worst], why


def _truth(spec: RunSpec, reference: np.ndarray | None) -> Outcome:
    try:
        r = run(spec)
    except KazeiaError as e:  # refused before running (no session on this arch, a plan the host refuses)
        r = RunResult(ok=False, error=str(e))
    return classify(r, reference)


def verdict_matrix(model: str, profiles=PROFILES, archs=ARCHS, ms=MS, vtcms=VTCMS, fault_rows=FAULT_ROWS,
                   progress=lambda s: None) -> list[Row]:
    """Every scenario's emulator outcome and check's prediction (module doc)."""
    report = check_model(model, profiles=tuple(profiles), archs=tuple(archs), vtcms=tuple(vtcms), ubatches=(512,))
    refs = {}
    for m in ms:
        r = run(RunSpec(model=model, n_prompt=m, device="REF"))
        refs[m] = r.logits
    scenarios = [(p, a, v, m, None) for p in profiles for a in archs for v in vtcms for m in ms]
    scenarios += [(p, a, v, m, f) for p, a, f in fault_rows for v in vtcms for m in ms]
    rows = []
    for i, (p, a, v, m, fault) in enumerate(scenarios):
        spec = RunSpec(model=model, n_prompt=m, device="HTP0", htp_profile=p, vtcm=v,
                       faults=[fault] if fault else [], env={"GGML_HEXAGON_ARCH": f"v{a}"})
        o = _truth(spec, refs[m])
        pred, why = _predicted(report, p, a, v, m)
        if fault and not FAULTS[fault].report:  # kazeia's own injection: not in upstream's code, which check reads
            pred, why = "depends", (f"--fault {fault} is kazeia's injection, not upstream code: check predicts what "
                                    f"upstream's code does with this header ({pred} here)")
        rows.append(Row(p, a, v, m, fault, o.kind, pred, why if pred != o.kind or pred == "depends" else o.summary))
        if i % 50 == 0:
            progress(f"{i}/{len(scenarios)} scenarios")
    return rows


def render(rows: list[Row]) -> str:
    """The matrix as markdown: per version x arch x VTCM, the outcome at each M (truth / check), then every
    disagreement with check's reason."""
    ms = sorted({r.m for r in rows})
    out = [f"{len(rows)} scenarios, {sum(r.agrees for r in rows)} agree (check's prediction is the emulator's "
           f"outcome, or 'depends'), {sum(not r.agrees for r in rows)} disagree.", "",
           "| version | arch | VTCM | fault | " + " | ".join(f"M {m}" for m in ms) + " |",
           "| --- | --- | --- | --- |" + " --- |" * len(ms)]
    keyed: dict[tuple, dict[int, Row]] = {}
    for r in rows:
        keyed.setdefault((r.profile, r.arch, r.vtcm, r.fault), {})[r.m] = r
    short = {COMPLETES: "ok", WRONG: "wrong", DEATH: "death", ERROR: "error", "depends": "?", "hang": "hang",
             "op error": "status"}
    for (p, a, v, f), by_m in keyed.items():
        cells = []
        for m in ms:
            r = by_m.get(m)
            if r is None:
                cells.append("")
                continue
            cell = short.get(r.truth, r.truth)
            if r.predicted != r.truth:
                cell += f" ({short.get(r.predicted, r.predicted)})" + ("" if r.agrees else " **X**")
            cells.append(cell)
        out.append(f"| {p} | v{a} | {v >> 20} MiB | {f or '-'} | " + " | ".join(cells) + " |")
    bad = [r for r in rows if not r.agrees]
    if bad:
        out += ["", "Disagreements:", ""]
        out += [f"- {r.profile} v{r.arch} {r.vtcm >> 20} MiB M {r.m}{f' --fault {r.fault}' if r.fault else ''}: "
                f"emulator {r.truth}, check {r.predicted} ({r.why})" for r in bad]
    return "\n".join(out) + "\n"
