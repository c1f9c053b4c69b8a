"""The `htp` backend as the scheduler sees it (-dev HTP0): supports_op, enqueue, synchronize.

This file only adapts the host session to the Backend interface; the host model is in host/ (session.py), the DSP
in device.py, the op kernels in ops/ (executor.py, matmul.py), the VTCM arena and its layouts in vtcm/ (arena.py,
matmul/ for MUL_MAT, op_layouts.py for the other ops).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from kazeia.backends.base import Backend
from kazeia.backends.htp.archs import session_refusal
from kazeia.backends.htp.device import Dsp
from kazeia.backends.htp.host.fusion import fuseable_nodes
from kazeia.backends.htp.host.repack import RepackedWeight
from kazeia.backends.htp.host.session import HostSession
from kazeia.backends.htp.host.support import supports_op
from kazeia.backends.htp.msg import DeviceState, DspFault, OpBatch, OpDesc, OpRecord
from kazeia.backends.htp.ops.executor import Executor
from kazeia.backends.htp.ops.matmul import WeightStore
from kazeia.backends.htp.profiles import check_faults, get_profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.errors import KazeiaError
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import Tensor
from kazeia.identity import IdentityCache

_WARNED: set[str] = set()


def _warn_ignored(settings: HtpSettings) -> None:
    """Once per process: switches the profile's upstream no longer reads (USE_HMX, OPSTAGE under 2026-10)."""
    line = settings.ignored_warning()
    if line is not None and line not in _WARNED:
        _WARNED.add(line)
        print(line, file=sys.stderr, flush=True)


