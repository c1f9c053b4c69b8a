"""The inputs of a case's one-op graph: leaves with an init rule, and the seeded values written into them.

Inputs are initialized like test-backend-ops (U(-1, 1) by default; MUL U(0.9, 1.1), RMS_NORM U(-10, 10), GLU,
SILU and CPY U(-150, 150); quantized weights are gguf-py quantizations of random data), but seeded: every
leaf's data comes from (seed, case name, leaf name), so one case re-run alone sees the same numbers. Weights
are seeded by (seed, type, shape) instead, so cases that differ only in the token count share them (and the
per-process weight caches).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
from gguf import quants as gq

from kazeia.debug.tensors import elements
from kazeia.errors import KazeiaError
from kazeia.graph import builder as gb
from kazeia.graph.tensor import (
    SCALAR_DTYPES,
    GGMLType,
    Tensor,
    TFlag,
    block_size,
    is_quantized,
    make_tensor,
    type_name,
    type_size,
)


@dataclass
class Leaf:
    tensor: Tensor
    # ("uniform", lo, hi) | ("ids", hi, distinct) | ("mask", n_q) | ("zeros",) | ("weight", lo, hi) | ("extreme",)
    init: tuple
    own_buffer: bool = False  # persistent storage (KV cache, copy destination) rather than the compute buffer


class Leaves:
    """Creates the input tensors of a case's graph and remembers how to fill them."""

    def __init__(self) -> None:
        self.items: list[Leaf] = []

    def input(self, t: GGMLType | str, ne: tuple[int, ...], name: str, lo: float = -1.0, hi: float = 1.0,
              init: tuple | None = None, own_buffer: bool = False) -> Tensor:
        x = make_tensor(ggml_type(t), tuple(ne), name=name, flags=TFlag.INPUT)
        self.items.append(Leaf(x, init or ("uniform", lo, hi), own_buffer))
        return x

    def weight(self, t: GGMLType | str, ne: tuple[int, ...], name: str, extreme: bool = False) -> Tensor:
        """A model weight (flags WEIGHT: the HTP keeps it in its REPACK buffer, CPU/REF cache it dequantized).
        extreme: random valid blocks whose scales are any finite fp16 (+-65504, subnormals) instead of U(-1, 1)
        data quantized."""
        t = ggml_type(t)
        x = make_tensor(t, tuple(ne), name=name, flags=TFlag.WEIGHT,
                        weight_name=f"oracle.{type_name(t)}.{'x'.join(str(d) for d in ne)}")
        self.items.append(Leaf(x, ("extreme",) if extreme else ("weight", -1.0, 1.0), True))
        return x

    def permuted(self, t: GGMLType | str, ne: tuple[int, int, int, int], per: tuple[int, ...], name: str,
                 lo: float = -1.0, hi: float = 1.0) -> Tensor:
        """test-backend-ops' `per`: a base tensor whose dim per[i] holds logical dim i, permuted back to ne."""
        base_ne = [0] * 4
        for i in range(4):
            base_ne[per[i]] = ne[i]
        base = self.input(t, tuple(base_ne), name, lo, hi)
        inv = [0] * 4
        for i in range(4):
            inv[per[i]] = i
        return gb.permute(base, *inv)


def ggml_type(t: GGMLType | str) -> GGMLType:
    if isinstance(t, str):
        try:
            return GGMLType[t.upper()]
        except KeyError:
            raise KazeiaError(f"unknown tensor type '{t}'") from None
    return GGMLType(t)


def _encode(t: GGMLType, values: np.ndarray) -> np.ndarray:
    """Float values (numpy order) -> what the tensor stores (F16 rounding, real quantized blocks)."""
    if t == GGMLType.F32:
        return values.astype(np.float32)
    if t == GGMLType.F16:
        return values.astype(np.float16)
    if t in (GGMLType.I32, GGMLType.I64):
        return values.astype(SCALAR_DTYPES[t])
    if is_quantized(t):
        return np.ascontiguousarray(gq.quantize(values.astype(np.float32), t)).view(np.uint8)
    raise KazeiaError(f"cannot initialize a {type_name(t)} tensor")


