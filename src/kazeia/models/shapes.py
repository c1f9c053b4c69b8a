"""Models from shapes only: weight tensors with the right shapes and types but no data, and the prefill graphs
a model with these hyperparameters builds. Nothing here reads a file or runs a graph; the cost model prices
these graphs (kazeia.engine.modeled) for models too large to run, such as the real 36-layer Qwen3-4B."""

from __future__ import annotations

from collections.abc import Iterator

from kazeia.graph.builder import Graph
from kazeia.graph.tensor import GGMLType, Tensor, TFlag, make_tensor
from kazeia.models.base import ModelArgs, arch_module, expected_shapes
from kazeia.models.transformer import GraphOptions, LayerCache, make_inputs

KV_PAD = 256  # llama.cpp pads the KV cells a graph sees to 256


def shape_tensor(t: GGMLType, ne: tuple[int, ...], name: str) -> Tensor:
    return make_tensor(t, ne, name=name, flags=TFlag.WEIGHT, weight_name=name)


def shape_only_weights(args: ModelArgs, weight_type: GGMLType = GGMLType.Q4_0) -> dict[str, Tensor]:
    """Every weight the architecture needs, matrices of `weight_type` and vectors F32, without data."""
    shapes = expected_shapes(args)
    out = {}
    for name in arch_module(args.arch).required_weights(args):
        ne = shapes[name]
        out[name] = shape_tensor(weight_type if len(ne) == 2 else GGMLType.F32, ne, name)
    return out


def prefill_graphs(args: ModelArgs, n_tokens: int, weight_type: GGMLType = GGMLType.Q4_0,
                   n_ubatch: int = 512) -> Iterator[Graph]:
    """The graphs of the prefill micro-batches of `n_tokens` prompt tokens (flash attention, F16 KV cache), one at
    a time (a 36-layer graph is large: callers price one and drop it)."""
    arch = arch_module(args.arch)
    weights = shape_only_weights(args, weight_type)
    kv_size = n_tokens + KV_PAD
    caches = [LayerCache(shape_tensor(GGMLType.F16, (args.n_embd_kv, kv_size), f"cache_k_l{i}"),
                         shape_tensor(GGMLType.F16, (args.n_embd_kv, kv_size), f"cache_v_l{i}"))
              for i in range(args.n_layer)]
    for start in range(0, n_tokens, n_ubatch):
        t = min(n_ubatch, n_tokens - start)
        n_kv = min(kv_size, -(-(start + t) // KV_PAD) * KV_PAD)
        graph, _ = arch.build(args, weights, make_inputs(t, n_kv, 1, True), caches, n_kv, GraphOptions(flash_attn=True))
        yield graph
