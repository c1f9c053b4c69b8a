"""The recurrent-state cache of hybrid models, beside the KV cache (llama.cpp's llama_memory_recurrent).

Every recurrent (gated-delta-net) layer keeps, per cell, a conv state row `cache_r_l{il}` (the last d_conv - 1
inputs of each conv channel) and an SSM state row `cache_s_l{il}` (the delta-rule state), both F32 as llama.cpp's
default type_r/type_s. Sequence s uses cell s. The graph reads the rows of its cells (GET_ROWS through the
`rs_s_copy` input) and writes the new states back in place (CPY), so a prompt split into micro-batches, then
decode, carries the state exactly. Unlike the KV cache the state cannot be rewound: it always describes all
`n_past` tokens. `clear` zeroes it (llama.cpp zeroes a freshly allocated cell inside the graph instead).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, Tensor, array, make_tensor
from kazeia.models.base import ModelArgs
from kazeia.models.transformer import RecurrentLayerCache


class RecurrentCache:
    def __init__(self, n_embd_r: int, n_embd_s: int, layers: list[int], n_layer: int, n_cells: int = 1) -> None:
        self.n_cells = n_cells
        self.layers: list[RecurrentLayerCache | None] = [None] * n_layer
        tensors: list[Tensor] = []
        for il in layers:
            r = make_tensor(GGMLType.F32, (n_embd_r, n_cells), name=f"cache_r_l{il}")
            s = make_tensor(GGMLType.F32, (n_embd_s, n_cells), name=f"cache_s_l{il}") if n_embd_s else None
            self.layers[il] = RecurrentLayerCache(r, s)
            tensors += [r] if s is None else [r, s]
        sizes = [(t.nbytes + Buffer.ALIGN - 1) // Buffer.ALIGN * Buffer.ALIGN for t in tensors]
        self.buffer = Buffer.zeros("recurrent_state", sum(sizes), BufferUsage.ANY)
        off = 0
        for t, n in zip(tensors, sizes):
            t.buffer, t.offset = self.buffer, off
            off += n
        self.fresh = True  # no cell holds a state yet (llama.cpp zeroes such a cell in the graph: build_rs)

    @classmethod
    def for_model(cls, args: ModelArgs, arch: ModuleType, n_seq: int = 1) -> RecurrentCache | None:
        """The cache an architecture with recurrent layers needs, one cell per sequence (llama.cpp's
        max(1, n_seq_max) cells); None for the others."""
        layers = getattr(arch, "recurrent_layers", None)
        if layers is None or not layers(args):
            return None
        return cls(args.n_embd_r, args.n_embd_s, layers(args), args.n_layer, n_seq)

    @property
    def nbytes(self) -> int:
        return self.buffer.size

    def clear(self) -> None:
        self.buffer.data[:] = 0
        self.buffer.version += 1  # backends' copies of these bytes expire
        self.fresh = True

    def layer_caches(self, kv_layers: list) -> list:
        """Per layer what its graph reads and writes: the recurrent state, else the KV cache."""
        return [r if r is not None else kv for r, kv in zip(self.layers, kv_layers)]

    def write_inputs(self, inp) -> None:
        array(inp.s_copy)[...] = np.arange(inp.s_copy.ne[0], dtype=np.int32)  # sequence s reads cell s
