"""The HTP's own routing gate (`--gate vtcm-plan`, built by HtpBackend.make_gate; engine/gates.py has the others).

`VtcmPlanGate` is the one `kazeia investigate` recommends for the HMX VTCM-overflow fault: the host can compute,
before enqueueing a MUL_MAT, the VTCM plan the DSP will make for it (the plan arithmetic is deterministic), and keep
on the CPU every MUL_MAT whose plan would not fit, so it never reaches the broken fallback."""

from __future__ import annotations

from dataclasses import dataclass

from kazeia.backends.htp.host.support import supports_op
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_for_node
from kazeia.graph.tensor import Tensor


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
