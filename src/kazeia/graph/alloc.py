"""The graph allocator, as ggml-alloc.c does it (ggml_gallocr, bb4dc86a): intermediates share one compute buffer.

The rules, in upstream's order (ggml_gallocr_alloc_graph_impl):
1. every leaf without storage is allocated first (the graph inputs: tokens, positions, the KQ mask, ...), then
   the nodes flagged INPUT and the INPUT sources of nodes; inputs are ordinary tensors afterwards: they are freed
   after their last consumer like anything else (only OUTPUT tensors are never freed);
2. children and views are counted; then, node by node in graph order: its (leaf) parents are allocated, the node
   is allocated, and every parent whose last child this was (and which no view still needs) is freed; a view's
   root is freed when its last view is done;
3. an op that can work in place (ggml_op_can_inplace) takes over a parent's memory when the parent is owned by
   the allocator, not an output, has the node's exact layout, has this node as its only child and no views; the
   bytes a smaller node does not need go back to the free list;
4. memory comes from a free list of blocks sorted by address: the best-fitting block other than the last one
   (ties: the later block), else the last block (the open end of the buffer); freed bytes merge with the blocks
   around them.
Sizes are ggml_nbytes rounded up to the buffer alignment (128 B, the HTP buffer's).

Reserve, then reuse (ggml_gallocr_reserve / ggml_gallocr_alloc_graph): llama.cpp plans the compute buffer once,
for the worst-case graph (n_ubatch tokens, every KV cell, every row an output), and later graphs of the same
structure (same node and leaf counts, every tensor no larger than in that plan) take the addresses that plan gave
the node at the same position. So a 38-token prefill runs at the addresses of a 512-token plan: each tensor at the
start of its worst-case slot, and two tensors of equal worst-case size can share a slot (in Qwen3-4B with a
4096-cell context, the F32 KQ mask [4096, 512] and the flash attention output [128, 32, 512] are both 8 MiB, and
best fit gives the attention output the mask's freed block). A graph that does not fit the plan is planned
anew (the scheduler's re-reserve) and its plan is kept. The compute buffer persists between graphs, so stale
bytes of earlier tenants stay where they were: what early host reads see.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazeia.graph.builder import Graph
from kazeia.graph.tensor import Buffer, BufferUsage, Tensor, TFlag
from kazeia.memory import check_fits

# ggml_op_can_inplace (bb4dc86a; CLAMP joined later), in kazeia's op names (FILL, ADD_ID, ... do not occur here)
INPLACE_OPS = frozenset({"FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL",
                         "DIV", "SQR", "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM",
                         "RMS_NORM_BACK", "SOFT_MAX", "SOFT_MAX_BACK"})


def _align(n: int, a: int = Buffer.ALIGN) -> int:
    return (n + a - 1) // a * a


class DynAllocator:
    """ggml_dyn_tallocr with one chunk: free blocks sorted by offset, the last one the open end of the buffer."""

    def __init__(self, alignment: int = Buffer.ALIGN) -> None:
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, 1 << 62]]  # [offset, size]
        self.max_size = 0

    def alloc(self, size: int) -> int:
        size = _align(size, self.alignment)
        best, best_size = -1, None
        for i, (_off, sz) in enumerate(self.blocks[:-1]):  # the best fit besides the last block
            if sz >= size and (best_size is None or sz <= best_size):
                best, best_size = i, sz
        if best < 0:
            best = len(self.blocks) - 1  # the open end always fits
        block = self.blocks[best]
        off = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.blocks[best]
        self.max_size = max(self.max_size, off + size)
        return off

    def free(self, off: int, size: int) -> None:
        size = _align(size, self.alignment)
        for i, block in enumerate(self.blocks):
            if block[0] + block[1] == off:  # ends where the freed bytes start
                block[1] += size
                if i + 1 < len(self.blocks) and block[0] + block[1] == self.blocks[i + 1][0]:
                    block[1] += self.blocks[i + 1][1]
                    del self.blocks[i + 1]
                return
            if off + size == block[0]:  # starts where they end
                block[0] = off
                block[1] += size
                if i > 0 and self.blocks[i - 1][0] + self.blocks[i - 1][1] == block[0]:
                    self.blocks[i - 1][1] += block[1]
                    del self.blocks[i]
                return
        pos = 0
        while pos < len(self.blocks) and self.blocks[pos][0] < off:
            pos += 1
        self.blocks.insert(pos, [off, size])


@dataclass
class _Node:
    n_children: int = 0
    n_views: int = 0
    allocated: bool = False
    offset: int = -1


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


_NONE = (-1, 0)  # a slot the allocator does not own: a view, a weight, the KV cache (size_max 0)


@dataclass
class _Plan:
    """The assignments of a reserved graph by position (ggml_gallocr's leaf_allocs and node_allocs)."""

    leafs: list[tuple[int, int]]  # (offset, size_max)
    nodes: list[tuple[tuple[int, int], list[tuple[int, int]]]]  # (dst, [src_j])

    @classmethod
    def of(cls, graph: Graph) -> _Plan:
        placed, _ = plan(graph)
        off = {id(t): o for t, o in placed}

        def slot(t: Tensor) -> tuple[int, int]:
            return (off[id(t)], t.nbytes) if id(t) in off else _NONE

        return cls([slot(t) for t in graph.leafs],
                   [(slot(n), [slot(s) if s is not None else _NONE for s in n.src]) for n in graph.nodes])

    def fits(self, graph: Graph) -> bool:
        """ggml_gallocr_needs_realloc, negated: same counts, every owned tensor within its slot."""
        if len(graph.nodes) != len(self.nodes) or len(graph.leafs) != len(self.leafs):
            return False

        def ok(t: Tensor, s: tuple[int, int]) -> bool:
            if not _owned(t):
                return True
            return s[0] >= 0 and s[1] >= t.nbytes

        if not all(ok(t, s) for t, s in zip(graph.leafs, self.leafs)):
            return False
        for n, (dst, srcs) in zip(graph.nodes, self.nodes):
            if not ok(n, dst) or len(srcs) != len(n.src):
                return False
            if not all(ok(t, s) for t, s in zip(n.src, srcs) if t is not None):
                return False
        return True

    def apply(self, graph: Graph, buffer: Buffer) -> None:
        def put(t: Tensor | None, s: tuple[int, int]) -> None:
            if t is not None and _owned(t) and s[0] >= 0:
                t.buffer, t.offset = buffer, s[0]

        for t, s in zip(graph.leafs, self.leafs):
            put(t, s)
        for n, (dst, srcs) in zip(graph.nodes, self.nodes):
            for t, s in zip(n.src, srcs):
                put(t, s)
            put(n, dst)

    @property
    def size(self) -> int:
        ends = [o + _align(sz) for o, sz in self.leafs if o >= 0]
        for dst, srcs in self.nodes:
            ends += [o + _align(sz) for o, sz in [dst, *srcs] if o >= 0]
        return max(ends, default=0)


def _owned(t: Tensor) -> bool:
    return t.view_src is None and t.buffer is None


class Placement:
    """The placement stamp: where the allocator put every tensor of a graph (its compute buffer and plan). A new
    object each time the graph is placed anew; whatever was bound to the graph's addresses (scheduler plans, CPU
    binds, the HTP batch record and bound ops) holds while `graph.placement` is the Placement it was bound under.
    Weights, KV caches and recurrent states never move; what depends on a buffer's contents asks its `version`."""

    __slots__ = ("buffer", "plan")

    def __init__(self, buffer: Buffer, plan) -> None:
        self.buffer, self.plan = buffer, plan


class GraphAllocator:
    """Places every unallocated tensor of a graph in one persistent compute buffer, at the addresses of the
    reserved plan when the graph fits it (see the module docstring)."""

    def __init__(self, name: str = "compute") -> None:
        self.name = name
        self.buffer: Buffer | None = None
        self.reallocations = 0
        self.plans = 0  # graphs planned (reserved), the worst case included
        self._plan: _Plan | None = None

    def reserve(self, graph: Graph) -> None:
        """Plan the buffer for `graph` (the worst case) without placing it; later graphs of its structure reuse
        the plan's addresses."""
        _release(graph)
        graph.placement = None  # its tensors lost their places
        self._plan = _Plan.of(graph)
        self.plans += 1
        self._ensure(self._plan.size)

    def allocate(self, graph: Graph) -> Buffer:
        """Assign buffer/offset to every tensor of the graph that has no storage yet; resolve views. The graph gets
        a new `Placement` each time it is placed anew, and keeps its own while it is placed as before."""
        p = graph.placement
        if self.buffer is not None and p is not None and p.buffer is self.buffer and p.plan is self._plan:
            return self.buffer  # placed with this very plan last time: keep it
        _release(graph)
        if self._plan is None or not self._plan.fits(graph):
            self.reserve(graph)  # ggml_backend_sched_alloc_splits: re-reserve for this graph
        self._plan.apply(graph, self.buffer)
        for t in graph.leafs + graph.nodes:
            if t.view_src is not None:
                root = t.view_src
                if root.buffer is None:
                    raise RuntimeError(f"view {t.name!r} of unallocated tensor {root.name!r}")
                t.buffer, t.offset = root.buffer, root.offset + t.view_offs
        graph.placement = Placement(self.buffer, self._plan)
        return self.buffer

    def _ensure(self, size: int) -> None:
        if self.buffer is None or self.buffer.size < size:
            # like ggml_gallocr_reserve: a bigger plan gets a new (zeroed) buffer, asked of the memory first
            check_fits(f"the compute buffer ({self.name}) of the largest graph", _align(size + 1),
                       "; lower -c or -ub")
            self.buffer = Buffer.zeros(self.name, _align(size + 1), BufferUsage.COMPUTE)
            self.reallocations += 1


def _release(graph: Graph) -> None:
    """A graph placed before is placed again: its compute tensors lose their old places."""
    for t in graph.leafs + graph.nodes:
        if t.view_src is None and t.buffer is not None and t.buffer.usage == BufferUsage.COMPUTE:
            t.buffer = None


def plan(graph: Graph) -> tuple[list[tuple[Tensor, int]], int]:
    """ggml_gallocr_alloc_graph_impl over the graph: (tensor, offset) for every tensor the allocator places, in the
    order it placed them, and the buffer size it needs."""
    alloc = DynAllocator()
    info: dict[int, _Node] = {}
    placed: list[tuple[Tensor, int]] = []

    def h(t: Tensor) -> _Node:
        n = info.get(id(t))
        if n is None:
            n = info[id(t)] = _Node()
        return n

    def allocate(t: Tensor) -> None:
        hn = h(t)
        # ggml_gallocr_is_allocated: storage from elsewhere (weights, KV cache) or already the allocator's
        if hn.allocated or t.buffer is not None or t.view_src is not None:
            return
        hn.allocated = True
        if t.op in INPLACE_OPS:
            for p in t.src:
                if p is None or not h(p).allocated:  # only memory the allocator owns can be reused
                    continue
                if p.flags & TFlag.OUTPUT or (p.view_src is not None and p.view_src.flags & TFlag.OUTPUT):
                    continue
                if not _same_layout(t, p):
                    continue
                ph = h(p)
                if ph.n_children == 1 and ph.n_views == 0:
                    if p.view_src is not None:
                        vs = h(p.view_src)
                        if vs.n_views == 1 and vs.n_children == 0 and p.view_offs == 0:
                            _take(t, hn, ph.offset, ph, p.view_src)
                            vs.allocated = False
                            return
                    else:
                        _take(t, hn, ph.offset, ph, p)
                        return
        hn.offset = alloc.alloc(t.nbytes)
        placed.append((t, hn.offset))

    def _take(t: Tensor, hn: _Node, off: int, ph: _Node, parent: Tensor) -> None:
        hn.offset = off
        ph.allocated = False  # the node owns the bytes now: the parent is not freed
        placed.append((t, off))
        extra = _align(parent.nbytes) - _align(t.nbytes)
        if extra > 0:
            alloc.free(off + _align(t.nbytes), extra)

    def free(t: Tensor) -> None:
        if t.flags & TFlag.OUTPUT:
            return  # graph outputs are never freed
        hn = h(t)
        alloc.free(hn.offset, t.nbytes)
        hn.allocated = False

    for leaf in graph.leafs:
        allocate(leaf)
    for n in graph.nodes:
        if n.view_src is not None and n.op != "NONE":
            h(n.view_src).n_views += 1
        if n.flags & TFlag.INPUT:
            allocate(n)
        for s in n.src:
            if s is None:
                continue
            h(s).n_children += 1
            if s.flags & TFlag.INPUT:
                allocate(s)
    for n in graph.nodes:
        for s in n.src:
            if s is not None:
                allocate(s)
        allocate(n)
        for s in n.src:
            if s is None:
                continue
            ph = h(s)
            ph.n_children -= 1
            if ph.n_children == 0 and ph.n_views == 0:
                if s.view_src is not None:
                    vs = h(s.view_src)
                    vs.n_views -= 1
                    if vs.n_views == 0 and vs.n_children == 0 and vs.allocated:
                        free(s.view_src)
                elif ph.allocated:
                    free(s)
    return placed, alloc.max_size
