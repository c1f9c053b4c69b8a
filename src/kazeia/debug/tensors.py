"""Reading and writing a tensor's logical elements through ne/nb, for the debug tools.

Always through `kazeia.graph.tensor.array` / `rows`, so the gaps of a view are never read or written: scalar
types as (ne3, ne2, ne1, ne0) values, block types as raw block rows (ne3, ne2, ne1, row_bytes).
"""

from __future__ import annotations

import numpy as np

from kazeia.graph.tensor import SCALAR_DTYPES, BufferUsage, Tensor, TFlag, array, rows, type_size


def elements(t: Tensor) -> np.ndarray:
    """A writable strided view of the tensor's logical elements in their storage type."""
    return array(t) if t.type in SCALAR_DTYPES else rows(t)


def logical_values(t: Tensor) -> np.ndarray:
    """A C-contiguous copy of the tensor's logical elements."""
    return np.array(elements(t), order="C")


def write_elements(t: Tensor, values: np.ndarray) -> None:
    """Write storage-typed values into the tensor's elements (views included). A host-side write outside the
    graph: bump the buffer's version so backends drop their copies of it (the cpu backend's KV mirrors)."""
    elements(t)[...] = values
    t.buffer.version += 1


def read_bytes(t: Tensor) -> int:
    """Bytes from the data pointer that a kernel may read for the tensor: the span from element 0 to the last
    element, widened to the dense size (the quantized HMX kernel reads M*K floats from the data pointer whatever
    the row stride)."""
    n = t.nbytes
    if t.type in SCALAR_DTYPES:
        n = max(n, t.nelements * type_size(t.type))
    return n


def read_extent(t: Tensor) -> tuple[int, int]:
    """[start, end) bytes of the tensor's buffer that a kernel may read for it (`read_bytes` from its offset),
    clipped to the buffer."""
    assert t.buffer is not None
    return t.offset, min(t.buffer.size, t.offset + read_bytes(t))


def is_weight(t: Tensor) -> bool:
    """A model weight, or a view of one."""
    root = t.root
    return bool(root.flags & TFlag.WEIGHT) or (root.buffer is not None and root.buffer.usage == BufferUsage.WEIGHTS)
