"""The verdict of each branch, in words built from the findings: names from the run, numbers from the run or
from the code that decides them."""

from __future__ import annotations

from kazeia.debug.investigate.facts import dies
from kazeia.debug.investigate.hypotheses import Judged
from kazeia.debug.investigate.table import Context

# what the outcome of a failed HMX plan means for the DSP (kazeia.backends.htp.plan.MatmulPlan.outcome)
_CONSEQUENCE = {"reenter": "re-entry without HVX fallback"}


def evaluate(cx: Context, table: tuple[Judged, ...]) -> None:
    for judge in table:
        try:
            h = judge(cx.findings)
        except Exception as e:  # one hypothesis failing to evaluate must not lose the others
            cx.inv.notes.append(f"could not evaluate {judge.__name__}: {type(e).__name__}: {e}")
            continue
        if h is not None:
            cx.inv.hypotheses.append(h)


def _with_gate(cx: Context, parts: list[str]) -> str:
    """The verdict's sentences, closed by the gate's first sentence when a gate was proposed; a fault injected for
    a public report is named as that report's symptom, reported and not explained."""
    from kazeia.backends.htp import REPORTED

    for name in cx.spec.faults:
        if name in REPORTED:
            parts = [*parts, f"This run injects {name}, the symptom of {REPORTED[name]} as reported upstream; its "
                             "cause is not published, so the mechanism named here is the injection's, not a "
                             "confirmed one."]
    if cx.settings is not None:
        parts = [*parts, *_build_sentence(cx)]
    g = cx.inv.gate
    if g:
        checked = "validated by a rerun" if g.get("validated") else "NOT validated"
        parts = [*parts, f"Gate: {g['description'].split('. ')[0]} ({checked})."]
    pd = cx.findings.prompt_dependence
    if pd is not None and pd[0] and not (g and g.get("validated")):
        parts = [*parts, "An output that ignores the prompt points at what reaches the device rather than at one op: "
                         "no gate by op kind was validated here; the CPU (-dev CPU) computes it."]
    return " ".join(parts)


def _build_sentence(cx: Context) -> list[str]:
    """The bad build this run injects (fault hmx-queue-narrowing), named with what it skips: the ops this
    investigation found wrong are then the ones those workers serve, or not."""
    from kazeia.backends.htp import build_skips, describe_skips

    skips = build_skips(cx.settings)
    if not skips:
        return []
    seed = cx.spec.env.get("KAZEIA_HTP_BUILD_SEED")
    which = f" (KAZEIA_HTP_BUILD_SEED={seed})" if seed else ""
    return [f"This run injects hmx-queue-narrowing: a 2026-05 build{which} whose {describe_skips(skips)} entry "
            "address ends in 0x00, so May's hmx_queue_process takes those jobs for HMX_QUEUE_NOOP, skips them and "
            "marks them done (fixed by llama.cpp #25677); another build of the same code skips other workers or "
            "none (`kazeia determinism ... -N 20` runs 20 builds)."]


def mechanism(cx: Context) -> str:
    """The failure chain of a dying HMX plan, from the plan and the death this run showed."""
    f = cx.findings
    p = f.plan
    death = f.death or (f.first.death if f.first else None) or {}
    head = (f"HMX VTCM plan overflow by {p.overflow} B" if p.status == "overflow"
            else f"HMX chunk search finds no chunking for {p.vtcm} B")
    if death.get("kind") == "hang":
        return (f"{head} → {_CONSEQUENCE.get(p.outcome, p.outcome)}, compiled as a jump (this build: the injected "
                f"reentry-tail-call; which builds do so is kazeia's hypothesis) → the DSP retries the op forever "
                f"(a hang; the host's dspqueue_read never returns)")
    code = death.get("code")
    seen = f"the host sees 0x{code:x} at its next flush_pending" if code is not None else "the host sees the death late"
    return (f"{head} → {_CONSEQUENCE.get(p.outcome, p.outcome)} → DSP death ({death.get('kind') or 'death'}; "
            f"{seen})")


