"""Per-op comparison of a backend against the float64 `ref` oracle, in two modes.

- cumulative: the backend under test runs the whole prefill feeding itself, like a normal run; every node's
  output is compared at completion with REF's. Error accumulates along the graph, so an op is only judged by
  its per-op threshold when the inputs it consumed were bit-identical to REF's (or when it turns finite inputs
  into NaN/inf); the other rows show drift. The whole-model output (logits) is judged against 2e-3.
- isolated: test-backend-ops style. The graph is walked node by node on the backend under test; before each
  node the reference values of the sources it reads are written into their storage (through ne/nb, so views,
  in-place ops and KV-cache views get exactly what REF consumed), the node runs alone and is waited for (on
  the HTP: one op per batch), and its output is compared with REF's. The first row out of tolerance is the
  culprit; a device death inside an op is that op failing.

Every output is judged by kazeia.debug.judge (test-backend-ops' checks and NMSE thresholds). The reference is
REF's float64 value rounded to the output's storage type (the backend cannot store more than that), which makes
the exact ops exact. A weight MUL_MAT also gets the NMSE of ggml's own activation conversion on its inputs
(kazeia.debug.allowance; `strict=True` removes it). Isolated mode runs each HTP op in its own batch, so bugs that
need the batch context (the per-batch src1 VTCM shortcut) only show in cumulative mode.

Python use: `report = compare(RunSpec(...), "isolated")`, `report.first_failure`, `plot_errors(report, path)`.
One `Reference` (from `capture_reference`) can serve several compares of the same model and prompt.

The parts: `verdict` (statuses and the element-wise checks), `op_io` (what an op reads and produces),
`reference` (the REF run), `rows` (one row per op), `cumulative` and `isolated` (the two modes), `run` (the
entry point) and `report` (the report and its text).
"""

from kazeia.debug.compare.reference import Reference, capture_reference
from kazeia.debug.compare.report import CompareReport, compare_command, format_table, summary_lines
from kazeia.debug.compare.rows import OpRow
from kazeia.debug.compare.run import compare
from kazeia.debug.compare.verdict import DEATH, DRIFT, FAIL, MODES, OK, REF_INVALID, Verdict, judge
from kazeia.debug.plots import plot_errors

__all__ = ["DEATH", "DRIFT", "FAIL", "MODES", "OK", "REF_INVALID", "CompareReport", "OpRow", "Reference", "Verdict",
           "capture_reference", "compare", "compare_command", "format_table", "judge", "plot_errors", "summary_lines"]
