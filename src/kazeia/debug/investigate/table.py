"""Step tables: each step declares the findings it needs and the ones it gives; the table runner checks both,
counts the progress from the table, and records one report row per table entry (skipped steps included)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from kazeia.backends.htp import HtpSettings
from kazeia.debug.investigate.findings import Findings, is_set
from kazeia.debug.investigate.report import Investigation, Step
from kazeia.engine.session import RunSpec


@dataclass
class Context:
    """One investigation: what is investigated, where the report goes, what has been found."""

    spec: RunSpec
    out_dir: str
    inv: Investigation
    settings: HtpSettings | None  # the HTP settings of the investigated run (None: not an HTP run)
    findings: Findings = field(default_factory=Findings)
    prefix_refs: dict = field(default_factory=dict)  # CPU outputs of prefix runs' stop nodes (common.prefix_reference)

    def fact(self, key: str, value) -> None:
        """A line of the report's Facts table."""
        self.inv.facts[key] = value

    def out(self, *parts: str) -> str:
        p = os.path.join(self.out_dir, *parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p


StepFn = Callable[[Context], tuple[str, str]]  # -> (summary, reproduce command)


@dataclass(frozen=True)
class StepDef:
    title: str
    run: StepFn
    needs: tuple[str, ...] = ()  # Findings fields that must be established for the step to make sense
    gives: tuple[str, ...] = ()  # Findings fields the step may set

    def __post_init__(self) -> None:
        names = {f.name for f in fields(Findings)}
        unknown = [n for n in (*self.needs, *self.gives) if n not in names]
        if unknown:
            raise ValueError(f"step {self.title!r} declares unknown findings {unknown}")


class Progress:
    """`[investigate i/total 12.3s] step title` lines; the total comes from the step table (`start`)."""

    def __init__(self, stream=sys.stderr) -> None:
        self.total, self.i, self.t0, self.stream = None, 0, time.perf_counter(), stream

    def start(self, total: int) -> None:
        self.total = self.i + total

    def __call__(self, msg: str) -> None:
        self.i += 1
        of = f"/{self.total}" if self.total else ""
        if self.stream is not None:
            self.stream.write(f"[investigate {self.i}{of} {time.perf_counter() - self.t0:5.1f}s] {msg}\n")
            self.stream.flush()


def run_table(cx: Context, table: tuple[StepDef, ...], progress: Callable[[str], None]) -> None:
    """Run the steps in order. A step whose needs are not established is recorded as skipped; a step that
    raises is recorded as failed (never the end of the investigation); a step that sets a finding it did not
    declare is noted in the report."""
    start = getattr(progress, "start", None)
    if start is not None:
        start(len(table))
    for step in table:
        progress(step.title)
        missing = [n for n in step.needs if not is_set(getattr(cx.findings, n))]
        if missing:
            cx.inv.steps.append(Step(step.title, 0.0, f"skipped: no {', '.join(missing)} established", ""))
            continue
        before = cx.findings.values()
        t0 = time.perf_counter()
        try:
            summary, cmd = step.run(cx)
        except Exception as e:  # a failing step is reported, never the end of the investigation
            summary, cmd = f"step failed: {type(e).__name__}: {e}", ""
        changed = [k for k, v in cx.findings.values().items() if v is not before[k]]
        undeclared = [k for k in changed if k not in step.gives]
        if undeclared:
            cx.inv.notes.append(f"step {step.title!r} set findings it does not declare: {', '.join(undeclared)}")
        cx.inv.steps.append(Step(step.title, time.perf_counter() - t0, summary, cmd))