def death_verdict(cx: Context) -> None:
    f = cx.findings
    fo = f.faulting_facts
    name = f.faulting or "an unidentified op"
    part = f"The faulting op is {name}" + (f" ({fo.shape()})" if fo is not None and fo.m is not None else "")
    if f.last_enqueued_team and f.last_enqueued_team != name:
        blamed = f.facts.described.get(f.last_enqueued_team) if f.facts is not None else None
        part += (f", not {f.last_enqueued_team}, the {blamed}, which the OPBATCH=1 log pointed at" if blamed else
                 f", not {f.last_enqueued_team} (which the OPBATCH=1 log pointed at)")
    parts = [part + "."]
    if f.plan is not None and dies(f.plan):
        cx.inv.mechanism = mechanism(cx)
        parts.append(f"Mechanism: {cx.inv.mechanism}.")
        cx.fact("mechanism", cx.inv.mechanism)
    elif cx.inv.mechanism:  # set by the address step from the crash record
        parts.append(f"Mechanism: {cx.inv.mechanism}.")
        cx.fact("mechanism", cx.inv.mechanism)
    if f.failing_range:
        lo, hi = f.failing_range
        others = [r for r in f.predicted_ranges or [] if r != f.failing_range]
        rest = (f"and, by the plan, for M in {', '.join(f'{a}..{b}' for a, b in others)}" if others else
                f"and for no other M up to {f.m_limit}")
        parts.append(f"It fails for M = {lo}..{hi} tokens per micro-batch {rest}.")
    ruled = [h.name for h in cx.inv.hypotheses if h.status == "ruled out"]
    if ruled:
        parts.append("Ruled out by measurement: " + ", ".join(ruled) + ".")
    if any(h.name == "capture timing" and h.status == "explains a symptom" for h in cx.inv.hypotheses):
        parts.append("A dump taken at enqueue time would not be the data the op consumed.")
    cx.inv.verdict = _with_gate(cx, parts)


def numeric_verdict(cx: Context) -> None:
    f = cx.findings
    parts = [cx.inv.outcome + "."]
    if f.first_bad:
        first = f.compare.first_failure if f.compare is not None else None
        how = ("in the run itself: its inputs were near the reference's, its output not" if first is not None
               and first.mode == "cumulative" else "each op fed the float64 reference's inputs")
        parts.append(f"The first op out of tolerance ({how}) is {f.first_bad}.")
    if f.determinism is not None:
        parts.append("The run is deterministic." if f.determinism.deterministic else
                     f"The run is NOT deterministic: {f.determinism.message}.")
    if f.prompt_dependence is not None and f.prompt_dependence[0]:
        _, dev, host = f.prompt_dependence
        parts.append(f"The output is prompt-independent: another prompt of the same length leaves the device's logits "
                     f"{'the same' if dev == 0 else f'within {dev:.3g} (relative)'} where the CPU's change by "
                     f"{host:.3g}; finite numbers, no error.")
    if cx.inv.mechanism:
        parts.append(f"Mechanism: {cx.inv.mechanism}.")
    elif f.replay is not None and f.replay.diagnosis():
        parts.append(f"Replay: {f.replay.diagnosis()}.")
    if f.later_code is not None:
        profile, right, how = f.later_code
        parts.append(f"On the same inputs the {profile} code computes {f.first_bad} right ({how}): a defect of "
                     f"this version's code that upstream's later code does not have (both as kazeia transcribes "
                     f"them; which change fixed it is not established here)." if right else
                     f"The {profile} code gets {f.first_bad} wrong on the same inputs too ({how}).")
    cx.inv.verdict = _with_gate(cx, parts)


def healthy_verdict(cx: Context) -> None:
    f = cx.findings
    rep = f.determinism
    where = cx.spec.device + (f" ({cx.spec.htp_profile})" if cx.spec.htp_profile else "")
    det = "deterministic" if rep is not None and rep.deterministic else "NOT deterministic"
    cx.inv.verdict = (f"No fault: the run completes on {where}, its logits match the CPU backend "
                      f"({f.logits.reason}), and it is {det}.")
    cx.fact("logits vs CPU", f.logits.reason)
