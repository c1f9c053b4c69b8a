"""The `cpu` backend: float32 numpy, BLAS GEMM for matmuls, a bounded cache of dequantized weights."""

from __future__ import annotations

import numpy as np

from kazeia.backends.base import Backend
from kazeia.backends.numpy_ops import KERNELS, NumpyOps
from kazeia.backends.weights import WeightCache
from kazeia.errors import UnsupportedError
from kazeia.gguf.quants import BlockFormat, dequantize
from kazeia.graph.tensor import SCALAR_DTYPES, GGMLType, Tensor, array, is_quantized, rows


class NumpyBackend(Backend, NumpyOps):
    """Shared plumbing of `cpu` and `ref`: loading sources, caching weights, writing results."""

    ft = np.float32

    def __init__(self, weight_cache: WeightCache | None = None) -> None:
        super().__init__()
        self.weights = weight_cache if weight_cache is not None else WeightCache()

    # --- Backend ---
    def supports(self, node: Tensor) -> bool:
        if node.op not in KERNELS:
            return False
        return all(s is None or _readable(s.type) for s in node.src) and _writable(node.type)

    def compute(self, node: Tensor) -> None:
        kern = KERNELS.get(node.op)
        if kern is None:
            raise UnsupportedError(f"op {node.op} ({node.name}) is not implemented by {self.name}")
        if self.hooks:
            self.emit_start(node, self._info(node, self.path_name))
        kern(self, node)
        if self.hooks:
            self.emit_complete(node, self._info(node, self.path_name))

    path_name = "cpu"

    # --- NumpyOps ---
    def load(self, t: Tensor) -> np.ndarray:
        if t.type in SCALAR_DTYPES:
            return np.asarray(array(t), dtype=self.ft)  # no copy for float32 sources
        if t.type == GGMLType.BF16 or is_quantized(t.type):
            return dequantize(rows(t), t.type, self.ft)
        raise UnsupportedError(f"{t.name}: type {t.type.name} cannot be read by {self.name}")

    def load_rows(self, t: Tensor, sel: np.ndarray) -> np.ndarray:
        """Selected rows of a 2-D weight, dequantized (GET_ROWS on an embedding table)."""
        if t.type in SCALAR_DTYPES:
            return array(t)[0, 0, sel].astype(self.ft)
        return dequantize(rows(t)[0, 0, sel], t.type, self.ft)

    def weight_matrix(self, t: Tensor) -> np.ndarray:
        key = (t.weight_name or t.name, t.data_addr, t.type, self.ft)
        return self.weights.get(key, lambda: np.ascontiguousarray(self.load(t)[0, 0]))

    def store(self, t: Tensor, values: np.ndarray) -> None:
        out = array(t)
        out[...] = values.reshape(out.shape) if values.shape != out.shape else values

    def store_rows(self, t: Tensor, idx: np.ndarray, vals: np.ndarray) -> None:
        out = array(t)  # (d3, d2, rows, ne0)
        for i3 in range(vals.shape[0]):
            for i2 in range(vals.shape[1]):
                sel = idx[i3 % idx.shape[0], i2 % idx.shape[1], 0]
                out[i3 % out.shape[0], i2 % out.shape[1], sel] = vals[i3, i2]


def _readable(t: GGMLType) -> bool:
    return t in SCALAR_DTYPES or t == GGMLType.BF16 or t in BlockFormat.registry


def _writable(t: GGMLType) -> bool:
    return t in (GGMLType.F32, GGMLType.F16)


class CpuBackend(NumpyBackend):
    name = "CPU"
    ft = np.float32
    float_dtype = "float32"
    path_name = "cpu"
