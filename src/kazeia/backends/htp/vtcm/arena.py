"""VTCM of the emulated Hexagon NPU: the byte arena (here), its areas and bump allocator and the arithmetic the
layouts share (areas.py, imported from here too).

`Vtcm` is a real byte array that persists across ops and batches and is never cleared (as on the device, where
correctness relies on each op writing every byte it later reads). How each op carves its scratch out of it is
pure arithmetic in the sibling modules, reproducing for given shapes the layout each op of the May 2026
ggml-hexagon snapshot (ggml-org/ggml bb4dc86a, `src/ggml-hexagon/htp/`) computes from `vtcm_base`: `plan`
(MUL_MAT: the HMX chunk search and its rounded bump allocation, which can exceed VTCM; the HVX
spads; the dispatch), `deep_loads` (the HMX load runs of a plan, and the bank crossings among them),
`scratch_layouts` (the row ping-pong spads of the element-wise ops, softmax, rope and both flash attentions)
and `src1_shortcut` (what each op does to the src1 "already quantized" shortcut). The backend
executes these plans and the `kazeia htp plan` command prints them, so every number a report shows comes from
there.

Profiles: "2026-05" is the snapshot as it is (HMX search budgets 256 B of overhead while the allocator rounds each
area to 2048 B; an HMX failure re-enters `op_matmul`; some ops leave the src1 "already quantized" shortcut
stale). "robust" is what a fixed backend does: the search checks the rounded layout, an HMX failure falls back
to HVX, and every op that writes VTCM drops the shortcut.

All offsets are bytes from `vtcm_base`. Upstream file/function names in comments say where each rule was read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kazeia.backends.htp import profiles
from kazeia.backends.htp.archs import HMX_SKELS
from kazeia.backends.htp.settings import DEFAULT_HVX_THREADS, MAX_HVX_THREADS  # noqa: F401 (layouts take them)
from kazeia.backends.htp.settings import DEFAULT_VTCM as DEFAULT_VTCM_SIZE
from kazeia.backends.htp.vtcm.areas import (  # noqa: F401 (the layout arithmetic, imported from here too)
    Area,
    BumpAllocator,
    align_down,
    align_up,
    ceil_div,
    find_area,
    overlaps,
    row_extent,
    thread_rows,
)

PROFILES = tuple(profiles.PROFILES)
DEFAULT_PROFILE = "robust"

VLEN = 128  # HVX vector bytes: the row alignment of all HVX spads
HMX_TILE = 32  # rows/cols of one HMX fp16 tile
HMX_TILE_BYTES = 2048  # 32 x 32 fp16: granule of every HMX matmul area
HMX_SCALES_BYTES = 256  # output scale/bias block: 64 fp16 scales then 64 fp16 zero biases
HMX_ARCHS = HMX_SKELS["2026-05"]  # htp/CMakeLists.txt: HMX code is only built for these (archs.py)


def check_profile(profile: str) -> str:
    return profiles.get_profile(profile).name


def hmx_scale_block(scale: float = 1.0) -> bytes:
    """The 256 B block `Q6_bias_mxmem2_A` loads: 64 x fp16 `scale`, then 64 x fp16 0 (bias)
    (hmx-utils.h: hmx_init_column_scales). HMX matmul uses 1.0; HMX flash attention also keeps one with the qk scale."""
    v = np.zeros(128, dtype=np.float16)
    v[:64] = np.float16(scale)
    return v.tobytes()


# --------------------------------------------------------------------------------------------------------------
# the arena


class VtcmAccessError(Exception):
    """An access outside the VTCM block. On the device this is a precise bus error that kills the DSP process;
    the DSP model turns it into a PD crash (deliberately not a KazeiaError: it is a modelled hardware fault)."""

    def __init__(self, offset: int, nbytes: int, size: int, access: str):
        super().__init__(f"VTCM {access} out of range: offset {offset:#x} + {nbytes} B outside a {size} B block")
        self.offset = offset
        self.nbytes = nbytes
        self.size = size
        self.access = access


@dataclass
class _LazyWrite:
    """A deferred `Vtcm.write`: `live` are the byte ranges no later write has covered yet."""

    offset: int
    nbytes: int
    make: Callable[[], np.ndarray]
    live: list[tuple[int, int]]
    hits: int = 0  # covers that reached its extent (see Vtcm._cover)

    def land(self, mem: np.ndarray) -> None:
        raw = np.ascontiguousarray(self.make()).reshape(-1).view(np.uint8)
        if raw.size != self.nbytes:
            raise ValueError(f"deferred VTCM write at {self.offset:#x} made {raw.size} B, announced {self.nbytes}")
        for a, b in self.live:
            mem[a:b] = raw[a - self.offset:b - self.offset]


@dataclass
class _ReadyWrite:
    """A deferred `Vtcm.write_deferred` of bytes already made: `data` lands at `offset`; a..b is its one live range
    (a write that would split it lands the part before the split first, so there is never more than one)."""

    offset: int
    data: np.ndarray
    a: int
    b: int

    def land(self, mem: np.ndarray, hi: int) -> None:
        """Land the live bytes up to `hi`; the rest stays deferred."""
        hi = min(hi, self.b)
        if self.a < hi:
            mem[self.a:hi] = self.data[self.a - self.offset:hi - self.offset]
            self.a = hi

    def cut(self, mem: np.ndarray, lo: int, hi: int) -> bool:
        """Bytes lo..hi (overlapping the live range) are written now: inside it, the part before lo lands now and
        the part after hi stays deferred; else the range shrinks. True when nothing is left live."""
        if lo > self.a and hi < self.b:
            self.land(mem, lo)
            self.a = hi
        elif lo <= self.a:
            self.a = hi
        else:
            self.b = lo
        return self.a >= self.b


# A deferred image that later writes keep cutting into without ever covering it (a prefill's HMX tiles, partly
# overwritten by every decode op after it) would make each of those writes walk its live ranges, token after token
# (~60 ms a decode token of the 36-layer model after a pp128). After this many covers it is made and landed: its
# live ranges are disjoint from every other deferred write's, so landing it now leaves the same bytes.
LAND_AFTER_HITS = 64


class Vtcm:
    """A VTCM block: `size` bytes whose contents persist across ops and batches and are never cleared.

    `fill` is the initial byte value; `fill=None` starts from seeded random bytes (a device does not zero VTCM,
    so garbage is the honest starting point when hunting stale reads).
    """

    def __init__(self, size: int = DEFAULT_VTCM_SIZE, fill: int | None = 0, seed: int = 0):
        if size <= 0:
            raise ValueError("VTCM size must be positive")
        if fill is None:
            self._mem = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
        else:
            self._mem = np.full(size, fill, dtype=np.uint8)
        self._pending: list[_LazyWrite] = []
        self._ready: list[_ReadyWrite] = []

    @property
    def mem(self) -> np.ndarray:
        """The whole byte array, every deferred write made first."""
        self._flush(0, self.size)
        return self._mem

    @property
    def size(self) -> int:
        return int(self._mem.size)

    def check(self, offset: int, nbytes: int, access: str = "access") -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise VtcmAccessError(offset, nbytes, self.size, access)

    def read(self, offset: int, nbytes: int) -> bytes:
        self.check(offset, nbytes, "read")
        self._flush(offset, offset + nbytes)
        return self._mem[offset:offset + nbytes].tobytes()

    def write(self, offset: int, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        if isinstance(data, np.ndarray):
            raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        else:
            raw = np.frombuffer(data, dtype=np.uint8)
        self.check(offset, raw.size, "write")
        self._cover(offset, offset + raw.size)
        self._mem[offset:offset + raw.size] = raw

    def write_runs(self, runs: Iterable[tuple[int, np.ndarray]], box: tuple[int, int] | None = None) -> None:
        """`write(offset, data)` for each (offset, data) in order, data already flat uint8 (C-contiguous): the
        bound op programs of a decode (scratch.py, hvx/path.py) write a few thousand small runs a token, so
        the conversions and calls of `write` are left out; the checks and the bytes are the same. `box`: an
        extent (lo, hi) holding every run, when the caller knows one (no cover needed for the ready writes
        outside it)."""
        mem, size = self._mem, self._mem.size
        cover = bool(self._pending) or (bool(self._ready) and (
            box is None or any(r.a < box[1] and box[0] < r.b for r in self._ready)))
        for offset, raw in runs:
            end = offset + raw.size
            if offset < 0 or end > size:
                raise VtcmAccessError(offset, raw.size, size, "write")
            if cover:
                self._cover(offset, end)
            mem[offset:end] = raw

    def run_views(self, spans: Iterable[tuple[int, int]]) -> list[np.ndarray]:
        """Writable views of the (offset, nbytes) spans, every one checked now: the destinations of a program
        that `write_views` runs again and again."""
        spans = list(spans)
        for offset, nbytes in spans:
            self.check(offset, nbytes, "write")
        return [self._mem[o:o + n] for o, n in spans]

    def write_views(self, spans: list[tuple[int, int]], pairs: list[tuple[np.ndarray, np.ndarray]],
                    box: tuple[int, int] | None = None, copy=None) -> None:
        """dst[...] = src for each (dst, src) of `pairs`, dst made by `run_views(spans)`: the same as
        `write_runs` of those spans (a write changes the bytes, its cover only the deferred writes). `box`:
        `span_box(spans)`, when the caller keeps it. `copy`: a callable making the same copies at once (a
        native copy of the pairs' bytes, fast.CopyRuns), used instead of the pairs when given."""
        if self._pending or self._ready:
            box = box if box is not None else span_box(spans)
            lo, hi = box
            if any(p.offset < hi and lo < p.offset + p.nbytes for p in self._pending):
                for offset, nbytes in spans:
                    self._cover(offset, offset + nbytes)
            elif self._ready:  # (no lazy image under these spans: the usual case in a decode)
                self._cover_spans(spans, box)
        if copy is not None:
            copy()
            return
        for dst, src in pairs:
            dst[...] = src

    def _cover_spans(self, spans: list[tuple[int, int]], box: tuple[int, int]) -> None:
        """`_cover_ready` of each span in order, ready write by ready write: their live ranges are disjoint and
        landing one touches only its own bytes, so each one sees the same sequence of covers as span by span.
        A ready write outside the spans' extent (`box`) is untouched by every span's cover: skipped."""
        lo, hi = box
        dead = False
        for r in self._ready:
            if r.a < hi and lo < r.b:
                for offset, nbytes in spans:
                    end = offset + nbytes
                    if nbytes and r.a < end and offset < r.b and r.cut(self._mem, offset, end):
                        dead = True
                        break
        if dead:
            self._ready = [r for r in self._ready if r.a < r.b]

    def write_lazy(self, offset: int, nbytes: int, make: Callable[[], np.ndarray]) -> None:
        """`write(offset, make())`, with `make` called only when some byte of it is read (read, view, mem).

        For images an op leaves behind that usually nothing reads before the next op overwrites them (the HMX
        weight tiles): the bytes anyone sees are the same as with `write`, and the range is checked now.
        `make` must return exactly `nbytes` bytes and depend only on what it captured."""
        self.check(offset, nbytes, "write")
        self._cover(offset, offset + nbytes)
        if nbytes:
            self._pending.append(_LazyWrite(offset, nbytes, make, [(offset, offset + nbytes)]))

    def write_deferred(self, offset: int, data: np.ndarray) -> None:
        """`write(offset, data)` for bytes that are ready but usually overwritten before anything reads them (the
        weight rows an HVX matmul leaves in its rings: the same kept image every token, and the next matmul of the
        same K puts its own rings on the same bytes). `data`: flat uint8 that nobody changes afterwards. A read
        lands the bytes it needs, a later write drops what it covers; the bytes anyone sees are those of `write`."""
        self.check(offset, data.size, "write")
        self._cover(offset, offset + data.size)
        if data.size:
            self._ready.append(_ReadyWrite(offset, data, offset, offset + data.size))

    def fill(self, offset: int, nbytes: int, value: int = 0) -> None:
        self.check(offset, nbytes, "write")
        self._cover(offset, offset + nbytes)
        self._mem[offset:offset + nbytes] = value

    def view(self, offset: int, dtype: Any, count: int) -> np.ndarray:
        """A writable view (no copy) of `count` elements of `dtype` at `offset`."""
        dt = np.dtype(dtype)
        nbytes = count * dt.itemsize
        self.check(offset, nbytes, "view")
        self._flush(offset, offset + nbytes)
        return self._mem[offset:offset + nbytes].view(dt)

    def land(self, lo: int, hi: int) -> None:
        """`read`'s first step without its check: every deferred write on bytes lo..hi made (a bound matmul)."""
        if self._ready or self._pending:
            self._flush(lo, hi)

    def raw_view(self, offset: int, nbytes: int) -> np.ndarray:
        """A kept writable uint8 view that deferred writes do not land in first: `land` before reading it."""
        self.check(offset, nbytes, "view")
        return self._mem[offset:offset + nbytes]

    def _cover(self, lo: int, hi: int) -> None:
        """Bytes lo..hi are written now: no deferred write may land there later."""
        if hi <= lo:
            return
        if self._ready:
            self._cover_ready(lo, hi)
        if not self._pending:
            return
        hit = False
        for p in self._pending:
            if p.offset < hi and lo < p.offset + p.nbytes:  # most writes miss most deferred images
                p.live = [(a, b) for x, y in p.live for a, b in ((x, min(y, lo)), (max(x, hi), y)) if a < b]
                p.hits += 1
                hit = True
        if hit:
            for p in self._pending:
                if p.live and p.hits >= LAND_AFTER_HITS:
                    p.land(self._mem)
                    p.live = []
            self._pending = [p for p in self._pending if p.live]

    def _cover_ready(self, lo: int, hi: int) -> None:
        dead = False
        for r in self._ready:
            if r.a < hi and lo < r.b and r.cut(self._mem, lo, hi):
                dead = True
        if dead:
            self._ready = [r for r in self._ready if r.a < r.b]

    def _flush(self, lo: int, hi: int) -> None:
        """Make every deferred write that still owns a byte of lo..hi (all of its live bytes; a ready write
        only up to hi)."""
        if self._ready:
            for r in self._ready:
                if r.a < hi and lo < r.b:
                    r.land(self._mem, hi)
            self._ready = [r for r in self._ready if r.a < r.b]
        if not self._pending:
            return
        keep = []
        for p in self._pending:
            if any(a < hi and lo < b for a, b in p.live):
                p.land(self._mem)
            else:
                keep.append(p)
        self._pending = keep

    def view_f16(self, offset: int, count: int) -> np.ndarray:
        return self.view(offset, np.float16, count)

    def view_f32(self, offset: int, count: int) -> np.ndarray:
        return self.view(offset, np.float32, count)

    def view_i8(self, offset: int, count: int) -> np.ndarray:
        return self.view(offset, np.int8, count)

    def view_u8(self, offset: int, count: int) -> np.ndarray:
        return self.view(offset, np.uint8, count)

    def area_view(self, area: Area, dtype: Any = np.uint8) -> np.ndarray:
        """The whole of `area` as `dtype` (raises VtcmAccessError if the area lies past the end)."""
        return self.view(area.offset, dtype, area.size // np.dtype(dtype).itemsize)


def span_box(spans: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """(lowest offset, highest end) of the non-empty (offset, nbytes) spans; (0, 0) when there is none."""
    ext = [(o, o + n) for o, n in spans if n]
    return (min(a for a, _ in ext), max(b for _, b in ext)) if ext else (0, 0)
