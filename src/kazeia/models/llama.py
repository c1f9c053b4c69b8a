"""Llama (and SmolLM2, Llama-2/3 style GGUFs): RMSNorm, GQA attention with NORM-mode rope, SwiGLU FFN.

The GGUF converter already permuted q/k rows so that rotating adjacent pairs (rope mode NORM) matches
Hugging Face's rotate_half; we must not undo that.
"""

from __future__ import annotations

from kazeia.graph.builder import ROPE_NORM, Graph
from kazeia.graph.tensor import Tensor
from kazeia.models import transformer
from kazeia.models.base import ModelArgs
from kazeia.models.transformer import GraphOptions, Inputs, LayerCache

ARCH = "llama"
ROPE_MODE = ROPE_NORM
ATTN_OUT = "attn_out"  # the name build_attn's output projection gets (src/models/llama.cpp)
QK_NORM = False


def required_weights(args: ModelArgs) -> list[str]:
    return transformer.required_weights(args, QK_NORM)


def build(args: ModelArgs, w: dict[str, Tensor], inp: Inputs, caches: list[LayerCache], n_kv: int,
          opts: GraphOptions) -> tuple[Graph, Tensor]:
    return transformer.build(args, w, inp, caches, n_kv, ROPE_MODE, QK_NORM, opts, ATTN_OUT)
