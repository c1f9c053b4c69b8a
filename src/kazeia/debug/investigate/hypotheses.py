"""The standard hypotheses, each judged from what the investigation measured (never from the emulator's ground
truth): fp16 overflow, non-finite inputs, shape alone, value pattern, context/state, VTCM budget, capture
timing, and the op the logs blamed. A hypothesis without evidence stays inconclusive."""

from __future__ import annotations

from collections.abc import Callable

from kazeia.debug.investigate.facts import dies
from kazeia.debug.investigate.figures import FP16_MAX
from kazeia.debug.investigate.findings import BLAMED_CPU, FAULTING_CPU, HMX_OFF, Findings
from kazeia.debug.investigate.report import Hypothesis
from kazeia.debug.investigate.shortcut import stale_shortcut_shown
from kazeia.debug.investigate.vtcm import why_it_fails

Judged = Callable[[Findings], Hypothesis | None]


def _status(h: Hypothesis) -> str:
    if h.evidence_for and not h.evidence_against:
        return "confirmed"
    if h.evidence_against and not h.evidence_for:
        return "ruled out"
    return "inconclusive"


def fp16_overflow(f: Findings) -> Hypothesis:
    h = Hypothesis("fp16 overflow", f"Do activations exceed the fp16 range ({FP16_MAX:g}), so fp16 staging or "
                                    f"accumulation produces inf?", "inconclusive")
    if f.amax_inputs is None:  # no trace: nothing measured
        return h
    fin = f.fault_inputs or []
    if fin:
        h.evidence_against.append("faulting op's inputs: " + "; ".join(s.short() for s in fin))
    big = max([f.amax_inputs, f.amax_outputs] + [s.amax for s in fin])
    hmx_off = f.trial(HMX_OFF)
    if big >= FP16_MAX:
        h.status, h.evidence_for = "confirmed", [f"|x| reaches {big:.4g} (fp16 max {FP16_MAX:g})"]
        return h
    h.evidence_against.append(f"largest |x| of any op input {f.amax_inputs:.4g}, of any output "
                              f"{f.amax_outputs:.4g}: {FP16_MAX / big if big else float('inf'):.3g}x below "
                              f"{FP16_MAX:g}")
    if hmx_off is not None and hmx_off.completes:
        h.evidence_against.append("with HMX off the same activations are converted to fp16 by the HVX path and the "
                                  "run completes" + (f" {hmx_off.ran}" if hmx_off.ran else ""))
    h.status = "ruled out" if big < FP16_MAX / 8 else "inconclusive"
    return h


def nonfinite_inputs(f: Findings) -> Hypothesis:
    h = Hypothesis("non-finite inputs", "Does a NaN or inf reach the faulting op (counted NaN-aware: amax skips "
                                        "nothing, NaN/inf are counted separately)?", "inconclusive")
    if f.nonfinite_before is None:
        return h
    n_fault = sum(s.nonfinite for s in f.fault_inputs or [])
    if not f.nonfinite_before and not n_fault:
        h.status = "ruled out"
        h.evidence_against.append(f"0 NaN, 0 +inf, 0 -inf in the inputs and outputs of all {f.ops_completed} ops "
                                  f"that completed, and in the faulting op's inputs (the KQ mask's -inf entries, "
                                  f"there by design, excluded)")
    else:
        h.status = "confirmed"
        h.evidence_for.append(f"non-finite values in {len(f.nonfinite_before)} tensors (first: "
                              f"{f.nonfinite_before[:3]})")
    return h


def shape_alone(f: Findings) -> Hypothesis:
    h = Hypothesis("shape alone", "Does the op fail because of its shapes (M, K, N, type), whatever the values and "
                                  "whatever ran before it?", "inconclusive")
    if f.replay is not None:
        (h.evidence_for if not f.replay.alone.ok else h.evidence_against).append(
            f"replayed alone on a fresh device with its dumped inputs: {f.replay.alone.verdict()}")
    if f.rows is not None and f.rows.depends_on:
        (h.evidence_for if f.rows.depends_on == "row count" else h.evidence_against).append(
            f"delta debugging over its input rows: {f.rows.message}")
    if f.failing_range:
        lo, hi = f.failing_range
        runs = f"real runs ({f.m_ran}) confirm" if f.m_ran else "real runs confirm"
        h.evidence_for.append(f"the plan arithmetic predicts failure exactly for M in {lo}..{hi} (up to M="
                              f"{f.m_limit}) and {runs} the boundaries")
    h.status = _status(h)
    return h


