"""The reference run: REF's float64 output of every op of one prefill, and what each op read (for isolated
replays) and how much ggml's own activation conversion would cost a MUL_MAT (the allowance)."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field

import numpy as np

from kazeia.backends.base import Hook, OpInfo
from kazeia.backends.ref import RefBackend
from kazeia.debug.allowance import conversion_allowance, conversion_floor
from kazeia.debug.compare.op_io import read_sources, ref_output
from kazeia.debug.compare.spill import ArrayStore, SpilledArrays, SpilledSources
from kazeia.debug.runner import run
from kazeia.debug.tensors import logical_values
from kazeia.engine.session import (
    RunSpec,
    build_context,
    graph_generation,
    load_model,
    prompt_ids,
    reference_spec,
)
from kazeia.errors import KazeiaError
from kazeia.graph.tensor import Tensor


def ref_spec(spec: RunSpec) -> RunSpec:
    return reference_spec(spec, device="REF", htp_profile=None, vtcm=None, faults=[], env={}, cpu_ops=None,
                          cpu_nodes=None, cpu_node_range=None, n_predict=0)


def ref_key(spec: RunSpec) -> tuple:
    return (os.path.realpath(spec.model_path), tuple(spec.tokens or ()), spec.ubatch, spec.ctx, spec.flash_attn,
            graph_generation(spec))


@dataclass
class Reference:
    """REF's view of one prefill: per (micro-batch, node index) the float64 output and the raw contents of
    the sources the op read (None when sources were not captured)."""

    spec: RunSpec
    outputs: SpilledArrays  # (micro-batch, node index) -> REF's float64 output
    sources: SpilledSources | None = None  # (micro-batch, node index) -> [(source index, raw contents)]
    names: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    floors: dict[tuple[int, int], float] = field(default_factory=dict)  # MUL_MAT activation-conversion NMSE
    logits: np.ndarray | None = None
    n_ubatch: int = 0

    def matches(self, spec: RunSpec) -> bool:
        return ref_key(self.spec) == ref_key(spec)

    def nbytes(self) -> int:
        """Bytes of the arrays held (in the spill file)."""
        return self.outputs.nbytes() + (self.sources.nbytes() if self.sources is not None else 0)


class _RefCapture(Hook):
    def __init__(self, ref: RefBackend, out: Reference, sources: bool) -> None:
        self.ref, self.out, self.want_sources = ref, out, sources
        self.ubatch = 0
        self._converted: np.ndarray | None = None

    def next_ubatch(self, *_args) -> None:
        self.ubatch += 1

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        if self.want_sources:
            self.out.sources[(self.ubatch, info.index)] = [(i, logical_values(node.src[i])) for i in read_sources(node)]
        self._converted = conversion_floor(self.ref, node)

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        key = (self.ubatch, info.index)
        self.out.names[key] = (node.name, node.desc())
        out = self.out.outputs[key] = ref_output(self.ref, node)
        allowance = conversion_allowance(self._converted, out)
        if allowance is not None:
            self.out.floors[key] = allowance
        self._converted = None


def fix_tokens(spec: RunSpec) -> RunSpec:
    if spec.tokens is not None:
        return spec
    return spec.with_(tokens=prompt_ids(spec, load_model(spec.model_path)))


def capture_reference(spec: RunSpec, sources: bool = True, hooks: tuple = ()) -> Reference:
    """Run the prefill of `spec` on REF and keep every op's float64 output (and, with `sources`, what each op
    read, for isolated replays). Device settings of `spec` are ignored. `hooks` watch the same run (a caller that
    also wants the graph's ops, as upgrade's plan scans do, needs no run of its own)."""
    rspec = ref_spec(fix_tokens(spec))
    ctx = build_context(rspec)
    ref = next(b for b in ctx.scheduler.backends if isinstance(b, RefBackend))
    store = ArrayStore()  # outputs and sources in a temporary file: ~1.1 GB for a 36-layer model's prefill
    out = Reference(rspec, outputs=SpilledArrays(store), sources=SpilledSources(store) if sources else None)
    cap = _RefCapture(ref, out, sources)
    ctx.on_ubatch = cap.next_ubatch
    res = run(rspec, hooks=[cap, *hooks], ctx=ctx)
    if not res.ok:
        raise KazeiaError(f"the REF run failed: {res.signature()}")
    out.logits = res.logits
    out.n_ubatch = cap.ubatch
    del ctx, ref, cap
    gc.collect()  # drop REF's per-run state (shadows, graphs) before the backend under test runs
    return out
