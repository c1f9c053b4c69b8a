"""The one outcome of a run: `upgrade`, `investigate`, `determinism` and `gate` classify what a run did here, so no
two tools call the same run two names (issue 37). NaN is never "completes".

The classes, first match wins:
- hang: the DSP never finished an op (the host's dspqueue_read would wait forever), or a child run timed out;
- device death: the DSP process died; the host's line (`ggml-hex: dspqueue_read failed: 0x0000002e`) is kept as
  printed, with the op the DSP died in;
- op error: an op returned a status the host surfaced (2026-10's sticky status, robust's raise);
- error: anything else that stopped the run (a child that crashed, a refused input);
- wrong numbers: it finished, but some logit is not finite, or (judged against a reference) the logits are past
  the whole-model bound (test_llama's 2e-3 NMSE);
- completes: it finished with finite logits within the bound (or with no reference to judge them: `judged` says).

Whether wrong numbers come from one op or from a drift accumulated over many is not decided here: `kazeia compare`
tells them apart (its cumulative mode judges an op only while its inputs still match the reference).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kazeia.debug.judge import WHOLE_MODEL_NMSE, nmse
from kazeia.debug.runner import RunResult
from kazeia.errors import COMPLETES, DEATH, ERROR, HANG, OP_ERROR, OUTCOMES, WRONG

KINDS = OUTCOMES  # (the classes, named once in errors.py)


@dataclass(frozen=True)
class Outcome:
    """What a run did: its class (KINDS), one line a person reads, the op behind a failure, the host's own line."""

    kind: str
    summary: str
    op: str | None = None           # the op the DSP died or hung in, or whose status stopped the run
    host_line: str | None = None    # the host's error line, as a device prints it
    nonfinite: int = 0              # logits that are NaN or infinite (of `total`)
    total: int = 0
    nmse: float | None = None       # the logits against the reference (None: not judged)
    judged: bool = False            # the logits were compared with a reference

    @property
    def ok(self) -> bool:
        return self.kind == COMPLETES

    @property
    def failed(self) -> bool:
        return not self.ok


def classify(r: RunResult, reference: np.ndarray | None = None, bound: float = WHOLE_MODEL_NMSE,
             what: str = "logits") -> Outcome:
    """The outcome of a finished `run` / `run_child`: `reference` (the same rows as r.output, e.g. REF's or the
    CPU's logits) judges the numbers against `bound`; the last row is judged (the token a decode would pick)."""
    if r.death:
        d = r.death
        line, op = d.get("message") or "", d.get("faulting")
        if d.get("kind") == "hang":
            return Outcome(HANG, f"hang: the DSP never finishes {op or 'an op'} ({d.get('cause') or line})", op, line)
        return Outcome(DEATH, f"device death ({d.get('kind') or 'death'}) in {op or 'an unknown op'}: "
                              f"{d.get('cause') or line}", op, line)
    if r.error:
        det = r.error_detail or {}
        if "(hang)" in r.error:
            return Outcome(HANG, r.error)
        if det.get("status"):
            return Outcome(OP_ERROR, f"{det.get('faulting') or 'an op'} returned {det['status']} on the DSP "
                                     f"(the host aborted in {det.get('aborted_in') or '?'})", det.get("faulting"),
                           r.error)
        return Outcome(ERROR, r.error, host_line=r.error)
    out = r.output
    if out is None:
        return Outcome(COMPLETES, "completes (no output kept to judge)")
    last = np.asarray(out)[-1:]
    total = int(last.size)
    bad = total - int(np.isfinite(last).sum())
    err = None
    if reference is not None:
        err = float(nmse(np.asarray(last, np.float64), np.asarray(np.asarray(reference)[-1:], np.float64)))
    if bad:
        return Outcome(WRONG, f"{bad} of {total} {what} are not finite", nonfinite=bad, total=total, nmse=err,
                       judged=reference is not None)
    if err is not None and not err <= bound:
        return Outcome(WRONG, f"{what} NMSE {err:.3g} against the reference, past the whole-model bound {bound:g}",
                       total=total, nmse=err, judged=True)
    judged = f" ({what} NMSE {err:.3g} against the reference)" if err is not None else " (not judged)"
    return Outcome(COMPLETES, "completes" + judged, total=total, nmse=err, judged=reference is not None)


def of_exception(e: BaseException) -> str:
    """The class of an exception raised in this process (a run that did not return a RunResult): the error's own
    `outcome` (errors.py), "error" for anything else."""
    return getattr(e, "outcome", ERROR)
