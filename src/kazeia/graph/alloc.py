"""A ggml-alloc style graph allocator: intermediate tensors share one compute buffer, memory is reused.

Like ggml_gallocr: inputs are placed first, each node gets memory when it is computed, an op that can work
in place takes over its parent's memory when it is the parent's only consumer, and a tensor's memory is
freed after its last consumer (best-fit free list). The compute buffer persists between graphs, so stale
bytes of earlier tenants stay where they were (the fact that makes early host reads show zeros and -inf).
"""

from __future__ import annotations

from kazeia.graph.builder import Graph
from kazeia.graph.tensor import Buffer, BufferUsage, Tensor, TFlag

INPLACE_OPS = frozenset({"SCALE", "ADD", "SUB", "MUL", "DIV", "SQR", "SQRT", "UNARY", "ROPE", "RMS_NORM", "SOFT_MAX"})


def _align(n: int, a: int = Buffer.ALIGN) -> int:
    return (n + a - 1) // a * a


class _Arena:
    """Best-fit free list over [0, inf); tracks the high-water mark."""

    def __init__(self) -> None:
        self.free: list[tuple[int, int]] = []  # (offset, size), sorted by offset
        self.end = 0
        self.peak = 0

    def alloc(self, size: int) -> int:
        size = _align(max(size, 1))
        best = None
        for i, (_off, sz) in enumerate(self.free):
            if sz >= size and (best is None or sz < self.free[best][1]):
                best = i
        if best is not None:
            off, sz = self.free.pop(best)
            if sz > size:
                self.free.insert(best, (off + size, sz - size))
            return off
        off = self.end
        self.end += size
        self.peak = max(self.peak, self.end)
        return off

    def release(self, off: int, size: int) -> None:
        size = _align(max(size, 1))
        self.free.append((off, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        if merged and merged[-1][0] + merged[-1][1] == self.end:
            self.end = merged.pop()[0]
        self.free = merged


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


class GraphAllocator:
    """Places every unallocated tensor of a graph in one persistent compute buffer."""

    def __init__(self, name: str = "compute") -> None:
        self.name = name
        self.buffer: Buffer | None = None
        self.reallocations = 0

    def allocate(self, graph: Graph) -> Buffer:
        """Assign buffer/offset to every tensor of the graph that has no storage yet; resolve views."""
        if self.buffer is not None and graph.allocated_in is self.buffer:
            return self.buffer  # placed in this very buffer last time: the plan is deterministic, keep it
        for t in graph.leafs + graph.nodes:  # a reused graph is placed again, in the current compute buffer
            if t.view_src is None and t.buffer is not None and t.buffer.usage == BufferUsage.COMPUTE:
                t.buffer = None
        placed, size = _plan(graph)
        if self.buffer is None or self.buffer.size < size:
            # like ggml_gallocr_reserve: a bigger graph gets a new (zeroed) buffer
            self.buffer = Buffer.zeros(self.name, _align(size + 1), BufferUsage.COMPUTE)
            self.reallocations += 1
        for t, off in placed:
            t.buffer, t.offset = self.buffer, off
        for t in graph.leafs + graph.nodes:
            if t.view_src is not None:
                root = t.view_src
                if root.buffer is None:
                    raise RuntimeError(f"view {t.name!r} of unallocated tensor {root.name!r}")
                t.buffer, t.offset = root.buffer, root.offset + t.view_offs
        graph.allocated_in = self.buffer
        return self.buffer


def _plan(graph: Graph) -> tuple[list[tuple[Tensor, int]], int]:
    """Simulate ggml_gallocr over the graph: returns (tensor, offset) for every tensor needing memory."""
    arena = _Arena()
    placed: list[tuple[Tensor, int]] = []
    live: dict[int, tuple[Tensor, int]] = {}  # tensors currently holding arena memory
    remaining: dict[int, int] = {}  # consumers not yet computed
    n_views: dict[int, int] = {}
    for n in graph.nodes:
        for s in n.src:
            if s is not None:
                remaining[id(s)] = remaining.get(id(s), 0) + 1
        if n.view_src is not None:
            n_views[id(n.view_src)] = n_views.get(id(n.view_src), 0) + 1

    def needs_memory(t: Tensor) -> bool:
        return t.buffer is None and t.view_src is None and id(t) not in live and not _was_placed(t)

    placed_ids: set[int] = set()

    def _was_placed(t: Tensor) -> bool:
        return id(t) in placed_ids

    def put(t: Tensor, off: int) -> None:
        live[id(t)] = (t, off)
        placed.append((t, off))
        placed_ids.add(id(t))

    def allocate(t: Tensor) -> None:
        if not needs_memory(t):
            return
        if t.op in INPLACE_OPS:
            for p in t.src:
                if (p is not None and id(p) in live and p.view_src is None and not (p.flags & TFlag.OUTPUT)
                        and not (p.flags & TFlag.INPUT) and _same_layout(t, p)
                        and remaining.get(id(p), 0) == 1 and n_views.get(id(p), 0) == 0):
                    _, off = live.pop(id(p))  # take over the parent's memory (in place)
                    put(t, off)
                    return
        put(t, arena.alloc(t.nbytes))

    def maybe_free(r: Tensor) -> None:
        if id(r) not in live or r.flags & (TFlag.OUTPUT | TFlag.INPUT):
            return
        if remaining.get(id(r), 0) <= 0 and n_views.get(id(r), 0) <= 0:
            t, off = live.pop(id(r))
            arena.release(off, t.nbytes)

    for t in sorted(graph.leafs, key=lambda x: not (x.flags & TFlag.INPUT)):
        allocate(t)
    for n in graph.nodes:
        allocate(n)
        for s in n.src:
            if s is None:
                continue
            remaining[id(s)] = remaining.get(id(s), 0) - 1
            if remaining[id(s)] == 0:
                if s.view_src is not None:
                    n_views[id(s.view_src)] = n_views.get(id(s.view_src), 0) - 1
                    maybe_free(s.view_src)
                else:
                    maybe_free(s)
    return placed, arena.peak
