"""The scheduler: places every node of a graph on a backend and runs the graph.

Placement: routing rules first (ops or node names forced to a fallback backend, gates), then the first
backend in priority order whose `supports` says yes. Before a node runs, every asynchronous backend that
last wrote one of its inputs is synchronized (like a ggml_backend_sched split boundary). Memory is shared
host memory, so no copies are needed, only waits.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from kazeia.backends.base import Backend, Hooks
from kazeia.errors import KazeiaError, UnsupportedError
from kazeia.graph import rowsplit
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import Tensor
from kazeia.identity import IdentityCache, binding
from kazeia.limits import safe_regex

# A gate looks at a node and may name the backend it must run on (or None to let placement decide).
Gate = Callable[[Tensor], "str | None"]


@dataclass
class Router:
    """User routing: `cpu_ops` (ggml op names or descs), `cpu_nodes` (regex on node names),
    `cpu_node_ranges` (graph node indices, see `parse_node_ranges`), gates."""

    cpu_ops: set[str] = field(default_factory=set)
    cpu_nodes: re.Pattern | None = None
    gates: list[Gate] = field(default_factory=list)
    fallback: str = "CPU"
    # [start, stop) ranges of node indices in graph.nodes (ALL nodes, views included: the index the KZOP trace
    # prints as #N and OpInfo.index holds); stop None = to the end. Applies to every graph (micro-batch).
    cpu_node_ranges: list[tuple[int, int | None]] = field(default_factory=list)
    n_gpu_layers: int | None = None  # -ngl: only the last N layers on the device (engine/offload.py); None: all
    n_layer: int = 0
    _ngl_cpu: set[int] = field(default_factory=set)

    def begin_graph(self, graph: Graph, device_supports: Callable[[Tensor], bool]) -> None:
        """Work out, for this graph, the nodes -ngl keeps on the CPU."""
        if self.n_gpu_layers is not None:
            from kazeia.engine.offload import cpu_nodes

            self._ngl_cpu = cpu_nodes(graph, self.n_layer, self.n_gpu_layers, device_supports)

    @classmethod
    def from_args(cls, cpu_ops: str | None = None, cpu_nodes: str | None = None,
                  cpu_node_range: str | None = None) -> Router:
        ops = {o.strip().upper() for o in (cpu_ops or "").split(",") if o.strip()}
        pattern = safe_regex(cpu_nodes, "--cpu-nodes") if cpu_nodes else None
        return cls(cpu_ops=ops, cpu_nodes=pattern, cpu_node_ranges=parse_node_ranges(cpu_node_range))

    def key(self) -> tuple:
        """The rules placement depends on (gates and -ngl aside), for plans made under them."""
        return (tuple(sorted(self.cpu_ops)), self.cpu_nodes, tuple(self.cpu_node_ranges), self.fallback)

    def forced(self, node: Tensor, index: int | None = None) -> tuple[str, str] | None:
        """(backend name, reason) if a rule decides for this node (`index`: its position in graph.nodes)."""
        if self._ngl_cpu and id(node) in self._ngl_cpu:
            where = f"layer {node.layer}" if node.layer is not None else "not an offloaded layer"
            return self.fallback, f"-ngl {self.n_gpu_layers}: {where} stays on the CPU"
        if node.op in self.cpu_ops or node.desc() in self.cpu_ops:
            return self.fallback, f"--cpu-ops {node.desc()}"
        if self.cpu_nodes is not None and self.cpu_nodes.search(node.name):
            return self.fallback, f"--cpu-nodes {self.cpu_nodes.pattern}"
        if index is not None and any(a <= index and (b is None or index < b) for a, b in self.cpu_node_ranges):
            return self.fallback, f"--cpu-node-range {format_node_ranges(self.cpu_node_ranges)}"
        for gate in self.gates:
            target = gate(node)
            if target is not None and not isinstance(target, str):  # a Route (engine/policy.py): the rule's
                node.route_path, node.route_rule = target.path, target.rule  # path, read by the device
                return target.target or "", target.reason
            if target:
                return target, getattr(gate, "reason", "gate")
        return None


def parse_node_ranges(text: str | None) -> list[tuple[int, int | None]]:
    """'A:B,C,D:' -> [(A, B), (C, C+1), (D, None)]: half-open ranges of graph node indices."""
    out: list[tuple[int, int | None]] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if ":" in part:
                a, b = part.split(":", 1)
                start, stop = int(a or 0), (int(b) if b.strip() else None)
            else:
                start = int(part)
                stop = start + 1
        except ValueError:
            raise KazeiaError(f"bad node range '{part}' (want A:B, A: or N, comma-separated)") from None
        if start < 0 or (stop is not None and stop < start):
            raise KazeiaError(f"bad node range '{part}'")
        out.append((start, stop))
    return out


def format_node_ranges(ranges: list[tuple[int, int | None]]) -> str:
    return ",".join(f"{a}:{'' if b is None else b}" for a, b in ranges)


@dataclass
class Placement:
    node: str
    op: str
    backend: str
    reason: str
    index: int = -1  # position in graph.nodes


class GraphPlan:
    """What the general path works out for a graph before it computes anything: each computed node's backend
    and Placement, the waits before it, the root it writes. Made when placement is a pure function of the node
    (Scheduler._cacheable) and kept while the tensors sit where they sat (the waits follow data addresses).

    steps: (node, backend, checks, root, other backends); a check is a backend to synchronize (the source's
    writer earlier in this graph) or the data address of a source no node before it wrote (looked up in the
    scheduler's last writers when the step runs, as the general path does)."""

    def __init__(self, graph: Graph, key: tuple) -> None:
        self.graph, self.n_nodes, self.key = graph, len(graph.nodes), key
        self.placement = graph.placement  # the allocator's stamp the plan's addresses hold under
        self.steps: list[tuple[Tensor, Backend, tuple, Tensor, tuple[Backend, ...]]] = []
        self.placements: list[Placement] = []
        self.writes: list[tuple[int, Backend]] = []  # (root address, backend) per step, in order
        self.last_writes: dict[int, Backend] = {}

    @classmethod
    def make(cls, sched: Scheduler, graph: Graph, key: tuple) -> GraphPlan:
        plan = cls(graph, key)
        for i, node in enumerate(graph.nodes):
            if not node.is_computed:
                continue
            backend, reason = sched.place(node, i)
            plan.placements.append(Placement(node.name, node.desc(), backend.name, reason, i))
            checks: list = []
            for s in node.src:
                if s is None:
                    continue
                addr = s.root.data_addr
                writer = plan.last_writes.get(addr, addr)
                if writer is addr:
                    checks.append(addr)
                elif writer is not backend and writer.is_async:
                    checks.append(writer)
            root = node.root
            plan.steps.append((node, backend, tuple(checks), root,
                               tuple(b for b in sched.backends if b is not backend)))
            plan.writes.append((root.data_addr, backend))
            plan.last_writes[root.data_addr] = backend
        return plan

    def valid(self, graph: Graph, key: tuple) -> bool:
        """The graph is placed where it was (its Placement), with as many nodes, under the same rules."""
        return self.placement is graph.placement and self.n_nodes == len(graph.nodes) and self.key == key


class Scheduler:
    def __init__(self, backends: list[Backend], router: Router | None = None) -> None:
        if not backends:
            raise ValueError("at least one backend is needed")
        self.backends = backends
        self.by_name = {b.name: b for b in backends}
        self.router = router or Router()
        self.hooks: list[Hooks] = []
        self.placements: list[Placement] = []
        self._last_writer: dict[int, Backend] = {}  # data address of a root tensor -> backend that wrote it
        # by graph: the single-backend path's (n nodes, computed nodes, placements); the general path's GraphPlan
        self._plans: IdentityCache[tuple[int, list[Tensor], list[Placement]]] = IdentityCache(
            "scheduler.single_plans", limit=16, bind=True)
        self._general_plans: IdentityCache[GraphPlan] = IdentityCache("scheduler.graph_plans", limit=16, bind=True)

    def add_hook(self, hook: Hooks) -> None:
        self.hooks.append(hook)
        for b in self.backends:
            b.hooks.append(hook)

    def remove_hook(self, hook: Hooks) -> None:
        self.hooks.remove(hook)
        for b in self.backends:
            if hook in b.hooks:
                b.hooks.remove(hook)

    def place(self, node: Tensor, index: int | None = None) -> tuple[Backend, str]:
        node.route_path = node.route_rule = None  # a rule decides again at every placement
        forced = self.router.forced(node, index)
        if forced is not None:
            name, reason = forced
            b = self.by_name.get(name) if name else self.backends[0]  # "": the device (first backend)
            if b is not None and b.supports(node):
                return b, reason
            node.route_path = node.route_rule = None
        for b in self.backends:
            if b.supports(node):
                return b, "supported" if b is self.backends[0] else f"not supported by {self.backends[0].name}"
        raise UnsupportedError(f"no backend can run {node.name} ({node.desc()} "
                               f"{node.type.name}{node.shape_str()})")

    def _cacheable(self) -> bool:
        """Placement is a pure function of the node when no gate runs and every backend's `supports` is."""
        return not self.router.gates and all(b.static_supports for b in self.backends)

    def compute(self, graph: Graph) -> None:
        if self._cacheable() and binding():
            if len(self.backends) == 1 and not self.backends[0].is_async:
                return self._compute_single(graph)
            plan = self._plan_for(graph) if self.router.n_gpu_layers is None else None
            if plan is not None:
                return self._replay(graph, plan)
        self.placements = []
        if len(self.backends) > 1:
            self.router.begin_graph(graph, self.backends[0].supports)
        for b in self.backends:
            b.begin_graph(graph)
        for i, node in enumerate(graph.nodes):
            if not node.is_computed:
                continue
            backend, reason = self.place(node, i)
            self.placements.append(Placement(node.name, node.desc(), backend.name, reason, i))
            self._wait_for_inputs(node, backend)
            if node.route_path is not None and node.route_path.startswith(rowsplit.PREFIX):
                for piece in rowsplit.split_nodes(node):  # a split-op rule: M cut into pieces avoiding a range
                    backend.compute(piece)
            else:
                backend.compute(node)
            root = node.root
            self._last_writer[root.data_addr] = backend
            for other in self.backends:
                if other is not backend:
                    other.foreign_write(root)
        for b in self.backends:
            b.end_graph()

    def _compute_single(self, graph: Graph) -> None:
        """One synchronous backend: nothing to wait for, nobody else to tell; placements computed once
        per graph (same reasons and indices as the general path)."""
        (backend,) = self.backends

        def make() -> tuple[int, list[Tensor], list[Placement]]:
            nodes, placements = [], []
            for i, node in enumerate(graph.nodes):
                if node.is_computed:
                    b, reason = self.place(node, i)
                    nodes.append(node)
                    placements.append(Placement(node.name, node.desc(), b.name, reason, i))
            return len(graph.nodes), nodes, placements

        _, nodes, self.placements = self._plans.get(graph, make, lambda c: c[0] == len(graph.nodes))
        backend.begin_graph(graph)
        backend.run_nodes(nodes)
        backend.end_graph()

    def _plan_for(self, graph: Graph) -> GraphPlan | None:
        """The graph's plan (placements, waits), made once and kept while the graph, its tensors' places, the
        backends and the rules stay the same; None: no plan (placement failed: the general path says where)."""
        key = (tuple(self.backends), self.router.key())
        plan = self._general_plans.peek(graph)
        if plan is not None and plan.valid(graph, key):
            return plan
        if graph.placement is None:
            return None  # not placed by an allocator: nothing says its addresses hold, the general path runs it
        try:
            plan = GraphPlan.make(self, graph, key)
        except (KazeiaError, RuntimeError):  # unplaceable or unallocated: the general path fails where it does
            return None
        self._general_plans.put(graph, plan)
        return plan

    def _replay(self, graph: Graph, plan: GraphPlan) -> None:
        """The general path's steps from a plan: the same waits (a source written earlier in this graph has its
        writer fixed; one from outside is looked up as the general path does), computes and foreign writes."""
        self.placements = plan.placements
        if len(self.backends) > 1:
            self.router.begin_graph(graph, self.backends[0].supports)
        for b in self.backends:
            b.begin_graph(graph)
        writers = self._last_writer
        j = done = 0
        try:
            for j, (node, backend, checks, root, others) in enumerate(plan.steps):
                node.route_path = node.route_rule = None  # as place() leaves it (no gate runs)
                for c in checks:
                    if type(c) is int:
                        c = writers.get(c)
                        if c is None or c is backend or not c.is_async:
                            continue
                    c.synchronize()
                backend.compute(node)
                done = j + 1
                for other in others:
                    other.foreign_write(root)
        except BaseException:
            for addr, b in plan.writes[:done]:  # what the general path had recorded when it stopped here
                writers[addr] = b
            self.placements = plan.placements[:j + 1]
            raise
        writers.update(plan.last_writes)
        for b in self.backends:
            b.end_graph()

    def _wait_for_inputs(self, node: Tensor, backend: Backend) -> None:
        for s in node.src:
            if s is None:
                continue
            writer = self._last_writer.get(s.root.data_addr)
            if writer is not None and writer is not backend and writer.is_async:
                writer.synchronize()

    def synchronize(self) -> None:
        for b in self.backends:
            b.synchronize()

    def read_output(self, t: Tensor) -> None:
        """llama_decode's output read: ggml_backend_tensor_get_async on the backend that wrote `t`, then the
        context's synchronize."""
        writer = self._last_writer.get(t.root.data_addr)
        if writer is not None:
            writer.get_tensor_async(t)
        self.synchronize()

    def replace_backend(self, old: Backend, new: Backend) -> None:
        """Put `new` (a new session of a dead device) where `old` was, with the same hooks; nothing it wrote is
        waited for any more."""
        self.backends = [new if b is old else b for b in self.backends]
        self.by_name = {b.name: b for b in self.backends}
        for h in self.hooks:
            if h not in new.hooks:
                new.hooks.append(h)
        self._last_writer = {a: b for a, b in self._last_writer.items() if b is not old}
        self._plans.clear()
        self._general_plans.clear()

