"""Tensors with ggml semantics: a type, ne[4] element counts, nb[4] byte strides, and a place in a buffer.

A tensor either owns storage (a byte range of a `Buffer`) or is a view of another tensor (`view_src`, the
root tensor, plus `view_offs` bytes). Numpy arrays over tensor data are zero-copy strided views shaped
(ne3, ne2, ne1, ne0), i.e. ggml's dims reversed, exactly as gguf-py shapes its arrays.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGMLType = GGMLQuantizationType

# numpy dtypes of the types whose elements are plain scalars
SCALAR_DTYPES: dict[GGMLType, np.dtype] = {
    GGMLType.F32: np.dtype(np.float32),
    GGMLType.F16: np.dtype(np.float16),
    GGMLType.F64: np.dtype(np.float64),
    GGMLType.I8: np.dtype(np.int8),
    GGMLType.I16: np.dtype(np.int16),
    GGMLType.I32: np.dtype(np.int32),
    GGMLType.I64: np.dtype(np.int64),
}


def type_name(t: GGMLType) -> str:
    return GGMLType(t).name.lower()


def block_size(t: GGMLType) -> int:
    return GGML_QUANT_SIZES[GGMLType(t)][0]


def type_size(t: GGMLType) -> int:
    """Bytes per block (for scalar types: bytes per element)."""
    return GGML_QUANT_SIZES[GGMLType(t)][1]


def is_quantized(t: GGMLType) -> bool:
    return GGMLType(t) not in SCALAR_DTYPES and GGMLType(t) != GGMLType.BF16


def row_size(t: GGMLType, n: int) -> int:
    """Bytes of a row of n elements (n must be a multiple of the block size)."""
    return type_size(t) * (n // block_size(t))


def contiguous_strides(t: GGMLType, ne: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    nb0 = type_size(t)
    nb1 = row_size(t, ne[0])
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


class BufferUsage(IntEnum):
    """ggml buffer usages: only COMPUTE tensors get the HTP 'compute' flag (cache maintenance applies)."""

    ANY = 0
    WEIGHTS = 1
    COMPUTE = 2


_next_address = itertools.count(1)


class Buffer:
    """A block of bytes at a fake but stable virtual address.

    Addresses matter: the HTP host de-duplicates tensor descriptors by data address, and the graph allocator
    reuses addresses, so two logical tensors can share one (exactly as with ggml-alloc).
    """

    ALIGN = 128  # HVX vector size; every allocation is aligned to it

    def __init__(self, name: str, data: np.ndarray, usage: BufferUsage = BufferUsage.ANY, source: str | None = None):
        """`source`: the file `data` maps from its first byte (a model's weights), if any."""
        if data.dtype != np.uint8 or data.ndim != 1:
            raise ValueError("buffer data must be a 1-D uint8 array")
        self.name = name
        self.data = data
        self.usage = usage
        self.source = source
        self.version = 0  # bumped by host-side writes outside the graph (KV cache clear): backends' copies expire
        # 4 GiB apart, 1 MiB aligned: distinct, readable, deterministic per process start order
        self.base_addr = 0x1_0000_0000 * next(_next_address)

    @classmethod
    def zeros(cls, name: str, nbytes: int, usage: BufferUsage = BufferUsage.ANY) -> Buffer:
        return cls(name, np.zeros(max(nbytes, 1), dtype=np.uint8), usage)

    @property
    def size(self) -> int:
        return int(self.data.size)

    def __repr__(self) -> str:
        return f"Buffer({self.name!r}, {self.size} B, {self.usage.name})"


class TFlag(IntEnum):
    INPUT = 1
    OUTPUT = 2
    WEIGHT = 4


VIEW_OPS = frozenset({"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})


@dataclass(eq=False)
class Tensor:
    type: GGMLType
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    name: str = ""
    op: str = "NONE"
    src: tuple[Tensor | None, ...] = ()
    params: dict = field(default_factory=dict)
    view_src: Tensor | None = None  # root tensor that owns the storage (never itself a view)
    view_offs: int = 0
    buffer: Buffer | None = None
    offset: int = 0  # byte offset of element 0 inside `buffer` (resolved for views at allocation)
    flags: int = 0
    weight_name: str | None = None  # GGUF name for weights ("blk.0.ffn_down.weight")
    layer: int | None = None
    # set by the scheduler at each placement from a routing rule (engine/policy.py): the path on the device
    # ("hvx": HMX off for this node, "cpu": on the host), and the rule's name; None: no rule decided
    route_path: str | None = None
    route_rule: str | None = None

    # ----- shape helpers -----
    @property
    def nelements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def nrows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def nbytes(self) -> int:
        """Bytes spanned from element 0 to the last element (ggml_nbytes); views may have gaps inside."""
        if self.nelements == 0:
            return 0
        if block_size(self.type) == 1:
            n = type_size(self.type)
            dims = range(4)
        else:
            n = self.ne[0] * self.nb[0] // block_size(self.type)
            dims = range(1, 4)
        for i in dims:
            n += (self.ne[i] - 1) * self.nb[i]
        return n

    def is_contiguous(self) -> bool:
        """ggml_is_contiguous: the strides of packed rows, except that a dimension of extent 1, never stepped
        through, may have any stride (a one-token view of a fused QKV is contiguous)."""
        want = contiguous_strides(self.type, self.ne)
        return all(n == 1 or a == b for n, a, b in zip(self.ne, self.nb, want))

    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def root(self) -> Tensor:
        return self.view_src if self.view_src is not None else self

    @property
    def is_computed(self) -> bool:
        """True for nodes a backend must execute: not views, not leaves, not empty (ggml-cpu's ggml_compute_forward
        and ggml-hexagon's op_is_compute, both versions, skip a tensor of zero elements: build_rs's zero-row
        copies)."""
        return self.op not in VIEW_OPS and self.nelements > 0

    @property
    def data_addr(self) -> int:
        if self.buffer is None:
            raise RuntimeError(f"tensor {self.name!r} is not allocated")
        return self.buffer.base_addr + self.offset

    def shape_str(self) -> str:
        return "[" + ",".join(str(x) for x in self.ne) + "]"

    def desc(self) -> str:
        """ggml_op_desc: the op name, or the unary/glu sub-op name."""
        if self.op == "UNARY":
            return self.params["unary_op"]
        if self.op == "GLU":
            return self.params["glu_op"]
        return self.op

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.op}, {type_name(self.type)}{self.shape_str()})"


def make_tensor(t: GGMLType, ne: tuple[int, ...], name: str = "", **kw) -> Tensor:
    ne4 = tuple(list(ne) + [1] * (4 - len(ne)))
    if block_size(t) > 1 and ne4[0] % block_size(t) != 0:
        raise ValueError(f"{name}: ne0={ne4[0]} is not a multiple of the {type_name(t)} block size")
    return Tensor(type=GGMLType(t), ne=ne4, nb=contiguous_strides(t, ne4), name=name, **kw)


# ----------------------------------------------------------------------------------------------
# data access: zero-copy numpy views through ne/nb (never "nbytes from the start")


def array(t: Tensor) -> np.ndarray:
    """Strided view of a scalar-typed tensor, shape (ne3, ne2, ne1, ne0). Writes go to the buffer."""
    v = t.__dict__.get("_view")  # (buffer, offset, type, ne, nb, array): a reused graph keeps its places
    if v is not None and v[0] is t.buffer and v[1] == t.offset and v[2] == t.type and v[3] == t.ne \
            and v[4] == t.nb:
        return v[5]
    arr = _array(t)
    t.__dict__["_view"] = (t.buffer, t.offset, t.type, t.ne, t.nb, arr)
    return arr


def _array(t: Tensor) -> np.ndarray:
    dt = SCALAR_DTYPES.get(GGMLType(t.type))
    if dt is None:
        raise TypeError(f"{t.name}: {type_name(t.type)} has no scalar view; use rows()")
    if t.buffer is None:
        raise RuntimeError(f"tensor {t.name!r} is not allocated")
    return np.ndarray(shape=t.ne[::-1], dtype=dt, buffer=t.buffer.data, offset=t.offset, strides=t.nb[::-1])


def rows(t: Tensor) -> np.ndarray:
    """Raw bytes of a block-typed (or any) tensor as rows: shape (ne3, ne2, ne1, row_bytes)."""
    if t.buffer is None:
        raise RuntimeError(f"tensor {t.name!r} is not allocated")
    rb = row_size(t.type, t.ne[0])
    if t.nb[0] != type_size(t.type):
        raise ValueError(f"{t.name}: rows of a {type_name(t.type)} tensor must be contiguous")
    return np.ndarray(shape=(t.ne[3], t.ne[2], t.ne[1], rb), dtype=np.uint8, buffer=t.buffer.data,
                      offset=t.offset, strides=(t.nb[3], t.nb[2], t.nb[1], 1))


def byte_extent(t: Tensor) -> tuple[int, int]:
    """[start, end) byte range inside the buffer that the tensor's elements touch."""
    return t.offset, t.offset + t.nbytes
