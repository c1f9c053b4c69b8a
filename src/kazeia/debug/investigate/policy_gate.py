"""Gates written as a gate policy (docs/gate_policy.md, engine/policy.py) and validated by rerunning the
investigated configuration with `--gates FILE`: the narrowest rules the evidence supports, `hvx` (the node stays
on the device with HMX off) before anything goes to the CPU."""

from __future__ import annotations

import os

from kazeia.debug.investigate.gate import validate
from kazeia.debug.investigate.table import Context
from kazeia.engine.policy import Policy, Rule


def policy_source(cx: Context) -> dict:
    s = cx.settings
    src = {"model": os.path.basename(cx.spec.model_path), "ubatch": cx.spec.ubatch}
    if s is not None:
        src.update(profile=s.profile, vtcm=s.vtcm_bytes, faults=list(s.faults))
    return src


def validate_rules(cx: Context, rules: list[Rule], description: str) -> bool:
    """Write the rules to <report>/gate.toml, rerun with them, record the gate (validated or not)."""
    path = cx.out("gate.toml")
    Policy(rules, policy_source(cx)).save(path)
    ok = validate(cx, cx.spec.with_(policy=path), description)
    cx.inv.gate["policy"] = path
    return ok


def hmx_class_rule(cx: Context, cls: str, what: str | None) -> Rule:
    """Every MUL_MAT the HTP would run on HMX, kept on the device with HMX off: the HMX unit's state (or a race
    on its operands) is shared by all of them, whatever their shapes."""
    f = cx.findings
    return Rule(f"{cls}-hmx-mul-mat-to-hvx", "hvx", op="MUL_MAT", m=(32, max(32, cx.spec.ubatch)),
                why=f"{cls} fault in the HMX path ({what}); found on {f.first_bad}",
                evidence=[cx.inv.mechanism[:400]] if cx.inv.mechanism else [])


def bank_rules(cx: Context) -> list[Rule]:
    """One rule per MUL_MAT class (weight type, K, N) whose HMX plan at this run's M has a deep load across a
    VTCM bank: to HVX at that M only."""
    from kazeia.backends.htp.forensics import bank_crossings
    from kazeia.graph.tensor import type_name

    rules: dict[tuple, Rule] = {}
    for p in cx.findings.matmul_plans or []:
        if p.plan.path != "hmx" or not bank_crossings(p.plan):
            continue
        w = p.node.src[0]
        key = (type_name(w.type), w.ne[0], w.ne[1], p.plan.m)
        if key not in rules:
            c = bank_crossings(p.plan)[0]
            rules[key] = Rule(f"bank-crossing-{key[0]}-k{key[1]}-n{key[2]}-m{key[3]}", "hvx", op="MUL_MAT",
                              type=key[0], k=(key[1], key[1]), n=(key[2], key[2]), m=(key[3], key[3]),
                              why="an HMX deep load of this class's VTCM plan crosses a 4 MiB bank",
                              evidence=[f"{p.name}: {c.kind} deep load 0x{c.offset:06x}-0x{c.end - 1:06x}"])
    return list(rules.values())
