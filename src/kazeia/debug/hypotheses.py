"""The standard hypotheses, each judged from what the investigation measured (never from the emulator's
ground truth): fp16 overflow, non-finite inputs, shape alone, value pattern, context/state, VTCM budget,
capture timing, and the op the logs blamed."""

from __future__ import annotations

from kazeia.debug.investigate import Context
from kazeia.debug.report import Hypothesis

FP16_MAX = 65504.0


def _h(cx: Context, name: str, question: str) -> Hypothesis:
    h = Hypothesis(name, question, "inconclusive")
    cx.inv.hypotheses.append(h)
    return h


def fp16_overflow(cx: Context) -> None:
    f = cx.findings
    h = _h(cx, "fp16 overflow", "Do activations exceed the fp16 range (65504), so fp16 staging or accumulation "
                                 "produces inf?")
    fin = f.get("fault_inputs") or []
    a_in, a_out = f.get("amax_inputs", 0.0), f.get("amax_outputs", 0.0)
    if fin:
        h.evidence_against.append("faulting op's inputs: " + "; ".join(s.short() for s in fin))
    h.evidence_against.append(f"largest |x| of any op input before the fault {a_in:.4g}, of any output "
                              f"{a_out:.4g}, far below {FP16_MAX:g}")
    rt = f.get("routing", {})
    hmx_off = next((v for k, v in rt.items() if k.startswith("HMX off")), None)
    if hmx_off and not hmx_off["died"]:
        h.evidence_against.append("with HMX off the same activations are converted to fp16 by the HVX path and the "
                                  "run completes")
    big = max([a_in, a_out] + [s.amax for s in fin])
    h.status = "ruled out" if big < FP16_MAX / 8 else "inconclusive"
    if big >= FP16_MAX:
        h.status, h.evidence_for = "confirmed", [f"|x| reaches {big:.4g}"]


def nonfinite_inputs(cx: Context) -> None:
    f = cx.findings
    h = _h(cx, "non-finite inputs", "Does a NaN or inf reach the faulting op (counted NaN-aware: amax skips "
                                    "nothing, NaN/inf are counted separately)?")
    bad = f.get("nonfinite_before") or []
    fin = f.get("fault_inputs") or []
    n_fault = sum(s.nonfinite for s in fin)
    if not bad and not n_fault:
        h.status = "ruled out"
        h.evidence_against.append(f"0 NaN, 0 +inf, 0 -inf in the inputs and outputs of all "
                                  f"{f.get('ops_completed', 0)} ops that completed before the fault, and in the "
                                  f"faulting op's inputs (the KQ mask's -inf entries, there by design, excluded)")
    else:
        h.status = "confirmed"
        h.evidence_for.append(f"non-finite values in {len(bad)} tensors before the fault (first: {bad[:3]})")


def shape_alone(cx: Context) -> None:
    f = cx.findings
    h = _h(cx, "shape alone", "Does the op fail because of its shapes (M, K, N, type), whatever the values and "
                              "whatever ran before it?")
    rp = f.get("replay")
    if rp is not None:
        (h.evidence_for if not rp.alone.ok else h.evidence_against).append(
            f"replayed alone on a fresh device with its dumped inputs: {rp.alone.verdict()}")
    rows = f.get("rows")
    if rows is not None and rows.depends_on:
        (h.evidence_for if rows.depends_on == "row count" else h.evidence_against).append(
            f"delta debugging over its input rows: {rows.message}")
    rng = f.get("failing_range")
    if rng:
        h.evidence_for.append(f"the plan arithmetic predicts failure exactly for M in {rng[0]}..{rng[1]} and real "
                              f"runs confirm the boundaries")
    h.status = "confirmed" if h.evidence_for and not h.evidence_against else (
        "ruled out" if h.evidence_against and not h.evidence_for else "inconclusive")


def value_pattern(cx: Context) -> None:
    f = cx.findings
    h = _h(cx, "value pattern", "Does a particular pattern of activation values trigger the fault?")
    rows = f.get("rows")
    if rows is not None:
        if rows.depends_on == "row count":
            h.status = "ruled out"
            h.evidence_against.append(rows.message)
            for vc in rows.value_checks[:3]:
                h.evidence_against.append(f"{vc.get('what', 'check')}: {vc.get('outcome', vc)}")
        elif rows.depends_on == "values":
            h.status = "confirmed"
            h.evidence_for.append(rows.message)


def context_state(cx: Context) -> None:
    f = cx.findings
    h = _h(cx, "context / device state", "Does what ran before the op in its batch (VTCM contents, the src1 "
                                         "shortcut, DSP state) cause the fault?")
    rp = f.get("replay")
    if f.get("sync_reproduces"):
        h.evidence_against.append("the run still dies with one op per batch (no batch context at all)")
    if rp is not None and rp.context is not None:
        same = rp.alone.ok == rp.context.ok
        (h.evidence_against if same else h.evidence_for).append(f"replay alone vs with its batch context: "
                                                                f"{rp.verdict()}")
    h.status = "ruled out" if h.evidence_against and not h.evidence_for else (
        "confirmed" if h.evidence_for else "inconclusive")


