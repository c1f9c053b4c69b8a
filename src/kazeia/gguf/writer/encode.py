"""Encoding a tensor for the file: the quantizers, the type each matrix gets, matrices drawn in row blocks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf.quants import quantize

from kazeia.gguf.kquantize import quantize_q4_k, quantize_q6_k
from kazeia.gguf.writer.config import TYPES, SynthConfig, T


@dataclass(frozen=True)
class RowBlocks:
    """A matrix of `rows` rows drawn block by block (`make(n)` -> the next n rows, float32); encoded right when
    it is yielded, so the generator's later draws come after its rows, as with one draw."""

    rows: int
    make: object
    block: int = 16384

    def encoded(self, qtype: T) -> np.ndarray:
        parts = [encode_tensor(self.make(min(self.block, self.rows - r)), qtype)[0]
                 for r in range(0, self.rows, self.block)]
        return np.concatenate(parts)


def encode_tensor(arr, qtype: T) -> tuple[np.ndarray, T]:
    if isinstance(arr, RowBlocks):
        return arr.encoded(qtype), qtype
    if qtype == T.F32:
        return arr.astype(np.float32), T.F32
    if qtype == T.F16:
        return arr.astype(np.float16), T.F16
    if qtype == T.Q4_K:
        return quantize_q4_k(arr), qtype
    if qtype == T.Q6_K:
        return quantize_q6_k(arr), qtype
    return quantize(arr, qtype), qtype


def _use_more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits (src/llama-quant.cpp): the first and last eighth of the layers and every third
    one between them."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def tensor_type(cfg: SynthConfig, name: str) -> T:
    """The type a matrix gets: cfg.wtype's, except under q4_k_m, where llama.cpp's Q4_K_M rule (llama-quant.cpp:
    llama_tensor_get_type) gives Q6_K to output.weight and to attn_v / ffn_down of the use_more_bits layers."""
    if cfg.wtype != "q4_k_m":
        return TYPES[cfg.wtype]
    if name == "output.weight":
        return T.Q6_K
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down"):
        return T.Q6_K if _use_more_bits(int(parts[1]), cfg.n_layer) else T.Q4_K
    return T.Q4_K
