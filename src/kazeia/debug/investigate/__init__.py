"""kazeia investigate: the whole procedure the original team did by hand, automated.

reproduce -> then one branch, a table of steps, each declaring the findings it needs and gives:
- device death: localise the faulting op with one-op batches, show what the logs would have blamed, trace the
  run up to the fault, check determinism, dump the faulting op (at completion and at enqueue time) and replay it
  alone and with its batch context, route op classes away, the op's VTCM plan, the failing prompt lengths
  predicted by the plan and confirmed by runs, values or row count, a gate validated by a rerun;
- wrong numbers: compare every op against float64, trace, determinism, dump and replay the first bad op, route it
  away, a gate;
- an op status (2026-10: sticky, the host aborts at synchronize): the status, the op that set it and its plan
  against the VTCM the DSP had, determinism, a workaround validated by a rerun;
- nothing wrong: determinism.
Then the branch's hypotheses, each judged from the findings, the verdict and the report (report.py). Every run
is in process (a device death is an exception here) and reuses the loaded weights.

The parts: `findings` (the typed record), `facts` (per-op recorders), `table` (step tables), one module per
step family (`reproduce`, `localise`, `trace`, `determinism`, `dumps`, `routing`, `vtcm`, `rows`, `numbers`, `prompt`,
`prompt`, `gate`), `hypotheses`, `verdicts`, `figures` and `report`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from kazeia.debug.investigate.address import ADDRESS_GATE, CRASH
from kazeia.debug.investigate.determinism import determinism_step
from kazeia.debug.investigate.dumps import DUMP_FAULTING, DUMP_FIRST_BAD, REPLAY
from kazeia.debug.investigate.findings import Findings, RoutingTrial
from kazeia.debug.investigate.gate import DEATH_GATE
from kazeia.debug.investigate.hypotheses import DEATH_HYPOTHESES, NUMERIC_HYPOTHESES, Judged
from kazeia.debug.investigate.localise import LOCALISE, MISATTRIBUTION
from kazeia.debug.investigate.mechanism import LATER_CODE, MECHANISM_GATE, RACE, SIGNATURE, STATE
from kazeia.debug.investigate.numbers import COMPARE
from kazeia.debug.investigate.prompt import PROMPT
from kazeia.debug.investigate.report import Hypothesis, Investigation, Step, write_report
from kazeia.debug.investigate.reproduce import REPRODUCE
from kazeia.debug.investigate.routing import ROUTE_CLASSES
from kazeia.debug.investigate.rows import ROWS
from kazeia.debug.investigate.shortcut import SHORTCUT
from kazeia.debug.investigate.status import STATUS, STATUS_GATE, status_verdict
from kazeia.debug.investigate.table import Context, Progress, StepDef, run_table
from kazeia.debug.investigate.trace import TRACE
from kazeia.debug.investigate.verdicts import death_verdict, evaluate, healthy_verdict, numeric_verdict
from kazeia.debug.investigate.vtcm import PLAN, THRESHOLD
from kazeia.engine.session import RunSpec


@dataclass(frozen=True)
class Branch:
    """What a kind of fault calls for: its steps, the hypotheses judged after them, and how the verdict reads."""

    name: str
    steps: tuple[StepDef, ...]
    hypotheses: tuple[Judged, ...]
    verdict: Callable[[Context], None]


DEATH = Branch("device death", (LOCALISE, MISATTRIBUTION, TRACE, determinism_step(2), DUMP_FAULTING, REPLAY,
                                ROUTE_CLASSES, PLAN, CRASH, THRESHOLD, ROWS, ADDRESS_GATE, DEATH_GATE),
               DEATH_HYPOTHESES, death_verdict)
NUMERIC = Branch("wrong numbers", (COMPARE, TRACE, determinism_step(3), PROMPT, DUMP_FIRST_BAD, SIGNATURE, STATE,
                                   RACE, LATER_CODE, SHORTCUT, MECHANISM_GATE), NUMERIC_HYPOTHESES, numeric_verdict)
HEALTHY = Branch("no fault", (determinism_step(2),), (), healthy_verdict)
# 2026-10: an op status the host kept sticky and aborted on (status.py)
STATUS_ERROR = Branch("op status", (STATUS, determinism_step(2), STATUS_GATE), (), status_verdict)


def branch(f: Findings) -> Branch:
    """Which branch the reproduction calls for."""
    r = f.first
    if r.death:
        return DEATH
    if r.error_detail and r.error_detail.get("status"):
        return STATUS_ERROR
    if r.error or f.logits is None or not f.logits.ok:
        return NUMERIC
    return HEALTHY


def investigate(spec: RunSpec, out_dir: str, progress: Callable[[str], None] | None = None) -> Investigation:
    settings = spec.htp_settings()
    if settings is not None:  # a bad build nothing pins: this process's, named, for every step and child run
        from kazeia.backends.htp import pin_build

        spec = spec.with_(env=pin_build(spec.env, settings))
    inv = Investigation(title=f"kazeia investigation: {os.path.basename(spec.model_path)} on {spec.device}"
                              f"{' (' + spec.htp_profile + ')' if spec.htp_profile else ''}",
                        command=spec.command(), outcome="", fault_found=False)
    cx = Context(spec, out_dir, inv, spec.htp_settings())
    progress = progress or Progress()
    run_table(cx, (REPRODUCE,), progress)
    if cx.findings.first is not None:
        b = branch(cx.findings)
        run_table(cx, b.steps, progress)
        evaluate(cx, b.hypotheses)
        b.verdict(cx)
    paths = write_report(inv, out_dir)
    inv.notes.append(f"report files: {', '.join(paths.values())}")
    return inv


__all__ = ["DEATH", "HEALTHY", "NUMERIC", "STATUS_ERROR", "Branch", "Context", "Findings", "Hypothesis",
           "Investigation", "Progress", "RoutingTrial", "Step", "StepDef", "branch", "investigate"]
