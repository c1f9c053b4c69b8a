"""The host's op batch (htp_general_req's op and tensor tables) and its replay on a reused graph.

An OpBatch is what `enqueue_op` builds: one descriptor per distinct tensor (de-duplicated by address and
shape, as upstream), the buffer table, the VMEM it maps. Built from empty, a batch is a pure function of its
nodes in order and of what their tensors are (source list, buffer, offset, type, ne, nb; the buffers' base,
size and usage): a decode enqueues the same nodes, placed at the same addresses, every token. A
`BatchRecord` keeps a batch as it was built, op by op, under one placement stamp of its graph (graph/alloc.py:
where the allocator put the graph's tensors; weights, KV caches and recurrent states never move); the host replays
it while the same nodes come again under that stamp, and builds the batch op by op from the first op that differs,
so the batch sent, its descriptors and the boundaries between batches are those the op by op build gives.
"""

from __future__ import annotations

from dataclasses import replace

from kazeia.backends.htp.msg import OpBatch
from kazeia.graph.tensor import Tensor


class BatchRecord:
    """A batch as `add_op` built it from empty, under one placement of its graph: per op its node, source list and
    graph index, and the table sizes after it."""

    def __init__(self, placement: object) -> None:
        self.placement = placement  # the graph's placement stamp when it was built
        self.nodes: list[Tensor] = []
        self.srcs: list[tuple] = []  # node.src, the tuple object itself
        self.graph_index: list[int] = []
        self.sizes: list[tuple[int, int, int]] = []  # (tensors, buffers, vmem) after op k
        self.op_index: list[int] = []  # the batch op each node is in (2026-10 fusion merges nodes into one op)
        self.has_fusion = False
        self.batch: OpBatch | None = None  # the batch built (once closed)

    def add(self, node: Tensor, graph_index: int, batch: OpBatch, fused: bool = False) -> None:
        """Op `node` was just added to `batch`, or merged into its last op (`fused`) (recording)."""
        self.has_fusion |= fused
        self.op_index.append(len(batch.ops) - 1)
        self.nodes.append(node)
        self.srcs.append(node.src)
        self.graph_index.append(graph_index)
        self.sizes.append((len(batch.tensors), len(batch.buffers), batch.vmem))

    def close(self, batch: OpBatch) -> BatchRecord:
        self.batch = batch
        return self

    def valid(self, placement: object) -> bool:
        """Recorded under this placement of its graph (a record of no graph is never replayed)."""
        return placement is not None and placement is self.placement

    def matches(self, k: int, node: Tensor, graph_index: int) -> bool:
        """Op k of the record is `node`, with the same sources and graph index."""
        return k < len(self.nodes) and node is self.nodes[k] and node.src is self.srcs[k] \
            and graph_index == self.graph_index[k]

    def full(self, seq: int) -> OpBatch:
        """The whole recorded batch again, numbered `seq` (its tables copied: the new batch is the one sent)."""
        b = self.batch
        return OpBatch(seq, list(b.ops), list(b.tensors), list(b.buffers), b.vmem, None,
                       {a: v[:] for a, v in b._by_data.items()}, dict(b._by_tensor), dict(b._buf_index), b.check_type,
                       b.vmem_limit, b.mbuf)

    def prefix(self, k: int, seq: int) -> tuple[OpBatch, BatchRecord]:
        """The open batch after its first k ops, numbered `seq` (what add_op built), and the record of those k
        ops to go on recording in (a cut inside a fused op keeps the nodes before the cut in it)."""
        src = self.batch
        nt, nb, vmem = self.sizes[k - 1] if k else (0, 0, 0)
        tensors, buffers = src.tensors[:nt], src.buffers[:nb]
        by_data: dict[int, list[int]] = {}
        for d in tensors:
            by_data.setdefault(d.addr, []).append(d.index)
        n_ops = self.op_index[k - 1] + 1 if k else 0
        ops = src.ops[:n_ops]
        if ops and ops[-1].fused:  # a cut inside a fused op: it holds only the nodes before the cut
            j = sum(1 for i in self.op_index[:k] if i == n_ops - 1) - 1
            ops[-1] = replace(ops[-1], fused=ops[-1].fused[:j], name=ops[-1].name if j else None, l2_spans=None)
        batch = OpBatch(seq, ops, tensors, buffers, vmem, None, by_data,
                        {d.tensor: d.index for d in tensors}, {b: i for i, b in enumerate(buffers)}, src.check_type,
                        src.vmem_limit, src.mbuf)
        rec = BatchRecord(self.placement)
        rec.nodes, rec.srcs, rec.graph_index, rec.sizes = (self.nodes[:k], self.srcs[:k], self.graph_index[:k],
                                                           self.sizes[:k])
        rec.op_index = self.op_index[:k]
        return batch, rec
