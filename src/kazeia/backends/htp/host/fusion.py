"""October 2026's op fusion on the host (ggml-hexagon.cpp 0c1e57098bba: `ggml_hexagon_opbatch::try_fuse`,
`try_fuse_rms_norm_mul`, `try_fuse_mul_mat_add`, `try_fuse_mul_mat_nx`; the FUSEABLE tags of
`ggml_backend_hexagon_graph_compute`), under GGML_HEXAGON_OPFUSION.

When an op is enqueued, the host first tries to merge it into the last op of the open batch: RMS_NORM then the MUL
that scales its output (RMS_NORM+MUL), a MUL_MAT then the ADD of its output and a residual (MUL_MAT+ADD, taken only
if the plan with the residual in VTCM keeps the same HMX chunks and act threads, or the MUL_MAT has one activation
row), and MUL_MATs sharing one src1 (MUL_MAT_NX, at most 4 outputs, with the plan of the first weight). A fused op
is one descriptor, one status and one log name; the DSP runs its nodes in order.

Numerics: the fused kernels compute what the separate ops compute, in the same order (the MUL_MAT output is added
to the fp32 residual, RMS_NORM's output is scaled in fp32), so the fused op's values are the unfused ones. What
changes is what the host sends (fewer ops, other names), the VTCM plan, and that the intermediate tensor is no
longer an op output of its own (upstream never writes it; kazeia still computes it into its buffer).

Not modelled: ALLREDUCE+ADD (multi-NPU), MUL_MAT_ID_NX and GDN+CPY (no such graph here), and the VTCM check of
the fused RMS_NORM+MUL params (kazeia's unary layouts are May's).
"""

from __future__ import annotations

from kazeia.backends.htp.host.buffer_type import REPACK
from kazeia.backends.htp.msg import MAX_INPUTS, OpBatch, OpDesc
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.matmul import hmx_2026_10 as hmx
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_for_node
from kazeia.backends.htp.vtcm.matmul.hvx_2026_10 import nx_layout_bytes
from kazeia.backends.htp.vtcm.matmul.record import norm_qtype
from kazeia.graph.tensor import GGMLType, Tensor, TFlag

MAX_OUTPUTS = 4  # HTP_OP_MAX_OUTPUTS


def fuseable_nodes(nodes: list[Tensor]) -> set[Tensor]:
    """The GGML_HEXAGON_TENSOR_FUSEABLE tags: an RMS_NORM whose only use is the next node, a MUL (ggml_can_fuse);
    a MUL_MAT whose next node is an ADD it alone feeds, or with exactly one use."""
    uses: dict[int, int] = {}
    for n in nodes:
        for s in n.src:
            if s is not None:
                uses[id(s)] = uses.get(id(s), 0) + 1
    out = set()
    for i, n in enumerate(nodes):
        nxt = nodes[i + 1] if i + 1 < len(nodes) else None
        only_next = (uses.get(id(n), 0) == 1 and nxt is not None and any(s is n for s in nxt.src)
                     and not n.flags & TFlag.OUTPUT)
        if n.op == "RMS_NORM" and nxt is not None and nxt.op == "MUL" and only_next:
            out.add(n)
        elif n.op == "MUL_MAT" and ((nxt is not None and nxt.op == "ADD" and only_next) or uses.get(id(n), 0) == 1):
            out.add(n)
    return out


def _same(a: Tensor, b: Tensor) -> bool:
    """One tensor, or two at one address (a graph built from shapes alone has no addresses: identity only)."""
    return a is b or (a.buffer is not None and b.buffer is not None and a.data_addr == b.data_addr)


def _mm_hmx_eligible(node: Tensor, settings: HtpSettings) -> bool:
    """mm_is_hmx_eligible: NHMX != 0 and ggml_hexagon_matmul_is_hmx_eligible (not MM_SELECT)."""
    w, x = node.src[0], node.src[1]
    if settings.nhmx == 0:
        return False
    try:
        qt = norm_qtype(w.type)
    except Exception:  # noqa: BLE001 (a type with no HTP kernel)
        return False
    batched = w.ne[2] * w.ne[3] > 1 or x.ne[2] * x.ne[3] > 1
    return hmx.hmx_eligible(qt, w.ne[0], w.ne[1], x.ne[1], x.type == GGMLType.F32, batched)


def _mergeable(node: Tensor, settings: HtpSettings) -> bool:
    """is_mergeable_mul_mat."""
    w, x = node.src[0], node.src[1]
    if node.op != "MUL_MAT" or x.type != GGMLType.F32 or w.ne[2] != 1 or w.ne[3] != 1:
        return False
    if _mm_hmx_eligible(node, settings):
        return w.type in REPACK or w.type in (GGMLType.F16, GGMLType.F32)
    return w.type in REPACK and w.type != GGMLType.Q6_K