def seed32(*parts: object) -> int:
    return zlib.crc32("|".join(str(p) for p in parts).encode())


def _mask_values(rng: np.random.Generator, n_kv: int, n_q: int, shape: tuple[int, ...]) -> np.ndarray:
    """A KQ mask: U(-1, 1), causal (query t of the last n_q positions sees cells <= n_kv - n_q + t) and ~20% extra
    holes, column 0 always visible so no row is entirely masked."""
    m = rng.uniform(-1, 1, shape).astype(np.float32)
    rows_ = shape[-2]
    for t in range(rows_):
        m[..., t, n_kv - n_q + t + 1:] = -np.inf
    holes = rng.uniform(size=shape) < 0.2
    m[holes] = -np.inf
    m[..., 0] = 0.0
    return m


# byte offsets of the fp16 fields (d, and m for Q4_1) inside one block
_F16_FIELDS = {GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q8_0: (0,), GGMLType.IQ4_NL: (0,)}


def _extreme_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite fp16 bit patterns: a quarter +-65504, a quarter subnormal, the rest any finite value."""
    bits = rng.integers(0, 1 << 16, size=n).astype(np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # exponent all ones would be inf/NaN
    kind = rng.integers(0, 4, size=n)
    sign = bits & 0x8000
    bits = np.where(kind == 0, sign | 0x7BFF, bits)
    sub = rng.integers(1, 0x400, size=n).astype(np.uint16)
    return np.where(kind == 1, sign | sub, bits).astype(np.uint16)


def _extreme_values(t: GGMLType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    n = int(np.prod(shape))
    if t == GGMLType.F16:
        return _extreme_f16_bits(rng, n).view(np.float16).reshape(shape)
    if t == GGMLType.F32:
        bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
        bits[(bits & 0x7F800000) == 0x7F800000] &= 0xBFFFFFFF
        return bits.view(np.float32).reshape(shape)
    if t not in _F16_FIELDS:
        raise KazeiaError(f"no extreme-scale blocks for {type_name(t)}")
    bs, ts = block_size(t), type_size(t)
    nb = n // bs
    blocks = rng.integers(0, 256, size=(nb, ts)).astype(np.uint8)
    for off in _F16_FIELDS[t]:
        blocks[:, off:off + 2] = _extreme_f16_bits(rng, nb).view(np.uint8).reshape(nb, 2)
    return blocks.reshape(shape[:-1] + (shape[-1] // bs * ts,))


def leaf_values(leaf: Leaf, rng: np.random.Generator) -> np.ndarray:
    t = leaf.tensor
    shape = t.ne[::-1]
    kind = leaf.init[0]
    if kind in ("uniform", "weight"):
        return _encode(t.type, rng.uniform(leaf.init[1], leaf.init[2], size=shape))
    if kind == "extreme":
        return _extreme_values(t.type, shape, rng)
    if kind == "zeros":
        return _encode(t.type, np.zeros(shape))
    if kind == "ids":
        hi, distinct = leaf.init[1], leaf.init[2]
        n = int(np.prod(shape))
        ids = rng.permutation(hi)[:n] if distinct else rng.integers(0, hi, size=n)
        return _encode(t.type, ids.reshape(shape))
    if kind == "mask":
        return _encode(t.type, _mask_values(rng, t.ne[0], leaf.init[1], shape))
    raise ValueError(f"unknown init {leaf.init}")


def write_values(t: Tensor, data: np.ndarray) -> None:
    """Write `leaf_values` output (values, or raw blocks of any shape) into the tensor's elements."""
    dst = elements(t)
    raw = data if t.type in SCALAR_DTYPES else np.ascontiguousarray(data).view(np.uint8)
    dst[...] = raw.reshape(dst.shape)
