"""Running a dumped op alone in a fresh device (fresh VTCM, a batch of one op), and the float64 reference run.

That answers "do these inputs (values and shapes) make this op fail?"."""

from __future__ import annotations

from typing import Any

import numpy as np

from kazeia.backends.base import Backend, Hook, OpInfo
from kazeia.backends.cpu import CpuBackend
from kazeia.backends.devices import device_name
from kazeia.backends.ref import RefBackend
from kazeia.debug.allowance import conversion_allowance, conversion_floor
from kazeia.debug.dump import Dump
from kazeia.debug.replay.materialize import materialize
from kazeia.debug.replay.results import Execution
from kazeia.debug.tensors import logical_values
from kazeia.errors import DeviceDeathError, DeviceOpError, KazeiaError
from kazeia.graph.tensor import SCALAR_DTYPES, Tensor


class _Watch(Hook):
    """Captures the target op's inputs at start and how it completed."""

    def __init__(self, target: Tensor) -> None:
        self.target = target
        self.inputs: list[np.ndarray | None] | None = None
        self.info: OpInfo | None = None

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        if node is self.target:
            self.inputs = [_read(s) if s is not None else None for s in node.src]

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        if node is self.target:
            self.info = info


def _read(t: Tensor) -> np.ndarray | None:
    try:
        return logical_values(t)
    except (TypeError, ValueError):
        return None


def _output_of(backend: Backend, node: Tensor) -> np.ndarray:
    if isinstance(backend, RefBackend) and node.type in SCALAR_DTYPES:
        return np.asarray(backend.value(node), dtype=np.float64)  # the float64 shadow, not the f32 buffer
    v = logical_values(node)
    return v.astype(np.float64) if v.dtype.kind == "f" else v


def make_backend(device: str, settings: Any) -> Backend:
    dev = device_name(device)
    if dev == "CPU":
        return CpuBackend()
    if dev == "REF":
        return RefBackend()
    if dev == "HTP0":
        from kazeia.backends.htp import HtpBackend

        return HtpBackend(settings)
    raise KazeiaError(f"unknown device '{device}' (replay runs on CPU, HTP0 or REF)")


def _death(e: DeviceDeathError, target: str) -> dict:
    return {**e.to_dict(), "target": target}


def run_watched(backend: Backend, target: Tensor, ex: Execution, run) -> np.ndarray | None:
    """Run `run()` on the backend, filling `ex` with what happened; returns the target's output."""
    watch = _Watch(target)
    backend.hooks.append(watch)
    try:
        run()
    except DeviceDeathError as e:
        ex.died = _death(e, target.name)
    except DeviceOpError as e:
        ex.error = str(e)
    except KazeiaError as e:
        ex.error = str(e)
    except (ArithmeticError, LookupError, ValueError, TypeError, AttributeError, MemoryError) as e:
        # a kernel refusing its inputs (a dump's params and shapes are only what the file says)
        ex.error = f"{type(e).__name__}: {e}"
    finally:
        backend.hooks.remove(watch)
        backend.close()
    if watch.info is not None:
        ex.path = watch.info.path
        ex.extra = dict(watch.info.extra)
        st = watch.info.extra.get("status")
        if st is not None:
            from kazeia.backends.htp import STATUS_NAMES, STATUS_OK

            if st != STATUS_OK:  # 2026-05 drops it on the host; the op still did not do its work
                ex.status = STATUS_NAMES.get(st, str(st))
    ex.inputs_seen = watch.inputs
    if ex.died is not None or ex.error is not None or watch.info is None:
        if ex.died is None and ex.error is None:
            ex.error = "the op did not complete"
        return None
    return _output_of(backend, target)


def _supports(backend: Backend, node: Tensor) -> bool:
    """backend.supports, False for a node it cannot even inspect (a dump whose sources do not fit its op)."""
    try:
        return backend.supports(node)
    except (LookupError, ValueError, TypeError, AttributeError):
        return False


def run_alone(dump: Dump, device: str, settings: Any, mode: str = "alone") -> Execution:
    """Run the dumped op on `device` in a fresh backend, judged later; `mode` names the execution."""
    node = materialize(dump)
    backend = make_backend(device, settings)
    ex = Execution(mode, backend.name, getattr(settings, "profile", None) if backend.name == "HTP0" else None)
    backend.node_index = {node: dump.graph_index}
    if not _supports(backend, node):
        ex.error = f"{backend.name} does not support this op ({dump.desc} {dump.node['type']}{dump.node['ne']})"
        backend.close()
        return ex

    def run() -> None:
        backend.compute(node)
        backend.synchronize()

    ex.output = run_watched(backend, node, ex, run)
    return ex


def reference_run(dump: Dump) -> tuple[Execution, float | None]:
    """The float64 run on the dumped inputs, and for a weight MUL_MAT the NMSE of ggml's activation
    conversion (REF recomputed from activations converted as ggml's CPU does) against it."""
    node = materialize(dump)
    be = RefBackend()
    ex = Execution("reference", "REF")
    be.node_index = {node: dump.graph_index}
    if not _supports(be, node):
        ex.error = f"REF does not support this op ({dump.desc})"
        return ex, None

    def run() -> None:
        be.compute(node)

    ex.output = run_watched(be, node, ex, run)
    converted = conversion_floor(be, node) if ex.output is not None else None
    return ex, conversion_allowance(converted, ex.output)
