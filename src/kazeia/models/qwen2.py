"""Qwen2 / Qwen2.5 (dense): Llama's skeleton with biases on the q, k and v projections, no q/k norm, and
NEOX-mode rope (llama.cpp src/models/qwen2.cpp: build_qkv adds each bias right after its MUL_MAT, under the same
Qcur/Kcur/Vcur name; build_attn's output projection is not named).

Qwen2.5-1.5B: hidden 1536, 28 layers, 12 query heads x 128, 2 KV heads, FFN 8960, rope base 1e6, RMS eps 1e-6,
tied embeddings; Qwen2.5-3B: hidden 2048, 36 layers, 16 x 128, 2 KV heads, FFN 11008, tied.
"""

from __future__ import annotations

from kazeia.graph.builder import ROPE_NEOX, Graph
from kazeia.graph.tensor import Tensor
from kazeia.models import transformer
from kazeia.models.base import ModelArgs
from kazeia.models.transformer import GraphOptions, Inputs, LayerCache

ARCH = "qwen2"
ROPE_MODE = ROPE_NEOX
ATTN_OUT = None  # build_attn's output projection keeps ggml's node_<index> (src/models/qwen2.cpp)
QK_NORM = False


def required_weights(args: ModelArgs) -> list[str]:
    """The llama set; the q/k/v biases are optional, as llama.cpp's create_tensor_qkv makes them (converted Qwen2
    checkpoints have them). A fused attn_qkv.weight is not read here: such a file is refused for its missing
    attn_q.weight."""
    return transformer.required_weights(args, QK_NORM)


def build(args: ModelArgs, w: dict[str, Tensor], inp: Inputs, caches: list[LayerCache], n_kv: int,
          opts: GraphOptions) -> tuple[Graph, Tensor]:
    return transformer.build(args, w, inp, caches, n_kv, ROPE_MODE, QK_NORM, opts, ATTN_OUT)
