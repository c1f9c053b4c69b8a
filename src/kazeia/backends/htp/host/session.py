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

The batch tables themselves are msg.py's; a batch built from empty is recorded (batch.py) and, while the same nodes
come again under the same placement of their graph (a decode's reused graph), replayed instead of built op by op.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kazeia.backends.htp.host.batch import BatchRecord
from kazeia.backends.htp.host.crash_record import crash_record
from kazeia.backends.htp.host.fusion import Fuser
from kazeia.backends.htp.host.oplog import OpDump, kzop_line
from kazeia.backends.htp.host.timing import Timing
from kazeia.backends.htp.host.verbose import op_desc_line, op_desc_line_2026_10
from kazeia.backends.htp.msg import (
    AEE_EINTERRUPTED,
    MAX_INPUTS,
    STATUS_NAMES,
    STATUS_OK,
    DspQueue,
    OpBatch,
    OpDesc,
    op_tensors,
)
from kazeia.backends.htp.profiles import Profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.errors import DeviceDeathError, DeviceHangError, DeviceOpError, HostAbortError
from kazeia.graph.tensor import Tensor
from kazeia.identity import IdentityCache, binding

RECORDS_MAX = 64  # batch records kept per session (a decode graph needs a few; they hold its tensors alive)


@dataclass(frozen=True)
class StickyError:
    """2026-10's `last_error`: the status of the last non-OK response, and (what the DSP knew, and a device only
    shows in its FARF log) the op that set it: the first failing op of that batch."""

    status: int
    op_name: str
    op_desc: str
    batch_seq: int
    earlier: StickyError | None = None  # the first error of the session, when a later response overwrote it

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, "UNKNOWN")

    @property
    def first(self) -> StickyError:
        return self.earlier or self

    def origin(self) -> str:
        """Which op set the status kept (kazeia's note: the DSP knew it, the host does not say)."""
        text = f"set by op {self.op_name} ({self.op_desc}) in batch {self.batch_seq}"
        f = self.first
        if f is not self:
            text += f"; the session's first failing op: {f.op_name} ({f.status_name}, batch {f.batch_seq})"
        return text

    def abort(self, session: str, where: str) -> DeviceOpError:
        """The GGML_ABORT of ggml_backend_hexagon_synchronize / get-tensor: upstream's text, then kazeia's note."""
        return self._error(f"ggml-hex: {session} {where} failed : dsp-error {self.status_name} ({self.origin()})",
                           where)

    def failed_graph(self, session: str) -> DeviceOpError:
        """ggml_backend_hexagon_graph_compute returning GGML_STATUS_FAILED while this error is kept."""
        return self._error(f"ggml-hex: {session} graph_compute returned GGML_STATUS_FAILED: the session holds "
                           f"dsp-error {self.status_name} ({self.origin()})", "graph_compute")

    def _error(self, text: str, where: str) -> DeviceOpError:
        err = DeviceOpError(text)
        err.status, err.faulting, err.aborted_in = self.status_name, self.first.op_name, where
        return err


@dataclass
class Response:
    batch: OpBatch
    status: int
    statuses: list[int]


