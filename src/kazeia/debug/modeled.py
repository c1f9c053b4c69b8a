"""Modeled device rates of a scenario, priced by the HTP cost model (kazeia.backends.htp.cost): a calibrated
estimate, NOT a measurement. This is the one place a scenario's modeled t/s is computed: `upgrade`, `check` and
the tests that hold `bench`'s modeled column to it ask `ScenarioCost`. The cost model only sees the graphs it is
given; building them is this layer's job, so the backend never imports the models.

The graphs are the engine's (models/shapes.ubatch_graph: the architecture's own builder) over the file's own
tensors (models/shapes.file_weights: each weight's type and shape from the GGUF header, no data), so a Q4_K_M file
is priced with its Q4_K / Q6_K weights on the paths they take under each version, refused ops on the phone's CPU:
- prefill: the prompt's micro-batches of at most `n_ubatch` tokens, each seeing the KV cells filled so far
  (padded to 256 as llama.cpp's n_kv); t/s = prompt tokens / the sum of their modeled seconds;
- decode: one token after the prompt, seeing the prompt's cells; t/s = 1 / its modeled seconds.
"""

from __future__ import annotations

from kazeia.backends.htp import DEFAULT, CostModel, HtpSettings, graph_seconds
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import GGMLType
from kazeia.models.base import ModelArgs, model_args
from kazeia.models.shapes import KV_PAD, file_weights, prefill_graphs, shape_caches, ubatch_graph


class ScenarioCost:
    """A scenario's graphs (the prompt's micro-batches, one decode step), built once from the file's header and
    priced under any number of device settings (`rates`)."""

    def __init__(self, f, n_prompt: int, n_ubatch: int = 512) -> None:
        """`f`: a GGUFFile (`load_gguf(path, header_only=True)` is enough)."""
        self.args = model_args(f)
        weights = file_weights(f)
        self.n_prompt = n_prompt
        self.prefill: list[Graph] = list(prefill_graphs(self.args, n_prompt, n_ubatch=n_ubatch, weights=weights))
        n_kv = -(-(n_prompt + 1) // KV_PAD) * KV_PAD
        self.decode = ubatch_graph(self.args, weights, shape_caches(self.args, n_kv), 1, n_kv)

    def rates(self, settings: HtpSettings, c: CostModel = DEFAULT) -> tuple[float, float]:
        """(modeled prefill t/s, modeled decode t/s) under `settings`."""
        prefill_s = sum(graph_seconds(g.nodes, settings, c)[0] for g in self.prefill)
        decode_s = graph_seconds(self.decode.nodes, settings, c)[0]
        return (self.n_prompt / prefill_s if prefill_s > 0 else 0.0), (1.0 / decode_s if decode_s > 0 else 0.0)


def modeled_prefill_tps(args: ModelArgs, n_tokens: int, settings: HtpSettings,
                        weight_type: GGMLType = GGMLType.Q4_0, n_ubatch: int = 512, c: CostModel = DEFAULT) -> float:
    """Modeled prompt tokens/s of a model known only by its hyperparameters `args`, every matrix of `weight_type`
    (for sweeps over shapes that have no file; a file's scenario is `ScenarioCost`)."""
    total = sum(graph_seconds(g.nodes, settings, c)[0] for g in prefill_graphs(args, n_tokens, weight_type, n_ubatch))
    return n_tokens / total
