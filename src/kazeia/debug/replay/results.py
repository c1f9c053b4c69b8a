"""What a replay found: one judged execution, the whole replay with its diagnosis, and the lines it prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kazeia.debug.dump import Dump
from kazeia.debug.judge import Verdict


@dataclass
class Execution:
    """One run of the op (alone or with context) on one device, judged."""

    mode: str  # "alone" | "with context"
    device: str
    profile: str | None = None
    path: str | None = None  # cpu / ref / hvx / hmx
    status: str | None = None  # the DSP's op status if not OK
    died: dict | None = None  # kind, cause, message, faulting op
    error: str | None = None
    vs_ref: Verdict | None = None
    vs_recorded: Verdict | None = None
    same_death_as_recorded: bool | None = None
    inputs_reproduced: bool | None = None  # with context: did the preceding ops recreate the dumped inputs?
    input_mismatch: list[str] = field(default_factory=list)
    descriptors_reproduced: bool | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    output: np.ndarray | None = field(default=None, repr=False)
    inputs_seen: list | None = field(default=None, repr=False)  # the op's inputs as it started (replay side)
    signature: Any = None  # kazeia.debug.signature.Signature of a wrong output against float64

    @property
    def ok(self) -> bool:
        return (self.died is None and self.error is None and self.status is None and self.vs_ref is not None
                and self.vs_ref.ok)

    @property
    def reference_invalid(self) -> bool:
        return self.vs_ref is not None and self.vs_ref.reference_invalid

    def verdict(self) -> str:
        if self.died is not None:
            s = f"died ({self.died.get('kind')}: {self.died.get('cause')})"
            if self.died.get("faulting") and self.died.get("faulting") != self.died.get("target"):
                s += f" in {self.died['faulting']}, before reaching the op"
            if self.same_death_as_recorded:
                s += ", the same death as the recorded run"
            return s
        if self.error is not None:
            return f"error: {self.error}"
        if self.status is not None:
            return f"FAIL: the op returned {self.status}"
        if self.vs_ref is None:
            return "not compared"
        if self.vs_ref.reference_invalid:
            s = f"UNKNOWN: {self.vs_ref.reason}"
        elif self.vs_ref.ok:
            err = f", max abs err {self.vs_ref.max_abs:.3g}" if self.vs_ref.max_abs else ""
            s = f"OK ({self.vs_ref.reason}{err})"
        else:
            s = f"FAIL: wrong numbers ({self.vs_ref.short()})"
        r = self.vs_recorded
        if r is not None:
            if r.identical:
                s += "; reproduces the recorded output exactly"
            elif r.ok:
                s += f"; matches the recorded output within the threshold (NMSE {r.nmse:.3g})"
            else:
                s += "; differs from the recorded output"
        return s

    def to_dict(self) -> dict:
        return {"mode": self.mode, "device": self.device, "profile": self.profile, "path": self.path,
                "ok": self.ok, "verdict": self.verdict(), "status": self.status, "died": self.died,
                "error": self.error, "vs_ref": self.vs_ref.to_dict() if self.vs_ref else None,
                "vs_recorded": self.vs_recorded.to_dict() if self.vs_recorded else None,
                "same_death_as_recorded": self.same_death_as_recorded,
                "inputs_reproduced": self.inputs_reproduced, "input_mismatch": self.input_mismatch,
                "descriptors_reproduced": self.descriptors_reproduced, "notes": self.notes,
                "signature": self.signature.to_dict() if self.signature is not None else None,
                "extra": {k: v for k, v in self.extra.items() if isinstance(v, (bool, int, float, str, type(None)))}}


@dataclass
class ReplayResult:
    dump_id: str
    name: str
    op: str
    capture: str
    threshold: float
    device: str
    profile: str | None
    alone: Execution
    context: Execution | None = None
    recorded_vs_ref: Verdict | None = None
    recorded_fault: dict | None = None
    reference_error: str | None = None
    notes: list[str] = field(default_factory=list)
    recorded_signature: Any = None  # the recorded output's error signature against float64, when it is wrong
    base_threshold: float | None = None  # the op's threshold before the MUL_MAT allowance
    quant_allowance: float | None = None  # NMSE of ggml's activation conversion on these inputs (MUL_MAT)

    @property
    def ok(self) -> bool:
        return self.alone.ok and (self.context is None or self.context.ok)

    def diagnosis(self) -> str | None:
        if self.context is None:
            return None
        a, c = self.alone.ok, self.context.ok
        if self.alone.reference_invalid or self.context.reference_invalid:
            return "undecided: the float64 reference itself is invalid on these inputs"
        if a and not c:
            return ("context-triggered: the op is correct on its own inputs; what ran before it in its batch "
                    "(VTCM contents, the src1 shortcut, DSP state) makes it fail")
        if not a and not c:
            return "value/shape-triggered: the op fails on its own inputs, with or without its batch context"
        if not a and c:
            return "fails alone only: the batch context hides the failure"
        if self.recorded_fault:
            return "not reproduced: the recorded run died in this op, but the replay passes alone and with context"
        if self.recorded_vs_ref is not None and not self.recorded_vs_ref.ok:
            return ("not reproduced: the recorded output was wrong, but the op passes alone and with its batch "
                    "context")
        return "healthy: the op passes alone and with its batch context"

    def verdict(self) -> str:
        s = f"alone: {self.alone.verdict()}"
        if self.context is not None:
            s += f"; with context: {self.context.verdict()}"
        return s

    def to_dict(self) -> dict:
        return {"dump": self.dump_id, "name": self.name, "op": self.op, "capture": self.capture,
                "threshold": self.threshold, "base_threshold": self.base_threshold,
                "quant_allowance": self.quant_allowance, "device": self.device, "profile": self.profile, "ok": self.ok,
                "verdict": self.verdict(), "diagnosis": self.diagnosis(),
                "recorded_fault": self.recorded_fault, "reference_error": self.reference_error,
                "recorded_vs_ref": self.recorded_vs_ref.to_dict() if self.recorded_vs_ref else None,
                "alone": self.alone.to_dict(), "context": self.context.to_dict() if self.context else None,
                "notes": self.notes}


def format_result(r: ReplayResult, dump: Dump | None = None) -> list[str]:
    """Human-readable lines for one replay."""
    lines = []
    if dump is not None:
        lines.append(dump.summary())
    where = r.device + (f" (profile {r.profile})" if r.profile else "")
    thr = f"threshold NMSE {r.threshold:.3g}"
    if r.quant_allowance is not None and r.threshold != r.base_threshold:
        thr += f" ({r.base_threshold:g} + {r.quant_allowance:.2g} for ggml's own activation conversion)"
    lines.append(f"  replay of {r.name} ({r.op}) on {where}; {thr} vs float64 ref")
    for n in r.notes:
        lines.append(f"  note: {n}")
    if r.recorded_fault:
        lines.append(f"  recorded run: device died in this op ({r.recorded_fault.get('kind')}: "
                     f"{r.recorded_fault.get('cause')})")
    elif r.recorded_vs_ref is not None:
        c = r.recorded_vs_ref
        state = "UNKNOWN" if c.reference_invalid else "OK" if c.ok else "WRONG"
        lines.append(f"  recorded output vs ref: {state} ({c.short()})")
        if r.recorded_signature is not None and r.recorded_signature.classes:
            lines += ["    " + x for x in r.recorded_signature.lines()]
    for ex in (r.alone, r.context):
        if ex is None:
            continue
        lines.append(f"  {ex.mode}: {ex.verdict()}" + (f" [path {ex.path}]" if ex.path else ""))
        if ex.signature is not None and ex.signature.classes:
            lines.append(f"    {ex.signature.lines()[0]}")
        if ex.descriptors_reproduced is not None:
            lines.append(f"    context rebuilt: descriptor indexes "
                         f"{'as recorded' if ex.descriptors_reproduced else 'DIFFERENT from the recording'}; "
                         f"the op's inputs {'as dumped' if ex.inputs_reproduced else 'NOT as dumped'}")
        if ex.inputs_reproduced is False:
            lines.append(f"    warning: the context replay did not recreate the dumped inputs "
                         f"({', '.join(ex.input_mismatch)})")
        for n in ex.notes:
            lines.append(f"    note: {n}")
    lines.append(f"  verdict: {r.verdict()}")
    diag = r.diagnosis()
    if diag:
        lines.append(f"  => {diag}")
    return lines