def value_pattern(f: Findings) -> Hypothesis:
    h = Hypothesis("value pattern", "Does a particular pattern of activation values trigger the fault?", "inconclusive")
    if f.rows is not None:
        if f.rows.depends_on == "row count":
            h.status = "ruled out"
            h.evidence_against.append(f.rows.message)
            for vc in f.rows.value_checks[:3]:
                h.evidence_against.append(f"{vc.get('what', 'check')}: {vc.get('outcome', vc)}")
        elif f.rows.depends_on == "values":
            h.status = "confirmed"
            h.evidence_for.append(f.rows.message)
    return h


def context_state(f: Findings) -> Hypothesis:
    h = Hypothesis("context / device state", "Does what ran before the op in its batch (VTCM contents, the src1 "
                                             "shortcut, DSP state) cause the fault?", "inconclusive")
    if f.sync_reproduces:
        h.evidence_against.append("the run still dies with one op per batch (no batch context at all)")
    rp = f.replay
    if rp is not None and rp.context is not None:
        same = rp.alone.ok == rp.context.ok
        (h.evidence_against if same else h.evidence_for).append(f"replay alone vs with its batch context: "
                                                                f"{rp.verdict()}")
    h.status = _status(h)
    return h


def vtcm_budget(f: Findings) -> Hypothesis:
    h = Hypothesis("VTCM budget", "Does the op's VTCM layout exceed the VTCM it has?", "not applicable")
    p, pr = f.plan, f.plan_robust
    if p is None:
        return h
    if dies(p):
        h.evidence_for.append(why_it_fails(p))
    else:
        h.evidence_against.append(f"the plan runs: {p.used} of {p.vtcm} B ({p.path}, {p.status})")
    if pr is not None and pr.fits:
        h.evidence_for.append(f"the robust plan for the same op fits ({pr.path}, {pr.used} B"
                              + (f", mc={pr.mc}, nc={pr.nc})" if pr.mc is not None else ")"))
    dying = {p.name for p in f.dying_plans()}
    for kind in (HMX_OFF, FAULTING_CPU):
        t = f.trial(kind)
        if t is None:
            continue
        moved = t.died and t.died_in in dying and t.died_in != f.faulting  # the death follows the plan
        (h.evidence_for if t.completes or moved else h.evidence_against).append(
            f"{t.label}: the run {t.outcome()}" + (", another op whose HMX plan does not fit" if moved else ""))
    rr = f.replay_robust
    if rr is not None:
        (h.evidence_for if rr.alone.ok else h.evidence_against).append(f"replay on the robust profile: "
                                                                        f"{rr.alone.verdict()}")
    if f.dsp_log:
        h.evidence_for.append(f"DSP log: {len(f.dsp_log)} error lines like '{f.dsp_log[0]}' (on a device only "
                              f"visible with root)")
    h.status = "confirmed" if h.evidence_for and dies(p) else "ruled out"
    return h


def capture_timing(f: Findings) -> Hypothesis:
    h = Hypothesis("capture timing", "Is a dump taken at enqueue time what the op consumed?", "inconclusive")
    diff = f.capture_diff
    if diff is None:
        return h
    if not diff.inputs_identical:
        h.status = "explains a symptom"
        h.evidence_for.append("a dump taken at enqueue time is NOT the consumed data: " + " ".join(diff.describe()))
        h.evidence_for.append("the host captured it before the DSP ran the op's batch (the HTP runs a batch only "
                              "when the host waits for it), so the capture holds whatever that memory held before "
                              "the producer wrote it")
    else:
        h.status = "ruled out"
        h.evidence_against.append("the enqueue-time capture equals the consumed data here")
    return h


def blamed_op(f: Findings) -> Hypothesis | None:
    team, faulting = f.last_enqueued_team, f.faulting
    if not team or team == faulting:
        return None
    h = Hypothesis(f"{team} (what the logs blamed)", f"Is {team}, the last op logged before the error with "
                                                     f"OPBATCH=1, the faulting op?", "ruled out")
    h.evidence_against.append(f"with one-op batches the failing batch holds {faulting}, not {team}")
    if f.team_distance:
        h.evidence_against.append(f"{team} comes {f.team_distance} ops after {faulting}: with OPQUEUE="
                                  f"{f.team_opqueue} batches in flight the host only reads a failed response when "
                                  f"the queue is full")
    t = f.trial(BLAMED_CPU)
    if t is not None:
        h.evidence_against.append(f"{t.label}: the run {t.outcome()}")
    return h