def vtcm_budget(cx: Context) -> None:
    f = cx.findings
    h = _h(cx, "VTCM budget", "Does the op's VTCM layout exceed the VTCM it has?")
    p, pr = f.get("plan"), f.get("plan_robust")
    if p is None:
        h.status = "not applicable"
        return
    if not p.fits:
        h.evidence_for.append(f"the HMX plan ({p.profile}) uses {p.used} B of {p.vtcm} B: over by {p.overflow} B "
                              f"(mc={p.mc}, nc={p.nc}; the chunk search budgets 256 B of overhead while every area "
                              f"is rounded up to 2048 B) -> the kernel returns -1 -> {p.outcome}")
    else:
        h.evidence_against.append(f"the plan fits: {p.used} of {p.vtcm} B")
    if pr is not None and pr.fits:
        h.evidence_for.append(f"the robust plan for the same op fits ({pr.used} B, mc={pr.mc}, nc={pr.nc})")
    rt = f.get("routing", {})
    for k, v in rt.items():
        if k.startswith("HMX off") or k.startswith("only " + str(f.get("faulting"))):
            (h.evidence_for if not v["died"] else h.evidence_against).append(
                f"{k}: the run {'completes' if not v['died'] else 'still dies'}")
    rr = f.get("replay_robust")
    if rr is not None:
        (h.evidence_for if rr.alone.ok else h.evidence_against).append(f"replay on the robust profile: "
                                                                        f"{rr.alone.verdict()}")
    log = f.get("dsp_log") or []
    if log:
        h.evidence_for.append(f"DSP log: {len(log)} lines like '{log[0]}' (on a device only visible with root)")
    h.status = "confirmed" if h.evidence_for and not p.fits else "ruled out"


def capture_timing(cx: Context) -> None:
    f = cx.findings
    h = _h(cx, "capture timing", "Is a dump taken at enqueue time what the op consumed?")
    diff = f.get("capture_diff")
    if diff is None:
        h.status = "inconclusive"
        return
    if not diff.inputs_identical:
        h.status = "explains a symptom"
        h.evidence_for.append("a dump taken at enqueue time is NOT the consumed data: " + " ".join(diff.describe()))
        h.evidence_for.append("on the device, the producer of that input is still in the same, unsubmitted batch "
                              "when the host enqueues the op: the buffer holds leftovers of earlier tenants (zeros, "
                              "-inf mask values), different from run to run, which is what the team saw")
    else:
        h.status = "ruled out"
        h.evidence_against.append("the enqueue-time capture equals the consumed data here")


def blamed_op(cx: Context) -> None:
    f = cx.findings
    team, faulting = f.get("last_enqueued_team"), f.get("faulting")
    if not team or team == faulting:
        return
    h = _h(cx, f"{team} (what the logs blamed)", f"Is {team}, the last op logged before the error with "
                                                 f"OPBATCH=1, the faulting op?")
    h.status = "ruled out"
    h.evidence_against.append(f"with one-op batches the failing batch holds {faulting}, not {team}")
    if f.get("team_distance"):
        h.evidence_against.append(f"{team} comes {f['team_distance']} ops after {faulting}: with OPQUEUE=16 batches in "
                                  f"flight the host only reads a failed response when the queue is full")
    for k, v in f.get("routing", {}).items():
        if k.startswith(f"only {team}"):
            h.evidence_against.append(f"{k}: the run {'still dies' if v['died'] else 'completes'}")


def evaluate_death(cx: Context) -> None:
    for fn in (fp16_overflow, nonfinite_inputs, shape_alone, value_pattern, context_state, vtcm_budget,
               capture_timing, blamed_op):
        try:
            fn(cx)
        except Exception as e:  # one hypothesis failing to evaluate must not lose the others
            cx.inv.notes.append(f"could not evaluate {fn.__name__}: {type(e).__name__}: {e}")
    _verdict(cx)


def _verdict(cx: Context) -> None:
    f = cx.findings
    fo = f.get("faulting_facts")
    p = f.get("plan")
    death = f.get("death") or (cx.first.death if cx.first else {}) or {}
    name = f.get("faulting") or "an unidentified op"
    shape = f" ({fo.op} of {fo.weight}, K={fo.k}, N={fo.n}, M={fo.m}, {fo.wtype})" if fo and fo.m else ""
    blamed = f.get("last_enqueued_team")
    parts = [f"The faulting op is {name}{shape}"]
    if blamed and blamed != name:
        parts[-1] += f", not {blamed} (which the OPBATCH=1 log pointed at)"
    parts[-1] += "."
    if p is not None and not p.fits and p.outcome == "reenter":
        kind = death.get("kind") or "death"
        cx.inv.mechanism = (f"HMX VTCM plan overflow by {p.overflow} B → re-entry without HVX fallback → DSP death "
                            f"({kind}; the host sees 0x2e at its next flush_pending)")
        parts.append(f"Mechanism: {cx.inv.mechanism}.")
    rng = f.get("failing_range")
    if rng:
        parts.append(f"It fails for M = {rng[0]}..{rng[1]} tokens per micro-batch and for no other M up to the "
                     f"micro-batch size.")
    ruled = [h.name for h in cx.inv.hypotheses if h.status == "ruled out"]
    if ruled:
        parts.append("Ruled out by measurement: " + ", ".join(ruled) + ".")
    ct = next((h for h in cx.inv.hypotheses if h.name == "capture timing" and h.status == "explains a symptom"), None)
    if ct:
        parts.append("A dump taken at enqueue time would not be the data the op consumed.")
    if cx.inv.gate:
        parts.append(f"Gate: {cx.inv.gate['description'].split(';')[0]} "
                     f"({'validated by a rerun' if cx.inv.gate.get('validated') else 'NOT validated'}).")
    cx.inv.verdict = " ".join(parts)
    if fo and fo.m:
        cx.inv.facts["mechanism"] = cx.inv.mechanism


def evaluate_numeric(cx: Context) -> None:
    from kazeia.debug.investigate_numeric import verdict

    for fn in (fp16_overflow, nonfinite_inputs, capture_timing):
        try:
            fn(cx)
        except Exception as e:
            cx.inv.notes.append(f"could not evaluate {fn.__name__}: {type(e).__name__}: {e}")
    verdict(cx)
