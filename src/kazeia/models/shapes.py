"""Models from shapes only: weight tensors with the right shapes and types but no data, and the prefill graphs
a model with these hyperparameters builds. Nothing here reads a file or runs a graph; the cost model prices
these graphs (kazeia.debug.modeled) for models too large to run, such as the real 36-layer Qwen3-4B."""

from __future__ import annotations

from collections.abc import Iterator

from kazeia.graph.builder import Graph
from kazeia.graph.tensor import GGMLType, Tensor, TFlag, block_size, make_tensor
from kazeia.models.base import ModelArgs, arch_expected_shapes, arch_module, weight_tensor
from kazeia.models.transformer import GraphOptions, LayerCache, RecurrentLayerCache, make_inputs

KV_PAD = 256  # llama.cpp pads the KV cells a graph sees to 256


def shape_tensor(t: GGMLType, ne: tuple[int, ...], name: str) -> Tensor:
    return make_tensor(t, ne, name=name, flags=TFlag.WEIGHT, weight_name=name)


def shape_only_weights(args: ModelArgs, weight_type: GGMLType = GGMLType.Q4_0) -> dict[str, Tensor]:
    """Every weight the architecture needs, matrices of `weight_type` (whole blocks per row) and the rest F32,
    without data."""
    shapes = arch_expected_shapes(args)  # the hybrid's own tensors too
    out = {}
    for name in arch_module(args.arch).required_weights(args):
        ne = shapes[name]
        quantized = len(ne) == 2 and ne[0] % block_size(weight_type) == 0  # the hybrid's conv kernel stays F32
        out[name] = shape_tensor(weight_type if quantized else GGMLType.F32, ne, name)
    return out


def file_weights(f) -> dict[str, Tensor]:
    """Every tensor of a GGUF file (its header is enough: `load_gguf(path, header_only=True)`) as a data-less
    weight of the file's own type and shape: the graphs built over them are the engine's, op for op and type for
    type, for pricing (a Q4_K_M file keeps its Q4_K, Q6_K and F32 tensors)."""
    return {name: weight_tensor(name, info) for name, info in f.tensors.items()}


def shape_caches(args: ModelArgs, kv_size: int) -> list:
    """Per layer what its graph reads and writes: F16 K/V caches of `kv_size` cells, or for a recurrent layer of a
    hybrid its conv and SSM states (F32 [n_embd_r, 1] and [n_embd_s, 1], one cell)."""
    recurrent = set(getattr(arch_module(args.arch), "recurrent_layers", lambda a: [])(args))
    out: list = []
    for i in range(args.n_layer):
        if i in recurrent:
            ssm = shape_tensor(GGMLType.F32, (args.n_embd_s, 1), f"cache_s_l{i}") if args.n_embd_s else None
            out.append(RecurrentLayerCache(shape_tensor(GGMLType.F32, (args.n_embd_r, 1), f"cache_r_l{i}"), ssm))
        else:
            out.append(LayerCache(shape_tensor(GGMLType.F16, (args.n_embd_kv, kv_size), f"cache_k_l{i}"),
                                  shape_tensor(GGMLType.F16, (args.n_embd_kv, kv_size), f"cache_v_l{i}")))
    return out


def ubatch_graph(args: ModelArgs, weights: dict[str, Tensor], caches: list, n_tokens: int, n_kv: int) -> Graph:
    """The graph of one micro-batch of `n_tokens` tokens seeing `n_kv` KV cells (flash attention, one output
    row), with the architecture's own inputs (the hybrid's position streams and rs_s_copy)."""
    arch = arch_module(args.arch)
    arch_inputs = getattr(arch, "make_inputs", None)
    # sliding-window layers see the cells of their own cache; here priced as seeing the same n_kv (an upper bound:
    # that cache holds at most n_swa + n_ubatch cells)
    n_kv_swa = n_kv if getattr(arch, "swa_layers", lambda a: [])(args) else 0
    inp = (arch_inputs(n_tokens, n_kv, 1, True) if arch_inputs is not None
           else make_inputs(n_tokens, n_kv, 1, True, n_kv_swa=n_kv_swa))
    graph, _ = arch.build(args, weights, inp, caches, n_kv, GraphOptions(flash_attn=True))
    return graph


def prefill_graphs(args: ModelArgs, n_tokens: int, weight_type: GGMLType = GGMLType.Q4_0,
                   n_ubatch: int = 512, weights: dict[str, Tensor] | None = None) -> Iterator[Graph]:
    """The graphs of the prefill micro-batches of `n_tokens` prompt tokens (flash attention, F16 KV cache), one at
    a time (a 36-layer graph is large: callers price one and drop it); over `weights` (file_weights) when given,
    else matrices of `weight_type`."""
    weights = weights if weights is not None else shape_only_weights(args, weight_type)
    kv_size = n_tokens + KV_PAD
    caches = shape_caches(args, kv_size)
    for start in range(0, n_tokens, n_ubatch):
        t = min(n_ubatch, n_tokens - start)
        n_kv = min(kv_size, -(-(start + t) // KV_PAD) * KV_PAD)
        yield ubatch_graph(args, weights, caches, t, n_kv)
