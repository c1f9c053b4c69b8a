"""Wrong numbers that batch context makes: the first bad MUL_MAT rerun with one op per batch (`--sync`), and the op
that ran before it in its batch. May's HVX MUL_MAT keeps the quantized activations of the last src1 it saw in VTCM
and skips the quantization when the next src1 is at the same address (the src1 shortcut); an op that writes VTCM
without clearing that record (HMX flash attention under 2026-05, as kazeia transcribes upstream) lets a later
MUL_MAT whose src1 reuses that address multiply stale activations. Whether that is what happened is judged from
what this run shows: the order of the ops in their batch and the rerun, never from the emulator's own records."""

from __future__ import annotations

from kazeia.debug.investigate.common import rerun, sync_spec
from kazeia.debug.investigate.table import Context, StepDef


def shortcut_step(cx: Context) -> tuple[str, str]:
    f = cx.findings
    facts = f.facts
    bad = facts.ops.get(f.first_bad) if facts is not None and f.first_bad else None
    if bad is None or bad.op != "MUL_MAT" or not (bad.path or "").startswith("HTP0"):
        return "skipped: the first bad op is not a MUL_MAT the HTP ran", ""
    i = facts.order.index(bad.name)
    prev = facts.ops[facts.order[i - 1]] if i > 0 else None
    f.batch_predecessor = prev if prev is not None and prev.batch == bad.batch and prev.batch is not None else None
    spec = sync_spec(cx)
    r, v = rerun(cx, spec)
    ok = r.ok and v is not None and v.ok
    f.sync_correct = (ok, v.reason if v is not None else r.signature())
    before = (f"{f.batch_predecessor.name} ({f.batch_predecessor.op}) ran just before it in its batch"
              if f.batch_predecessor is not None else "it opened its batch")
    return (f"{before}; with one op per batch the run is {'correct' if ok else 'still wrong'} "
            f"({f.sync_correct[1]})", spec.command())


def stale_shortcut_shown(f) -> bool:
    """This step's evidence points at a stale src1 shortcut: one op per batch makes the run correct and a flash
    attention ran just before the first bad MUL_MAT in its batch (the one predicate the hypothesis, the mechanism
    and the gate ask)."""
    prev = f.batch_predecessor
    return bool(f.sync_correct and f.sync_correct[0] and prev is not None and prev.op == "FLASH_ATTN_EXT")


SHORTCUT = StepDef("batch context of the first bad op", shortcut_step, needs=("first_bad", "facts"),
                   gives=("batch_predecessor", "sync_correct"))