def _first_output(f: Findings, pred) -> tuple[int, str] | None:
    """(position, name) in the run's execution order of the first op whose output satisfies `pred` (Stats)."""
    facts = f.facts
    if facts is None:
        return None
    for i, name in enumerate(facts.order):
        st = facts.ops[name].out_stats
        if st is not None and pred(name, st):
            return i, name
    return None


def _after_first_bad(f: Findings, h: Hypothesis, pred, what: str) -> Hypothesis:
    """A confirmed hypothesis of the wrong-numbers branch whose first sign comes after the first bad op is one of its
    consequences, not its cause: relabelled so, with where each was seen."""
    facts = f.facts
    if h.status != "confirmed" or facts is None or not f.first_bad or f.first_bad not in facts.order:
        return h
    seen = _first_output(f, pred)
    bad = facts.order.index(f.first_bad)
    if seen is not None and seen[0] >= bad:  # (the bad op's own output is its symptom, not a cause)
        h.status = "consequence"
        where = "the first bad op's own output" if seen[0] == bad else f"{seen[0] - bad} ops after the first bad op"
        h.evidence_against.append(f"the first output with {what} is {seen[1]} ({where}; {f.first_bad}'s inputs were "
                                  f"still near the reference's): it follows from {f.first_bad}'s wrong output, it does "
                                  f"not explain it")
    elif seen is not None:
        h.status = "cause"
        h.evidence_for.append(f"{what} first at {seen[1]}, before the first bad op {f.first_bad}")
    return h


def fp16_overflow_numeric(f: Findings) -> Hypothesis:
    return _after_first_bad(f, fp16_overflow(f), lambda name, st: st.amax >= FP16_MAX, f"|x| >= {FP16_MAX:g}")


def nonfinite_numeric(f: Findings) -> Hypothesis:
    # (a KQ mask's -inf entries are there by design)
    return _after_first_bad(f, nonfinite_inputs(f), lambda name, st: st.nan or st.pinf or (st.ninf and "mask" not in
                                                                                          name), "NaN or inf")


def stale_shortcut(f: Findings) -> Hypothesis | None:
    """May's src1 shortcut left stale by the op before the first bad MUL_MAT in its batch (shortcut.py)."""
    if f.sync_correct is None:
        return None
    h = Hypothesis("stale src1 shortcut", "Does the first bad MUL_MAT multiply quantized activations an earlier op of "
                                          "its batch left in VTCM (the src1 shortcut), because the op just before it "
                                          "did not clear the shortcut?", "inconclusive")
    ok, why = f.sync_correct
    (h.evidence_for if ok else h.evidence_against).append(
        f"with one op per batch (--sync: no op shares a batch, so no shortcut survives) the run is "
        f"{'correct' if ok else 'still wrong'} ({why})")
    prev = f.batch_predecessor
    if prev is not None and prev.op == "FLASH_ATTN_EXT":
        h.evidence_for.append(f"{prev.name} (FLASH_ATTN_EXT on {prev.path}) ran just before {f.first_bad} in its "
                              f"batch: 2026-05's HMX flash attention writes VTCM without clearing the shortcut "
                              f"(kazeia's transcription of upstream, listed by `kazeia htp faults`)")
    elif prev is not None:
        h.evidence_against.append(f"the op before it in its batch is {prev.name} ({prev.op}), not a flash attention")
    else:
        h.evidence_against.append(f"{f.first_bad} opened its batch: no earlier op of the batch could leave state")
    h.status = "cause" if stale_shortcut_shown(f) else _status(h)
    return h


def prompt_independent(f: Findings) -> Hypothesis | None:
    """The device's output ignores the prompt (prompt.py): GenieX #1429's symptom, apart from non-finite numbers."""
    if f.prompt_dependence is None:
        return None
    ignores, dev, host = f.prompt_dependence
    h = Hypothesis("prompt-independent output", "Does the device give the same output whatever the prompt (finite "
                                                "numbers, no error), where the CPU's output changes with it?",
                   "confirmed" if ignores else "ruled out")
    (h.evidence_for if ignores else h.evidence_against).append(
        f"another prompt of the same length changes the CPU's logits by {host:.3g} (relative) and the device's by "
        f"{dev:.3g}")
    return h


DEATH_HYPOTHESES: tuple[Judged, ...] = (fp16_overflow, nonfinite_inputs, shape_alone, value_pattern, context_state,
                                        vtcm_budget, capture_timing, blamed_op)
NUMERIC_HYPOTHESES: tuple[Judged, ...] = (stale_shortcut, prompt_independent, fp16_overflow_numeric, nonfinite_numeric,
                                          capture_timing)
