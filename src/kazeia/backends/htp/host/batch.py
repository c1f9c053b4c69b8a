"""The host's op batch (htp_general_req's op and tensor tables) and its replay on a reused graph.

An OpBatch is what `enqueue_op` builds: one descriptor per distinct tensor (de-duplicated by address and
shape, as upstream), the buffer table, the VMEM it maps. Built from empty, a batch is a pure function of its
nodes in order and of what their tensors are (source list, buffer, offset, type, ne, nb; the buffers' base,
size and usage): a decode enqueues the same nodes, placed at the same addresses, every token. A
`BatchRecord` keeps a batch as it was built, op by op; the host replays it while the same nodes come again
with their tensors unchanged, and builds the batch op by op from the first op that differs, so the batch
sent, its descriptors and the boundaries between batches are those the op by op build gives.
"""

from __future__ import annotations

from kazeia.backends.htp.msg import OpBatch, op_tensors
from kazeia.graph.tensor import Tensor


def _place(t: Tensor) -> tuple:
    return t, t.buffer, t.offset, t.type, t.ne, t.nb


class BatchRecord:
    """A batch as `add_op` built it from empty: per op its node, source list and graph index, the tensors it
    was the first op of the batch to name (with their places), and the table sizes after it."""

    def __init__(self) -> None:
        self.nodes: list[Tensor] = []
        self.srcs: list[list] = []  # node.src, the list object itself
        self.graph_index: list[int] = []
        self.places: list[tuple[tuple, ...]] = []  # _place() of the tensors op k names first
        self.sizes: list[tuple[int, int, int]] = []  # (tensors, buffers, vmem) after op k
        self.batch: OpBatch | None = None  # the batch built (once closed)
        self.buffers: list[tuple] = []  # (buffer, base address, size, usage) of its buffer table
        self._seen: set[int] = set()

    def add(self, node: Tensor, graph_index: int, batch: OpBatch) -> None:
        """Op `node` was just added to `batch` (recording)."""
        seen, new = self._seen, []
        for t in op_tensors(node):
            if id(t) not in seen:
                seen.add(id(t))
                new.append(_place(t))
        self.nodes.append(node)
        self.srcs.append(node.src)
        self.graph_index.append(graph_index)
        self.places.append(tuple(new))
        self.sizes.append((len(batch.tensors), len(batch.buffers), batch.vmem))

    def close(self, batch: OpBatch) -> BatchRecord:
        self.batch = batch
        self.buffers = [(b, b.base_addr, b.size, b.usage) for b in batch.buffers]
        return self

    def matches(self, k: int, node: Tensor, graph_index: int) -> bool:
        """Op k of the record is `node`, with the same sources, graph index and tensors as recorded."""
        if k >= len(self.nodes) or node is not self.nodes[k] or node.src is not self.srcs[k] \
                or graph_index != self.graph_index[k]:
            return False
        for t, buf, off, ty, ne, nb in self.places[k]:
            if t.buffer is not buf or t.offset != off or t.type != ty or t.ne != ne or t.nb != nb:
                return False
        return True

    def buffers_unchanged(self) -> bool:
        return all(b.base_addr == a and b.size == n and b.usage == u for b, a, n, u in self.buffers)

    def full(self, seq: int) -> OpBatch:
        """The whole recorded batch again, numbered `seq` (its tables copied: the new batch is the one sent)."""
        b = self.batch
        return OpBatch(seq, list(b.ops), list(b.tensors), list(b.buffers), b.vmem, None,
                       {a: v[:] for a, v in b._by_data.items()}, dict(b._by_tensor), dict(b._buf_index))

    def prefix(self, k: int, seq: int) -> tuple[OpBatch, BatchRecord]:
        """The open batch after its first k ops, numbered `seq` (what add_op built), and the record of those k
        ops to go on recording in."""
        src = self.batch
        nt, nb, vmem = self.sizes[k - 1] if k else (0, 0, 0)
        tensors, buffers = src.tensors[:nt], src.buffers[:nb]
        by_data: dict[int, list[int]] = {}
        for d in tensors:
            by_data.setdefault(d.addr, []).append(d.index)
        batch = OpBatch(seq, src.ops[:k], tensors, buffers, vmem, None, by_data,
                        {id(d.tensor): d.index for d in tensors}, {id(b): i for i, b in enumerate(buffers)})
        rec = BatchRecord()
        rec.nodes, rec.srcs, rec.graph_index = self.nodes[:k], self.srcs[:k], self.graph_index[:k]
        rec.places, rec.sizes = self.places[:k], self.sizes[:k]
        rec._seen = {id(p[0]) for ps in rec.places for p in ps}
        return batch, rec
