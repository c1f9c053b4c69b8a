"""Device death with an address: the cDSP crash record the run left (what logcat shows on a device), its Bad VA
placed on the faulting op's VTCM plan map (area, deep-load run, boundary), and the gate that follows: the HMX
class to HVX (GGML_HEXAGON_USE_HMX=0: HVX issues no HMX deep loads), validated by a rerun."""

from __future__ import annotations

from kazeia.debug.investigate.gate import validate
from kazeia.debug.investigate.policy_gate import bank_rules, validate_rules
from kazeia.debug.investigate.table import Context, StepDef

HVX_ENV = {"GGML_HEXAGON_USE_HMX": "0"}


def crash_step(cx: Context) -> tuple[str, str]:
    from kazeia.backends.htp.forensics import parse_crash
    from kazeia.debug.crashmap import place_bad_va

    f = cx.findings
    record = (f.death or {}).get("crash_record") or []
    if not record:
        return "the death left no crash record", ""
    crash = parse_crash("\n".join(record))
    cx.inv.notes.append("cDSP crash record (adb logcat -s adsprpc on a device):")
    cx.inv.notes += record
    cx.fact("crash record", f"fault PC {crash.fault_location()}, Bad VA 0x{crash.bad_va:08X}, error code "
                            f"0x{crash.error_code:X}")
    if f.plan is None or crash.bad_va is None:
        return f"fault PC {crash.fault_location()}, Bad VA 0x{(crash.bad_va or 0):08X}", ""
    f.crash = place_bad_va(crash.bad_va, f.plan)
    f.crash.error_code, f.crash.reason = crash.error_code, crash.reason
    cx.fact("Bad VA on the VTCM plan map", "; ".join(f.crash.lines()))
    return "; ".join(f.crash.lines()), f"kazeia crashlog FILE -m {cx.spec.model_path} --n-prompt {f.plan.m}"


def crosses_bank(f) -> bool:
    return f.crash is not None and any(
        d["offset"] // (4 << 20) != (d["offset"] + d["size"] - 1) // (4 << 20) for d in f.crash.loads)


def address_mechanism(cx: Context) -> str:
    f = cx.findings
    c = f.crash
    load = next(iter(c.loads), None)
    run = (f"the HMX {load['kind']} deep load run 0x{load['offset']:06x}-0x{load['offset'] + load['size'] - 1:06x} "
           f"(tile {load['tile']}, from K tile {load['k0']})" if load else "an HMX deep load")
    code = f" (error code 0x{c.error_code:X})" if c.error_code is not None else ""
    return (f"address fault in {f.faulting}: the DSP process crashed {c.reason or ''}{code} at Bad VA "
            f"0x{c.bad_va:08X} = VTCM "
            f"offset 0x{c.offset:06x}, {c.boundary or 'inside the plan'}, area {c.area}; {run} crosses it")


def address_gate(cx: Context) -> tuple[str, str]:
    """HVX first: with HMX off no deep load is issued. When the evidence is not an address fault, or HVX does not
    validate, the death branch's own gate step follows."""
    f = cx.findings
    if not crosses_bank(f):
        return "not an address fault (no deep load crosses the Bad VA)", ""
    cx.inv.mechanism = address_mechanism(cx)
    cx.fact("mechanism class", f"address ({f.crash.boundary})")
    rules = bank_rules(cx)
    if rules:
        desc = (f"Keep on the device with HMX off (action hvx) the {len(rules)} MUL_MAT class(es) (type, K, N at this "
                f"M) whose HMX VTCM plan has a deep load across a 4 MiB bank: "
                f"{', '.join(r.name for r in rules)}; HVX issues no HMX deep loads")
        if validate_rules(cx, rules, desc):
            return f"gate policy ({len(rules)} rule(s)): validated", cx.inv.gate["flags"]
    spec = cx.spec.with_(env={**cx.spec.env, **HVX_ENV})
    desc = (f"Route the HMX matmuls to HVX (GGML_HEXAGON_USE_HMX=0): HVX issues no HMX deep loads, so no load run "
            f"crosses a VTCM bank; {f.faulting}'s plan has {len(f.crash.loads)} deep load(s) on the faulting address")
    ok = validate(cx, spec, desc)
    return f"gate HMX -> HVX: {'validated' if ok else 'NOT validated'}", spec.command()


CRASH = StepDef("crash record and Bad VA on the plan map", crash_step, needs=("death",), gives=("crash",))
ADDRESS_GATE = StepDef("gate by address", address_gate, needs=("crash",))
