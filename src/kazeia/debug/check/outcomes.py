"""What each MUL_MAT weight class of a model meets on the HTP, per configuration and per M (activation rows):
upstream's supports_op rules for the version, then the same plan arithmetic the emulator runs (plan_matmul), then
the arch (no session, HMX built or not) and the public field reports that apply.

Outcomes, in order of severity:
  no-session   the version opens no session on this arch (October below v73: no skel)
  death        2026-05: the HMX layout overflows VTCM, op_matmul re-enters itself until the DSP dies (0x2e)
  dropped      2026-05: HVX VTCM_TOO_SMALL, the op is skipped and its dst keeps stale bytes (garbage, no error)
  wrong        a non-MUL_MAT op computes wrong numbers, decided by the shapes (op_risks.py: May's SSM_CONV, #24470)
  risk         it runs, but a public report with no published cause matches (#26123 on v73 under 2026-10)
  depends      whether it goes wrong depends on what the header cannot say (op_risks.py: a stale src1 shortcut
               bites only where the allocator puts the next src1): run `kazeia upgrade` on the scenario
  cpu          supports_op leaves it to the CPU (slow, correct; with several sequences a recurrent layer's ssm_out
               under May's rules is #26094)
  hvx / hmx    it runs on the DSP on that unit ("hvx" includes robust's fallback and October's HMX refusal)
"""

from __future__ import annotations

from dataclasses import dataclass

from kazeia.backends.htp import (
    FAULTS,
    K_QUANTS,
    L2_LAZY_STALE,
    MAX_SRC1_ROWS,
    MAX_WEIGHT_ROWS,
    OCTOBER_QUANT_TYPES,
    V73_HMX_QUANT_INF,
    arch_profile,
    get_profile,
    plan_matmul,
)
from kazeia.debug.check.weights import WeightClass

# the reported faults that act on a weight's MUL_MAT path, and what check says of each
REPORTED_MATMUL_FAULTS = tuple(f for f in FAULTS.values() if f.report and f.path in ("hmx", "hvx"))
RISK_WHY = {V73_HMX_QUANT_INF.name: "quantized HMX MUL_MAT on v73 (n >= 5): test-backend-ops reports ERR = inf and "
                                    "garbage/0x2e on 4B+ models; cause unknown (reported, not explained)",
            L2_LAZY_STALE.name: "HMX MUL_MAT on v81: an ADD of its batch that consumes its output without being fused "
                             "into it reads stale data (OPFILTER=ADD fixes it); cause unknown (reported, not "
                             "explained)"}
SEVERITY = {"no-session": 0, "death": 1, "dropped": 2, "wrong": 3, "risk": 4, "depends": 5, "cpu": 6, "hvx": 7,
            "hmx": 8}
# upstream's quantized src0 types (ggml_hexagon_supported_mul_mat): October's (0c1e57098bba, K-quants with K % 256);
# May's (bb4dc86a) are those without the K-quants. Not the emulator's own list (host/support.py runs MXFP4, Q5_K
# on the CPU for want of their numerics): check predicts what upstream does.
OCT_QUANT = tuple(t.name.lower() for t in OCTOBER_QUANT_TYPES)
MAY_QUANT = tuple(t.name.lower() for t in OCTOBER_QUANT_TYPES if t not in K_QUANTS)
MAY_MAX_SRC0_ROWS, MAY_MAX_SRC1_ROWS = MAX_WEIGHT_ROWS, MAX_SRC1_ROWS  # May's supports_op row limits


@dataclass(frozen=True)
class Config:
    profile: str
    arch: int
    vtcm: int
    ubatch: int
    threads: int = 6
    n_seq: int = 1  # -np: sequences per micro-batch (split_equal: n_seq x ubatch // n_seq rows)

    @property
    def generation(self) -> str:
        return self.caps.generation

    @property
    def caps(self):
        """The profile's capabilities (what its upstream code does)."""
        return get_profile(self.profile).caps

    def key(self) -> str:
        return f"{self.profile} v{self.arch} vtcm={self.vtcm} ub={self.ubatch}" + (
            f" np={self.n_seq}" if self.n_seq > 1 else "")

    def rows(self, w: WeightClass, m: int) -> int:
        """The rows class w is multiplied with in a micro-batch of m rows: m, or one per sequence for the classes
        after llama.cpp's output-row selection (the last layer's FFN, the lm_head)."""
        return m if w.m_max is None else min(m, w.m_max * self.n_seq)


@dataclass(frozen=True)
class Step:
    """One M's outcome: path (hmx/hvx/cpu/none), outcome (see SEVERITY), VTCM bytes the plan uses, why."""

    path: str
    outcome: str
    used: int
    mc: int | None
    nc: int | None
    reason: str
    report: str | None = None  # the public report whose risk applies


@dataclass
class Range:
    """M from m_lo to m_hi with one outcome; `step` is m_lo's (its chunks and reason), the bytes span the range."""

    m_lo: int
    m_hi: int
    step: Step
    used_min: int = 0
    used_max: int = 0

    def add(self, m: int, s: Step) -> None:
        self.m_hi = m
        self.used_min, self.used_max = min(self.used_min, s.used), max(self.used_max, s.used)

    def to_dict(self) -> dict:
        s = self.step
        return {"m": [self.m_lo, self.m_hi], "path": s.path, "outcome": s.outcome,
                "vtcm_bytes": [self.used_min, self.used_max], "mc": s.mc, "nc": s.nc, "reason": s.reason,
                "report": s.report}