class HostSession:
    """One HTP session (HTP0): the op batch, the op queue and the DSP behind them."""

    def __init__(self, name: str, settings: HtpSettings, profile: Profile, dsp: DspQueue,
                 log: Callable[[str], None] | None = None,
                 batch_seconds: Callable[[OpBatch], float] | None = None):
        """`batch_seconds`: the modeled DSP time of a batch (the cost model; default: nothing but a round trip)."""
        self.name = name
        self.settings = settings
        self.profile = profile
        self.dsp: DspQueue = dsp
        self.log = log or (lambda s: print(s, file=sys.stderr, flush=True))
        self.max_tensors = settings.opbatch * (1 + MAX_INPUTS)
        self._seq = 1
        # the open batch (while a record is replayed: empty, its number only)
        self._batch = self._new_batch(1)
        self.in_flight: deque[OpBatch] = deque()
        self.last_enqueued: OpDesc | None = None
        self.dead: DeviceDeathError | None = None
        self.last_error: StickyError | None = None  # 2026-10: the sticky status of a failed response
        self.timing = Timing(settings.race_seed)
        self.batch_seconds = batch_seconds or (lambda b: 120e-6)
        self.op_dump = (OpDump(settings.dump, settings.dump_dir, settings.dump_limit)
                        if settings.dump is not None else None)
        self.placement: object = None  # the placement stamp of the graph being queued (HtpBackend.begin_graph)
        # batch.py: batches built from empty, by first node; the one being replayed (and how many of its ops
        # are in), or the one the open batch is being recorded in
        self._records: IdentityCache[BatchRecord] = IdentityCache("htp.batch_records", limit=RECORDS_MAX, bind=True)
        self._replay: BatchRecord | None = None
        self._replayed = 0
        self._recording: BatchRecord | None = None
        # 2026-10 op fusion (fusion.py): None when the profile or GGML_HEXAGON_OPFUSION has none
        self.fuser = Fuser(settings, self.max_tensors) if profile.caps.op_fusion and settings.opfusion > 0 else None

    def _new_batch(self, seq: int) -> OpBatch:
        s = self.settings
        return OpBatch(seq=seq, check_type=self.profile.descriptor_checks_type, vmem_limit=s.max_vmem,
                       mbuf=s.mbuf_mib << 20)

    @property
    def batch(self) -> OpBatch:
        """The open batch."""
        if self._replay is not None:
            self._diverge()
        return self._batch

    @property
    def open_ops(self) -> int:
        """How many ops the open batch holds."""
        rec, k = self._replay, self._replayed
        if rec is not None:
            return rec.op_index[k - 1] + 1 if k else 0  # (2026-10: fused nodes share an op)
        return len(self._batch.ops)

    @property
    def open_seq(self) -> int:
        return self._batch.seq

    # --- the upstream entry points ---
    def enqueue_op(self, node: Tensor, graph_index: int) -> None:
        if self.dead is not None:
            raise self.dead
        rec = self._replay
        if rec is not None:
            k = self._replayed
            if rec.matches(k, node, graph_index):  # the op add_op would build, in the batch it would build
                self._replayed = k + 1
                self.last_enqueued = rec.batch.ops[rec.op_index[k]]
                return self._enqueued(node)
            self._diverge()
        if self.fuser is not None and self._fuse(node, graph_index):
            return self._enqueued(node, fused=True)
        if not self._batch.fits(node, self.settings.opbatch, self.max_tensors):
            self.flush_batch()
            if self.profile.caps.host_batch_limits and not self._batch.fits(node, self.settings.opbatch,
                                                                             self.max_tensors):
                needs = self._batch._extra_vmem(op_tensors(node))
                raise HostAbortError(f"ggml-hex: {self.name} op does not fit into empty batch (vmem/tensor/buffer "
                                     f"limit exceeded): {node.op} {node.name} maps {needs} B, max_vmem "
                                     f"{self._batch.vmem_limit} B")
        batch = self._batch
        if not batch.ops:
            rec = self._records.peek(node)
            if rec is not None and rec.valid(self.placement) and rec.matches(0, node, graph_index):
                self._replay, self._replayed, self._recording = rec, 1, None
                self.last_enqueued = rec.batch.ops[0]
                return self._enqueued(node)
            # one-op batches, or a graph no allocator placed: nothing to save
            keep = self.settings.opbatch > 1 and self.placement is not None and binding()
            self._recording = BatchRecord(self.placement) if keep else None
        op = batch.add_op(node, graph_index, self.placement)
        if self._recording is not None:
            self._recording.add(node, graph_index, batch)
        self.last_enqueued = op
        self._enqueued(node)

    def _fuse(self, node: Tensor, graph_index: int) -> bool:
        """ggml_hexagon_opbatch::try_fuse on the open batch: `node` merged into its last op (and recorded)."""
        name = self.fuser.try_fuse(self._batch, node)
        if name is None:
            return False
        if self.settings.verbose:
            self.log(f"ggml-hex: {self.name} fused {name} (#{len(self._batch.ops) - 1})")
        if self._recording is not None:
            self._recording.add(node, graph_index, self._batch, fused=True)
        return True

    def _enqueued(self, node: Tensor, fused: bool = False) -> None:
        """What the host does once an op is in the open batch: the VERBOSE line (not for a node merged into the
        last op: upstream logs "fused ..." instead), the team's instrumentation."""
        if self.settings.verbose and not fused:
            self.log(op_desc_line_2026_10(node, self.name, self.settings) if self.profile.caps.op_line_with_plan
                     else op_desc_line(node, self.name))
        if self.settings.oplog or self.op_dump is not None:
            # the host clock only decides what a host read sees (advance): without one, its per-op step is not drawn
            self.timing.host(self.timing.costs.enqueue_s)
            self._instrument(node)

    def _diverge(self) -> None:
        """Stop replaying: the open batch becomes what add_op built of the ops replayed so far, and the ops
        from here on are recorded after them."""
        rec, k = self._replay, self._replayed
        self._replay = None
        self._batch, self._recording = rec.prefix(k, self._batch.seq)

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
            wrote = self.op_dump.maybe_dump(node, self._batch.seq)
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
        rec = self._replay
        if rec is not None:
            self._replay = None
            if self._replayed == len(rec.nodes):  # all of it: the record stays as it is
                self._batch = rec.full(self._batch.seq)
            else:
                self._batch, self._recording = rec.prefix(self._replayed, self._batch.seq)
        batch = self._batch
        if batch.empty():
            return
        if len(self.in_flight) >= self.settings.opqueue:
            self.flush_pending(all_=False)
        self.timing.host(self.timing.costs.write_s)
        self.timing.submit(batch.seq, self.batch_seconds(batch))
        self.in_flight.append(batch)
        if self._recording is not None:
            self._records.put(batch.ops[0].node, self._recording.close(batch))
            self._recording = None
        self._seq += 1
        self._batch = self._new_batch(self._seq)

    def flush_pending(self, all_: bool = False) -> None:
        while self.in_flight:
            batch = self.in_flight[0]
            rsp = self._dspqueue_read(batch)
            self.in_flight.popleft()
            if rsp.status != STATUS_OK:
                self._failed_response(batch, rsp)
            if not all_:
                break

    def _failed_response(self, batch: OpBatch, rsp: Response) -> None:
        """A non-OK response: 2026-05 logs it; robust raises, naming the op; 2026-10 logs it and keeps it (each
        non-OK response overwrites last_error) for the next synchronize, output read or graph_compute."""
        name = STATUS_NAMES.get(rsp.status, "UNKNOWN")
        sticky = self.profile.status_policy == "sticky"
        self.log(f"ggml-hex: {self.name} dspcall : dsp-rsp{'' if sticky else ':'} {name}")
        if not (sticky or self.profile.surface_status):
            return
        op, s = next((op, s) for op, s in zip(batch.ops, rsp.statuses) if s != STATUS_OK)  # the DSP's first
        if sticky:
            self.last_error = StickyError(rsp.status, op.node.name, op.node.desc(), batch.seq,
                                          self.last_error.first if self.last_error is not None else None)
            return
        raise DeviceOpError(f"{self.name}: op {op.node.name} ({op.node.desc()}) failed on the DSP: "
                            f"{STATUS_NAMES.get(s, s)}")

    def open_batch(self, seq: int, ops: list[tuple]) -> OpBatch:
        """Make (node, graph index[, fused op name]) `ops` the open batch, numbered `seq`, as the host built it: a
        replay of a recorded batch (a node with a fused op name is merged into the op before it). The next flush
        sends it."""
        self._check_alive()
        self._seq = seq
        self._replay = self._recording = None
        self._batch = self._new_batch(seq)
        for node, graph_index, *fused in ops:
            if fused and fused[0] and self._batch.ops:  # merged into the last op, as the recorded host did
                self.last_enqueued = self._batch.fuse(self._batch.ops[-1], node, fused[0])
            else:
                self.last_enqueued = self._batch.add_op(node, graph_index)
        return self._batch

    def flush(self, where: str = "synchronize") -> None:
        """Graph end (2026-05) / synchronize / get-tensor: close the open batch and wait for every response. Under
        2026-10 a sticky error then aborts with the caller's text (ggml_backend_hexagon_synchronize,
        ggml_backend_hexagon_get_tensor_async)."""
        self._check_alive()
        self.flush_batch()
        self.flush_pending(all_=True)
        if self.last_error is not None:
            raise self.last_error.abort(self.name, where)

    def check_graph_compute(self) -> None:
        """ggml_backend_hexagon_graph_compute (2026-10) returns GGML_STATUS_FAILED while an error is sticky."""
        if self.last_error is not None:
            raise self.last_error.failed_graph(self.name)

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
            raise self._dead(batch, self.dsp.death)
        status = STATUS_OK
        if self.profile.surface_status and any(s != STATUS_OK for s in statuses):
            status = next(s for s in statuses if s != STATUS_OK)
        return Response(batch, status, statuses)

    def _dead(self, batch: OpBatch, d) -> DeviceDeathError:
        """What the read of `batch` gets once the DSP died in it or before: the wait is cancelled (0x2e), with the
        crash record logcat shows. A hang is no death: the process lives, one op never ends, and a phone's host
        blocks in dspqueue_read forever, printing nothing; kazeia, which knows the op cannot finish, says so and
        stops (no crash record). The session is unusable either way."""
        hang = d.kind == "hang"
        cls, code, message = (
            (DeviceHangError, 0, f"ggml-hex: {self.name}: dspqueue_read: no response for batch {batch.seq}: the DSP is "
                                 f"still in op #{d.op_index} {d.op_name} (a hang: a device waits here forever; kazeia "
                                 f"stops the run)") if hang else
            (DeviceDeathError, AEE_EINTERRUPTED, f"ggml-hex: dspqueue_read failed: 0x{AEE_EINTERRUPTED:08x}"))
        err = cls(message, code=code, last_enqueued=self.last_enqueued.node.name if self.last_enqueued else None,
                  faulting=d.op_name, cause=d.cause)
        err.crash_record = None if hang else crash_record(d.kind, d.detail, arch=self.settings.arch)  # logcat's
        err.batch_seq, err.kind, err.detail = batch.seq, d.kind, d.detail
        err.batch_ops = [op.node.name for op in batch.ops]  # what the host sent in the failed batch
        self.dead = err
        return err

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise self.dead
