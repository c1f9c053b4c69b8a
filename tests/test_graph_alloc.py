"""Graph views and the graph allocator.

- Views (RESHAPE, PERMUTE, TRANSPOSE, VIEW, and views of views) read through ne/nb: their values equal the
  numpy equivalent of the logical operation on the base data, and CONT on either backend materializes them.
- The allocator, checked over real model graphs by an independent checker: no two tensors that are live at
  the same time share a byte, except a parent and the element-wise child that takes its memory over at the
  parent's last use (ggml's in-place reuse); everything fits in the compute buffer. Inputs live from the start
  to their last use, outputs to the end (ggml-alloc frees inputs like any other tensor).
- The same property checked dynamically: while the model runs, every source still holds the bytes it held
  when it was produced.
"""

from __future__ import annotations

import numpy as np
import pytest

from kazeia.backends.cpu import CpuBackend
from kazeia.engine.context import Context
from kazeia.engine.scheduler import Scheduler
from kazeia.graph import builder as gb
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import BufferUsage, GGMLType, Tensor, TFlag, array
from oracle_utils import cpu_and_ref, leaf, shared_model

F32, F16 = GGMLType.F32, GGMLType.F16


def base_tensor(shape_np, dtype=np.float32, seed=0):
    data = np.random.default_rng(seed).standard_normal(shape_np).astype(dtype)
    t = leaf(F16 if dtype == np.float16 else F32, shape_np[::-1], data)
    return t, data


def resolve(t: Tensor) -> Tensor:
    """Give a view the storage of its root (what the graph allocator does), without an allocator."""
    if t.view_src is not None:
        t.buffer, t.offset = t.view_src.buffer, t.view_src.offset + t.view_offs
    return t


def test_reshape_reads_the_same_bytes():
    t, data = base_tensor((3, 4, 10))
    r = resolve(gb.reshape(t, 5, 8, 3))
    np.testing.assert_array_equal(array(r), data.reshape(1, 3, 8, 5))
    assert r.view_src is t and r.is_contiguous()


def test_reshape_of_non_contiguous_is_refused():
    t, _ = base_tensor((4, 6))
    with pytest.raises(ValueError):
        gb.reshape(gb.transpose(t), 24)


@pytest.mark.parametrize("axes", [(0, 2, 1, 3), (1, 0, 2, 3), (2, 0, 3, 1), (3, 2, 1, 0)], ids=str)
def test_permute(axes):
    t, data = base_tensor((2, 3, 4, 5))  # ggml ne (5, 4, 3, 2)
    p = resolve(gb.permute(t, *axes))
    # ggml: source dim i moves to axes[i]; numpy axis of ggml dim d is 3 - d
    want = np.empty(p.ne[::-1], dtype=np.float32)
    for idx in np.ndindex(*data.shape):
        src_dims = idx[::-1]  # ggml order i0..i3
        dst = [0] * 4
        for i in range(4):
            dst[axes[i]] = src_dims[i]
        want[tuple(dst[::-1])] = data[idx]
    np.testing.assert_array_equal(array(p), want)


def test_transpose():
    t, data = base_tensor((6, 7))
    np.testing.assert_array_equal(array(resolve(gb.transpose(t))), data.T.reshape(1, 1, 7, 6))


def test_view_with_offset_and_row_stride():
    t, data = base_tensor((2, 10, 16))  # ne (16, 10, 2)
    # a [5, 4, 2] window starting at element (3, 2, 0), keeping the parent's row and plane strides
    v = resolve(gb.view_3d(t, 5, 4, 2, t.nb[1], t.nb[2], offset=3 * 4 + 2 * t.nb[1]))
    np.testing.assert_array_equal(array(v), data[None, :, 2:6, 3:8])
    assert not v.is_contiguous()
    # ggml_nbytes: from the first to the last element, gaps included
    assert v.nbytes == 5 * 4 + 3 * t.nb[1] + 1 * t.nb[2]


