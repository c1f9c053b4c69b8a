"""Single-op differential oracle in the style of llama.cpp's test-backend-ops (`kazeia oracle`).

Each case is one op with named parameters (`MUL_MAT(type_a=q4_0,type_b=f32,m=2560,n=38,k=9728,bs=[1,1],
nr=[1,1],view=contig)`; m = output features = weight rows, n = tokens, k = inner dimension, as in
test-backend-ops). Running a case builds a one-op graph over seeded random inputs, runs it on the backend under
test and on REF (float64), and judges the two outputs with kazeia.debug.judge, the way test-backend-ops does:
NaN first (a NaN in the reference is "reference invalid", never the backend's fault), then infinities (same
sign on both sides), then NMSE = sum((a-b)^2)/sum(a^2) against the op's threshold.

The parts, in the order data flows through them: `cases` (names, grid options), `inputs` (leaves and their
seeded values), `mul_mat` and `other_ops` (each op's grid and graph builder), `ops` (the op table, one-op graphs,
the case list), `backends` (the backend under test, per-worker caches), `run` (one case), `verdicts` (statuses,
a case's result), `sweep` (the worker pool) and `report` (summary, CSV and JSON).

API: `make_cases` (the case grids), `Case` / `parse_case`, `run_case` (one case in this process),
`run_sweep` (isolated workers) -> `SweepResult` (summary, CSV and JSON in test-backend-ops' fields).
"""

from kazeia.debug.judge import FLT_MAX, Verdict, judge
from kazeia.debug.oracle.backends import BACKENDS, BackendSpec, Caches
from kazeia.debug.oracle.cases import Case, GridOptions, OpDef, Value
from kazeia.debug.oracle.mul_mat import (
    MM_TYPES,
    N_COARSE,
    N_FOCUS,
    N_MODEL_SMALL,
    N_SMALL,
    N_TILES,
    QWEN3_4B,
    SMOLLM2_135M,
    case_for_node,
    mul_mat_case,
    plan_points,
)
from kazeia.debug.oracle.ops import OPS, make_cases, op_def, parse_case
from kazeia.debug.oracle.other_ops import N_ROWS_OPS
from kazeia.debug.oracle.report import CSV_FIELDS, SweepResult, build_commit
from kazeia.debug.oracle.run import case_inputs, case_threshold, reference_output, run_case
from kazeia.debug.oracle.sweep import DEFAULT_TIMEOUT, Progress, default_jobs, now_seed, run_sweep
from kazeia.debug.oracle.verdicts import (
    CRASH,
    DEATH,
    FAIL,
    FAILED_STATUSES,
    NOT_SUPPORTED,
    OK,
    REF_INVALID,
    TIMEOUT,
    CaseResult,
)

__all__ = [
    "BACKENDS", "CRASH", "CSV_FIELDS", "DEATH", "DEFAULT_TIMEOUT", "FAIL", "FAILED_STATUSES", "FLT_MAX", "MM_TYPES",
    "N_COARSE", "N_FOCUS", "N_MODEL_SMALL", "N_ROWS_OPS", "N_SMALL", "N_TILES", "NOT_SUPPORTED", "OK", "OPS",
    "QWEN3_4B", "REF_INVALID", "SMOLLM2_135M", "TIMEOUT", "BackendSpec", "Caches", "Case", "CaseResult",
    "GridOptions", "OpDef", "Progress", "SweepResult", "Value", "Verdict", "build_commit", "case_for_node",
    "case_inputs", "case_threshold", "default_jobs", "judge", "make_cases", "mul_mat_case", "now_seed", "op_def",
    "parse_case", "plan_points", "reference_output", "run_case", "run_sweep",
]
