"""Wrong numbers: from the first bad op to its mechanism. The error signature of its dumped output against
float64, the state-versus-value experiment on the HTP model, race localisation when runs differ, then the
mechanism class (state / race / value) and a gate chosen by it: the HMX unit's state or races feeding HMX go to
HVX (GGML_HEXAGON_USE_HMX=0) before anything goes to the CPU; every gate is validated by a rerun."""

from __future__ import annotations

from kazeia.debug.investigate.common import cpu_ops_spec
from kazeia.debug.investigate.gate import numeric_gate, validate
from kazeia.debug.investigate.policy_gate import hmx_class_rule, validate_rules
from kazeia.debug.investigate.shortcut import stale_shortcut_shown
from kazeia.debug.investigate.table import Context, StepDef

HVX_ENV = {"GGML_HEXAGON_USE_HMX": "0"}


def signature_step(cx: Context) -> tuple[str, str]:
    from kazeia.debug.replay.alone import reference_run
    from kazeia.debug.signature import classify

    f = cx.findings
    out = f.dump.output.floats() if f.dump.output is not None else None
    ref, _ = reference_run(f.dump)
    if out is None or ref.output is None:
        return "no output or reference to classify", ""
    priors = {}
    if f.dump.output_before is not None and f.dump.output_before.floats() is not None:
        priors["the output buffer (its previous contents)"] = f.dump.output_before.floats()
    f.signature = classify(out, ref.output, priors=priors)
    cx.fact(f"error signature of {f.dump.name}", f.signature.headline())
    return f.signature.headline(), f"kazeia replay {f.dump_dir}"


def later_code_step(cx: Context) -> tuple[str, str]:
    """The first bad op's dump, on the same inputs, under the code users build today (2026-10): when this run's
    version is older and the later code computes the op right, the fault is a defect of this version's code that
    upstream's later code does not have (both as kazeia transcribes them). Injected faults go with the replay: a
    fault that only the older code has makes the comparison meaningless, so it is not run."""
    from kazeia.backends.htp import LATEST_PROFILE, check_faults
    from kazeia.debug.replay import replay
    from kazeia.errors import KazeiaError

    f = cx.findings
    settings = cx.spec.htp_settings()
    if settings is None or settings.profile == LATEST_PROFILE:
        return f"skipped: the run is not an HTP run of an older version than {LATEST_PROFILE}", ""
    try:
        check_faults(settings.faults, LATEST_PROFILE)
    except KazeiaError:
        return "skipped: an injected fault that only the older code has", ""
    r = replay(f.dump, device="HTP0", htp_profile=LATEST_PROFILE)
    v = r.alone.vs_ref
    f.later_code = (LATEST_PROFILE, r.alone.ok, v.reason if v is not None else (r.alone.error or "died"))
    cx.fact(f"{f.first_bad} under {LATEST_PROFILE}'s code", f.later_code[2])
    return (f"under {LATEST_PROFILE}'s code the op is {'right' if r.alone.ok else 'wrong too'}: {f.later_code[2]}",
            f"kazeia replay {f.dump_dir} --htp-profile {LATEST_PROFILE}")


def state_step(cx: Context) -> tuple[str, str]:
    from kazeia.debug.replay import htp_settings_for
    from kazeia.debug.state_experiment import state_experiment

    f = cx.findings
    f.state_exp = state_experiment(f.dump, htp_settings_for(f.dump))
    cx.inv.notes += f.state_exp.lines()
    return f.state_exp.verdict(), f"kazeia replay {f.dump_dir} --experiment"


def race_step(cx: Context) -> tuple[str, str]:
    from kazeia.debug.race import localise_race

    f = cx.findings
    if f.determinism is not None and f.determinism.deterministic and (
            f.state_exp is None or f.state_exp.mechanism_class != "race"):
        return "skipped: the runs are deterministic and the timing experiment changed nothing", ""
    f.race = localise_race(cx.spec, f.first_bad, dump=f.dump)
    cx.inv.notes += f.race.lines()
    return "; ".join(f.race.evidence[:1] + ([f.race.stage] if f.race.stage else [])), cx.spec.command()


def mechanism_class(cx: Context) -> tuple[str, str | None]:
    """(class, the state or address involved) from the experiments."""
    f = cx.findings
    if stale_shortcut_shown(f):
        return "state", "the src1 shortcut left by the flash attention before it"
    se, rc = f.state_exp, f.race
    if rc is not None and rc.differ:
        return "race", (f"VTCM bytes of {rc.area}, read before the weight scatter drained" if rc.area
                        else rc.stage)
    if se is not None and se.mechanism_class in ("state", "race"):
        return se.mechanism_class, se.state
    if se is not None and se.mechanism_class == "value":
        return "value", None
    return "unknown", None


