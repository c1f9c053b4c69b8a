"""What the runs of an investigation record about their ops: shapes and NaN-aware statistics of every op
(`FactsHook`), and the MUL_MAT plan the HTP would make for each of its matmuls (`PlanScan`, by
plan_for_node: the backend's own plan)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kazeia.backends.base import Hook, OpInfo
from kazeia.backends.htp import HtpSettings, MatmulPlan, plan_for_node, supports_op
from kazeia.debug.stats import Stats, tensor_stats
from kazeia.graph.tensor import Tensor, type_name


@dataclass
class OpFacts:
    """What we know about one node of the run: shapes, weight, input/output statistics."""

    index: int
    name: str
    op: str
    dst: str
    srcs: list[str]
    weight: str | None
    m: int | None = None  # MUL_MAT: src1 rows
    k: int | None = None
    n: int | None = None
    wtype: str | None = None
    in_stats: list[Stats | None] = field(default_factory=list)
    out_stats: Stats | None = None
    path: str | None = None
    faulted: bool = False
    fault: dict = field(default_factory=dict)
    batch: int | None = None  # the HTP batch it ran in (its sequence number; None off the HTP)

    def shape(self) -> str:
        """'MUL_MAT of blk.0.ffn_down.weight, K=9728, N=2560, M=38, q4_0' (MUL_MAT) or the op's name."""
        if self.m is None:
            return self.op
        return f"{self.op} of {self.weight}, K={self.k}, N={self.n}, M={self.m}, {self.wtype}"


def _label(t: Tensor) -> str:
    return f"{t.name} {type_name(t.type)}[{','.join(str(x) for x in t.ne)}]"


class FactsHook(Hook):
    """Records every op's shapes and NaN-aware statistics at start (inputs) and completion (output)."""

    def __init__(self) -> None:
        self.ops: dict[str, OpFacts] = {}
        self.order: list[str] = []
        self.fault: OpFacts | None = None
        self.described: dict[str, str] = {}  # every enqueued node (run or not): "MUL_MAT of blk.1.attn_output.weight"

    def on_enqueue(self, node: Tensor, info: OpInfo) -> None:
        w = node.src[0] if node.op == "MUL_MAT" else None
        self.described[node.name] = f"{node.desc()} of {w.weight_name}" if w is not None and w.weight_name \
            else node.desc()

    def _facts(self, node: Tensor, info: OpInfo) -> OpFacts:
        f = self.ops.get(node.name)
        if f is None:
            w = node.src[0] if node.op == "MUL_MAT" else None
            f = OpFacts(info.index, node.name, node.desc(), _label(node), [_label(s) if s else "" for s in node.src],
                        w.weight_name if w is not None else None)
            if node.op == "MUL_MAT":
                f.m, f.k, f.n, f.wtype = node.src[1].ne[1], w.ne[0], w.ne[1], type_name(w.type)
            self.ops[node.name] = f
            self.order.append(node.name)
        return f

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        f = self._facts(node, info)
        # (a ggml_cast lists its own result as src[1]: not an input, only the bytes it is about to overwrite)
        f.in_stats = [tensor_stats(s) if s is not None and s is not node and not s.weight_name else None
                      for s in node.src]

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        f = self._facts(node, info)
        f.out_stats = tensor_stats(node)
        f.path = f"{info.backend}/{info.path}"
        f.batch = info.batch

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        f = self._facts(node, info)
        # the facts are the first instance's (a prompt of several micro-batches runs ffn_out-0 at M = 512, then
        # at the remainder's M): the fault's own instance is the one to describe
        f.dst, f.srcs = _label(node), [_label(s) if s else "" for s in node.src]
        if node.op == "MUL_MAT":
            f.m = node.src[1].ne[1]
        f.faulted, f.fault, f.path = True, dict(info.extra), f"{info.backend}/dsp"
        self.fault = f


def skeleton(node: Tensor) -> Tensor:
    """A MUL_MAT node with its sources' types, shapes, strides and flags but no data: what plan_for_node and
    supports_op read, without keeping the run's buffers alive."""
    bare = [replace(s, buffer=None, src=(), view_src=None) if s is not None else None for s in node.src]
    return replace(node, buffer=None, src=tuple(bare), view_src=None)


def dies(plan: MatmulPlan) -> bool:
    """HMX chosen and its plan does not fit, with no fallback (plan_matmul returns the HVX plan when the profile
    falls back): the kernel returns -1 and the DSP re-enters op_matmul."""
    return plan.path == "hmx" and not plan.fits


@dataclass(frozen=True)
class OpPlan:
    """The plan the HTP makes for one MUL_MAT of the run (micro-batch `ubatch`)."""

    name: str  # node name (Qcur-0)
    weight: str | None  # GGUF weight name (blk.0.attn_q.weight)
    ubatch: int
    node: Tensor  # a skeleton (no data): plan_for_node(node, settings, m=...) plans other prompt lengths
    plan: MatmulPlan

    @property
    def family(self) -> str:
        """The weight without its layer (attn_q), or the node name for a matmul of two activations."""
        if not self.weight:
            return self.name
        w = self.weight.split(".", 2)[-1] if self.weight.startswith("blk.") else self.weight
        return w.removesuffix(".weight")

    @property
    def dies(self) -> bool:
        return dies(self.plan)


class PlanScan(Hook):
    """Plans every MUL_MAT the HTP would take (supports_op), as it starts on whatever backend runs it (a CPU
    reference run sees the whole graph, a device death cuts the HTP run short)."""

    def __init__(self, settings: HtpSettings) -> None:
        self.settings = settings
        self.plans: list[OpPlan] = []
        self._ubatch = 0
        self._seen: set[str] = set()

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        if node.op != "MUL_MAT" or not supports_op(node, self.settings):
            return
        if node.name in self._seen:  # the same name again: the next micro-batch's graph
            self._ubatch += 1
            self._seen = set()
        self._seen.add(node.name)
        bare = skeleton(node)
        self.plans.append(OpPlan(node.name, node.src[0].weight_name, self._ubatch, bare,
                                 plan_for_node(bare, self.settings)))
