"""MUL_MAT on the emulated DSP: op_matmul's dispatch (here), the HMX path (hmx/path.py) and the HVX path
(hvx/path.py), and what each leaves in VTCM.

op_matmul (matmul-ops.c) picks HMX or HVX by its gates and the HMX kernel plans its VTCM layout, returning -1
when the plan does not fit; both come from vtcm/matmul/dispatch.py plan_for_node, the one plan the cost model,
the routing gates and the forensic tools also use. What happens after an HMX failure is the profile's: `2026-05`
calls op_matmul again with the same inputs (each attempt takes a stack frame; the callback thread's stack runs out
and the DSP process dies), `robust` runs the HVX kernel instead.

The HVX kernel quantizes src1 into VTCM at vtcm_base unless the per-batch shortcut says the same src1
descriptor is already there, then reads its activations back FROM VTCM: whatever bytes are there are what
it multiplies. The numerics are in hvx/dot.py / hmx/tiles.py.
"""

from __future__ import annotations

from kazeia.backends.htp.device import Dsp
from kazeia.backends.htp.hmx.path import HmxPath
from kazeia.backends.htp.host.kquants import K_QUANT_TYPES, KQuantWeight
from kazeia.backends.htp.host.repack import RepackedWeight
from kazeia.backends.htp.hvx.bound import BoundHvx, BoundHvxHostPlan, bind_hvx, bind_hvx_host_plan
from kazeia.backends.htp.hvx.path import HvxPath, modeled_seconds
from kazeia.backends.htp.msg import (
    STATUS_INTERNAL_ERR,
    STATUS_VTCM_TOO_SMALL,
    DspFault,
    OpBatch,
    OpContext,
    OpDesc,
    OpRecord,
)
from kazeia.backends.htp.profiles import REENTRY_TAIL_CALL, Profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_for_node, src_layout
from kazeia.backends.htp.vtcm.matmul.record import MatmulPlan
from kazeia.graph.tensor import Tensor, rows
from kazeia.identity import IdentityCache, binding


