"""What an investigation has established so far: one typed record the steps fill in (each step declares the
fields it reads and the ones it writes, see table.py), and the structured result of one routing trial."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from kazeia.backends.htp import MatmulPlan
from kazeia.debug.investigate.facts import FactsHook, OpFacts, OpPlan
from kazeia.debug.judge import Verdict
from kazeia.debug.outcome import Outcome
from kazeia.debug.runner import RunResult
from kazeia.debug.stats import Stats

# routing trials (RoutingTrial.kind)
HMX_OFF = "hmx-off"  # GGML_HEXAGON_USE_HMX=0
ALL_MATMUL_CPU = "all-mul-mat-cpu"
FLASH_ATTN_CPU = "flash-attn-cpu"
FAULTING_CPU = "faulting-op-cpu"  # only the op the one-op batches showed
BLAMED_CPU = "blamed-op-cpu"  # only the op the OPBATCH=1 log pointed at
FIRST_BAD_CPU = "first-bad-op-cpu"  # only the first op out of tolerance (wrong numbers)


@dataclass(frozen=True)
class RoutingTrial:
    """One rerun with some ops moved off the device: what moved (kind, node), and what the run then did."""

    kind: str
    label: str
    node: str | None
    died: bool
    died_in: str | None  # the op the DSP died in, when it died
    error: str | None
    logits: Verdict | None  # against the CPU reference run (a prefix run: its stop node against the CPU's)
    command: str
    ran: str = ""  # a prefix run: 'layers 0..k of n (through l_out-k)'; '' for a whole run

    @property
    def completes(self) -> bool:
        """Completes what it ran (for a prefix run, the layers `ran` names)."""
        return not self.died and self.error is None

    def outcome(self) -> str:
        if self.died:
            return "still dies" + (f" (in {self.died_in}; ran {self.ran})" if self.died_in and self.ran else
                                   f" (in {self.died_in})" if self.died_in else "")
        if self.error:
            return f"fails: {self.error}"
        if self.ran:
            return f"completes {self.ran}" + (f", {self.logits.reason} vs CPU" if self.logits is not None else "")
        return "completes" + (f", logits {self.logits.reason}" if self.logits is not None else "")


@dataclass
class Findings:
    """Everything the steps measured; None = not established (the step did not run or had nothing to say)."""

    # reproduce
    reference_logits: np.ndarray | None = None
    first: RunResult | None = None
    facts: FactsHook | None = None
    matmul_plans: list[OpPlan] | None = None  # every MUL_MAT the HTP takes, planned with the run's settings
    logits: Verdict | None = None  # the run's logits against the CPU reference
    outcome: Outcome | None = None  # the run's class (debug/outcome.py), against the CPU reference
    graph_order: list[str] | None = None  # node names of the reference run's (last) graph, in execution order
    # localise / misattribution
    sync_reproduces: bool | None = None
    faulting: str | None = None
    faulting_facts: OpFacts | None = None
    death: dict | None = None  # the death of the one-op-batch run
    last_enqueued_sync: str | None = None
    last_enqueued_default: str | None = None
    last_enqueued_team: str | None = None
    team_distance: int | None = None  # ops between the faulting op and the one the OPBATCH=1 log blamed
    team_opqueue: int | None = None  # OPQUEUE of that run
    # trace
    nonfinite_before: list[tuple[str, int]] | None = None
    amax_inputs: float | None = None
    amax_outputs: float | None = None
    fault_inputs: list[Stats] | None = None
    ops_completed: int | None = None
    # determinism
    determinism: Any = None  # kazeia.debug.determinism.DeterminismReport
    # dumps and replays
    dump_dir: str | None = None
    dump: Any = None  # kazeia.debug.dump.Dump (completion-time capture)
    capture_diff: Any = None  # kazeia.debug.dump.CaptureDiff (enqueue-time vs completion-time)
    replay: Any = None  # kazeia.debug.replay.ReplayResult
    replay_robust: Any = None
    # routing
    routing: list[RoutingTrial] | None = None
    # VTCM plan of the faulting op
    plan: MatmulPlan | None = None
    plan_robust: MatmulPlan | None = None
    dsp_log: list[str] | None = None
    crash: Any = None  # kazeia.debug.crashmap.Placement: the crash record's Bad VA on the plan map
    # failing prompt lengths
    predicted_ranges: list[tuple[int, int]] | None = None
    m_limit: int | None = None  # the largest M the prediction looked at
    m_result: Any = None  # kazeia.debug.bisect.MResult
    m_ran: str | None = None  # what the runs of the M search covered, when they were prefix runs
    failing_range: tuple[int, int] | None = None
    # rows
    rows: Any = None  # kazeia.debug.bisect.RowsResult
    # wrong numbers
    compare: Any = None  # kazeia.debug.compare.CompareReport
    first_bad: str | None = None
    # the src1 shortcut step (shortcut.py): the op before the first bad one in its batch, and the one-op-batch rerun
    batch_predecessor: OpFacts | None = None
    sync_correct: tuple[bool, str] | None = None  # (the --sync rerun's logits match the CPU, its reason)
    # prompt.py: (the device's output ignores the prompt, its relative change, the CPU's) for another prompt
    prompt_dependence: tuple[bool, float, float] | None = None
    # mechanism (wrong numbers)
    signature: Any = None  # kazeia.debug.signature.Signature of the first bad op's dumped output vs float64
    state_exp: Any = None  # kazeia.debug.state_experiment.StateExperiment
    race: Any = None  # kazeia.debug.race.RaceReport
    later_code: tuple[str, bool, str] | None = None  # (profile, the op right there?, its judgement) on the dump

    def trial(self, kind: str) -> RoutingTrial | None:
        """The routing trial of `kind`, if it was run."""
        return next((t for t in self.routing or () if t.kind == kind), None)

    def dying_plans(self) -> list[OpPlan]:
        """The MUL_MATs of the run whose HMX plan fails with no way out (the DSP dies in them)."""
        return [p for p in self.matmul_plans or () if p.dies]

    def values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def is_set(value: Any) -> bool:
    """A finding counts as established when it is neither None nor an empty collection."""
    if value is None:
        return False
    if isinstance(value, (list, tuple, dict, set, str)):
        return len(value) > 0
    return True
