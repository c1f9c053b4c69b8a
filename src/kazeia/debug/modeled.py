"""Modeled device rates of whole models from their shapes (kazeia.models.shapes) priced by the HTP cost model
(kazeia.backends.htp.cost): a calibrated estimate, NOT a measurement. The cost model only sees the graphs it is
given; building them is this layer's job, so the backend never imports the models."""

from __future__ import annotations

from kazeia.backends.htp import DEFAULT, CostModel, HtpSettings, graph_seconds
from kazeia.graph.tensor import GGMLType
from kazeia.models.base import ModelArgs
from kazeia.models.shapes import prefill_graphs


def modeled_prefill_tps(args: ModelArgs, n_tokens: int, settings: HtpSettings,
                        weight_type: GGMLType = GGMLType.Q4_0, n_ubatch: int = 512, c: CostModel = DEFAULT) -> float:
    """Modeled prompt tokens/s of a model with hyperparameters `args`: its prefill graphs are built from shapes
    only and costed, never run."""
    total = sum(graph_seconds(g.nodes, settings, c)[0] for g in prefill_graphs(args, n_tokens, weight_type, n_ubatch))
    return n_tokens / total