def _unsupported(c: Config, qtype: str, k: int, n: int, m: int) -> str | None:
    """Why the version's supports_op leaves this MUL_MAT to the CPU, or None (a F32 src1, a weight in the device's
    weight buffer, contiguous)."""
    if c.caps.host_solves_plans:  # supports_op without row limits; K-quants planned
        if qtype in OCT_QUANT:
            return f"K={k} is not a multiple of {256 if qtype.endswith('_k') else 32}" if k % (
                256 if qtype.endswith("_k") else 32) else None
        return None if qtype in ("f16", "f32") else f"{qtype} weights are not supported"
    if qtype in MAY_QUANT:
        if k % 32:
            return f"K={k} is not a multiple of 32"
        if n > MAY_MAX_SRC0_ROWS:
            return f"{n} weight rows > {MAY_MAX_SRC0_ROWS} (supports_op's lm_head limit)"
    elif qtype != "f16":
        return f"{qtype} weights are not supported"
    return f"{m} activation rows > {MAY_MAX_SRC1_ROWS}" if m > MAY_MAX_SRC1_ROWS else None


class Planner:
    """Steps per (configuration, class, M), with the plans shared where the arithmetic is the same (the archs of
    one version differ only in whether HMX is built)."""

    def __init__(self) -> None:
        self._plans: dict[tuple, Step] = {}

    def step(self, c: Config, w: WeightClass, m: int) -> Step:
        ap = arch_profile(c.arch, c.generation)
        if not ap.opens:
            return Step("none", "no-session", 0, None, None, f"{c.generation} builds no v{c.arch} skel", "GenieX #1170")
        if w.seq_dim and c.n_seq > 1:
            return self._per_sequence(c, ap.hmx, w, m)
        why = _unsupported(c, w.qtype, w.k, w.n, m)
        if why is not None:
            return Step("cpu", "cpu", 0, None, None, why)
        key = (c.profile, ap.hmx, c.vtcm, c.threads, w.qtype, w.k, w.n, m)
        s = self._plans.get(key)
        if s is None:
            s = self._plans[key] = self._plan(c, ap.hmx, w, m)
        # the public reports kazeia injects as faults (reported, not explained): the same fault objects the emulator's
        # units ask (their one predicate), so check marks the ops a device of that arch and version would meet them on
        for risk in REPORTED_MATMUL_FAULTS:
            if risk.exists_in(c.generation) and risk.fires(c.arch, s.path, w.qtype):
                why = RISK_WHY.get(risk.name) or risk.description
                return Step(s.path, "risk", s.used, s.mc, s.nc, why, risk.report)
        return s

    @staticmethod
    def _per_sequence(c: Config, hmx_built: bool, w: WeightClass, m: int) -> Step:
        """A MUL_MAT whose src1 is [K, T, n_seqs] (a recurrent layer's ssm_out in llama.cpp's graph, weights.py):
        May's supports_op refuses a quantized one with src1 ne[2] != 1; October plans it batched."""
        if not c.caps.host_solves_plans:
            if w.qtype not in MAY_QUANT:
                return Step("cpu", "cpu", 0, None, None, f"{w.qtype} weights are not supported")
            return Step("cpu", "cpu", 0, None, None, f"src1 [K, T, {c.n_seq} sequences]: May's supports_op refuses a "
                        "quantized MUL_MAT whose src1 has ne[2] != 1, and the scheduler copies the weight out of the "
                        "HTP's REPACK buffer every compute (slow)", "llama.cpp #26094")
        why = _unsupported(c, w.qtype, w.k, w.n, m)
        if why is not None:
            return Step("cpu", "cpu", 0, None, None, why)
        p = plan_matmul(m, w.k, w.n, w.qtype, vtcm_size=c.vtcm, profile=c.profile, n_threads=c.threads,
                        hmx_built=hmx_built, batched=True, batch_rows=m // c.n_seq, group_size=c.n_seq)
        return Step(p.path, p.path, p.used, p.mc, p.nc, p.reason)

    @staticmethod
    def _plan(c: Config, hmx_built: bool, w: WeightClass, m: int) -> Step:
        p = plan_matmul(m, w.k, w.n, w.qtype, vtcm_size=c.vtcm, profile=c.profile, n_threads=c.threads,
                        hmx_built=hmx_built)
        if p.path == "cpu":
            return Step("cpu", "cpu", 0, None, None, p.reason)
        if p.outcome == "reenter":
            return Step("hmx", "death", p.used, p.mc, p.nc, f"HMX layout {p.used} B > VTCM {c.vtcm} B: op_matmul "
                        "re-enters itself until the DSP dies, 0x2e at the next read (the seed's fault; llama.cpp "
                        "#24963 reports it as a hang on a build where the self call became a loop)")
        if p.outcome == "dropped" or p.status == "vtcm_too_small":
            return Step("hvx", "dropped", p.used, p.mc, p.nc, f"HVX needs {p.used} B > VTCM {c.vtcm} B: "
                        "VTCM_TOO_SMALL, the op is skipped and dst keeps stale bytes")
        return Step(p.path, p.path, p.used, p.mc, p.nc, p.reason)

    def ranges(self, c: Config, w: WeightClass) -> list[Range]:
        """The class's M from 1 to its largest (the ubatch, or 1 for the lm_head) as runs of equal outcomes; with
        several sequences M steps by n_seq (split_equal gives every sequence as many tokens)."""
        n = c.n_seq
        top = c.rows(w, c.ubatch // n * n)
        out: list[Range] = []
        for m in range(n, top + 1, n):
            s = self.step(c, w, m)
            last = out[-1] if out else None
            if last and (last.step.outcome, last.step.path, last.step.report) == (s.outcome, s.path, s.report):
                last.add(m, s)
            else:
                out.append(Range(m, m, s, s.used, s.used))
        return out