def mul_mat_add_plan_allows(mm: Tensor, src2: Tensor, settings: HtpSettings) -> bool:
    """The plan side of try_fuse_mul_mat_add: the MUL_MAT planned with the residual in VTCM
    (ggml_hexagon_precompute_fused_matmul_add_params) is supported, is HMX or has one activation row, fits, and,
    when both plans are HMX, keeps mc, nc and the act threads ("HMX efficiency reduced" otherwise)."""
    fused = plan_for_node(mm, settings, src2=src2)
    if fused.path == "cpu":
        return False
    x = mm.src[1]
    if fused.path != "hmx" and x.ne[1] * x.ne[2] * x.ne[3] != 1:
        return False  # can_fuse: HMX, or a single activation row
    if fused.used > settings.vtcm_bytes:
        return False
    alone = plan_for_node(mm, settings)
    return not (fused.path == "hmx" and alone.path == "hmx" and (
        fused.mc < alone.mc or fused.nc < alone.nc or fused.info["act_threads"] < alone.info["act_threads"]))


def pair_fusion(prev: Tensor, node: Tensor, settings: HtpSettings, fuseable: set[Tensor]) -> tuple[str, Tensor] | None:
    """The fusion of `node` into the op `prev` alone makes, as try_fuse_rms_norm_mul and try_fuse_mul_mat_add judge
    it apart from the batch's table room: (its upstream name, the tensor the fused op adds: the MUL's weight or the
    ADD's residual), or None. `prev` must be tagged FUSEABLE and `node` must consume its output (by tensor or by
    data address, as upstream compares)."""
    if prev not in fuseable or len(node.src) < 2:
        return None
    a, b = node.src[0], node.src[1]
    other = b if _same(a, prev) else a if _same(b, prev) else None
    if other is None:
        return None
    if node.op == "MUL" and prev.op == "RMS_NORM" and settings.fusion_enabled("RMS_NORM+MUL"):
        src0 = prev.src[0]
        if not (src0.ne[0] == other.ne[0] == node.ne[0]):
            return None
        if other.ne[1:] != (1, 1, 1) and other.ne != src0.ne:  # a row broadcast, or the same shape
            return None
        if src0.ne != node.ne or src0.is_contiguous() != node.is_contiguous():
            return None
        return "RMS_NORM+MUL", other
    if node.op == "ADD" and prev.op == "MUL_MAT" and settings.fusion_enabled("MUL_MAT+ADD"):
        if other.type != GGMLType.F32 or not mul_mat_add_plan_allows(prev, other, settings):
            return None
        return "MUL_MAT+ADD", other
    return None


class Fuser:
    """try_fuse for one session: `settings`, and the fuseable tags of the graph being queued."""

    def __init__(self, settings: HtpSettings, max_tensors: int) -> None:
        self.settings = settings
        self.max_tensors = max_tensors
        self.fuseable: set[Tensor] = set()

    def try_fuse(self, batch: OpBatch, node: Tensor) -> str | None:
        """Merge `node` into the batch's last op if a fusion takes it; returns the fused op's name, or None."""
        if not batch.ops:
            return None
        last = batch.ops[-1]
        found = pair_fusion(last.node, node, self.settings, self.fuseable) if last.name is None else None
        if found is not None and batch.room_for((found[1], node), self.max_tensors):
            name = found[0]
        elif self.settings.fusion_enabled("MUL_MAT_NX") and self._mul_mat_nx(batch, last, node):
            name = "MUL_MAT_NX"
        else:
            return None
        batch.fuse(last, node, name)
        return name

    def _mul_mat_nx(self, batch: OpBatch, last: OpDesc, node: Tensor) -> bool:
        if node.op != "MUL_MAT" or last.node.op != "MUL_MAT" or not _mergeable(node, self.settings):
            return False
        if last.name not in (None, "MUL_MAT_NX"):
            return False
        first = last.node
        if last.name == "MUL_MAT_NX":
            n_out = 1 + len(last.fused)
            if n_out >= MAX_OUTPUTS or n_out + 1 >= MAX_INPUTS:
                return False
        elif not _mergeable(first, self.settings):
            return False
        w0, w1 = first.src[0], node.src[0]
        if node.src[1] is not first.src[1] or w1.ne[0] != w0.ne[0] or w1.type != w0.type:
            return False
        if _mm_hmx_eligible(node, self.settings) != _mm_hmx_eligible(first, self.settings):
            return False
        if not self._nx_kernel_fits(first):
            return False
        return batch.room_for((w1, node), self.max_tensors)

    def _nx_kernel_fits(self, first: Tensor) -> bool:
        """is_supported_mul_mat_nx_kernel and the VTCM check of ggml_hexagon_precompute_fused_mmnx_params: the first
        weight's HMX 2-D plan, else the fused HVX QUANT_ROW layout (repacked types but Q6_K)."""
        p = plan_for_node(first, self.settings)
        if p.path == "hmx":
            return p.info.get("kernel") == "HMX_2D"
        w, x = first.src[0], first.src[1]
        if w.type not in REPACK or w.type == GGMLType.Q6_K or self.settings.mm_select < 1:
            return False
        rows = x.ne[1] * x.ne[2] * x.ne[3]
        return nx_layout_bytes(norm_qtype(w.type), w.ne[0], rows, self.settings.nhvx,
                               self.settings.vtcm_bytes) <= self.settings.vtcm_bytes
