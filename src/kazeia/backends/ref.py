"""The `ref` backend: the float64 oracle.

Weights are dequantized exactly (float64 holds every value the block formats can express) and kept in a bounded
cache (`WeightCache`): keeping all of them would not fit for a 4B model (30 GB), so the cache keeps the first
matrices that fit a byte budget (KAZEIA_WEIGHT_CACHE_MB, default 768 MiB, so a run stays within the GGUF size +
1.5 GiB) and admits nothing more once full. A forward pass uses every weight once in the same order, so evicting the
least recently used one would throw away exactly the weight needed soonest (every access a miss past the budget);
keeping a fixed set makes the budget's worth of weights hits on every pass. Weights not kept are multiplied in
tiles of rows, never whole. The `cpu` backend and the HTP model keep no such copies: they compute from the
quantized bytes. Results of
float ops are kept as float64 "shadows" beside the float32 buffer contents, so a chain of ref ops never
rounds to float32 in between; storage types narrower than that (an F16 KV cache) are rounded, since that
rounding is part of the model. Kernels are the shared numpy ones; softmax never turns finite inputs into
NaN (a fully masked row gives zeros).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kazeia import settings
from kazeia.backends.cpu.backend import NumpyBackend
from kazeia.backends.cpu.kernels.dequant import dequantize_rows_f64
from kazeia.backends.libm import OWNED
from kazeia.backends.numpy_ops import scatter_rows
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import BufferUsage, GGMLType, Tensor, array, rows

_SHADOWED = (GGMLType.F32,)
# rows of a weight dequantized at a time when its whole copy is not kept: a tile the last-level cache holds while
# BLAS reads it (a 36-layer 4B model's REF pass at 38 tokens: 19 s with 4 MiB tiles, 45 s with 64 MiB ones; the
# same logits, bit for bit)
WEIGHT_TILE_BYTES = 4 << 20




def default_budget_bytes() -> int:
    """KAZEIA_WEIGHT_CACHE_MB (kazeia/settings.py), in bytes."""
    return int(settings.get().weight_cache_mb * 2**20)

# block types whose every value float32 holds exactly (an fp16 scale times a code of at most 8 bits: 19 significant
# bits), so the CPU's native float32 dequantization, widened, is bitwise the float64 one (gguf/quants.py); Q4_1 and
# the K-quants add a second term and stay on the float64 path
EXACT_IN_F32 = (GGMLType.Q4_0, GGMLType.Q8_0)


class WeightCache:
    def __init__(self, budget_bytes: int | None = None) -> None:
        self.budget = default_budget_bytes() if budget_bytes is None else int(budget_bytes)
        self._items: dict[object, np.ndarray] = {}
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.peak_bytes = 0

    def get(self, key: object, make: Callable[[], np.ndarray]) -> np.ndarray:
        arr = self._items.get(key)
        if arr is not None:
            self.hits += 1
            return arr
        self.misses += 1
        arr = make()
        if self.admits(arr.nbytes):
            self._items[key] = arr
            self.bytes += arr.nbytes
            self.peak_bytes = max(self.peak_bytes, self.bytes)
        return arr

    def cached(self, key: object) -> np.ndarray | None:
        """The kept array for key, or None (counts a hit when found)."""
        arr = self._items.get(key)
        if arr is not None:
            self.hits += 1
        return arr

    def admits(self, nbytes: int) -> bool:
        """Whether an array of nbytes would be kept now."""
        return self.bytes + nbytes <= self.budget

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0


class RefBackend(NumpyBackend):
    name = "REF"
    ft = np.float64
    float_dtype = "float64"
    math = OWNED  # kazeia's float64 rules (backends/libm.py): numpy's own change their last bits with the host
    path_name = "ref"

    def __init__(self, weight_cache: WeightCache | None = None) -> None:
        super().__init__()
        self.weights = weight_cache if weight_cache is not None else WeightCache()
        # root -> (root, float64 values, the buffer version they describe)
        self.shadows: dict[Tensor, tuple[Tensor, np.ndarray, int]] = {}

    def begin_graph(self, graph: Graph) -> None:
        super().begin_graph(graph)
        # compute-buffer tensors are new objects every graph: forget their shadows
        self.shadows = {k: v for k, v in self.shadows.items()
                        if v[0].buffer is not None and v[0].buffer.usage != BufferUsage.COMPUTE}

    def foreign_write(self, root: Tensor) -> None:
        self.shadows.pop(root, None)

    # --- weights: exact float64 copies, kept while the budget lasts ---
    def _weight_key(self, t: Tensor) -> tuple:
        return (t.weight_name or t.name, t.data_addr, t.type, self.ft)

    def weight_matrix(self, t: Tensor) -> np.ndarray:
        return self.weights.get(self._weight_key(t), lambda: np.ascontiguousarray(self.load(t)[0, 0]))

    def weight_matmul(self, t: Tensor, y: np.ndarray) -> np.ndarray:
        w = self.weights.cached(self._weight_key(t))
        if w is not None:
            return y @ w.T
        if not self.weights.admits(t.ne[1] * t.ne[0] * np.dtype(self.ft).itemsize):
            return self._tiled_weight_matmul(t, y)
        return y @ self.weight_matrix(t).T

    def _tiled_weight_matmul(self, t: Tensor, y: np.ndarray) -> np.ndarray:
        """y @ W^T with W dequantized WEIGHT_TILE_BYTES of rows at a time (a weight the cache does not keep:
        the whole float64 copy of a 4B model's FFN matrix alone is 200 MB, a K=5120 one 700 MB)."""
        n, k = t.ne[1], t.ne[0]
        out = np.empty((y.shape[0], n), dtype=np.result_type(y.dtype, self.ft))
        step = max(1, WEIGHT_TILE_BYTES // (k * np.dtype(self.ft).itemsize))
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            out[:, r0:r1] = y @ self.load_rows(t, slice(r0, r1)).T
        return out

    def _shadow_view(self, t: Tensor) -> np.ndarray | None:
        entry = self.shadows.get(t.root)
        if entry is not None and entry[2] != entry[0].buffer.version:  # the buffer was rewritten behind the graph
            del self.shadows[t.root]  # (a context reset, a recovery restoring the recurrent state): stale
            entry = None
        if entry is None or t.type not in _SHADOWED or t.root.type != t.type:
            return None
        root, sh, _ = entry
        el = 4  # bytes per F32 element in the buffer
        start = (t.offset - root.offset) // el
        flat = sh.reshape(-1)
        strides = tuple(nb // el * 8 for nb in t.nb[::-1])
        return np.lib.stride_tricks.as_strided(flat[start:], shape=t.ne[::-1], strides=strides, writeable=True)

    def load(self, t: Tensor) -> np.ndarray:
        sv = self._shadow_view(t)
        if sv is not None:
            return np.array(sv, dtype=np.float64)
        if t.type in EXACT_IN_F32:
            raw = rows(t)
            return self._dequant(raw.reshape(-1, raw.shape[-1]), t).reshape(t.ne[::-1])
        return super().load(t)

    def load_rows(self, t: Tensor, sel) -> np.ndarray:
        if t.type in EXACT_IN_F32:
            return self._dequant(np.ascontiguousarray(rows(t)[0, 0, sel]), t)
        return super().load_rows(t, sel)

    @staticmethod
    def _dequant(raw: np.ndarray, t: Tensor) -> np.ndarray:
        """float64 values of rows of a type float32 holds exactly, through the CPU's native dequantization."""
        return dequantize_rows_f64(raw, t.type, t.ne[0])

    def store(self, t: Tensor, values: np.ndarray) -> None:
        super().store(t, values)
        if t.type in _SHADOWED:
            self._ensure_shadow(t)
            sv = self._shadow_view(t)
            sv[...] = values.reshape(sv.shape)

    def store_rows(self, t: Tensor, idx: np.ndarray, vals: np.ndarray) -> None:
        super().store_rows(t, idx, vals)
        if t.type in _SHADOWED:
            self._ensure_shadow(t)
            scatter_rows(self._shadow_view(t), idx, vals)

    def _ensure_shadow(self, t: Tensor) -> None:
        root = t.root
        if root not in self.shadows and root.type in _SHADOWED:
            self.shadows[root] = (root, array(root).astype(np.float64), root.buffer.version)

    def value(self, t: Tensor) -> np.ndarray:
        """The float64 value of a tensor as the oracle knows it (shadow if any, else the buffer)."""
        return self.load(t)
