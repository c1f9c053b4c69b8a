"""The entry point: compare a run's device against REF per op, in one mode or both."""

from __future__ import annotations

from kazeia.debug.compare.cumulative import run_cumulative
from kazeia.debug.compare.isolated import run_isolated
from kazeia.debug.compare.reference import Reference, capture_reference, fix_tokens
from kazeia.debug.compare.report import CompareReport
from kazeia.debug.compare.verdict import MODES
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError


def compare(spec: RunSpec, mode: str = "both", reference: Reference | None = None, hooks=(),
            strict: bool = False, only: set[str] | None = None) -> CompareReport:
    """Compare `spec`'s device against REF per op. mode: cumulative, isolated or both. `reference`: a
    `capture_reference` of the same model, prompt tokens, micro-batch and context (made here if None).
    `hooks`: extra hooks on the backend under test (their on_complete runs before the output is read).
    `strict`: judge MUL_MAT by its bare threshold, without the activation-conversion allowance. `only`: the
    node names the isolated mode runs (each op reads REF's inputs there, so the others need not run)."""
    modes = MODES if mode == "both" else (mode,)
    for m in modes:
        if m not in MODES:
            raise KazeiaError(f"unknown compare mode '{mode}' (cumulative, isolated or both)")
    shown = spec.with_(n_predict=0)  # as the user gave it (prompt or --n-prompt), for reproduction commands
    spec = fix_tokens(shown)
    if reference is None:
        reference = capture_reference(spec, sources=True)
    elif not reference.matches(spec):
        raise KazeiaError("the reference was captured for another model, prompt, micro-batch or context")
    report = CompareReport(shown, modes, n_tokens=len(spec.tokens or []), strict=strict)
    if "cumulative" in modes:
        run_cumulative(spec, reference, report, hooks, strict)
    if "isolated" in modes:
        run_isolated(spec, reference, report, hooks, strict, only)
    return report
