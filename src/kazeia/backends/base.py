"""The backend interface: what the scheduler needs, nothing more.

A backend says whether it can run a node (`supports`) and runs it (`compute`). Synchronous backends
(ref, cpu) finish the op inside `compute`; asynchronous ones (htp) only queue it and finish in
`synchronize`. Either way a backend reports every op it finished through the scheduler's hooks, with
what it knows about how it ran it (`OpInfo`), so tracing never needs to know which backend ran what.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from kazeia.graph.builder import Graph
from kazeia.graph.tensor import Tensor


@dataclass
class OpInfo:
    """How an op ran: backend name, path inside the backend (cpu, hvx, hmx, ref), batch id if batched."""

    backend: str
    path: str
    batch: int | None = None
    index: int = -1  # node index in the graph
    extra: dict = field(default_factory=dict)


class Hooks(Protocol):
    """Observers of execution. on_enqueue: the host queued the op (async backends only; data not ready).
    on_start: the op is about to execute and its inputs hold what it will consume. on_complete: it finished
    and its output is in memory. on_fault: the device died inside it. Subclass `Hook` to implement a few."""

    def on_enqueue(self, node: Tensor, info: OpInfo) -> None: ...

    def on_start(self, node: Tensor, info: OpInfo) -> None: ...

    def on_complete(self, node: Tensor, info: OpInfo) -> None: ...

    def on_fault(self, node: Tensor, info: OpInfo) -> None: ...


class Hook:
    """No-op base for hooks."""

    def on_enqueue(self, node: Tensor, info: OpInfo) -> None:
        pass

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        pass

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        pass

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        pass


class Backend:
    """Base class; capability attributes are class attributes."""

    name: str = "?"  # device name the user types: CPU, HTP0, REF
    is_async: bool = False
    static_supports: bool = False  # `supports` depends only on the node (the scheduler may cache placement)
    float_dtype: str = "float32"

    def __init__(self) -> None:
        self.hooks: list[Hooks] = []
        self.node_index: dict[Tensor, int] = {}  # the current graph's nodes -> their index

    # --- scheduling ---
    def supports(self, node: Tensor) -> bool:
        raise NotImplementedError

    def compute(self, node: Tensor) -> None:
        raise NotImplementedError

    def run_nodes(self, nodes: list[Tensor]) -> None:
        """compute() each node in order (a backend alone on a graph gets the whole list: it may run it faster)."""
        for node in nodes:
            self.compute(node)

    def synchronize(self) -> None:
        """Wait for everything queued so far (no-op for synchronous backends)."""

    def get_tensor_async(self, t: Tensor) -> None:
        """ggml_backend_tensor_get_async of an output this backend wrote (llama_decode reads its logits so): an
        asynchronous backend finishes what it queued first. Memory is shared here: nothing is copied."""
        self.synchronize()

    def begin_graph(self, graph: Graph) -> None:
        if getattr(self, "_indexed", None) is not graph or len(self.node_index) != len(graph.nodes):
            self.node_index = {n: i for i, n in enumerate(graph.nodes)}
            self._indexed = graph

    def end_graph(self) -> None:
        self.synchronize()

    def foreign_write(self, root: Tensor) -> None:
        """Another backend wrote `root`'s storage; drop anything cached about its contents."""

    # --- hooks ---
    def _info(self, node: Tensor, path: str, batch: int | None = None, **extra) -> OpInfo:
        return OpInfo(self.name, path, batch, self.node_index.get(node, -1), dict(extra))

    def emit_enqueue(self, node: Tensor, info: OpInfo) -> None:
        for h in self.hooks:
            h.on_enqueue(node, info)

    def emit_start(self, node: Tensor, info: OpInfo) -> None:
        for h in self.hooks:
            h.on_start(node, info)

    def emit_fault(self, node: Tensor, info: OpInfo) -> None:
        for h in self.hooks:
            h.on_fault(node, info)

    def emit_complete(self, node: Tensor, info: OpInfo) -> None:
        for h in self.hooks:
            h.on_complete(node, info)

    # --- device sessions (engine/recovery.py) ---
    @property
    def dead(self) -> Exception | None:
        """The error that ended this backend's session, or None (synchronous backends never die)."""
        return None

    def new_session(self, sync: bool = False) -> Backend:
        """A fresh session of the same device with the same settings (`sync`: one op per batch, waited on)."""
        return self

    def set_death_injector(self, injector) -> bool:
        """Let `injector.tick()` (called before each op the device starts) kill the session; False: no device."""
        return False

    def make_gate(self, name: str):
        """This device's routing gate called `name` (engine/gates.py DEVICE_GATES), or None when it has none."""
        return None

    def close(self) -> None:
        """Release resources (device sessions)."""
