"""The KV caches: one per context (llama.cpp's llama_kv_cache), and for sliding-window models a second one for the
SWA layers (llama_kv_cache_iswa: the base cache keeps the full-attention layers, this one the SWA layers).

The SWA cache's size: GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256) cells (llama-kv-cache-iswa.cpp, one stream), so a
micro-batch and the window before it always fit. With one sequence, llama_kv_cache::find_slot takes cells in order
from its head and reuses a cell once the window has passed it (is_masked_swa against the sequence's last
position), so position p lives in cell p mod size. A token at position q sees the cells holding positions p with
p <= q and q - p < n_swa (LLAMA_SWA_TYPE_STANDARD).
"""

from __future__ import annotations

import numpy as np

from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, make_tensor
from kazeia.memory import check_fits
from kazeia.models.base import ModelArgs
from kazeia.models.transformer import LayerCache

PAD = 256  # llama.cpp pads the SWA cache's size and the cells a graph sees to 256


class KVCache:
    """Per-layer K and V caches [n_embd_kv, size]. One sequence: cell i holds position i. Several sequences (one
    unified stream, llama.cpp's -kvu): cells are taken in order and `cell_seq`/`cell_pos` say whose token each
    holds, which the mask reads."""

    def __init__(self, args: ModelArgs, size: int, type_k: GGMLType = GGMLType.F16,
                 type_v: GGMLType = GGMLType.F16, layers: list[int] | None = None) -> None:
        """`layers`: the layers with attention (default all; a hybrid's other layers have None here)."""
        self.size = size
        self.layers: list[LayerCache | None] = [None] * args.n_layer
        tensors = []
        for il in range(args.n_layer) if layers is None else layers:
            k = make_tensor(type_k, (args.n_embd_kv, size), name=f"cache_k_l{il}")
            v = make_tensor(type_v, (args.n_embd_kv, size), name=f"cache_v_l{il}")
            tensors += [k, v]
            self.layers[il] = LayerCache(k, v)
        total = sum((t.nbytes + Buffer.ALIGN - 1) // Buffer.ALIGN * Buffer.ALIGN for t in tensors)
        check_fits(f"the KV cache for a context of {size} tokens ({len(tensors) // 2} layers, K and V "
                   f"{type_k.name}/{type_v.name})", total, "; lower -c")
        self.buffer = Buffer.zeros("kv_cache", total, BufferUsage.ANY)
        off = 0
        for t in tensors:
            t.buffer, t.offset = self.buffer, off
            off += (t.nbytes + Buffer.ALIGN - 1) // Buffer.ALIGN * Buffer.ALIGN
        self.n_past = 0  # cells in use (one sequence: its length)
        self.cell_seq = np.full(size, -1, dtype=np.int32)  # several sequences: the owner of each cell (-1: free)
        self.cell_pos = np.zeros(size, dtype=np.int64)

    def clear(self) -> None:
        self.buffer.data[:] = 0
        self.buffer.version += 1
        self.n_past = 0
        self.cell_seq[:] = -1


def swa_cache_size(n_ctx: int, n_swa: int, n_ubatch: int) -> int:
    """llama_kv_cache_iswa's size_swa for one sequence."""
    return -(-min(n_ctx, n_swa + n_ubatch) // PAD) * PAD


class SwaCache(KVCache):
    def __init__(self, args: ModelArgs, n_ctx: int, n_swa: int, n_ubatch: int, layers: list[int],
                 type_k: GGMLType = GGMLType.F16, type_v: GGMLType = GGMLType.F16) -> None:
        super().__init__(args, swa_cache_size(n_ctx, n_swa, n_ubatch), type_k, type_v, layers)
        self.n_swa = n_swa
        self.cell_pos[:] = -1  # the position each cell holds (-1: empty)

    def clear(self) -> None:
        super().clear()
        self.cell_pos[:] = -1

    def cells(self, pos: np.ndarray) -> np.ndarray:
        """The cells the tokens at `pos` go to (positions ascending, one sequence)."""
        return (pos % self.size).astype(np.int64)

    def n_kv(self, n_end: int) -> int:
        """The cells a graph sees after `n_end` tokens: every cell used so far, padded (llama_kv_cache::get_n_kv)."""
        used = min(n_end, self.size)
        return min(self.size, max(PAD, -(-used // PAD) * PAD))

    def store(self, pos: np.ndarray) -> np.ndarray:
        """Record the micro-batch's positions in their cells; returns the cells."""
        cells = self.cells(pos)
        self.cell_pos[cells] = pos
        return cells

    def visible(self, pos: np.ndarray, n_kv: int) -> np.ndarray:
        """(T, n_kv): which of the first n_kv cells each token sees (causal, within the window)."""
        at = self.cell_pos[:n_kv][None, :]
        q = pos[:, None]
        return (at >= 0) & (at <= q) & (q - at < self.n_swa)

    def keeps(self, n: int, n_past: int) -> bool:
        """Whether the first n tokens are still whole here after n_past (no cell of the window before n was
        reused by a later position), so the context can rewind to n."""
        return n_past <= self.size or n == n_past
