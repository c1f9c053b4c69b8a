"""The `ref` backend: the float64 oracle.

Weights are dequantized exactly (float64 holds every value the block formats can express). Results of
float ops are kept as float64 "shadows" beside the float32 buffer contents, so a chain of ref ops never
rounds to float32 in between; storage types narrower than that (an F16 KV cache) are rounded, since that
rounding is part of the model. Kernels are the shared numpy ones; softmax never turns finite inputs into
NaN (a fully masked row gives zeros).
"""

from __future__ import annotations

import numpy as np

from kazeia.backends.cpu import NumpyBackend
from kazeia.backends.numpy_ops import scatter_rows
from kazeia.backends.weights import WeightCache
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import BufferUsage, GGMLType, Tensor, array

_SHADOWED = (GGMLType.F32,)


class RefBackend(NumpyBackend):
    name = "REF"
    ft = np.float64
    float_dtype = "float64"
    path_name = "ref"

    def __init__(self, weight_cache: WeightCache | None = None) -> None:
        super().__init__(weight_cache)
        self.shadows: dict[int, tuple[Tensor, np.ndarray]] = {}  # id(root) -> (root, float64 values)

    def begin_graph(self, graph: Graph) -> None:
        super().begin_graph(graph)
        # compute-buffer tensors are new objects every graph: forget their shadows
        self.shadows = {k: v for k, v in self.shadows.items()
                        if v[0].buffer is not None and v[0].buffer.usage != BufferUsage.COMPUTE}

    def foreign_write(self, root: Tensor) -> None:
        self.shadows.pop(id(root), None)

    def _shadow_view(self, t: Tensor) -> np.ndarray | None:
        entry = self.shadows.get(id(t.root))
        if entry is None or t.type not in _SHADOWED or t.root.type != t.type:
            return None
        root, sh = entry
        el = 4  # bytes per F32 element in the buffer
        start = (t.offset - root.offset) // el
        flat = sh.reshape(-1)
        strides = tuple(nb // el * 8 for nb in t.nb[::-1])
        return np.lib.stride_tricks.as_strided(flat[start:], shape=t.ne[::-1], strides=strides, writeable=True)

    def load(self, t: Tensor) -> np.ndarray:
        sv = self._shadow_view(t)
        if sv is not None:
            return np.array(sv, dtype=np.float64)
        return super().load(t)

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
        if id(root) not in self.shadows and root.type in _SHADOWED:
            self.shadows[id(root)] = (root, array(root).astype(np.float64))

    def value(self, t: Tensor) -> np.ndarray:
        """The float64 value of a tensor as the oracle knows it (shadow if any, else the buffer)."""
        return self.load(t)