class WeightStore:
    """The REPACK buffer: one `RepackedWeight` per weight, made when the weight is first used (as set_tensor
    repacks it). A RepackedWeight is a view of the weight's memory-mapped ggml rows (the x4x2 repack is a byte
    permutation, computed only for the rows that land in VTCM), so the store holds no copies; `budget` is kept
    for callers that pass one and bounds nothing.

    One store is shared by every HTP session of the process (`shared_store()`): forensic tools open many
    sessions on the same model."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = budget
        # by (address, type, shape): views of models no longer in use go past 4096 entries
        self._items: IdentityCache[RepackedWeight] = IdentityCache("htp.repack_buffer", by_value=True)

    def get(self, w: Tensor) -> RepackedWeight | KQuantWeight:
        make = KQuantWeight.from_ggml if w.type in K_QUANT_TYPES else RepackedWeight.from_ggml
        return self._items.get((w.data_addr, w.type, w.ne), lambda: make(rows(w)[0, 0], w.type, w.ne[0]))


_SHARED: WeightStore | None = None


def shared_store() -> WeightStore:
    global _SHARED
    if _SHARED is None:
        _SHARED = WeightStore()
    return _SHARED


class MatmulUnit:
    """op_matmul on the DSP: the plan (the host's or the DSP's), then its HMX or HVX path; what happens after an
    HMX failure is the profile's. Holds one `hmx` and one `hvx` path over the same REPACK buffer."""

    def __init__(self, settings: HtpSettings, profile: Profile, weights: WeightStore | None = None) -> None:
        self.settings = settings
        self.profile = profile
        self.weights = weights if weights is not None else shared_store()
        self.hmx = HmxPath(settings, profile, self.weights)
        self.hvx = HvxPath(settings, profile, self.weights)
        self._plans: IdentityCache[MatmulPlan] = IdentityCache("htp.matmul_plans", bind=True, by_value=True)
        self._bound: IdentityCache[BoundHvx | None] = IdentityCache("htp.bound_matmuls", limit=16384, bind=True)
        # the version's op_matmul, chosen once: the host's plan in kernel params (2026-10), or the DSP's own
        self.op_matmul = self._op_matmul_host_plan if profile.caps.host_solves_plans else self._op_matmul_dsp_plan

    # --- op_matmul of the DSP-planned code (May's; robust) ---
    def _op_matmul_dsp_plan(self, dsp: Dsp, octx: OpContext, op: OpDesc, batch: OpBatch) -> OpRecord:
        node, placement = op.node, op.placement
        if placement is not None and binding():  # a decode runs the same nodes every token: bound once
            b = self._bound.get(node, lambda: self._bind(dsp, node, placement),
                                lambda b: b is None or b.matches(node, dsp, placement))
            if b is not None:
                rec = b.run(self.hvx, dsp, octx, op)
                if rec is not None:
                    return rec
        return self._run_dsp_plan(dsp, octx, op, self._plan(node))

    def _bind(self, dsp: Dsp, node: Tensor, placement: object) -> BoundHvx | None:
        """hvx/bound.py bind_hvx of the node under this placement of its graph, kept by node (None: the general path
        runs it, until the node is another one)."""
        w, x = node.src[0], node.src[1]
        return bind_hvx(self.hvx, dsp, node, self._plan(node), modeled_seconds(x.ne[1], w.ne[0], w.ne[1], w.type),
                        placement)

    def _plan(self, node: Tensor) -> MatmulPlan:
        """plan_for_node with this unit's settings, kept by what it reads of the node (type, ne and nb of both
        sources, the route path): a decode plans the same few shapes every token. MatmulPlan is frozen."""
        w, x = node.src[0], node.src[1]
        key = (w.type, w.ne, w.nb, x.type, x.ne, x.nb, node.route_path)
        return self._plans.get(key, lambda: plan_for_node(node, self.settings))

    def _run_dsp_plan(self, dsp: Dsp, octx: OpContext, op: OpDesc, plan: MatmulPlan) -> OpRecord:
        """The general path: HMX when the DSP's dispatch chose it, and the profile's answer to its failure."""
        node = op.node
        w, x = node.src[0], node.src[1]
        M, K, N = x.ne[1], w.ne[0], w.ne[1]
        batched, _ = src_layout(w, x)
        hmx = plan if plan.path == "hmx" else plan.hmx_attempt  # None: the dispatch chose HVX
        if hmx is None:
            return self.hvx.run(dsp, octx, op, plan.reason, plan)
        octx.src1_spad_src = None  # "always re-quantize src1 since HMX kernel overwrites vtcm"
        octx.src1_spad_kind = None
        rec = self.hmx.run(dsp, op, batched, hmx)
        if rec is not None:
            return rec
        if self.profile.hmx_failure == "reenter":
            # upstream: `return op_matmul(octx);` -- same inputs, same plan, same failure, one more frame
            if REENTRY_TAIL_CALL.acts(self.settings):  # compiled as a jump: no frame, the same failure forever
                raise DspFault("hang", f"op_matmul re-enters itself as a jump after every HMX failure on "
                                       f"{node.name} (M={M} K={K} N={N}): the same plan fails the same way each "
                                       f"time, so the op never finishes")
            octx.stack_used += self.profile.matmul_frame_bytes
            if octx.stack_used > self.profile.dsp_stack_bytes:
                attempts = octx.stack_used // self.profile.matmul_frame_bytes
                raise DspFault("stack-overflow",
                               f"stack overflow after {attempts} op_matmul -> hmx_matmul_q_f32 re-entries on "
                               f"{node.name} (M={M} K={K} N={N})")
            return self._run_dsp_plan(dsp, octx, op, plan)
        rec = self.hvx.run(dsp, octx, op, "HMX failed, fell back to HVX", plan)
        rec.detail["hmx_fallback"] = True
        return rec

    # --- op_matmul of the host-planned code (2026-10) ---
    def _op_matmul_host_plan(self, dsp: Dsp, octx: OpContext, op: OpDesc, batch: OpBatch) -> OpRecord:
        """op_matmul of 2026-10 (matmul-ops.c): the host's kernel params say HMX or HVX; the kernel rebuilds the
        plan's layout and checks it against the VTCM the DSP was granted (`ctx->vtcm_size`, main.c: vtcm_alloc)
        before touching anything. A misfit is an op status (hmx_mm_2d_f32 returns -1 -> INTERNAL-ERROR; the HVX
        kernels return VTCM-TOO-SMALL); dst keeps what it held; the batch goes on."""
        node = op.node
        placement = op.placement
        bound = self._bound.peek(node) if placement is not None else None
        if bound is not None and bound.matches(node, placement) and binding():
            # a decode's node, bound on an earlier token (only an HVX plan that fits the grant is ever bound)
            done, bound.done = bound.done, None
            if done is not None and done[0] is batch and done[1] == batch.seq:
                return bound.ok()  # a member of the MUL_MAT_NX whose head ran it just before (_nx_members)
            members = self._nx_members(op, bound) if op.fused and op.name == "MUL_MAT_NX" else None
            rec = bound.run(members or ())
            if rec is not None and members:
                for b in members:
                    b.done = (batch, batch.seq)
            return rec if rec is not None else self.hvx.run_host_plan(dsp, octx, op, self._plan(node))
        w = node.src[0]
        plan = self._plan(node)
        granted = self.settings.dsp_vtcm_bytes
        if plan.path == "hmx":
            octx.src1_spad_src = None  # the HMX kernel overwrites VTCM
            octx.src1_spad_kind = None
            if plan.used > granted:
                x = node.src[1]
                dsp.farf("ERROR", f"hmx-mm-2d-precomputed: VTCM overflow: used {plan.used} budget {granted}, "
                                  f"m {x.ne[1]} k {w.ne[0]} n {w.ne[1]} mc {plan.mc} nc {plan.nc}")
                dsp.farf("ERROR", "HMX matmul failed (ret=-1)")
                return OpRecord("hmx", STATUS_INTERNAL_ERR, {"vtcm_used": plan.used, "vtcm_granted": granted,
                                                              "mc": plan.mc, "nc": plan.nc})
            batched, _ = src_layout(w, node.src[1])
            rec = self.hmx.run(dsp, op, batched, plan)
            return rec
        if plan.used > granted:
            dsp.farf("ERROR", f"matmul-{plan.qtype} : current VTCM reservation {granted} is too small, "
                              f"needed {plan.used}")
            return OpRecord("hvx", STATUS_VTCM_TOO_SMALL, {"vtcm_used": plan.used, "vtcm_granted": granted})
        if placement is not None and binding():  # a decode runs the same nodes every token: bound once
            b = self._bound.get(node, lambda: self._bind_host_plan(node, plan, placement),
                                lambda b: b is None or b.matches(node, placement))
            rec = b.run() if b is not None else None
            if rec is not None:
                return rec
        return self.hvx.run_host_plan(dsp, octx, op, plan)

    def _nx_members(self, op: OpDesc, head: BoundHvxHostPlan) -> list[BoundHvxHostPlan] | None:
        """The bound host plans of a MUL_MAT_NX's other nodes when every one is bound under this placement and
        reads the head's src1 through an image of the head's shape (a decode from its second token on), else None:
        the head then runs alone and each member on its own, as before."""
        x = op.node.src[1]
        out = []
        for sub in op.fused:
            b = self._bound.peek(sub.node)
            if (b is None or not b.matches(sub.node, sub.placement) or sub.node.src[1] is not x
                    or b.img.shape != head.img.shape):
                return None
            out.append(b)
        return out

    def _bind_host_plan(self, node: Tensor, plan: MatmulPlan, placement: object) -> BoundHvxHostPlan | None:
        w, x = node.src[0], node.src[1]
        return bind_hvx_host_plan(self.hvx, node, plan, modeled_seconds(x.ne[1], w.ne[0], w.ne[1], w.type), placement)
