"""State versus value, by experiment: replay one dumped op on the HTP model from different device states.

The op is replayed with its dumped inputs (never changed) on a fresh device:
- from reset;
- after each of a few preceding ops that leave different unit state: a clean HMX matmul, an HVX matmul, an HMX
  flash attention (oracle cases with seeded inputs; their shapes are printed);
- with VTCM filled with two known byte patterns (registers at reset);
- with the same state twice under two timing-race seeds.
The device's own clean output (same profile, no fault injection, same inputs) is the yardstick. A fault whose
output changes with the preceding state is a state fault, whatever its inputs; the state is named by which
experiment moves it: the output scale following the HMX scale register the preceding op left (read through
HtpBackend.snapshot()), the output following the VTCM bytes (the pattern trials), the outcome following the DMA
queue state (a descriptor left outstanding). If only the race seed moves it, it is a race; if nothing moves it
and it is wrong, it is a value (or shape) fault.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from kazeia.debug.dump import Dump
from kazeia.debug.oracle.backends import Caches
from kazeia.debug.oracle.cases import Case
from kazeia.debug.oracle.mul_mat import mul_mat_case
from kazeia.debug.oracle.run import run_case_on
from kazeia.debug.replay.alone import run_watched
from kazeia.debug.replay.materialize import materialize
from kazeia.debug.replay.results import Execution
from kazeia.debug.signature import Signature, classify, name_constant

PATTERNS = {"0xA5 bytes": 0xA5, "fp16 1.0 (0x3C00)": None}  # None: the fp16 1.0 halfword pattern
RACE_SEEDS = (11, 12)


@dataclass
class Trial:
    label: str
    setup: str  # what ran before, with its shapes
    registers: dict  # DSP registers as the op started (HtpBackend.snapshot().registers())
    output: np.ndarray | None = field(default=None, repr=False)
    error: str | None = None
    signature: Signature | None = None  # against the device's clean output
    scale: float | None = None  # output / clean when the output is the clean one times a constant

    def outcome(self) -> str:
        if self.error:
            return self.error
        if self.signature is None:
            return "no output"
        if not self.signature.classes:
            return "equals the clean output"
        return self.signature.headline()


@dataclass
class StateExperiment:
    name: str
    trials: list[Trial]
    mechanism_class: str  # "state" | "race" | "value" | "none"
    state: str | None  # "HMX output scale" | "VTCM bytes" | "DMA queue" | None
    evidence: list[str] = field(default_factory=list)

    def verdict(self) -> str:
        if self.mechanism_class == "state":
            return f"state fault: the output follows the {self.state} the device holds before the op"
        if self.mechanism_class == "race":
            return ("race: the output changes with timing alone" + (f", reading {self.state}" if self.state else ""))
        if self.mechanism_class == "value":
            return "value/shape fault: the op is wrong the same way from every device state"
        return "not reproduced: the op equals its clean output from every device state tried"

    def lines(self) -> list[str]:
        out = [f"state experiment on {self.name}: {self.verdict()}"]
        for t in self.trials:
            regs = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in t.registers.items() if k != "race_rng")
            out.append(f"  {t.label} [{t.setup}; registers {regs}]: {t.outcome()}")
        out += [f"  evidence: {e}" for e in self.evidence]
        return out

    def to_dict(self) -> dict:
        return {"name": self.name, "class": self.mechanism_class, "state": self.state, "verdict": self.verdict(),
                "evidence": self.evidence,
                "trials": [{"label": t.label, "setup": t.setup, "registers": {k: v for k, v in t.registers.items()
                                                                              if k != "race_rng"},
                            "outcome": t.outcome(), "scale": t.scale} for t in self.trials]}


def preceding_cases(dump: Dump) -> list[tuple[str, Case]]:
    """Ops that leave different unit state: small oracle cases (an HMX matmul needs M >= 32 rows, HVX M < 32)."""
    return [("after a clean HMX matmul", mul_mat_case("q4_0", m=64, n=32, k=256)),
            ("after an HVX matmul", mul_mat_case("q4_0", m=64, n=4, k=256)),
            ("after an HMX flash attention", Case.make("FLASH_ATTN_EXT", hs=128, nh=8, nr=4, kv=256, nb=38, mask=1,
                                                       type_KV="f16"))]


def _backend(settings):
    from kazeia.backends.htp import HtpBackend

    return HtpBackend(settings)


def run_dumped_op(dump: Dump, be) -> tuple[np.ndarray | None, str | None]:
    node = materialize(dump)
    be.node_index = {node: dump.graph_index}
    ex = Execution("experiment", be.name)

    def run() -> None:
        be.compute(node)
        be.synchronize()

    out = run_watched(be, node, ex, run)
    err = ex.error or (f"died ({ex.died.get('kind')}: {ex.died.get('cause')})" if ex.died else None)
    return out, err


def _pattern(vtcm: np.ndarray, name: str) -> np.ndarray:
    v = vtcm.copy()
    if PATTERNS[name] is None:
        v.view(np.uint16)[:] = 0x3C00
    else:
        v[:] = PATTERNS[name]
    return v


def _trial(dump: Dump, settings, label: str, setup: str, before=None, vtcm_fill: str | None = None) -> Trial:
    be = _backend(settings)
    if before is not None:
        run_case_on(before, be, caches=Caches())
    if vtcm_fill is not None:
        st = be.snapshot()
        st.vtcm = _pattern(st.vtcm, vtcm_fill)
        be.restore(st)
    t = Trial(label, setup, be.snapshot().registers())
    t.output, t.error = run_dumped_op(dump, be)
    return t


def _judge(t: Trial, clean: np.ndarray) -> None:
    if t.output is None:
        return
    t.signature = classify(t.output, clean)
    if not t.signature.classes:
        t.scale = 1.0
    elif t.signature.get("zeros") is not None and not np.any(t.output):
        t.scale = 0.0
    elif t.signature.get("scaled") is not None:
        t.scale = t.signature.get("scaled").value


def _same(a: Trial, b: Trial) -> bool:
    if a.output is None or b.output is None:
        return (a.output is None) == (b.output is None) and a.error == b.error
    return np.array_equal(a.output, b.output, equal_nan=True)


def state_experiment(dump: Dump, settings) -> StateExperiment:
    """Run the experiments on the HTP `settings` (the recorded run's, faults included) and conclude."""
    pinned = dataclasses.replace(settings, race_seed=RACE_SEEDS[0])
    clean_out, clean_err = run_dumped_op(dump, _backend(dataclasses.replace(settings, faults=())))
    trials = [_trial(dump, pinned, "from reset", "nothing before")]
    for label, case in preceding_cases(dump):
        trials.append(_trial(dump, pinned, label, case.name, before=case))
    for name in PATTERNS:
        trials.append(_trial(dump, pinned, f"VTCM filled with {name}", "inputs kept, registers at reset",
                             vtcm_fill=name))
    trials.append(_trial(dump, dataclasses.replace(settings, race_seed=RACE_SEEDS[1]), "from reset, another timing",
                         f"race seed {RACE_SEEDS[1]} instead of {RACE_SEEDS[0]}"))
    if clean_out is None:
        return StateExperiment(dump.name, trials, "none", None, [f"the clean replay failed: {clean_err}"])
    for t in trials:
        _judge(t, clean_out)
    return _conclude(dump.name, trials)


def _conclude(name: str, trials: list[Trial]) -> StateExperiment:
    reset, prev, pats, other_seed = trials[0], trials[1:-3], trials[-3:-1], trials[-1]
    ev: list[str] = []
    by_prev = [t for t in prev if not _same(t, reset)]
    by_vtcm = [t for t in pats if not _same(t, reset)] + ([pats[1]] if not _same(pats[0], pats[1]) else [])
    by_race = not _same(other_seed, reset)
    wrong = [t for t in trials if t.signature is not None and t.signature.classes]
    if by_prev:
        ev.append("the output changes with the op run before it: " + "; ".join(
            f"{t.label}: {t.outcome()}" for t in [reset, *prev]))
    scale_follows = all(t.scale is not None and abs(t.scale - t.registers.get("hmx_scale", np.nan))
                        <= 2e-3 * max(abs(t.scale), 1e-3) for t in [reset, *prev])
    if by_prev and scale_follows:
        ev.append("in every trial the output is the clean output times the HMX output scale the device held "
                  "before the op: " + "; ".join(f"{t.label}: scale register {name_constant(t.registers['hmx_scale'])}"
                                                f", output x{t.scale:.6g}" for t in [reset, *prev]))
        return StateExperiment(name, trials, "state", "HMX output scale", ev)
    dma = [t for t in [reset, *prev] if t.registers.get("dma_stale_pop")]
    if by_prev and dma and all(t in by_prev for t in dma) and not by_vtcm and not by_race:
        ev.append("wrong exactly after the ops that left a DMA descriptor outstanding (dma_stale_pop): "
                  + ", ".join(t.label for t in dma))
        return StateExperiment(name, trials, "state", "DMA queue", ev)
    if by_vtcm:
        ev.append("with the inputs and registers kept, changing only the VTCM bytes changes the output: "
                  + "; ".join(f"{t.label}: {t.outcome()}" for t in pats))
    if by_race:
        ev.append(f"same inputs, same device state, another timing: {other_seed.outcome()} (vs {reset.outcome()})")
        return StateExperiment(name, trials, "race", "VTCM bytes" if by_vtcm else None, ev)
    if by_vtcm or by_prev:
        return StateExperiment(name, trials, "state", "VTCM bytes" if by_vtcm else "unit state", ev)
    if wrong:
        ev.append(f"every trial gives the same wrong output: {reset.outcome()}")
        return StateExperiment(name, trials, "value", None, ev)
    return StateExperiment(name, trials, "none", None, ["every trial equals the clean output"])