def mechanism_text(cx: Context) -> str:
    f = cx.findings
    cls, what = mechanism_class(cx)
    name = f.first_bad
    sig = f.signature.headline() if f.signature is not None else "no signature"
    if stale_shortcut_shown(f):
        prev = f.batch_predecessor
        return (f"stale src1 shortcut in {name} (hypothesis from this run's evidence): {prev.name} "
                f"(FLASH_ATTN_EXT) ran just before it in its batch and, under {cx.spec.htp_profile or 'this version'}, "
                f"writes VTCM without clearing the shortcut; {name} then skips quantizing its src1 and multiplies the "
                f"activations left there ({sig}); with one op per batch the run is correct")
    if cls == "state":
        ev = f.state_exp.evidence[-1] if f.state_exp.evidence else ""
        return f"state fault in {name}: its output follows the {what} the device holds before it ({sig}); {ev}"
    if cls == "race":
        stale = [e for e in f.race.evidence if e.startswith("run 1: K tiles")] if f.race else []
        tail = f"; {stale[0]}" if stale else ""
        writers = f"; {f.race.evidence[-1]}" if f.race and f.race.writers else ""
        return f"race in {name}: {what} ({f.race.stage if f.race else ''}){tail}{writers}"
    if cls == "value":
        return f"value/shape fault in {name}: wrong the same way from every device state ({sig})"
    return f"{name}: {sig}"


def mechanism_gate(cx: Context) -> tuple[str, str]:
    """The narrowest validated route the mechanism supports: HMX unit state or an HMX operand race -> HVX for
    the HMX ops; otherwise (or if HVX does not validate) the ops like the first bad one to the CPU."""
    f = cx.findings
    cls, what = mechanism_class(cx)
    cx.inv.mechanism = mechanism_text(cx)
    cx.fact("mechanism class", cls + (f" ({what})" if what else ""))
    path = next((r.path for r in f.compare.rows.get("isolated", []) if r.name == f.first_bad), None)
    if stale_shortcut_shown(f):
        spec = cpu_ops_spec(cx, "FLASH_ATTN_EXT")
        desc = ("Run FLASH_ATTN_EXT on the CPU (--cpu-ops FLASH_ATTN_EXT): the MUL_MAT after it then starts a new "
                "batch on the HTP, with no shortcut left by the flash attention; every other op stays on the device")
        if validate(cx, spec, desc):
            return "gate FLASH_ATTN_EXT -> CPU: validated", spec.command()
    if cls in ("state", "race") and path == "hmx":
        rule = hmx_class_rule(cx, cls, what)
        desc = (f"Keep the HMX matmul class (rule {rule.name}: MUL_MAT with M >= 32, the ones the HTP sends to HMX) "
                f"on the device with HMX off (action hvx); the {cls} fault lives in the HMX path ({what}), which "
                f"HVX does not use")
        if validate_rules(cx, [rule], desc):
            return f"gate policy {rule.name}: validated", cx.inv.gate["flags"]
        spec = cx.spec.with_(env={**cx.spec.env, **HVX_ENV})
        desc = (f"Route everything the HTP runs on HMX ({f.first_bad} included) to HVX: "
                f"GGML_HEXAGON_USE_HMX=0, the host-side switch upstream reads; the {cls} fault lives in the HMX path "
                f"({what}), which HVX does not use")
        if validate(cx, spec, desc):
            return "gate HMX -> HVX: validated", spec.command()
    verdict, cmd = numeric_gate(cx)  # the ops like the first bad one to the CPU
    return f"gate to the CPU: {verdict}", cmd


SIGNATURE = StepDef("error signature of the first bad op", signature_step, needs=("dump",), gives=("signature",))
STATE = StepDef("state vs value experiment", state_step, needs=("dump",), gives=("state_exp",))
LATER_CODE = StepDef("the same op under the later code", later_code_step, needs=("dump", "first_bad"),
                     gives=("later_code",))
RACE = StepDef("localise the race", race_step, needs=("dump", "first_bad"), gives=("race",))
MECHANISM_GATE = StepDef("gate by mechanism", mechanism_gate, needs=("first_bad", "compare"))
