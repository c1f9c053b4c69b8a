"""Bisecting a failure: which op (`bisect_ops`), which prompt lengths (`bisect_m`), which input rows (`ddmin_rows`).

Every step is a run judged pass / fail / other by a `Judge`: the built-in `OracleJudge` (the run must not die
and its logits must match the CPU within the whole-model NMSE threshold) or a `CommandJudge` (a shell
command, exit status 0 = pass, like Polygraphy's `--check`). Runs happen in child processes by default, so a
crash or a hang in one step becomes a failed step, not a dead search. A `--fail-regex` pins the failure
signature: a step that fails with another message counts as "other" (treated as passing, and reported), so
the search cannot drift to a different bug. A child killed from outside (a signal, the out-of-memory killer)
is retried once, then the step is "inconclusive" and the search stops without a verdict (StepInconclusive).

Searches are resumable: `SearchState` memoizes every finished step by a key that names the run exactly (the
routing string, the prompt length, the row subset) and rewrites its JSON file after each one; a search
restarted on the same file replays its decisions from the memo and only runs steps it has not finished.

ops: candidates are the nodes the device runs, in graph order. F(k) = "the first k candidates on the device,
every node from candidate k on routed to the CPU" (one `--cpu-node-range` A: rule). F(n) is the unmodified
run (it must fail) and F(0) is all-CPU (assumed to pass, checked only if the answer would be candidate 0), so
the first failing op is candidate k-1 for the smallest failing k: O(log n) runs. Node indices count ALL
graph nodes (views included), as the KZOP trace's #N and the Router's `cpu_node_ranges` do.
"""

from kazeia.debug.bisect.judges import (
    FAIL,
    INCONCLUSIVE,
    OTHER,
    PASS,
    CommandJudge,
    Judge,
    OracleJudge,
    Outcome,
    classify,
    failure_text,
)
from kazeia.debug.bisect.ops import OpNode, OpsResult, bisect_ops, device_ops, format_ops, ops_routing
from kazeia.debug.bisect.prompt_lengths import MResult, bisect_m, format_m
from kazeia.debug.bisect.rows import (
    ROW_WISE_OPS,
    Replay,
    RowsResult,
    bisect_rows,
    ddmin,
    ddmin_rows,
    dump_rows_replay,
    format_rows,
)
from kazeia.debug.bisect.state import STATE_VERSION, BisectInterrupted, SearchState, StepInconclusive

__all__ = ["FAIL", "INCONCLUSIVE", "OTHER", "PASS", "ROW_WISE_OPS", "STATE_VERSION", "BisectInterrupted",
           "CommandJudge", "Judge", "MResult", "OpNode", "OpsResult", "OracleJudge", "Replay", "RowsResult",
           "SearchState", "StepInconclusive", "Outcome", "bisect_m", "bisect_ops", "bisect_rows", "classify", "ddmin",
           "ddmin_rows", "device_ops", "dump_rows_replay", "failure_text", "format_m", "format_ops", "format_rows",
           "ops_routing"]
