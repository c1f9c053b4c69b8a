"""Rerunning a dumped op with its HTP batch context: the VTCM contents and DSP state at the start of its batch
restored, the memory the batch read put back at the original addresses, and the ops that preceded it in its
batch rerun first, in the same order and with the same descriptor indexes. That answers "does this op fail
because of what ran before it in the batch?"."""

from __future__ import annotations

from typing import Any

import numpy as np

from kazeia.backends.htp.forensics import DeviceState
from kazeia.debug.dump import Dump
from kazeia.debug.replay.alone import run_watched
from kazeia.debug.replay.materialize import context_tensors
from kazeia.debug.replay.results import Execution
from kazeia.errors import DumpFileError, KazeiaError
from kazeia.graph.tensor import Tensor


def recorded_state(dump: Dump, ctx: dict) -> DeviceState:
    """The device state (VTCM bytes and registers) at the start of the recorded batch."""
    vt = np.ascontiguousarray(dump.load_blob(ctx["vtcm"], "context VTCM")).reshape(-1).view(np.uint8)
    regs = ctx.get("dsp_state") or {}
    try:
        return DeviceState(vt, float(regs.get("hmx_scale", 0.0)), bool(regs.get("dma_stale_pop", False)),
                           regs.get("race_rng"))
    except (TypeError, ValueError) as e:
        raise DumpFileError(f"{dump.path}: malformed DSP state in the batch context ({e})") from None


def _batch_nodes(dump: Dump, ctx: dict) -> tuple[list[dict], list[Tensor]]:
    """The recorded ops of the batch up to the dumped one, and their nodes rebuilt over the context's tensors."""
    try:
        tensors, _ = context_tensors(dump, ctx)
        ops = ctx["ops"]
        nodes = []
        for o in ops:
            n = tensors[int(o["dst_key"])]
            n.op, n.params = o["op"], dict(o.get("params") or {})
            n.src = tuple(tensors[int(k)] if k is not None else None for k in o["src_keys"])
            nodes.append(n)
    except (KeyError, TypeError, ValueError) as e:
        raise DumpFileError(f"{dump.path}: malformed batch context ({type(e).__name__}: {e})") from None
    return ops, nodes


def _mismatched_inputs(dump: Dump, got: list) -> list[str]:
    """The sources whose bytes, as the op started in the replay, differ from the dumped ones."""
    mism = []
    for i, (rec, v) in enumerate(zip(dump.sources, got)):
        if rec is None or rec.values is None or v is None:
            continue
        if v.shape != rec.values.shape or not np.array_equal(v.view(np.uint8), rec.values.view(np.uint8)):
            mism.append(f"src{i} {rec.name}")
    return mism


def run_with_context(dump: Dump, settings: Any) -> Execution:
    """Rerun the dumped op's batch up to it on an HTP whose VTCM, DSP state and memory are as they were."""
    from kazeia.backends.htp import HtpBackend

    ctx = dump.context
    if ctx is None:
        raise KazeiaError(f"{dump.id}: no batch context to replay ({dump.context_note})")
    ops, nodes = _batch_nodes(dump, ctx)
    backend = HtpBackend(settings)
    ex = Execution("with context", backend.name, settings.profile)
    ex.notes += backend.restore(recorded_state(dump, ctx))
    batch = backend.open_batch(int(ctx["batch_seq"]), [(n, int(o["graph_index"]), o.get("fused"))
                                                       for o, n in zip(ops, nodes)])
    built = [d for op in batch.ops for d in (op, *op.fused)]  # one per node, as the context lists them
    same = len(built) == len(ops) and all(d.src == list(o["src"]) and d.dst == int(o["dst"])
                                          for o, d in zip(ops, built))
    ex.descriptors_reproduced = same
    if not same:
        ex.notes.append("the rebuilt batch did not reproduce the recorded descriptor indexes")
    backend.node_index = {n: int(o["graph_index"]) for o, n in zip(ops, nodes)}
    target = nodes[-1]

    def run() -> None:
        backend.synchronize()

    ex.output = run_watched(backend, target, ex, run)
    if ex.inputs_seen is not None:
        ex.input_mismatch = _mismatched_inputs(dump, ex.inputs_seen)
        ex.inputs_reproduced = not ex.input_mismatch
    return ex
