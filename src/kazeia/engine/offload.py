"""-ngl / --n-gpu-layers: which nodes llama.cpp keeps on the CPU when only some layers are offloaded.

llama.cpp puts the weights (and the KV cache) of the last N repeating layers on the device, those of the
others on the CPU; the output layer (output norm and lm_head) goes to the device when N exceeds the layer count;
the input layer (the token embedding lookup) stays on the CPU. ggml_backend_sched then places the ops
(ggml-backend.cpp, ggml_backend_sched_split_graph):
- pass 1: an op whose destination or view source lives in a buffer runs with that buffer (the KV cache stores);
  an op reading a weight (ROPE excepted) runs where the weight is;
- pass 2: the device's assignments spread to the unassigned neighbours, down then up, never across a CPU op;
  then every assignment spreads (down, then up) to what is still unassigned.
`cpu_nodes` gives the ids of the computed nodes this leaves on the CPU; everything else is placed as usual
(the device if it supports the op). Views are skipped, as upstream does.
"""

from __future__ import annotations

from kazeia.graph.builder import Graph
from kazeia.graph.tensor import Tensor, TFlag

CPU, DEVICE = "CPU", "device"
OUTPUT_WEIGHTS = ("output_norm.weight", "output.weight")


def layer_on_device(layer: int | None, n_layer: int, ngl: int, output: bool = False) -> bool:
    """Layer `layer` (None with output=True: the output layer) is offloaded by -ngl ngl."""
    if output:
        return ngl > n_layer
    return layer is not None and layer >= n_layer - min(ngl, n_layer)


def _weight_home(node: Tensor, w: Tensor, n_layer: int, ngl: int) -> str:
    name = w.weight_name or ""
    if name == "token_embd.weight" and node.op == "GET_ROWS":
        return CPU  # the input layer
    if name in OUTPUT_WEIGHTS or name == "token_embd.weight":  # a tied lm_head is the output layer's copy
        return DEVICE if layer_on_device(None, n_layer, ngl, output=True) else CPU
    return DEVICE if layer_on_device(w.layer, n_layer, ngl) else CPU


def _cache_layer(t: Tensor) -> int | None:
    """The layer of a KV cache tensor (cache_k_l3 -> 3), or None."""
    root = t.root
    for prefix in ("cache_k_l", "cache_v_l", "cache_r_l", "cache_s_l"):
        if root.name.startswith(prefix) and root.name[len(prefix):].isdigit():
            return int(root.name[len(prefix):])
    return None


def _pass1(node: Tensor, n_layer: int, ngl: int) -> str | None:
    if node.view_src is not None:
        il = _cache_layer(node)
        if il is not None:  # a store into the KV cache runs with the cache
            return DEVICE if layer_on_device(il, n_layer, ngl) else CPU
    if node.op == "ROPE":
        return None
    for s in node.src:
        if s is not None and s.flags & TFlag.WEIGHT:
            return _weight_home(node, s, n_layer, ngl)
    return None


def cpu_nodes(graph: Graph, n_layer: int, ngl: int, supported) -> set[int]:
    """ids of the computed nodes -ngl ngl keeps on the CPU; `supported(node)`: the device can run it."""
    nodes = [n for n in graph.nodes if n.is_computed]
    where: list[str | None] = [_pass1(n, n_layer, ngl) for n in nodes]

    def spread(order, only_device: bool) -> None:
        cur = None
        for i in order:
            if where[i] is not None:
                cur = None if only_device and where[i] == CPU else where[i]
            elif cur is not None and (cur == CPU or supported(nodes[i])):
                where[i] = cur

    forward, backward = range(len(nodes)), range(len(nodes) - 1, -1, -1)
    spread(forward, True)
    spread(backward, True)
    spread(forward, False)
    spread(backward, False)
    return {id(n) for n, w in zip(nodes, where) if w == CPU}
