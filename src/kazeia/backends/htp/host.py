"""The host side of ggml-hexagon: op batches, the op queue, flush_pending, descriptors, supports_op.

Nothing waits per op. `enqueue_op` adds an op to the open batch; when the next op does not fit (OPBATCH
ops, the tensor table, the 16-entry buffer table, the VMEM budget) the batch is closed and pushed to the op
queue; if all OPQUEUE slots are in flight, `flush_pending` first blocks for the oldest response. Responses
are only ever read in `flush_pending` (graph end, synchronize, queue full), which is why a DSP death is
reported there, long after the op that caused it.

When the DSP runs a batch comes from the timing model (timing.py): the host's steps and the DSP's batches have
modeled durations, a batch runs (for real, in order) as soon as the host's clock passes its modeled finish, and
a host read (the team's OPLOG and DUMP, oplog.py; kazeia's enqueue-time hooks) sees exactly the batches finished
by then. A wait (flush_pending) runs the batch it waits for. Batches compute the same bytes whenever they run.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kazeia.backends.htp.crash_record import crash_record
from kazeia.backends.htp.oplog import OpDump, kzop_line
from kazeia.backends.htp.profiles import Profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.timing import Timing
from kazeia.errors import DeviceDeathError, DeviceOpError
from kazeia.graph.tensor import BufferUsage, GGMLType, Tensor, type_name

AEE_EINTERRUPTED = 0x2E
MAX_BUFS = 16  # HTP_OP_MAX_BUFS: buffer table entries per batch
MAX_INPUTS = 6  # HTP_OP_MAX_INPUTS
MAX_VMEM = 3200 * 1024 * 1024  # GGML_HEXAGON_VMEM default on v75+

TENSOR_COMPUTE = 1  # htp_tensor flag: lives in a compute buffer (not a weight)

STATUS_OK, STATUS_INTERNAL_ERR, STATUS_NO_SUPPORT, STATUS_INVAL_PARAMS, STATUS_VTCM_TOO_SMALL = 1, 2, 3, 4, 5
STATUS_NAMES = {1: "OK", 2: "INTERNAL-ERROR", 3: "NO-SUPPORT", 4: "INVAL-PARAMS", 5: "VTCM-TOO-SMALL"}


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
        for t in _op_tensors(node):
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


def _op_tensors(node: Tensor) -> tuple[Tensor, ...]:
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


def op_desc_line(node: Tensor, session: str, flags: int = 0) -> str:
    """The upstream VERBOSE 'execute-op' line: names : dims : types : strides : buffers : flags."""
    srcs = [s for s in node.src if s is not None]

    def dims(t: Tensor) -> str:
        return ":".join(str(x) for x in (t.ne[:2] if t.ne[2] == t.ne[3] == 1 else t.ne))

    def strides(t: Tensor) -> str:
        nb = t.nb[:2] if t.ne[2] == t.ne[3] == 1 else t.nb
        return ":".join(str(x) for x in nb) + ("" if t.is_contiguous() else "!")

    def join(f: Callable[[Tensor], str]) -> str:
        return (" x ".join(f(s) for s in srcs) + " -> " if srcs else "") + f(node)

    return (f"ggml-hex: {session} execute-op {node.desc()}: {join(lambda t: t.name)} : {join(dims)} : "
            f"{join(lambda t: type_name(t.type))} : {join(strides)} : {join(lambda t: t.buffer.name)} : "
            f"flags 0x{flags:x}")


@dataclass
class Response:
    batch: OpBatch
    status: int
    statuses: list[int]


class HostSession:
    """One HTP session (HTP0): the op batch, the op queue and the DSP behind them."""

    def __init__(self, name: str, settings: HtpSettings, profile: Profile, dsp,
                 log: Callable[[str], None] | None = None,
                 batch_seconds: Callable[[OpBatch], float] | None = None):
        """`batch_seconds`: the modeled DSP time of a batch (the cost model; default: nothing but a round trip)."""
        self.name = name
        self.settings = settings
        self.profile = profile
        self.dsp = dsp
        self.log = log or (lambda s: print(s, file=sys.stderr, flush=True))
        self.max_tensors = settings.opbatch * (1 + MAX_INPUTS)
        self._seq = 1
        self.batch = OpBatch(seq=1)
        self.in_flight: deque[OpBatch] = deque()
        self.last_enqueued: OpDesc | None = None
        self.dead: DeviceDeathError | None = None
        self.timing = Timing(settings.race_seed)
        self.batch_seconds = batch_seconds or (lambda b: 120e-6)
        self.op_dump = (OpDump(settings.dump, settings.dump_dir, settings.dump_limit)
                        if settings.dump is not None else None)

    # --- the upstream entry points ---
    def enqueue_op(self, node: Tensor, graph_index: int) -> None:
        self._check_alive()
        if not self.batch.fits(node, self.settings.opbatch, self.max_tensors):
            self.flush_batch()
        op = self.batch.add_op(node, graph_index)
        self.last_enqueued = op
        if self.settings.verbose:
            self.log(op_desc_line(node, self.name))
        if self.settings.oplog or self.op_dump is not None:
            # the host clock only decides what a host read sees (advance): without one, its per-op step is not drawn
            self.timing.host(self.timing.costs.enqueue_s)
            self._instrument(node)

    def _instrument(self, node: Tensor) -> None:
        """The team's OPLOG line and DUMP files: what the host reads of memory at this moment."""
        self.advance()
        c = self.timing.costs
        if self.settings.oplog:
            self.log(kzop_line(node, post_fix=self.settings.oplog >= 2))
            s1 = node.src[1] if len(node.src) > 1 else None
            read = s1.nbytes if s1 is not None and s1 is not node else 0
            self.timing.host(c.log_line_s + read / c.stats_bytes_per_s)
        if self.op_dump is not None:
            wrote = self.op_dump.maybe_dump(node, self.batch.seq)
            if wrote:
                self.timing.host(c.dump_s + wrote / c.dump_bytes_per_s)

    def advance(self) -> None:
        """Run, in order, every queued batch the DSP has finished by the host's current (modeled) time."""
        for batch in self.in_flight:
            if batch.statuses is not None:
                continue
            if not self.timing.done_by_now(batch.seq) or self.dsp.death is not None:
                break
            self._run(batch)

    def flush_batch(self) -> None:
        if self.batch.empty():
            return
        if len(self.in_flight) >= self.settings.opqueue:
            self.flush_pending(all_=False)
        self.timing.host(self.timing.costs.write_s)
        self.timing.submit(self.batch.seq, self.batch_seconds(self.batch))
        self.in_flight.append(self.batch)
        self._seq += 1
        self.batch = OpBatch(seq=self._seq)

    def flush_pending(self, all_: bool = False) -> None:
        while self.in_flight:
            batch = self.in_flight[0]
            rsp = self._dspqueue_read(batch)
            self.in_flight.popleft()
            if rsp.status != STATUS_OK:
                self.log(f"ggml-hex: {self.name} dspcall : dsp-rsp: {STATUS_NAMES.get(rsp.status, 'UNKNOWN')}")
                if self.profile.surface_status:
                    bad = [(op, s) for op, s in zip(batch.ops, rsp.statuses) if s != STATUS_OK]
                    op, s = bad[0]
                    raise DeviceOpError(f"{self.name}: op {op.node.name} ({op.node.desc()}) failed on the DSP: "
                                        f"{STATUS_NAMES.get(s, s)}")
            if not all_:
                break

    def open_batch(self, seq: int, ops: list[tuple[Tensor, int]]) -> OpBatch:
        """Make (node, graph index) `ops` the open batch, numbered `seq`, as the host would have built it: a replay
        of a recorded batch. The next flush sends it."""
        self._check_alive()
        self._seq = seq
        self.batch = OpBatch(seq=seq)
        for node, graph_index in ops:
            self.last_enqueued = self.batch.add_op(node, graph_index)
        return self.batch

    def flush(self) -> None:
        """Graph end / synchronize: close the open batch and wait for every response."""
        self._check_alive()
        self.flush_batch()
        self.flush_pending(all_=True)

    # --- internals ---
    def _run(self, batch: OpBatch) -> None:
        """The DSP runs `batch` (and, first, any batch queued before it that has not run)."""
        for b in self.in_flight:
            if b.statuses is None:
                b.statuses = self.dsp.process_batch(b)
            if b is batch:
                return
        batch.statuses = self.dsp.process_batch(batch)  # not queued (a replayed batch): run it now

    def _dspqueue_read(self, batch: OpBatch) -> Response:
        """Block for the response of `batch`: the host waits until its modeled finish; the DSP has run it."""
        self._check_alive()
        self.timing.wait_for(batch.seq)
        if batch.statuses is None:
            self._run(batch)
        statuses = batch.statuses
        # a batch done before the death has its response in the queue already; from the dead one on, the read
        # has to wait, and the wait is cancelled (AEE_EINTERRUPTED)
        if self.dsp.death is not None and self.dsp.death.batch_seq <= batch.seq:
            d = self.dsp.death
            err = DeviceDeathError(
                f"ggml-hex: dspqueue_read failed: 0x{AEE_EINTERRUPTED:08x}",
                code=AEE_EINTERRUPTED,
                last_enqueued=self.last_enqueued.node.name if self.last_enqueued else None,
                faulting=d.op_name, cause=d.cause)
            err.batch_seq = batch.seq
            err.kind = d.kind
            err.detail = d.detail
            err.crash_record = crash_record(d.kind, d.detail)  # what logcat shows on a device
            err.batch_ops = [op.node.name for op in batch.ops]  # what the host sent in the failed batch
            self.dead = err
            raise err
        status = STATUS_OK
        if self.profile.surface_status and any(s != STATUS_OK for s in statuses):
            status = next(s for s in statuses if s != STATUS_OK)
        return Response(batch, status, statuses)

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise self.dead
