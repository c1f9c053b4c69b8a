"""VTCM layout arithmetic shared by the layouts (matmul/, op_layouts.py, ...): the hex-utils.h helpers, the
scratch areas and the bump allocator (vtcm-utils.h) that carve them from vtcm_base. Re-exported by vtcm.py, the
home of the arena itself."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# --------------------------------------------------------------------------------------------------------------
# small arithmetic helpers (hex-utils.h semantics, for non-negative integers)


def align_up(v: int, a: int) -> int:
    return -(-v // a) * a


def align_down(v: int, a: int) -> int:
    return v // a * a


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------------------------------------------
# areas and the bump allocator


@dataclass(frozen=True)
class Area:
    """A scratch region: `size` is what the allocator reserved (rounded); `requested` what the op asked for;
    `written` the extent from `offset` the op actually writes for the given shapes (None: the whole area,
    or data-dependent)."""

    name: str
    offset: int
    size: int
    requested: int | None = None
    written: int | None = None

    @property
    def end(self) -> int:
        return self.offset + self.size

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "offset": self.offset, "size": self.size}
        if self.requested is not None and self.requested != self.size:
            d["requested"] = self.requested
        if self.written is not None:
            d["written"] = self.written
        return d


class BumpAllocator:
    """vtcm-utils.h: vtcm_seq_alloc semantics (a pointer that only moves forward), with each size rounded up to a
    granule first, as the callers do (2048 B for HMX matmul; each op's own rounding otherwise)."""

    def __init__(self, granule: int = 1, base: int = 0):
        self.granule = granule
        self.base = base
        self.ptr = base
        self.areas: list[Area] = []

    def alloc(self, name: str, size: int, granule: int | None = None, written: int | None = None) -> Area:
        g = self.granule if granule is None else granule
        a = Area(name, self.ptr, align_up(size, g), size, written)
        self.ptr += a.size
        self.areas.append(a)
        return a

    @property
    def used(self) -> int:
        return self.ptr - self.base


def row_extent(rows: int, stride: int, row_bytes: int) -> int:
    """Bytes from the start of a row spad that a DMA of `rows` rows of `row_bytes` at `stride` touches."""
    return 0 if rows <= 0 else (rows - 1) * stride + row_bytes


def thread_rows(nrows: int, n_threads: int) -> list[int]:
    """Rows each worker gets: ceil(nrows / n) each, the last ones fewer or none (the pattern of every HTP op)."""
    per = ceil_div(nrows, n_threads) if n_threads else 0
    return [max(0, min(per, nrows - t * per)) for t in range(n_threads)]


def overlaps(areas: Iterable[Area]) -> list[tuple[Area, Area]]:
    """Pairs of areas that share bytes (an allocator bug if ever non-empty)."""
    s = sorted((a for a in areas if a.size), key=lambda a: a.offset)
    return [(a, b) for a, b in zip(s, s[1:]) if b.offset < a.end]


def find_area(areas: Iterable[Area], name: str) -> Area:
    """The area called `name` (KeyError if the layout has none)."""
    for a in areas:
        if a.name == name:
            return a
    raise KeyError(name)
