"""What an op reads and what it produces, as the comparison sees them: the sources it consumes (weights excepted),
the part of its output it writes, and REF's float64 value of that output."""

from __future__ import annotations

import numpy as np

from kazeia.backends.ref import RefBackend
from kazeia.debug.tensors import is_weight
from kazeia.gguf.quants import Q8_0, dequantize
from kazeia.graph.tensor import SCALAR_DTYPES, GGMLType, Tensor, array, rows


def read_sources(node: Tensor) -> list[int]:
    """Positions of the sources whose contents the op consumes, weights excepted (both sides map the same
    file). SET_ROWS and CPY only write their destination operand, so it is not an input."""
    if node.op == "SET_ROWS":
        cand = [0, 1]
    elif node.op == "CPY":
        cand = [0]
    else:
        cand = list(range(len(node.src)))
    return [i for i in cand if i < len(node.src) and node.src[i] is not None and not is_weight(node.src[i])]


def _set_rows_ids(node: Tensor) -> np.ndarray | None:
    if node.op == "SET_ROWS" and node.ne[2] == node.ne[3] == 1:
        return np.asarray(array(node.src[1])).reshape(-1).astype(np.int64)
    return None


def output_raw(node: Tensor) -> np.ndarray:
    """The part of the output the op produces, in storage type. SET_ROWS: only the rows it writes (the rest of
    a KV cache is neither its work nor worth copying)."""
    ids = _set_rows_ids(node)
    if GGMLType(node.type) == GGMLType.Q8_0:  # a quantized KV cache: its rows' values (exact in float32)
        raw = rows(node)
        return dequantize(raw[0, 0, ids] if ids is not None else raw, node.type, np.float32)
    out = array(node)
    return np.array(out[0, 0, ids]) if ids is not None else np.array(out)


def ref_output(ref: RefBackend, node: Tensor) -> np.ndarray:
    """REF's float64 value of the output (the float64 shadow where REF keeps one)."""
    if node.type == GGMLType.F32:
        v = ref.value(node)
        ids = _set_rows_ids(node)
        return np.array(v[0, 0, ids] if ids is not None else v, dtype=np.float64)
    return output_raw(node).astype(np.float64)


def as_storable(values: np.ndarray, t: GGMLType) -> np.ndarray:
    """The reference rounded to the output's storage type, back in float64."""
    if GGMLType(t) == GGMLType.Q8_0:  # quantized as the CPU's SET_ROWS quantizes a KV cache row
        return dequantize(Q8_0.quantize_rows(values), t, np.float64)
    dt = SCALAR_DTYPES.get(GGMLType(t))
    if dt is None or not np.issubdtype(dt, np.floating) or dt == np.float64:
        return values
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(dt).astype(np.float64)
