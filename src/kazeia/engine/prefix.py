"""Prefix runs: each graph run only through one node (`kazeia run --stop-after NODE`).

A device death is decided by the ops enqueued up to the faulting one: the ops after the end of its layer cannot
undo it. Asking "does the death still happen (or move) when ... ?" therefore needs the graph only through the
end of the layer where it happened, a fraction of a full run on a 36-layer model. The prefix is the full graph's
own nodes, in its order, at the addresses the context's allocator gave them; the only difference is that the
graph ends (every backend synchronizes) after the stop node. No logits are computed: what a prefix run gives is
whether it died, where, and the stop node's output (`PrefixScheduler.output`), which a CPU prefix of the same
nodes can be judged against. Whoever reports a prefix run says what it ran (`layers_text`).
"""

from __future__ import annotations

import copy
import re

import numpy as np

from kazeia.engine.scheduler import Scheduler
from kazeia.errors import KazeiaError
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import array
from kazeia.identity import IdentityCache

LAYER_END = re.compile(r"^l_out-(\d+)$")  # llama.cpp's name of a layer's output (every architecture file uses it)


class PrefixScheduler(Scheduler):
    """A scheduler that runs each graph only through the node named `stop_after`, then ends the graph."""

    def __init__(self, backends, router=None, stop_after: str = "") -> None:
        super().__init__(backends, router)
        self.stop_after = stop_after
        self.output: np.ndarray | None = None  # the stop node's output after the last graph (a copy)
        self._views: IdentityCache[Graph] = IdentityCache("prefix.views", limit=9)  # graph -> its prefix view

    def compute(self, graph: Graph) -> None:
        view = self._prefix(graph)
        super().compute(view)
        self.synchronize()  # the stop node's output is in memory (an asynchronous device finished it)
        self.output = np.array(array(view.nodes[-1]))  # a copy: the buffer is reused

    def _prefix(self, graph: Graph) -> Graph:
        return self._views.get(graph, lambda: self._view(graph), lambda v: v.nodes[-1].name == self.stop_after)

    def _view(self, graph: Graph) -> Graph:
        names = [n.name for n in graph.nodes]
        if self.stop_after not in names:
            raise KazeiaError(f"--stop-after {self.stop_after}: no node of that name in the graph (node names as "
                              f"--oplog prints them, e.g. l_out-0)")
        view = copy.copy(graph)  # same nodes, leaves and allocation; only the node list ends early
        view.nodes = graph.nodes[:names.index(self.stop_after) + 1]
        return view


def make_scheduler(backends, router=None, stop_after: str | None = None) -> Scheduler:
    """The scheduler of a run: a PrefixScheduler when it stops after a node, else the plain one."""
    return PrefixScheduler(backends, router, stop_after) if stop_after else Scheduler(backends, router)


def check_prefix_run(stop_after: str | None, n_predict: int) -> None:
    """A prefix run computes no logits, so it cannot generate: refuse -n other than 0 in one line."""
    if stop_after and n_predict != 0:
        raise KazeiaError(f"--stop-after {stop_after} computes no logits to generate from: give -n 0")


def layer_end(order: list[str], op: str) -> str | None:
    """The node that ends the layer holding `op` (the first l_out-<il> at or after it in graph order `order`),
    or None when `op` is not in the graph, no layer end follows it, or it is in the last layer (its prefix is the
    whole run but for the output head: nothing to save)."""
    if op not in order:
        return None
    ends = [i for i, n in enumerate(order) if LAYER_END.match(n)]
    i = order.index(op)
    after = [j for j in ends if j >= i]
    if not after or after[0] == ends[-1]:
        return None
    return order[after[0]]


def layers_text(stop: str, order: list[str]) -> str:
    """'layers 0..k of n (through l_out-k)' for a prefix that ends at `stop`."""
    n = sum(1 for x in order if LAYER_END.match(x))
    m = LAYER_END.match(stop)
    return f"layers 0..{m.group(1)} of {n} (through {stop})" if m else f"the graph through {stop}"
