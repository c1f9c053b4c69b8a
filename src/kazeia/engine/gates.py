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

from kazeia.graph.tensor import Tensor, type_name


@dataclass
class VtcmPlanGate:
    """MUL_MATs whose HMX VTCM plan would not fit (under the given profile and VTCM size) go to `target`."""

    vtcm_bytes: int
    profile: str
    target: str = "CPU"
    use_hmx: bool = True
    reason: str = "gate: HMX VTCM plan would overflow"

    def __call__(self, node: Tensor) -> str | None:
        if node.op != "MUL_MAT":
            return None
        from kazeia.backends.htp.plan import HMX_TYPES, plan_matmul

        w, x = node.src[0], node.src[1]
        if type_name(w.type) not in HMX_TYPES:
            return None
        plan = plan_matmul(x.ne[1], w.ne[0], w.ne[1], type_name(w.type), vtcm_size=self.vtcm_bytes,
                           profile=self.profile, hmx_enabled=self.use_hmx)
        if plan.path == "hmx" and not plan.fits:
            return self.target
        return None

    def describe(self) -> str:
        return (f"route to {self.target} every MUL_MAT whose HMX VTCM plan does not fit "
                f"{self.vtcm_bytes} B under profile {self.profile}")


@dataclass
class NodeShapeGate:
    """Weights whose GGUF name matches `weight_regex`, with src1 row count M in [m_lo, m_hi], go to `target`."""

    weight_regex: str
    m_lo: int
    m_hi: int
    target: str = "CPU"
    reason: str = "gate: known-bad shape"

    def __post_init__(self) -> None:
        self._re = re.compile(self.weight_regex)

    def __call__(self, node: Tensor) -> str | None:
        if node.op != "MUL_MAT":
            return None
        w, x = node.src[0], node.src[1]
        if w.weight_name and self._re.search(w.weight_name) and self.m_lo <= x.ne[1] <= self.m_hi:
            return self.target
        return None

    def describe(self) -> str:
        return f"route to {self.target} MUL_MATs of /{self.weight_regex}/ with M in {self.m_lo}..{self.m_hi}"


def parse_gate(spec: str, vtcm_bytes: int, profile: str):
    """`--gate vtcm-plan` or `--gate 'weight=REGEX,m=LO-HI'` (target CPU)."""
    from kazeia.errors import KazeiaError

    if spec == "vtcm-plan":
        return VtcmPlanGate(vtcm_bytes, profile)
    fields = dict(kv.split("=", 1) for kv in spec.split(",") if "=" in kv)
    try:
        lo, hi = (int(v) for v in fields["m"].split("-"))
        return NodeShapeGate(fields["weight"], lo, hi)
    except (KeyError, ValueError):
        raise KazeiaError(f"bad --gate {spec!r}: use 'vtcm-plan' or 'weight=REGEX,m=LO-HI'") from None
