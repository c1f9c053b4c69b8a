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

from dataclasses import dataclass, field

from kazeia.graph.tensor import BufferUsage, GGMLType, Tensor

MAX_BUFS = 16  # HTP_OP_MAX_BUFS: buffer table entries per batch
MAX_INPUTS = 6  # HTP_OP_MAX_INPUTS
MAX_VMEM = 3200 * 1024 * 1024  # GGML_HEXAGON_VMEM default on v75+

TENSOR_COMPUTE = 1  # htp_tensor flag: lives in a compute buffer (not a weight)


@dataclass
class TensorDesc:
    """htp_tensor: what the DSP knows of a tensor (address, shape, strides, type, flags)."""

    index: int
    tensor: Tensor  # the first ggml tensor that produced this descriptor
    addr: int
    size: int
    type: GGMLType
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    flags: int
    buffer_index: int


@dataclass
class OpDesc:
    index: int
    node: Tensor
    src: list[int | None]
    dst: int
    graph_index: int


@dataclass
class OpBatch:
    seq: int = 0  # batch sequence number (monotonic, for logs and traces)
    ops: list[OpDesc] = field(default_factory=list)
    tensors: list[TensorDesc] = field(default_factory=list)
    buffers: list[object] = field(default_factory=list)
    vmem: int = 0
    statuses: list[int] | None = None  # set once the DSP has run the batch
    _by_data: dict[int, list[int]] = field(default_factory=dict)
    _by_tensor: dict[int, int] = field(default_factory=dict)
    _buf_index: dict[int, int] = field(default_factory=dict)

    def empty(self) -> bool:
        return not self.ops

    def fits(self, node: Tensor, max_ops: int, max_tensors: int) -> bool:
        if len(self.ops) >= max_ops:
            return False
        extra_tens = extra_bufs = extra_vmem = 0
        seen_bufs: set[int] = set()
        by_tensor, buf_index = self._by_tensor, self._buf_index
        for t in op_tensors(node):
            if id(t) in by_tensor:
                continue
            extra_tens += 1
            b = t.buffer
            if id(b) not in buf_index and id(b) not in seen_bufs:
                seen_bufs.add(id(b))
                extra_bufs += 1
                extra_vmem += b.size
        return (len(self.buffers) + extra_bufs <= MAX_BUFS and len(self.tensors) + extra_tens <= max_tensors
                and self.vmem + extra_vmem <= MAX_VMEM)

    def add_tensor(self, t: Tensor) -> int:
        # de-duplicate by data address with identical ne and nb (type is NOT compared, as upstream), then by
        # tensor identity: two logical tensors ggml-alloc put at one address share a descriptor
        addr = t.data_addr
        hits = self._by_data.get(addr)
        if hits is not None:
            for i in hits:
                d = self.tensors[i]
                if d.ne == t.ne and d.nb == t.nb:
                    return i
        i = self._by_tensor.get(id(t))
        if i is not None:
            return i
        bi = self._buf_index.get(id(t.buffer))
        if bi is None:
            bi = len(self.buffers)
            self.buffers.append(t.buffer)
            self._buf_index[id(t.buffer)] = bi
            self.vmem += t.buffer.size
        flags = TENSOR_COMPUTE if t.buffer.usage == BufferUsage.COMPUTE else 0
        d = TensorDesc(len(self.tensors), t, addr, _nbytes(t), t.type, t.ne, t.nb, flags, bi)
        self.tensors.append(d)
        self._by_data.setdefault(addr, []).append(d.index)
        self._by_tensor[id(t)] = d.index
        return d.index

    def add_op(self, node: Tensor, graph_index: int) -> OpDesc:
        src = [self.add_tensor(s) if s is not None else None for s in node.src]
        dst = self.add_tensor(node)
        op = OpDesc(len(self.ops), node, src, dst, graph_index)
        self.ops.append(op)
        return op


_OP_TENSORS: dict[int, tuple[Tensor, tuple, tuple[Tensor, ...]]] = {}


def op_tensors(node: Tensor) -> tuple[Tensor, ...]:
    """The node's sources that are there, then the node: the tensors `fits` counts, kept by node (a decode
    enqueues the same graph's nodes every token; a node whose sources changed is worked out again)."""
    hit = _OP_TENSORS.get(id(node))
    if hit is None or hit[0] is not node or hit[1] is not node.src:
        if len(_OP_TENSORS) > 16384:  # nodes of graphs long gone (as the executor's bound ops)
            _OP_TENSORS.clear()
        hit = _OP_TENSORS[id(node)] = (node, node.src, (*[s for s in node.src if s is not None], node))
    return hit[2]


_NBYTES: dict[tuple, int] = {}


def _nbytes(t: Tensor) -> int:
    """t.nbytes, kept by (type, ne, nb): a decode describes the same few shapes every token."""
    key = (t.type, t.ne, t.nb)
    n = _NBYTES.get(key)
    if n is None:
        if len(_NBYTES) > 65536:
            _NBYTES.clear()
        n = _NBYTES[key] = t.nbytes
    return n


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
