"""What the host and the DSP exchange (upstream htp/htp-msg.h, htp/htp-ops.h): op statuses, the op batch with its
tensor and buffer tables (htp_general_req), and what the DSP side reports back about an op: its record, a fault
that kills the DSP process, the death the host learns of later, the per-batch op context and the device state that
survives between batches. Both sides, and every unit of the model, import these from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kazeia.graph.tensor import BufferUsage, GGMLType, Tensor
from kazeia.identity import IdentityCache

AEE_EINTERRUPTED = 0x2E

STATUS_OK, STATUS_INTERNAL_ERR, STATUS_NO_SUPPORT, STATUS_INVAL_PARAMS, STATUS_VTCM_TOO_SMALL = 1, 2, 3, 4, 5
STATUS_NAMES = {1: "OK", 2: "INTERNAL-ERROR", 3: "NO-SUPPORT", 4: "INVAL-PARAMS", 5: "VTCM-TOO-SMALL"}

MAX_BUFS = 16  # HTP_OP_MAX_BUFS: buffer table entries per batch
MAX_INPUTS = 6  # HTP_OP_MAX_INPUTS
MAX_VMEM = 3200 * 1024 * 1024  # GGML_HEXAGON_VMEM default on v75+ (archs.py: 3000 MiB below; 2026-10 subtracts
                               # its op queue's shared memory: HtpSettings.max_vmem)
MAX_BUF = 1 << 30  # GGML_HEXAGON_MBUF default: the largest buffer llama.cpp allocates for weights (get_max_size)

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
    placement: object = None  # the graph's placement stamp when the host queued it (graph/alloc.py; None: no graph)
    name: str | None = None  # a fused op's upstream name (RMS_NORM+MUL, MUL_MAT+ADD, MUL_MAT_NX); None: not fused
    fused: list[OpDesc] = field(default_factory=list)  # the nodes merged into this op, run after `node`, in order
    l2_spans: tuple | None = None  # (inputs, outputs) as (address, size) for the L2 table (device.py), once made
    modeled_s: tuple[float, ...] | None = None  # its nodes' modeled DSP seconds (backend.py), once worked out


@dataclass
class OpBatch:
    seq: int = 0  # batch sequence number (monotonic, for logs and traces)
    ops: list[OpDesc] = field(default_factory=list)
    tensors: list[TensorDesc] = field(default_factory=list)
    buffers: list[object] = field(default_factory=list)
    vmem: int = 0
    statuses: list[int] | None = None  # set once the DSP has run the batch
    _by_data: dict[int, list[int]] = field(default_factory=dict)  # data address -> descriptors
    _by_tensor: dict[Tensor, int] = field(default_factory=dict)
    _buf_index: dict[object, int] = field(default_factory=dict)  # buffer -> its entry in the buffer table
    check_type: bool = False  # 2026-10 (#25968): a descriptor is reused only for the same type too
    vmem_limit: int = MAX_VMEM  # the host's VMEM budget (max_vmem): a batch mapping more is flushed first
    mbuf: int = MAX_BUF  # weight buffers are counted in chunks of this many bytes (vmem_span)
    _vmem_keys: set | None = None  # the chunks counted in `vmem` (None: worked out again from the tensors)

    def empty(self) -> bool:
        return not self.ops

    def vmem_keys(self) -> set:
        if self._vmem_keys is None:
            self._vmem_keys = {vmem_span(d.tensor, self.mbuf)[0] for d in self.tensors}
        return self._vmem_keys

    def _extra_vmem(self, tensors) -> int:
        """The VMEM these tensors would add: the chunks (vmem_span) the batch does not map yet."""
        keys, extra, seen = self.vmem_keys(), 0, set()
        for t in tensors:
            key, size = vmem_span(t, self.mbuf)
            if key not in keys and key not in seen:
                seen.add(key)
                extra += size
        return extra

    def fits(self, node: Tensor, max_ops: int, max_tensors: int) -> bool:
        """fit_op: one more op, and the tables and VMEM can take its tensors (room_for)."""
        return len(self.ops) < max_ops and self.room_for(op_tensors(node), max_tensors)

    def add_tensor(self, t: Tensor) -> int:
        # de-duplicate by data address with identical ne and nb (2026-05: type NOT compared, as upstream then;
        # 2026-10 same_shape compares it), then by tensor identity: two logical tensors ggml-alloc put at one
        # address share a descriptor
        addr = t.data_addr
        hits = self._by_data.get(addr)
        if hits is not None:
            for i in hits:
                d = self.tensors[i]
                if d.ne == t.ne and d.nb == t.nb and (d.type == t.type or not self.check_type):
                    return i
        i = self._by_tensor.get(t)
        if i is not None:
            return i
        bi = self._buf_index.get(t.buffer)
        if bi is None:
            bi = len(self.buffers)
            self.buffers.append(t.buffer)
            self._buf_index[t.buffer] = bi
        key, size = vmem_span(t, self.mbuf)
        keys = self.vmem_keys()
        if key not in keys:
            keys.add(key)
            self.vmem += size
        flags = TENSOR_COMPUTE if t.buffer.usage == BufferUsage.COMPUTE else 0
        d = TensorDesc(len(self.tensors), t, addr, _nbytes(t), t.type, t.ne, t.nb, flags, bi)
        self.tensors.append(d)
        self._by_data.setdefault(addr, []).append(d.index)
        self._by_tensor[t] = d.index
        return d.index

    def room_for(self, tensors: tuple[Tensor, ...], max_tensors: int) -> bool:
        """try_fuse_common: the tensor table, the buffer table and VMEM can take these tensors too."""
        extra_tens = extra_bufs = 0
        seen: set = set()
        new = []
        for t in tensors:
            if t in self._by_tensor:
                continue
            extra_tens += 1
            new.append(t)
            b = t.buffer
            if b not in self._buf_index and b not in seen:
                seen.add(b)
                extra_bufs += 1
        return (len(self.buffers) + extra_bufs <= MAX_BUFS and len(self.tensors) + extra_tens <= max_tensors
                and self.vmem + self._extra_vmem(new) <= self.vmem_limit)

    def fuse(self, op: OpDesc, node: Tensor, name: str) -> OpDesc:
        """Merge `node` into `op` (the batch's last op) under the fused op's upstream `name`."""
        src = [self.add_tensor(s) if s is not None else None for s in node.src]
        sub = OpDesc(op.index, node, src, self.add_tensor(node), op.graph_index, op.placement, name)
        op.name = name
        op.fused.append(sub)
        op.l2_spans = None
        return sub

    def add_op(self, node: Tensor, graph_index: int, placement: object = None) -> OpDesc:
        src = [self.add_tensor(s) if s is not None else None for s in node.src]
        dst = self.add_tensor(node)
        op = OpDesc(len(self.ops), node, src, dst, graph_index, placement)
        self.ops.append(op)
        return op


_OP_TENSORS: IdentityCache[tuple[tuple, tuple[Tensor, ...]]] = IdentityCache("htp.op_tensors", limit=16384)


def vmem_span(t: Tensor, mbuf: int) -> tuple[object, int]:
    """(what the DSP maps for tensor t, its bytes): its buffer, except that a weight buffer larger than `mbuf` is
    counted in mbuf-sized chunks, as llama.cpp allocates device weights in buffers of at most get_max_size
    (GGML_HEXAGON_MBUF, 1 GiB; ggml_backend_alloc_ctx_tensors_from_buft). kazeia keeps the whole file as one
    buffer, so a chunk here is a byte range of it (llama.cpp cuts at tensor boundaries, in its create order: the
    same number of chunks, not always the same tensors in each)."""
    b = t.buffer
    if b.usage != BufferUsage.WEIGHTS or b.size <= mbuf:
        return b, b.size
    i = t.offset // mbuf
    return (b, i), min(mbuf, b.size - i * mbuf)


def op_tensors(node: Tensor) -> tuple[Tensor, ...]:
    """The node's sources that are there, then the node: the tensors `fits` counts, kept by node (a decode
    enqueues the same graph's nodes every token; a node whose sources changed is worked out again)."""
    src = node.src
    return _OP_TENSORS.get(node, lambda: (src, (*[s for s in src if s is not None], node)), lambda h: h[0] is src)[1]


_NBYTES: IdentityCache[int] = IdentityCache("htp.nbytes", limit=65536, by_value=True)


def _nbytes(t: Tensor) -> int:
    """t.nbytes, kept by (type, ne, nb): a decode describes the same few shapes every token."""
    return _NBYTES.get((t.type, t.ne, t.nb), lambda: t.nbytes)


class DspFault(Exception):
    """Something that kills the DSP user process (PD): the emulated equivalent of an exception or abort."""

    def __init__(self, kind: str, cause: str, detail: dict | None = None):
        super().__init__(cause)
        self.kind = kind  # "stack-overflow" | "bus-error" | "abort" | "hang" (the process lives, the op never ends)
        self.cause = cause
        self.detail = dict(detail or {})  # what the crash record shows: vtcm_offset (Bad VA), stack_used, the load


@dataclass
class Death:
    kind: str
    cause: str
    op_name: str
    op_index: int  # index in its batch
    batch_seq: int
    graph_index: int
    detail: dict = field(default_factory=dict)


@dataclass
class OpContext:
    """htp_ops_context: zeroed at the start of every batch."""

    src1_spad_src: int | None = None  # descriptor index whose quantized copy sits at vtcm_base
    src1_spad_kind: str | None = None  # which quantization the cached image holds (q8x4x2, q8_1x4x2, f16)
    stack_used: int = 0


@dataclass
class DeviceState:
    """What survives on the DSP from one batch to the next: the VTCM bytes, the HMX output-conversion scale last
    loaded, a DMA descriptor left outstanding (fault injection) and the timing-race generator's state."""

    vtcm: np.ndarray  # uint8, a copy
    hmx_scale: float = 0.0
    dma_stale_pop: bool = False
    race_rng: dict | None = None

    def registers(self) -> dict:
        """Everything but VTCM, as plain values (JSON-ready)."""
        return {"hmx_scale": float(self.hmx_scale), "dma_stale_pop": bool(self.dma_stale_pop),
                "race_rng": self.race_rng}


@dataclass
class OpRecord:
    """What the DSP did for one op (for traces and forensics; the host never sees this on a device)."""

    path: str
    status: int = STATUS_OK
    detail: dict = field(default_factory=dict)


# --- the seam between the host, the DSP and the op executor ------------------------------------------------------

class OpRunner(Protocol):
    """What runs one op on the DSP (ops/executor.py Executor): its record, or a DspFault raised."""

    def execute(self, dsp: Any, octx: OpContext, op: OpDesc, batch: OpBatch) -> OpRecord: ...


class DspListener(Protocol):
    """What the DSP tells the host side while it runs a batch (backend.py HtpBackend): each op as it starts, as it
    is done (a fused op's nodes one by one), and the fault that kills the process."""

    def op_started(self, op: OpDesc, batch: OpBatch) -> None: ...

    def op_done(self, op: OpDesc, batch: OpBatch, rec: OpRecord) -> None: ...

    def op_faulted(self, op: OpDesc, batch: OpBatch, fault: DspFault) -> None: ...


class DspQueue(Protocol):
    """The DSP as the host's queue sees it (device.py Dsp): a batch in, its op statuses out (dspqueue_write /
    dspqueue_read); after a death, the death."""

    death: Death | None

    def process_batch(self, batch: OpBatch) -> list[int]: ...


class SilentListener:
    """A DspListener that listens to nothing (a DSP run by tests or tools without a host backend)."""

    def op_started(self, op: OpDesc, batch: OpBatch) -> None:
        pass

    def op_done(self, op: OpDesc, batch: OpBatch, rec: OpRecord) -> None:
        pass

    def op_faulted(self, op: OpDesc, batch: OpBatch, fault: DspFault) -> None:
        pass