def test_views_of_views_accumulate_offsets():
    t, data = base_tensor((4, 6, 8))  # ne (8, 6, 4)
    v1 = gb.view_3d(t, 8, 4, 4, t.nb[1], t.nb[2], offset=2 * t.nb[1])  # rows 2..5
    v2 = gb.view_2d(v1, 3, 4, v1.nb[1], offset=5 * 4)  # columns 5..7 of the first plane
    p = gb.permute(v2, 1, 0, 2, 3)
    for x in (v1, v2, p):
        resolve(x)
    assert p.view_src is t and v2.view_src is t
    np.testing.assert_array_equal(array(v2)[0, 0], data[0, 2:6, 5:8])
    np.testing.assert_array_equal(array(p)[0, 0], data[0, 2:6, 5:8].T)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cont_materializes_views_on_both_backends(dtype):
    data = np.random.default_rng(1).standard_normal((3, 4, 6, 8)).astype(dtype)
    tt = F16 if dtype == np.float16 else F32

    def build():
        t = leaf(tt, data.shape[::-1], data)
        v = gb.view(t, (5, 3, 2, 3), (t.nb[0], t.nb[1], t.nb[2], t.nb[3]), offset=t.nb[0] * 2 + t.nb[1])
        return gb.cont(gb.permute(v, 2, 0, 1, 3))  # [5,3,2,3] -> [3,2,5,3]

    want = np.transpose(data[:, :2, 1:4, 2:7], (0, 3, 1, 2)).astype(np.float64)  # numpy of ne (3, 2, 5, 3)
    cpu, ref = cpu_and_ref(build)
    np.testing.assert_array_equal(ref, want)
    np.testing.assert_array_equal(cpu, want)


# ---------------------------------------------------------------------------------------------------
# the allocator checker

# element-wise (or row-wise: each output row depends only on the same input row) ops, for which ggml lets
# the output take over an input's memory at that input's last use
ELEMENTWISE = {"ADD", "MUL", "SCALE", "UNARY", "GLU", "RMS_NORM", "ROPE", "SOFT_MAX", "SUB", "DIV", "SQR", "SQRT"}


def check_allocation(graph: Graph) -> dict:
    """Independent checker of a placed graph; returns a few statistics. Raises AssertionError on overlap."""
    nodes = graph.nodes
    end = len(nodes)
    compute = [t for t in graph.leafs + nodes if t.buffer is not None and t.buffer.usage == BufferUsage.COMPUTE]
    for n in nodes:
        assert n.buffer is not None, f"node {n.name} was not placed"
    roots = {id(t): t for t in compute if t.view_src is None}
    buf = None
    for t in roots.values():
        buf = buf or t.buffer
        assert t.buffer is buf, "compute tensors in two different compute buffers"
        assert 0 <= t.offset and t.offset + t.nbytes <= buf.size, f"{t.name} outside the compute buffer"
    for t in compute:  # views stay inside their root
        if t.view_src is not None and id(t.view_src) in roots:
            r = t.view_src
            assert r.offset <= t.offset and t.offset + t.nbytes <= r.offset + r.nbytes, f"view {t.name} escapes"

    index = {id(n): i for i, n in enumerate(nodes)}
    first = {k: (-1 if t.op == "NONE" else index[k]) for k, t in roots.items()}
    last = dict(first)
    for i, n in enumerate(nodes):
        for s in n.src:
            if s is not None and id(s.root) in last:
                last[id(s.root)] = max(last[id(s.root)], i)
    for k, t in roots.items():
        if t.flags & TFlag.OUTPUT:  # as in ggml-alloc, outputs live to the end; inputs only to their last use
            last[k] = end

    def handoff(parent: Tensor, child: Tensor) -> bool:
        return (first[id(child)] == last[id(parent)] and child.op in ELEMENTWISE
                and any(s is parent for s in child.src)
                and (parent.type, parent.ne, parent.nb) == (child.type, child.ne, child.nb)
                and parent.offset == child.offset)

    items = sorted(roots.values(), key=lambda t: t.offset)
    n_shared = 0
    for i, a in enumerate(items):
        a0, a1 = a.offset, a.offset + a.nbytes
        for b in items[i + 1:]:
            if b.offset >= a1:
                break
            b1 = b.offset + b.nbytes
            if not (b.offset < a1 and a0 < b1):
                continue
            n_shared += 1
            overlap_in_time = first[id(a)] <= last[id(b)] and first[id(b)] <= last[id(a)]
            if overlap_in_time and not (handoff(a, b) or handoff(b, a)):
                raise AssertionError(
                    f"{a.name} [{a0}, {a1}) live {first[id(a)]}..{last[id(a)]} and {b.name} [{b.offset}, {b1}) "
                    f"live {first[id(b)]}..{last[id(b)]} overlap in memory and time")
    return {"tensors": len(roots), "shared_pairs": n_shared}


