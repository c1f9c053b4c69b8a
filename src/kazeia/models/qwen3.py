"""Qwen3 (dense): Llama's skeleton plus a per-head RMS norm of Q and K before rope, and NEOX-mode rope.

Qwen3-4B: hidden 2560, 36 layers, 32 query heads x 128 (so q dim 4096 != hidden), 8 KV heads, FFN 9728,
rope base 1e6, RMS eps 1e-6, tied embeddings. `attention.key_length` is required: the generic default
hidden/heads (80) would be wrong.
"""

from __future__ import annotations

from kazeia.graph.builder import ROPE_NEOX, Graph
from kazeia.graph.tensor import Tensor
from kazeia.models import transformer
from kazeia.models.base import ModelArgs
from kazeia.models.transformer import GraphOptions, Inputs, LayerCache

ARCH = "qwen3"
ROPE_MODE = ROPE_NEOX
ATTN_OUT = None  # the name build_attn's output projection gets (src/models/qwen3.cpp)
QK_NORM = True


def required_weights(args: ModelArgs) -> list[str]:
    return transformer.required_weights(args, QK_NORM)


def build(args: ModelArgs, w: dict[str, Tensor], inp: Inputs, caches: list[LayerCache], n_kv: int,
          opts: GraphOptions) -> tuple[Graph, Tensor]:
    return transformer.build(args, w, inp, caches, n_kv, ROPE_MODE, QK_NORM, opts, ATTN_OUT)
