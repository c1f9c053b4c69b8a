"""The op classes a model executes on the device for micro-batch sizes 1..ubatch, grouped by identical plans.

The model's graph is built twice (two micro-batch sizes) to learn, node by node, whether a weight MUL_MAT's M is
the micro-batch size (every projection of every layer) or fixed (the lm_head's out_ids row). Every M in 1..ubatch
is then planned by the backend's own `plan_for_node` (the plan the DSP will make). A class is (weight type, K, N,
plan), the plan being what decides the run: path, status, outcome, M and N chunks; its M values are the sizes
that give that plan. Classes are validated at their smallest and largest M (the layout grows with M inside a
class, the code path does not change). The short conv (SSM_CONV: Qwen3.5's and LFM2's) is a class too, per kernel
shape and DSP kernel (May's HVX kernel reads shifted weights from 32 tokens, a defect a one-op run shows). Other
device ops are listed, not validated in isolation: no op of theirs kills the device or computes wrong alone in
any profile here, and the batch-dependent defects (the src1 shortcut, stale HMX scale) do not reproduce in a
one-op run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kazeia.backends.htp import HtpSettings, plan_for_node, supports_op
from kazeia.backends.htp.forensics import op_scratch
from kazeia.engine.context import Model
from kazeia.graph import builder as gb
from kazeia.graph.tensor import GGMLType, Tensor, make_tensor, type_name
from kazeia.models.shapes import shape_caches, ubatch_graph


@dataclass
class OpClass:
    """One validated unit: MUL_MATs of one weight type and shape whose plans are identical for these M; or
    (op SSM_CONV) short convolutions of one kernel shape (K = kernel length, N = channels) that run the same DSP
    kernel, its plan ("hvx", "ok", kernel, 0, 0) with kernel "scalar" or "hvx"."""

    wtype: str
    k: int
    n: int
    plan: tuple  # (path, status, outcome, mc, nc)
    ms: list[int] = field(default_factory=list)
    weights: list[str] = field(default_factory=list)  # every weight of the model in this class (GGUF names)
    nodes_per_ubatch: int = 0  # how many nodes of a micro-batch graph fall in it
    op: str = "MUL_MAT"

    @property
    def key(self) -> str:
        path, status, outcome, mc, nc = self.plan
        if self.op != "MUL_MAT":
            return f"{self.op.lower()}-k{self.k}-n{self.n}-{outcome}-m{self.ms[0]}-{self.ms[-1]}"
        return f"{self.wtype}-k{self.k}-n{self.n}-{path}-{status}-mc{mc}-nc{nc}-m{self.ms[0]}-{self.ms[-1]}"

    @property
    def rule_name(self) -> str:
        return f"{self.op.lower()}-{self.wtype}-k{self.k}-n{self.n}-m{self.ms[0]}-{self.ms[-1]}"

    @property
    def path(self) -> str:
        return self.plan[0]

    def ranges(self) -> list[tuple[int, int]]:
        """The M values as inclusive ranges."""
        out: list[list[int]] = []
        for m in self.ms:
            if out and m == out[-1][1] + 1:
                out[-1][1] = m
            else:
                out.append([m, m])
        return [(a, b) for a, b in out]

    def representatives(self) -> list[int]:
        """The M values validated: an HMX plan's layout is fixed by its chunks (mc, nc), so its largest M (the
        fullest chunk) stands for the class; an HVX layout grows with M: its smallest and largest."""
        if self.path == "hmx" and self.plan[3]:
            return [self.ms[-1]]
        return sorted({self.ms[0], self.ms[-1]})

    def describe(self) -> str:
        rs = ",".join(f"{a}..{b}" if a != b else str(a) for a, b in self.ranges())
        if self.op == "SSM_CONV":
            return f"SSM_CONV kernel {self.k} x {self.n} channels, {rs} tokens ({self.plan[2]} kernel)"
        return f"MUL_MAT {self.wtype} K={self.k} N={self.n} M={rs} ({self.path}, {self.plan[1]})"


def plan_key(node: Tensor, settings: HtpSettings, m: int, memo: dict | None = None) -> tuple:
    """(path, status, outcome, mc, nc) of the node's plan at M = m. `memo`: plans already made, by what a plan
    reads of the node (the weight's type and shape, src1's type, shape and strides, the route), so the nodes of
    every layer that share a weight shape are planned once per M."""
    w, x = node.src[0], node.src[1]
    key = (w.type, w.ne, w.nb, x.type, x.ne[2:], x.nb, node.route_path, m)
    if memo is not None and key in memo:
        return memo[key]
    p = plan_for_node(node, settings, m=m)
    out = p.path, p.status, p.outcome, p.mc, p.nc
    if memo is not None:
        memo[key] = out
    return out


def _graph_nodes(model: Model, t: int) -> list[Tensor]:
    caches = shape_caches(model.args, t + 256)
    return [n for n in ubatch_graph(model.args, model.weights, caches, t, 256).nodes if n.is_computed]


def enumerate_classes(model: Model, settings: HtpSettings, ubatch: int) -> tuple[list[OpClass], dict[str, int]]:
    """(MUL_MAT classes, other device op descs with their count per micro-batch graph)."""
    b = max(1, ubatch)
    a = 2 if b > 2 else 1
    big, small = _graph_nodes(model, b), ({n.name: n for n in _graph_nodes(model, a)} if a != b else {})
    classes: dict[tuple, OpClass] = {}
    others: dict[str, int] = {}
    plans: dict[tuple, tuple] = {}
    for node in big:
        if not supports_op(node, settings):
            continue
        if node.op == "SSM_CONV" and node.src[1].weight_name is not None:
            _conv_classes(node, settings, b, classes, plans)
            continue
        if node.op != "MUL_MAT" or node.src[0].weight_name is None:
            others[node.desc()] = others.get(node.desc(), 0) + 1
            continue
        w = node.src[0]
        twin = small.get(node.name)
        follows = twin is None or twin.src[1].ne[1] != node.src[1].ne[1]  # M is the micro-batch size
        ms = range(1, b + 1) if follows else [node.src[1].ne[1]]
        seen: set[tuple] = set()
        for m in ms:
            pk = plan_key(node, settings, m, plans)
            ck = (type_name(w.type).lower(), w.ne[0], w.ne[1], pk)
            c = classes.setdefault(ck, OpClass(ck[0], w.ne[0], w.ne[1], pk))
            if m not in c.ms:
                c.ms.append(m)
            if w.weight_name not in c.weights:
                c.weights.append(w.weight_name)
            if ck not in seen:
                seen.add(ck)
                c.nodes_per_ubatch += 1
    out = sorted(classes.values(), key=lambda c: (c.op, c.k, c.n, c.wtype, c.ms[0]))
    for c in out:
        c.ms.sort()
        w = 0 if c.op == "MUL_MAT" else 1  # where the class's weight is among the node's sources
        c.nodes_per_ubatch = sum(1 for n in big if n.op == c.op and n.src[w].weight_name in c.weights)
    return out, others


def conv_node(kernel: Tensor, m: int) -> Tensor:
    """An SSM_CONV of `m` new tokens (one sequence) with this kernel [d_conv, channels]: its state columns first."""
    d_conv, d_inner = kernel.ne[0], kernel.ne[1]
    sx = make_tensor(GGMLType.F32, (d_conv - 1 + m, d_inner, 1), name="gate_sx")
    return gb.ssm_conv(sx, kernel, "gate_conv")


def _conv_classes(node: Tensor, settings: HtpSettings, ubatch: int, classes: dict, memo: dict) -> None:
    """A short conv's classes: its tokens per sequence follow the micro-batch (1..ubatch), grouped by the DSP kernel
    each size runs (op_scratch: May's scalar loop below 32 tokens, HVX from there; October's HVX kernel always), so
    a defect of one kernel (May's HVX SSM_CONV, #24470) is one class. A one-op run shows it: unlike the other
    non-matmul ops, it needs nothing a batch leaves behind."""
    w = node.src[1]
    for m in range(1, ubatch + 1):
        key = ("SSM_CONV", w.ne, m)  # every layer's kernel of this shape runs the same DSP kernel at this M
        if key not in memo:
            memo[key] = op_scratch(conv_node(w, m), settings).info.get("kernel", "?")
        kernel = memo[key]
        ck = ("SSM_CONV", w.ne[0], w.ne[1], kernel)
        c = classes.setdefault(ck, OpClass("f32", w.ne[0], w.ne[1], ("hvx", "ok", kernel, 0, 0), op="SSM_CONV"))
        if m not in c.ms:
            c.ms.append(m)
        if w.weight_name not in c.weights:
            c.weights.append(w.weight_name)