def _context(path: str, flash_attn: bool, backend=None, n_ctx: int = 128) -> Context:
    backend = backend or CpuBackend()
    return Context(shared_model(path), Scheduler([backend]), n_ctx=n_ctx, flash_attn=flash_attn)


@pytest.mark.parametrize("flash_attn", [True, False], ids=["fa", "nofa"])
@pytest.mark.parametrize("all_logits", [False, True])
def test_allocator_on_tiny_model_graphs(tiny_qwen3, flash_attn, all_logits):
    ctx = _context(tiny_qwen3, flash_attn)
    ctx.decode(list(range(10, 17)), all_logits=all_logits)  # prefill graph
    stats = check_allocation(ctx.last_graph)
    assert stats["shared_pairs"] > 0, "the checker saw no memory reuse at all: is it checking anything?"
    ctx.decode([5])  # decode graph
    check_allocation(ctx.last_graph)


def test_allocator_on_default_model_graph(default_model):
    ctx = _context(default_model, True)
    ctx.decode([1, 504, 3458, 282, 4649, 314])
    stats = check_allocation(ctx.last_graph)
    assert stats["tensors"] > 30 * 10


def test_checker_catches_an_overlap(tiny_qwen3):
    """The checker itself must fail on a bad placement: move one live tensor onto another."""
    ctx = _context(tiny_qwen3, True)
    ctx.decode([1, 2, 3])
    g = ctx.last_graph
    a = g.node("attn_norm-0")  # read by the Q, K and V projections
    b = g.node("Qcur-0")  # computed while attn_norm-0 is still needed by K and V
    assert check_allocation(g)
    b.offset = a.offset
    for t in g.nodes:  # its views move with it
        if t.view_src is b:
            t.offset = b.offset + t.view_offs
    with pytest.raises(AssertionError, match="overlap"):
        check_allocation(g)


class WatchingCpu(CpuBackend):
    """CPU backend that checks, before each op, that its sources still hold what their producers wrote."""

    def begin_graph(self, graph: Graph) -> None:
        super().begin_graph(graph)
        self.snap: dict[int, bytes] = {}
        self.checked = 0
        for t in graph.leafs:
            if t.buffer is not None and t.buffer.usage == BufferUsage.COMPUTE:
                self._snapshot(t)

    def _snapshot(self, t: Tensor) -> None:
        self.snap[id(t)] = bytes(t.buffer.data[t.offset:t.offset + t.nbytes])

    def compute(self, node: Tensor) -> None:
        for s in node.src:
            if s is None or id(s.root) not in self.snap:
                continue
            r = s.root
            now = bytes(r.buffer.data[r.offset:r.offset + r.nbytes])
            assert now == self.snap[id(r)], f"{node.name}: source {r.name} was overwritten before this use"
            self.checked += 1
        super().compute(node)
        if node.view_src is None and node.buffer.usage == BufferUsage.COMPUTE:
            self._snapshot(node)


@pytest.mark.parametrize("flash_attn", [True, False], ids=["fa", "nofa"])
def test_sources_are_intact_when_consumed(tiny_qwen3, flash_attn):
    be = WatchingCpu()
    ctx = _context(tiny_qwen3, flash_attn, backend=be)
    ctx.decode(list(range(30, 41)))
    assert be.checked > 50
    ctx.decode([7])
    assert be.checked > 50
