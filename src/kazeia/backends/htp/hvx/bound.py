"""An HVX MUL_MAT node bound once and run the same way every token (a decode runs the same graph's nodes again
and again): what `HvxPath._hvx_vtcm` works out per call from shapes only (the plan, the weight's blocks, the
kernel and its scratch, the VTCM area and the pointers of every persistent buffer, where the dst bytes land) is
kept, so a call is the src1 shortcut test, one native quantization into VTCM, the dot straight into dst, and
the ring/dst images. The bytes are those of the general path, which every case the binding does not take
keeps running: weights other than Q4_0/Q8_0/IQ4_NL, HMX plans and fallbacks, batched or non-contiguous
operands, F16 src1, fault injections, activations the native quantizer does not take (|x| > 65504, NaN).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kazeia.backends.htp.device import Dsp
from kazeia.backends.htp.host.repack import QK, SUPER
from kazeia.backends.htp.hvx.path import HvxPath
from kazeia.backends.htp.hvx.quant import fp16_table, q8x4x2_row_size, round_up
from kazeia.backends.htp.kernels.hvx import BoundDot
from kazeia.backends.htp.kernels.quant import BoundQuant
from kazeia.backends.htp.kernels.vtcm_copy import CopyRuns
from kazeia.backends.htp.msg import STATUS_OK, OpContext, OpDesc, OpRecord
from kazeia.backends.htp.profiles import DMA_UNBALANCED
from kazeia.backends.htp.vtcm.matmul.record import MatmulPlan
from kazeia.graph.tensor import GGMLType, Tensor, array
from kazeia.native.buffers import ptr
from kazeia.native.compile import available

BOUND_TYPES = (GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.IQ4_NL)  # q8x4x2 activations, dot in kernels/hvx NAMES


class BoundHvx:
    """One node's HVX matmul with everything that depends only on its shapes and places worked out. `matches`
    says whether the node still is what it was bound from (same sources, route path, views of x and dst, weight
    placement, VTCM); `run` returns None where the general path must run this call (a stale DMA descriptor, or
    activations the native quantizer does not take: it has then written nothing)."""

    __slots__ = ("node", "src", "route_path", "placement", "vtcm", "plan", "rw", "prog", "m", "nbytes", "area",
                 "parea", "stride", "quant", "dot", "pdst", "y", "dst_runs", "checks_format", "record")

    def matches(self, node: Tensor, dsp: Dsp, placement: object) -> bool:
        """Bound for this node (its sources and route path), on this DSP's VTCM, under this placement of its graph
        (the views of x and dst it holds are where the tensors are; weights never move)."""
        return (placement is self.placement and node.src is self.src and node.route_path == self.route_path
                and dsp.vtcm is self.vtcm)

    def run(self, unit: HvxPath, dsp: Dsp, octx: OpContext, op: OpDesc) -> OpRecord | None:
        if dsp.dma_stale_pop:
            return None  # thread 0's first weight row is read early: matmul_hvx handles it
        vt = self.vtcm
        src1 = op.src[1]
        reuse = octx.src1_spad_src == src1 and (not self.checks_format or octx.src1_spad_kind == "q8x4x2")
        vt.land(0, self.nbytes)  # what `read` / `view` of the src1 area make first
        if not reuse:
            if not self.quant():  # nothing written: the numpy quantizer of the general path takes these values
                return None
            octx.src1_spad_src = src1  # (the image fills its rows: no spill past the area)
            octx.src1_spad_kind = "q8x4x2"
        self.dot.run(self.area, self.parea, self.stride, self.pdst)
        unit.leave_rings(vt, self.rw, self.prog)
        if self.dst_runs is not None:  # (spans, VTCM views <- dst bytes, native copy): write_runs of the dst runs
            vt.write_views(*self.dst_runs)
        else:
            vt.write_runs(unit.dst_runs(self.prog, self.y), self.prog.dst_box)
        reason, used, modeled = self.record
        return OpRecord("hvx", STATUS_OK, {"reason": reason, "src1_reused": reuse, "vtcm_used": used,
                                           "modeled_s": modeled})


class _Operands(NamedTuple):
    """What both bindings work out of an HVX matmul node: its shapes, the q8x4x2 row geometry, the views of x and
    dst, the weight and its ggml blocks."""

    m: int
    k: int
    kp: int
    stride: int
    xs: np.ndarray
    dst: np.ndarray
    rw: object
    b8: np.ndarray


def _operands(unit: HvxPath, node: Tensor) -> _Operands | None:
    """The node's operands when the native quantizer and dot take them (a q8x4x2 weight type, F32 x and dst, 2-D,
    C-contiguous, whole 32-element blocks), else None."""
    w, x = node.src[0], node.src[1]
    if (w.type not in BOUND_TYPES or x.type != GGMLType.F32 or node.type != GGMLType.F32 or not available()
            or w.ne[2] * w.ne[3] != 1 or x.ne[2] * x.ne[3] != 1):
        return None
    m, k = x.ne[1], w.ne[0]
    kp, stride = round_up(k, SUPER), q8x4x2_row_size(k)
    xs, dst = array(x)[0, 0], array(node)
    if (k % QK or not k or kp > stride or not xs.flags.c_contiguous or not dst.flags.c_contiguous
            or dst.shape != (1, 1, m, w.ne[1])):
        return None
    rw = unit.weights.get(w)
    b8, _ = rw.blocks()
    if not BoundDot.usable(b8, w.type, m):
        return None
    return _Operands(m, k, kp, stride, xs, dst, rw, b8)


def bind_hvx(unit: HvxPath, dsp: Dsp, node: Tensor, plan: MatmulPlan, modeled_s: float,
             placement: object) -> BoundHvx | None:
    """The binding of an HVX matmul node, or None where the general path keeps running it (see the module)."""
    if (plan.path == "hmx" or plan.hmx_attempt is not None or plan.status != "ok"
            or DMA_UNBALANCED.acts(unit.settings, "hvx")):
        return None
    ops = _operands(unit, node)
    vt = dsp.vtcm
    if ops is None or ops.m * ops.stride > vt.size:
        return None
    w = node.src[0]
    m, k, kp, stride, xs, dst, rw, b8 = ops
    prog = unit.leave_program(plan, rw)
    if any(r is not None and r.size and r.end > vt.size for r, _, _ in prog.rings) or prog.dst_box[1] > vt.size:
        return None  # a leave write would fault: the general path raises it where it does
    b = BoundHvx()
    b.node, b.src, b.route_path, b.vtcm, b.plan, b.rw, b.prog, b.m = node, node.src, node.route_path, vt, plan, rw, \
        prog, m
    b.placement = placement
    b.nbytes, b.stride = m * stride, stride
    b.area = vt.raw_view(0, m * stride).reshape(m, stride)
    b.parea = ptr(b.area)
    b.quant = BoundQuant(xs, kp, unit.settings.fp32_quantize_group, fp16_table("inverse"),
                              fp16_table("int8"), b.area)
    b.dot = BoundDot(b8, w.type, m, k, unit.dot_scratch(BoundDot.scratch_shape(w.type, rw.nsub, m), k))
    b.y = dst.reshape(m, -1)
    b.pdst = ptr(dst)
    b.dst_runs = _bound_runs(vt, unit.dst_runs(prog, b.y), prog.dst_box) if m == 1 else None
    b.checks_format = unit.profile.shortcut_checks_format
    b.record = (plan.reason, plan.used, modeled_s)
    return b


def _bound_runs(vt, runs: list[tuple[int, np.ndarray]], box: tuple[int, int]) -> tuple:
    """`write_views` arguments making `write_runs(runs, box)` of fixed runs (one output row: views of dst's
    bytes, in range: bind_hvx checked the dst areas)."""
    spans = [(off, raw.size) for off, raw in runs]
    pairs = list(zip(vt.run_views(spans), (raw for _, raw in runs)))
    return spans, pairs, box, CopyRuns.of(pairs)


class BoundHvxHostPlan:
    """2026-10's HVX MUL_MAT of one node bound once (`HvxPath.run_host_plan`'s steps with their arguments worked
    out): the October quantizer (32-element groups) into the binding's own image, the sequential dot straight into
    dst. Its VTCM leaves nothing here either (see `HvxPath.run_host_plan`). `run` returns None where the general path
    must run this call (activations the native quantizer does not take: it has then written nothing)."""

    __slots__ = ("src", "route_path", "placement", "quant", "dot", "img", "pimg", "stride", "pdst", "record", "done")

    def matches(self, node: Tensor, placement: object) -> bool:
        return placement is self.placement and node.src is self.src and node.route_path == self.route_path

    def run(self, members: tuple[BoundHvxHostPlan, ...] | list[BoundHvxHostPlan] = ()) -> OpRecord | None:
        """This node's dot, and with `members` (the other bound nodes of its MUL_MAT_NX, the same src1) theirs
        too from the one image, as the fused op does on the DSP (the image is a function of src1 alone, so each
        dst gets the bits of its own run). None, with nothing written, where the quantizer declines."""
        if not self.quant():
            return None
        for b in (self, *members):
            b.dot.run(self.img, self.pimg, self.stride, b.pdst)
        return self.ok()

    def ok(self) -> OpRecord:
        reason, used, kernel, modeled = self.record
        return OpRecord("hvx", STATUS_OK, {"reason": reason, "vtcm_used": used, "kernel": kernel, "modeled_s": modeled})


def bind_hvx_host_plan(unit: HvxPath, node: Tensor, plan: MatmulPlan, modeled_s: float,
                       placement: object) -> BoundHvxHostPlan | None:
    """The binding of a 2026-10 HVX matmul node, or None where the general path keeps running it (weights other
    than Q4_0/Q8_0/IQ4_NL, batched or non-contiguous operands, F16 src1)."""
    ops = _operands(unit, node) if plan.path == "hvx" and plan.status == "ok" else None
    if ops is None:
        return None
    w = node.src[0]
    m, k, kp, stride, xs, dst, rw, b8 = ops
    b = BoundHvxHostPlan()
    b.src, b.route_path, b.placement = node.src, node.route_path, placement
    b.img = np.zeros((m, stride), dtype=np.uint8)  # as hvx_matmul_sequential's fresh image: bytes never written stay 0
    b.pimg, b.stride = ptr(b.img), stride
    b.quant = BoundQuant(xs, kp, 32, fp16_table("inverse"), fp16_table("int8"), b.img)
    b.dot = BoundDot(b8, w.type, m, k, unit.dot_scratch(BoundDot.scratch_shape(w.type, rw.nsub, m), k),
                     sequential=True)
    b.pdst = ptr(dst)
    b.record = (plan.reason, plan.used, plan.info.get("kernel"), modeled_s)
    b.done = None  # (batch, seq) whose MUL_MAT_NX head already wrote this node's dst (matmul.py)
    return b
