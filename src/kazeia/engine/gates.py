"""Routing gates: rules that send a node to another backend before placement asks `supports`.

A gate is a callable node -> backend name | None with a `reason` attribute, installed in the scheduler's
Router. `VtcmPlanGate` is the one `kazeia investigate` recommends for the HMX VTCM-overflow fault: the host
can compute, before enqueueing a MUL_MAT, the VTCM plan the DSP will make for it (the plan arithmetic is
deterministic), and keep on the CPU every MUL_MAT whose plan would not fit, so it never reaches the broken
fallback. `NodeShapeGate` is the narrow form: named weights and an M range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kazeia.backends.htp import HtpSettings, plan_for_node, supports_op
from kazeia.errors import KazeiaError
from kazeia.graph.tensor import Tensor
from kazeia.limits import safe_regex


@dataclass
class VtcmPlanGate:
    """MUL_MATs the HTP would send to HMX with a plan that does not fit its VTCM, and no fallback, go to `target`.
    The plan is the backend's own (plan_for_node with the backend's settings), so the gate sees what op_matmul will
    see: src1's layout, the arch, GGML_HEXAGON_USE_HMX, the profile, the VTCM size and NHVX."""

    settings: HtpSettings
    target: str = "CPU"
    reason: str = "gate: HMX VTCM plan would overflow"

    def __call__(self, node: Tensor) -> str | None:
        if node.op != "MUL_MAT" or not supports_op(node, self.settings):
            return None  # not the HTP's: placement sends it elsewhere anyway
        plan = plan_for_node(node, self.settings)
        # robust falls back to HVX by itself (its plan is then the HVX one): only a failure with no way out routes
        return self.target if plan.path == "hmx" and not plan.fits else None

    def describe(self) -> str:
        return (f"route to {self.target} every MUL_MAT whose HMX VTCM plan does not fit "
                f"{self.settings.vtcm_bytes} B under profile {self.settings.profile}")


@dataclass
class NodeShapeGate:
    """Weights whose GGUF name matches `weight_regex`, with src1 row count M in [m_lo, m_hi], go to `target`."""

    weight_regex: str
    m_lo: int
    m_hi: int
    target: str = "CPU"
    reason: str = "gate: known-bad shape"

    def __post_init__(self) -> None:
        self._re = safe_regex(self.weight_regex, "gate")

    def __call__(self, node: Tensor) -> str | None:
        if node.op != "MUL_MAT":
            return None
        w, x = node.src[0], node.src[1]
        if w.weight_name and self._re.search(w.weight_name) and self.m_lo <= x.ne[1] <= self.m_hi:
            return self.target
        return None

    def describe(self) -> str:
        return f"route to {self.target} MUL_MATs of /{self.weight_regex}/ with M in {self.m_lo}..{self.m_hi}"


def parse_gate(spec: str, settings: HtpSettings):
    """`--gate vtcm-plan` or `--gate 'weight=REGEX,m=LO-HI'` (target CPU); `settings`: the HTP's."""
    if spec == "vtcm-plan":
        return VtcmPlanGate(settings)
    fields = dict(kv.split("=", 1) for kv in spec.split(",") if "=" in kv)
    try:
        lo, hi = (int(v) for v in fields["m"].split("-"))
        weight = fields["weight"]
    except (KeyError, ValueError):
        raise KazeiaError(f"bad --gate {spec!r}: use 'vtcm-plan' or 'weight=REGEX,m=LO-HI'") from None
    if not 1 <= lo <= hi:
        raise KazeiaError(f"bad --gate {spec!r}: m=LO-HI needs 1 <= LO <= HI (rows of the activation)")
    try:
        return NodeShapeGate(weight, lo, hi)
    except re.error as e:
        raise KazeiaError(f"bad --gate {spec!r}: weight={weight!r} is not a valid regular expression: {e}") from None
