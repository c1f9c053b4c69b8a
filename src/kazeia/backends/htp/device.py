"""The DSP side: batch processing, the per-batch op context, VTCM, the DSP log, and death.

Per batch (htp_packet_callback / proc_op_req): the op context is zeroed (so the src1 "already quantized in
VTCM" shortcut starts empty), then each op runs in order and its return status is what the profile decides to
keep or drop. Memory is shared with the host and an op writes its dst in place; what survives from one batch
to the next on the DSP itself is VTCM and a few registers (`DeviceState`).

A death (stack overflow, bus error, abort) ends the batch and the session: nothing after it runs, and the
host only learns at its next blocking read.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kazeia.backends.htp.archs import arch_profile
from kazeia.backends.htp.l2 import L2Recorder
from kazeia.backends.htp.msg import (
    STATUS_OK,
    Death,
    DeviceState,
    DspFault,
    DspListener,
    OpBatch,
    OpContext,
    OpDesc,
    OpRecord,
    OpRunner,
    SilentListener,
    vmem_span,
)
from kazeia.backends.htp.profiles import Profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.graph.tensor import TFlag


class Dsp:
    """The DSP process (a DspQueue to the host): runs each batch's ops through its OpRunner and tells its
    DspListener (the host backend) about each op as it starts, completes or kills the process."""

    def __init__(self, settings: HtpSettings, profile: Profile, executor: OpRunner,
                 listener: DspListener | None = None) -> None:
        from kazeia.backends.htp.vtcm.arena import Vtcm

        self.settings = settings
        self.profile = profile
        self.vtcm = Vtcm(settings.dsp_vtcm_bytes)  # what vtcm_alloc was granted (the host plans for vtcm_bytes)
        self.executor: OpRunner = executor  # runs one op: executor.execute(dsp, octx, op, batch) -> OpRecord
        self.listener: DspListener = listener or SilentListener()
        self.death: Death | None = None
        self.log: list[str] = []  # FARF lines (visible on a device only to root)
        self.octx = OpContext()
        self.on_batch_start: list[Callable[[Dsp, OpBatch], None]] = []
        self.hmx_scale = 0.0  # the HMX output-conversion scale last loaded (reset value 0)
        self.dma_stale_pop = False  # a DMA descriptor left outstanding by the previous op (fault injection)
        # fault l2-lazy-stale (#25876): data address -> what an HMX MUL_MAT's dst held before it wrote it, this batch
        self.stale_reads: dict[int, object] = {}
        self.in_fused = False  # running the later nodes of a fused op (their inputs come from inside the op)
        # fault v73-input-stale (GenieX #1429): the roots of the compute tensors the DSP itself wrote (id -> tensor)
        self.device_written: dict[int, object] = {}
        self.mmap_max = arch_profile(settings.arch, profile.generation).mmap_max_bytes
        # timing races (fault injections only) come from here: run-dependent unless KAZEIA_HTP_RACE_SEED is set
        self.race = np.random.default_rng(settings.race_seed)
        # fault hmx-queue-narrowing: the HMX queue workers this build skips (build_layout.py), fixed at session open
        self.skipped_workers = self._skipped_workers(settings)
        self.injector = None  # test deaths (engine/recovery.py: DeathInjector): tick() before each op
        # 2026-10's lazy L2 bookkeeping (l2.py): None under the May profiles
        self.l2 = L2Recorder(n_threads=settings.nhvx) if profile.caps.lazy_l2 else None

    def _skipped_workers(self, settings: HtpSettings) -> frozenset[str]:
        from kazeia.backends.htp.build_layout import describe_skips, session_skips

        skipped = session_skips(settings)
        if skipped:
            self.farf("HIGH", f"hmx-queue: this build's {describe_skips(skipped)} entry address ends in 0x00: taken "
                              f"for HMX_QUEUE_NOOP (skipped, marked done)")
        return skipped

    def snapshot(self) -> DeviceState:
        return DeviceState(self.vtcm.mem.copy(), self.hmx_scale, self.dma_stale_pop,
                           dict(self.race.bit_generator.state))

    def restore(self, state: DeviceState) -> list[str]:
        """Put `state` back; returns notes on what could not be restored exactly (another VTCM size)."""
        notes = []
        n = min(state.vtcm.size, self.vtcm.size)
        if state.vtcm.size != self.vtcm.size:
            notes.append(f"VTCM is {self.vtcm.size} B here, {state.vtcm.size} B in the snapshot: restored the "
                         f"first {n} B")
        self.vtcm.write(0, np.asarray(state.vtcm[:n], dtype=np.uint8))
        self.hmx_scale = float(state.hmx_scale)
        self.dma_stale_pop = bool(state.dma_stale_pop)
        if state.race_rng is not None:
            try:
                self.race.bit_generator.state = state.race_rng
            except (TypeError, ValueError, KeyError):
                notes.append("could not restore the DSP race generator state")
        return notes

    def farf(self, level: str, msg: str) -> None:
        line = f"[dsp {level}] {msg}"
        self.log.append(line)
        if self.settings.farf:
            import sys

            print(line, file=sys.stderr, flush=True)

    def _run_fused(self, op: OpDesc, batch: OpBatch, rec: OpRecord) -> OpRecord:
        """Run a fused op's other nodes after its first, each node reported done as soon as its output is in memory
        (a later node may overwrite an earlier one's buffer: MUL_MAT+ADD in place). Returns the op's record with
        its status: the first non-OK status of its nodes."""
        status = rec.status
        listener = self.listener
        listener.op_done(op, batch, rec)
        self.in_fused = True
        try:
            for sub in op.fused:
                listener.op_started(sub, batch)
                srec = self.executor.execute(self, self.octx, sub, batch)
                if status == STATUS_OK:
                    status = srec.status
                listener.op_done(sub, batch, srec)
        finally:
            self.in_fused = False
        return OpRecord(rec.path, status, rec.detail)

    def _map_buffers(self, batch: OpBatch, op) -> None:
        """prep_op_bufs' mappings (main.c mmap_buf): on v73 and older HAP_mmap takes at most 2 GiB a buffer and the
        DSP aborts on a larger one (llama.cpp #21071). Only a weight buffer cut larger than that reaches it
        (GGML_HEXAGON_MBUF above 2048); compute buffers that large are not modelled."""
        if self.mmap_max is None:  # HAP_mmap2 (v75 and later)
            return
        for d in (op, *op.fused):
            for i in (*d.src, d.dst):
                if i is None:
                    continue
                _, size = vmem_span(batch.tensors[i].tensor, batch.mbuf)
                if size > self.mmap_max:
                    raise DspFault("abort", f"mmap failed : size {size} exceeds 2GB limit for HAP_mmap",
                                   {"mapping_bytes": size})

    def process_batch(self, batch: OpBatch) -> list[int]:
        """Run every op of the batch; returns per-op statuses. Sets self.death and stops on a fault."""
        if self.death is not None:
            return []
        self.octx = OpContext()  # memset(octx, 0): the src1 shortcut never survives a batch
        self.stale_reads = {}  # (the flush-invalidate at batch start makes every earlier write visible)
        for cb in self.on_batch_start:
            cb(self, batch)
        if self.l2 is not None:
            self.l2.batch_start()
        statuses: list[int] = []
        listener = self.listener
        for op in batch.ops:
            if self.l2 is not None:  # prep_op_bufs: flush the dirty inputs, then record the outputs dirty
                spans = op.l2_spans
                if spans is None:  # (an op desc keeps its descriptor indexes: a replayed batch reuses it)
                    spans = op.l2_spans = (
                        _spans(batch, [i for d in (op, *op.fused) for i in d.src if i is not None]),
                        _spans(batch, [d.dst for d in (op, *op.fused)]))
                self.l2.op(*spans)
            listener.op_started(op, batch)
            try:
                if self.mmap_max is not None and batch.mbuf > self.mmap_max:
                    self._map_buffers(batch, op)
                injected = self.injector.tick(op.node.name) if self.injector is not None else None
                if injected:
                    raise DspFault("abort", injected)
                rec = self.executor.execute(self, self.octx, op, batch)
                if op.fused:  # a fused op's other nodes, in order (host/fusion.py); each reported when it is done
                    rec = self._run_fused(op, batch, rec)
            except DspFault as f:
                if f.kind == "stack-overflow":
                    f.detail.setdefault("stack_used", self.octx.stack_used)
                self.death = Death(f.kind, f.cause, op.node.name, op.index, batch.seq, op.graph_index, f.detail)
                if f.kind == "hang":  # no exception: the op's FARF line, over and over
                    self.farf("HIGH", f"HMX matmul failed (ret=-1), falling back to HVX (repeats without end: "
                                      f"op #{op.index} {op.node.desc()})")
                else:
                    self.farf("ERROR", f"process exception: {f.kind}: {f.cause} (op #{op.index} {op.node.desc()})")
                listener.op_faulted(op, batch, f)
                break
            statuses.append(rec.status)
            if self.profile.shortcut_scope == "op":  # 2026-10 proc_op_req: every spad src pointer cleared
                self.octx.src1_spad_src = None
                self.octx.src1_spad_kind = None
            if not op.fused:
                listener.op_done(op, batch, rec)
        if self.l2 is not None and self.death is None:
            self.l2.batch_end()
        return statuses


def _spans(batch: OpBatch, idxs: list[int]) -> list[tuple[int, int]]:
    """(address, size) of the batch's descriptors `idxs`, once each, leaving out weights (never tracked in L2)."""
    out, seen = [], set()
    for i in idxs:
        if i in seen:
            continue
        seen.add(i)
        d = batch.tensors[i]
        if not d.tensor.flags & TFlag.WEIGHT:
            out.append((d.addr, d.size))
    return out