class HtpBackend(Backend):
    name = "HTP0"
    is_async = True
    static_supports = True  # supports_op reads the node and the session's fixed settings only
    float_dtype = "float32"

    def make_gate(self, name: str):
        """`vtcm-plan`: the gate that keeps on the CPU every MUL_MAT whose HMX plan under this session's settings
        would not fit (gates.py)."""
        if name != "vtcm-plan":
            return None
        from kazeia.backends.htp.gates import VtcmPlanGate

        return VtcmPlanGate(self.settings)

    def __init__(self, settings: HtpSettings | None = None, log=None, weight_store: WeightStore | None = None) -> None:
        """`weight_store`: the REPACK buffer to use (default: the one shared by every session of the process)."""
        super().__init__()
        self.settings = settings or HtpSettings.from_env()
        self.profile = get_profile(self.settings.profile)
        _warn_ignored(self.settings)
        check_faults(self.settings.faults, self.settings.profile)
        refusal = session_refusal(self.settings.arch, self.profile.generation)
        if refusal is not None:
            raise KazeiaError(refusal)
        self.executor = Executor(self.settings, self.profile, weight_store)
        self.dsp = Dsp(self.settings, self.profile, self.executor, listener=self)  # (self: its DspListener)
        self.host = HostSession(self.name, self.settings, self.profile, self.dsp, log, self._batch_seconds)
        self.records: list[tuple[str, OpRecord]] = []  # (node name, record) of the current graph
        self._modeled_cache: IdentityCache[float] = IdentityCache("htp.modeled_graph_seconds", limit=16, bind=True)
        self._graph_runs: dict[Graph, int] = {}  # graphs run since the last fold, with counts
        self._modeled_done = 0.0
        # per node: modeled DSP time (the timing model), supports_op's answer
        self._op_seconds: IdentityCache[float] = IdentityCache("htp.op_seconds", limit=8192, bind=True)
        self._supported: IdentityCache[tuple] = IdentityCache("htp.supports", limit=16384, bind=True)
        self._batched_settings: HtpSettings | None = None  # a synchronous session's settings before --sync
        self._fuseable: IdentityCache[tuple] = IdentityCache("htp.fuseable", limit=16, bind=True)

    @classmethod
    def from_options(cls, opts) -> HtpBackend:
        """A session with the settings of `opts` (backends/devices.py DeviceOptions): env plus its overrides."""
        return cls(HtpSettings.from_options(opts))

    # --- Backend ---
    def supports(self, node: Tensor) -> bool:
        """supports_op, kept by node: the scheduler asks for every node of a reused graph on every token, and
        the answer depends only on the node's op, params, shapes, types and sources (and the fixed settings); a
        node's sources are the one thing a graph builder may give it anew."""
        src = node.src
        return self._supported.get(node, lambda: (src, supports_op(node, self.settings)), lambda h: h[0] is src)[1]

    def begin_graph(self, graph: Graph) -> None:
        if self.profile.caps.async_graph_compute:
            self.host.check_graph_compute()
        super().begin_graph(graph)
        if self.host.fuser is not None:  # the FUSEABLE tags of graph_compute (fusion.py)
            nodes = graph.nodes
            self.host.fuser.fuseable = self._fuseable.get(
                graph, lambda: (len(nodes), fuseable_nodes(nodes)), lambda h: h[0] == len(nodes))[1]
        self.records = []
        self.host.placement = graph.placement  # the stamp the ops of this graph are queued (and bound) under
        # costed lazily (bench_counters): planning every matmul of every graph is not the run's business
        self._graph_runs[graph] = self._graph_runs.get(graph, 0) + 1
        for h in self.hooks:  # hooks that need the device itself (op dumps snapshot VTCM at batch start)
            bind = getattr(h, "bind_backend", None)
            if bind is not None:
                bind(self)

    def compute(self, node: Tensor) -> None:
        idx = self.node_index.get(node, -1)
        self.host.enqueue_op(node, idx)
        if self.hooks:  # (the info is only built for someone to read)
            self.emit_enqueue(node, self._info(node, "queued", self.host.open_seq,
                                                 batch_index=self.host.open_ops - 1))

    def synchronize(self) -> None:
        if self.host.dead is None:
            self.host.flush()

    def get_tensor_async(self, t: Tensor) -> None:
        """ggml_backend_hexagon_get_tensor_async: flush_sync, then abort on a sticky error with its own text."""
        if self.host.dead is None:
            self.host.flush(where="get-tensor-async")

    def end_graph(self) -> None:
        """2026-05 flushes at graph end; 2026-10's graph_compute returns with the batch still open (it goes out at
        the next synchronize, get-tensor, or when full)."""
        if not self.profile.caps.async_graph_compute:
            self.synchronize()
        else:  # graph_compute's last check: an error a full queue's flush read while the graph was enqueued
            self.host.check_graph_compute()

    # --- sessions (engine/recovery.py) ---
    @property
    def dead(self) -> Exception | None:
        return self.host.dead

    def new_session(self, sync: bool = False) -> HtpBackend:
        """A new session (FastRPC session, DSP process, VTCM, op queue) with the same settings, hooks, REPACK
        buffer and death injector; `sync`: GGML_HEXAGON_OPBATCH=1 GGML_HEXAGON_OPQUEUE=1 (and back without)."""
        base = self._batched_settings or self.settings  # the settings before recovery asked for one-op batches
        settings = dataclasses.replace(base, opbatch=1, opqueue=1) if sync else base
        new = HtpBackend(settings, self.host.log, self.executor.matmul.weights)
        new._batched_settings = base if sync else None
        new.hooks = list(self.hooks)
        new.set_death_injector(self.dsp.injector)
        return new

    @property
    def synchronous(self) -> bool:
        """One op per batch, waited on: a death names its op (the failed batch holds only that op)."""
        return self.settings.opbatch == 1 and self.settings.opqueue == 1

    def set_death_injector(self, injector) -> bool:
        self.dsp.injector = injector
        return True

    def path_seconds(self, node: Tensor, path: str | None) -> float:
        """Modeled seconds of `node` on `path` (None: its default, "hvx": HMX off, "cpu": the phone's CPU)."""
        from kazeia.backends.htp.cost import op_seconds

        saved = node.route_path
        node.route_path = path
        try:
            return op_seconds(node, self.settings).seconds
        finally:
            node.route_path = saved

    def same_plan_m_range(self, node: Tensor, limit: int = 1024) -> tuple[int, int]:
        """The M range around a MUL_MAT's own M whose plans match its own (path, chunking, outcome): the class a
        rule about this node should cover. Other ops: their M only."""
        from kazeia.backends.htp.vtcm.matmul.dispatch import plan_for_node

        m = node.src[1].ne[1] if node.op == "MUL_MAT" else node.ne[1]
        if node.op != "MUL_MAT":
            return m, m

        def key(mm: int):
            p = plan_for_node(node, self.settings, m=mm)
            return p.path, p.status, p.outcome, p.mc, p.nc

        k0, lo, hi = key(m), m, m
        while lo > 1 and key(lo - 1) == k0:
            lo -= 1
        while hi < limit and key(hi + 1) == k0:
            hi += 1
        return lo, hi

    # --- the DspListener the DSP reports to ---
    def op_done(self, op: OpDesc, batch: OpBatch, rec: OpRecord) -> None:
        if op.name is not None:
            rec.detail.setdefault("fused", op.name)  # the op's name in upstream's logs and traces
        self.records.append((op.node.name, rec))
        if self.hooks:
            info = self._info(op.node, rec.path, batch.seq, status=rec.status, batch_index=op.index, **rec.detail)
            self.emit_complete(op.node, info)

    def op_started(self, op: OpDesc, batch: OpBatch) -> None:
        if self.hooks:
            self.emit_start(op.node, self._info(op.node, "dsp", batch.seq, batch_index=op.index))

    def op_faulted(self, op: OpDesc, batch: OpBatch, fault: DspFault) -> None:
        self.emit_fault(op.node, self._info(op.node, "fault", batch.seq, kind=fault.kind, cause=fault.cause,
                                            batch_index=op.index))

    def _batch_seconds(self, batch: OpBatch) -> float:
        """Modeled DSP time of a batch (cost.py): the round trip plus each op's time (kept by the op: a decode's
        replayed batches reuse their ops, ~830 a token)."""
        from kazeia.backends.htp.cost import DEFAULT

        total = DEFAULT.batch_overhead_s
        for op in batch.ops:
            secs = op.modeled_s
            if secs is None or len(secs) != 1 + len(op.fused) * (op.name == "MUL_MAT_NX"):
                secs = op.modeled_s = self._op_desc_seconds(op)
            for s in secs:  # (node by node: the same additions as when nothing was kept)
                total += s
        return total

    def _op_desc_seconds(self, op: OpDesc) -> tuple[float, ...]:
        from kazeia.backends.htp.cost import op_seconds

        # a fused ADD or MUL is folded into its op's output pass (no time of its own); MUL_MAT_NX runs every
        # weight's product (the shared activation conversion is not subtracted: an upper bound)
        nodes = [op.node, *(s.node for s in op.fused if op.name == "MUL_MAT_NX")]
        return tuple(self._op_seconds.get(n, lambda: op_seconds(n, self.settings).seconds)  # noqa: B023
                     for n in nodes)

    def modeled_graph_seconds(self, graph: Graph) -> float:
        """Modeled on-device time of one graph (cost.py; a calibrated estimate, not a measurement), including
        the ops the HTP refuses (modeled on the phone's CPU). Cached per graph object."""
        from kazeia.backends.htp.cost import graph_seconds

        return self._modeled_cache.get(graph, lambda: graph_seconds(graph.nodes, self.settings)[0])

    def bench_counters(self) -> dict[str, float]:
        """`kazeia bench` extension point: cumulative modeled device seconds of every graph run so far."""
        done = self._modeled_done + sum(self.modeled_graph_seconds(g) * n for g, n in self._graph_runs.items())
        if len(self._graph_runs) > 16:  # fold old graphs into the total so the table stays small
            self._modeled_done, self._graph_runs = done, {}
        return {"modeled device": done}

    # --- for forensic tools: the device state, without reaching into the DSP ---
    def snapshot(self) -> DeviceState:
        """A copy of what survives on the DSP between batches (VTCM bytes and registers)."""
        return self.dsp.snapshot()

    def restore(self, state: DeviceState) -> list[str]:
        """Put a snapshot back; returns notes on what could not be restored exactly."""
        return self.dsp.restore(state)

    def add_batch_start_hook(self, fn: Callable[[HtpBackend, OpBatch], None]) -> None:
        """Call fn(backend, batch) when the DSP starts a batch, before its first op (device state as it found it)."""
        self.dsp.on_batch_start.append(lambda _dsp, batch: fn(self, batch))

    def open_batch(self, seq: int, ops: list[tuple]) -> OpBatch:
        """Queue (node, graph index[, fused op name]) `ops` as one batch numbered `seq` (a recorded batch rebuilt);
        returns it with its descriptors. `synchronize()` runs it."""
        return self.host.open_batch(seq, ops)

    def weights_for(self, node: Tensor) -> RepackedWeight:
        """The REPACK-buffer form of a MUL_MAT node's weight (src0), as the kernels read it."""
        return self.executor.matmul.weights.get(node.src[0])

    def dsp_log(self) -> list[str]:
        return list(self.dsp.log)

    def close(self) -> None:
        if self.settings.farf and self.dsp.log:
            sys.stderr.flush()
