"""VTCM of the emulated Hexagon NPU: the byte arena, and how every HTP op carves its scratch out of it.

Two halves:

* `Vtcm`, a real byte array that persists across ops and batches and is never cleared (as on the device, where
  correctness relies on each op writing every byte it later reads).
* Pure arithmetic that reproduces, for given shapes, the scratch layout each op of the May 2026 ggml-hexagon
  snapshot (ggml-org/ggml bb4dc86a, `src/ggml-hexagon/htp/`) computes from `vtcm_base`: the HMX matmul chunk
  search and its rounded bump allocation (which can exceed VTCM, notes 6.1), the HVX matmul spads, the row
  ping-pong spads of the element-wise ops, softmax, rope and both flash attentions. The backend executes these
  plans and the `kazeia htp plan` command prints them, so every number a report shows comes from here.

Profiles: "2026-05" is the snapshot as it is (HMX search budgets 256 B of overhead while the allocator rounds each
area to 2048 B; an HMX failure re-enters `op_matmul`; some ops leave the src1 "already quantized" shortcut
stale). "robust" is what a fixed backend does: the search checks the rounded layout, an HMX failure falls back
to HVX, and every op that writes VTCM drops the shortcut.

All offsets are bytes from `vtcm_base`. Upstream file/function names in comments say where each rule was read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kazeia.errors import KazeiaError

DEFAULT_VTCM_SIZE = 8 * 1024 * 1024  # what v79/v81 phones report; main.c: vtcm_alloc falls back to 8 MiB too
DEFAULT_HVX_THREADS = 6  # assumption: on a device this is the HVX context count (GGML_HEXAGON_NHVX), capped at 10
MAX_HVX_THREADS = 10  # htp-ctx.h: HTP_MAX_NTHREADS
PROFILES = ("2026-05", "robust")
DEFAULT_PROFILE = "robust"

VLEN = 128  # HVX vector bytes: the row alignment of all HVX spads
HMX_TILE = 32  # rows/cols of one HMX fp16 tile
HMX_TILE_BYTES = 2048  # 32 x 32 fp16: granule of every HMX matmul area
HMX_DEEP_RUN_TILES = 32  # core_dot_chunk_fp16 loads at most 32 K-tiles per activation/weight load
HMX_SCALES_BYTES = 256  # output scale/bias block: 64 fp16 scales then 64 fp16 zero biases
BANK_BYTES = 4 * 1024 * 1024  # the VTCM bank size the March HMX code warned mxmem runs must not cross (notes 6.6)
SUPER_BLOCK = 256  # x4x2 super-block: 8 ggml blocks of 32

# ggml block bytes per 32 elements, i.e. the tensor descriptor's nb[1] per 32 columns (REPACK keeps ggml strides)
_BLOCK32_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34, "iq4_nl": 18, "mxfp4": 17, "f16": 64}
QTYPES = tuple(_BLOCK32_BYTES)
HMX_TYPES = ("f16", "q4_0", "q4_1", "q8_0", "iq4_nl", "mxfp4")  # matmul-ops.c: op_matmul type gate
HMX_ARCHS = (73, 75, 79, 81)  # htp/CMakeLists.txt: HMX code is only built for these


# --------------------------------------------------------------------------------------------------------------
# small arithmetic helpers (hex-utils.h semantics, for non-negative integers)


def align_up(v: int, a: int) -> int:
    return -(-v // a) * a


def align_down(v: int, a: int) -> int:
    return v // a * a


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_profile(profile: str) -> str:
    if profile not in PROFILES:
        raise KazeiaError(f"unknown HTP profile '{profile}' (available: {', '.join(PROFILES)})")
    return profile


def norm_qtype(qtype: Any) -> str:
    """'q4_0' / 'Q4_0' / GGMLType.Q4_0 -> 'q4_0'."""
    name = getattr(qtype, "name", qtype)
    name = str(name).lower()
    if name not in _BLOCK32_BYTES:
        raise KazeiaError(f"unsupported HTP matmul weight type '{qtype}' (supported: {', '.join(QTYPES)})")
    return name


def ggml_row_bytes(qtype: str, k: int) -> int:
    """The weight tensor's nb[1] (what the HVX path DMAs per row)."""
    return _BLOCK32_BYTES[norm_qtype(qtype)] * ceil_div(k, 32)


def x4x2_row_stride(qtype: str, k: int) -> int:
    """Bytes of one repacked x4x2 weight row as the HMX kernel strides it (hmx-matmul-ops.c: get_x4x2_row_stride).

    Quants of whole super-blocks then the scales: Q4_0/IQ4_NL 128+16 B, Q4_1 128+32 B (d,m pairs), Q8_0 256+16 B,
    MXFP4 128+8 B per super-block. F16 has no x4x2 form (its HMX kernel is a sibling function); 0 there.
    """
    nb = ceil_div(k, SUPER_BLOCK)
    per = {"q4_0": 144, "iq4_nl": 144, "q4_1": 160, "q8_0": 272, "mxfp4": 136}.get(norm_qtype(qtype), 0)
    return nb * per


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


class Vtcm:
    """A VTCM block: `size` bytes whose contents persist across ops and batches and are never cleared.

    `fill` is the initial byte value; `fill=None` starts from seeded random bytes (a device does not zero VTCM,
    so garbage is the honest starting point when hunting stale reads).
    """

    def __init__(self, size: int = DEFAULT_VTCM_SIZE, fill: int | None = 0, seed: int = 0):
        if size <= 0:
            raise ValueError("VTCM size must be positive")
        if fill is None:
            self.mem = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
        else:
            self.mem = np.full(size, fill, dtype=np.uint8)

    @property
    def size(self) -> int:
        return int(self.mem.size)

    def check(self, offset: int, nbytes: int, access: str = "access") -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise VtcmAccessError(offset, nbytes, self.size, access)

    def read(self, offset: int, nbytes: int) -> bytes:
        self.check(offset, nbytes, "read")
        return self.mem[offset:offset + nbytes].tobytes()

    def write(self, offset: int, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        if isinstance(data, np.ndarray):
            raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        else:
            raw = np.frombuffer(data, dtype=np.uint8)
        self.check(offset, raw.size, "write")
        self.mem[offset:offset + raw.size] = raw

    def fill(self, offset: int, nbytes: int, value: int = 0) -> None:
        self.check(offset, nbytes, "write")
        self.mem[offset:offset + nbytes] = value

    def view(self, offset: int, dtype: Any, count: int) -> np.ndarray:
        """A writable view (no copy) of `count` elements of `dtype` at `offset`."""
        dt = np.dtype(dtype)
        nbytes = count * dt.itemsize
        self.check(offset, nbytes, "view")
        return self.mem[offset:offset + nbytes].view(dt)

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


def _row_extent(rows: int, stride: int, row_bytes: int) -> int:
    """Bytes from the start of a row spad that a DMA of `rows` rows of `row_bytes` at `stride` touches."""
    return 0 if rows <= 0 else (rows - 1) * stride + row_bytes


def _thread_rows(nrows: int, n_threads: int) -> list[int]:
    """Rows each worker gets: ceil(nrows / n) each, the last ones fewer or none (the pattern of every HTP op)."""
    per = ceil_div(nrows, n_threads) if n_threads else 0
    return [max(0, min(per, nrows - t * per)) for t in range(n_threads)]


# --------------------------------------------------------------------------------------------------------------
# matmul plans


@dataclass(frozen=True)
class MatmulPlan:
    """One MUL_MAT's path and VTCM layout.

    status: "ok"; "overflow" (HMX rounded layout > VTCM, the kernel returns -1); "no_chunking" (HMX chunk search
    found nothing); "vtcm_too_small" (HVX spads > VTCM, the op returns VTCM_TOO_SMALL, which the batch drops).
    outcome: what the DSP then does: "runs", "reenter" (2026-05: op_matmul calls itself again, forever),
    "fallback" (robust HMX failure: op_matmul runs the HVX plan instead), "dropped" (HVX VTCM_TOO_SMALL: dst
    keeps stale contents).
    """

    path: str
    m: int
    k: int
    n: int
    qtype: str
    profile: str
    vtcm: int
    mc: int | None
    nc: int | None
    areas: tuple[Area, ...]
    used: int
    status: str
    outcome: str
    reason: str = ""
    estimate: int | None = None  # the HMX chunk search's own size estimate (what it believed it would use)
    n_threads: int | None = None
    row_stride: int | None = None  # HMX: raw weight row stride; HVX: padded src0 row stride in the ring
    hmx_attempt: MatmulPlan | None = None  # robust: the failed HMX plan that made it fall back to HVX
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def overflow(self) -> int:
        return max(0, self.used - self.vtcm)

    @property
    def fits(self) -> bool:
        return self.status == "ok"

    def area(self, name: str) -> Area:
        for a in self.areas:
            if a.name == name:
                return a
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "path": self.path, "m": self.m, "k": self.k, "n": self.n, "type": self.qtype, "profile": self.profile,
            "mc": self.mc, "nc": self.nc, "areas": [a.to_dict() for a in self.areas], "used": self.used,
            "vtcm": self.vtcm, "overflow": self.overflow, "status": self.status, "outcome": self.outcome,
            "reason": self.reason, "estimate": self.estimate, "n_threads": self.n_threads,
            "row_stride": self.row_stride,
        }
        if self.info:
            d["info"] = dict(self.info)
        if self.hmx_attempt is not None:
            d["hmx_attempt"] = self.hmx_attempt.to_dict()
        return d


def hmx_compute_chunks(vtcm_total: int, overhead: int, per_n: int, per_m: int, per_mn: int, m: int, n: int,
                       m_block_cost: int, n_block_cost: int,
                       exact: Callable[[int, int], int] | None = None) -> tuple[int, int, int] | None:
    """The (mc, nc) search of hmx-matmul-ops.c: hmx_compute_chunks; returns (mc, nc, estimated total) or None.

    For nc = floor32(n), floor32(n) - 32, ..., 32: mc = min(floor32((V - overhead - nc*per_n) / (per_m +
    nc*per_mn)), m); minimise ceil(m/mc)*m_block_cost + ceil(n/nc)*n_block_cost, ties to the larger mc*nc (the
    first candidate wins a full tie, i.e. the larger nc). `m` is the caller's M already rounded up to 32.
    `exact` (robust profile only) gives the real rounded layout size of (mc, nc): mc is lowered by 32 until it
    fits, the check upstream's HMX flash attention does but its matmul does not.
    """
    if m <= 0 or n <= 0 or vtcm_total <= overhead or not (per_n and per_m and per_mn):
        return None
    usable = vtcm_total - overhead
    best: tuple[int, int, int, int] | None = None  # cost, mn, mc, nc
    for nc in range(align_down(n, HMX_TILE), HMX_TILE - 1, -HMX_TILE):
        n_fixed = nc * per_n
        if n_fixed >= usable:
            continue
        mc = min(align_down((usable - n_fixed) // (per_m + nc * per_mn), HMX_TILE), m)
        if exact is not None:
            while mc > 0 and exact(mc, nc) > vtcm_total:
                mc -= HMX_TILE
        if mc == 0:
            continue
        cost = ceil_div(m, mc) * m_block_cost + ceil_div(n, nc) * n_block_cost
        mn = mc * nc
        if best is None or cost < best[0] or (cost == best[0] and mn > best[1]):
            best = (cost, mn, mc, nc)
    if best is None:
        return None
    _, _, mc, nc = best
    return mc, nc, nc * per_n + mc * per_m + mc * nc * per_mn + overhead


LayoutSpec = list[tuple[str, int, int]]  # (area name, requested bytes, rounding granule), in allocation order


def _hmx_q_spec(mc: int, nc: int, k: int, row_stride: int) -> LayoutSpec:
    """hmx-matmul-ops.c: hmx_matmul_q_f32 layout: [qweight][activation][out0][wt0][wt1][out1][scales 256],
    every area but the scales rounded to 2048 B. qweight holds nc raw x4x2 rows (DMA, single buffer), wt0/wt1
    the dequantised fp16 weight tiles (double buffer), out0/out1 the fp16 output tiles (double buffer)."""
    t = HMX_TILE_BYTES
    return [("qweight", nc * row_stride, t), ("activation", mc * k * 2, t), ("out0", mc * nc * 2, t),
            ("wt0", nc * k * 2, t), ("wt1", nc * k * 2, t), ("out1", mc * nc * 2, t),
            ("scales", HMX_SCALES_BYTES, 1)]


def _hmx_f16_spec(mc: int, nc: int, k: int, strided: bool) -> LayoutSpec:
    """hmx-matmul-ops.c: hmx_matmul_f16_f32 layout: [weight tiles][activation][output][scratch0][scratch1]
    [scales 256][f32 activation staging, only for strided activations]; scratch0/1 receive raw fp16 weight rows
    by DMA (double buffer) and are interleaved into `weight`; one output buffer (no pipeline)."""
    t = HMX_TILE_BYTES
    spec = [("weight", nc * k * 2, t), ("activation", mc * k * 2, t), ("output", mc * nc * 2, t),
            ("scratch0", nc * k * 2, t), ("scratch1", nc * k * 2, t), ("scales", HMX_SCALES_BYTES, 1)]
    return spec + [("act_f32", mc * k * 4, t)] if strided else spec


def _spec_used(spec: LayoutSpec) -> int:
    return sum(align_up(size, g) for _, size, g in spec)


def _spec_alloc(spec: LayoutSpec) -> BumpAllocator:
    b = BumpAllocator()
    for name, size, g in spec:
        b.alloc(name, size, granule=g)
    return b


def hmx_failure_fallback(profile: str) -> str:
    """What op_matmul does when the HMX kernel returns nonzero: "reenter" (2026-05, matmul-ops.c: op_matmul
    calls op_matmul again with the same inputs, so a deterministic failure never ends) or "hvx" (robust)."""
    return "reenter" if check_profile(profile) == "2026-05" else "hvx"


def hmx_matmul_plan(m: int, k: int, n: int, qtype: str = "q4_0", vtcm_size: int = DEFAULT_VTCM_SIZE,
                    profile: str = DEFAULT_PROFILE, *, act_stride: int | None = None) -> MatmulPlan:
    """The HMX matmul chunking and layout for M=m activation rows, K=k, N=n weight rows.

    Quantized types follow hmx_matmul_q_f32 (4-stage pipeline: costs per nc column row_stride + 2*K*2, per
    activation row K*2, per output element 2*2, overhead 256; block costs 3N per M chunk and 2M per N chunk).
    F16 follows its sibling hmx_matmul_f16_f32 (per nc 3*K*2, per row K*2 (+K*4 when the activation rows are
    strided), per element 2; block costs N and M). The search sees M rounded up to 32; the raw M only enters
    the N-block cost. "2026-05" searches with the 256 B overhead only; "robust" verifies the rounded layout.
    """
    check_profile(profile)
    qt = norm_qtype(qtype)
    if m <= 0 or k <= 0 or n <= 0:
        raise KazeiaError(f"matmul shape must be positive (m={m} k={k} n={n})")
    if vtcm_size <= 0:
        raise KazeiaError("VTCM size must be positive")
    m32 = align_up(m, HMX_TILE)
    kb = k * 2  # one fp16 row of K
    if qt == "f16":
        strided = act_stride is not None and act_stride > k
        per_n, per_m, per_mn = 3 * kb, kb + (k * 4 if strided else 0), 2
        m_cost, n_cost = n, m
        row_stride = None

        def spec(mc: int, nc: int) -> LayoutSpec:
            return _hmx_f16_spec(mc, nc, k, strided)
    else:
        row_stride = x4x2_row_stride(qt, k)
        per_n, per_m, per_mn = row_stride + 2 * kb, kb, 2 * 2
        m_cost, n_cost = 3 * n, 2 * m

        def spec(mc: int, nc: int) -> LayoutSpec:
            return _hmx_q_spec(mc, nc, k, row_stride)

    exact = (lambda mc, nc: _spec_used(spec(mc, nc))) if profile == "robust" else None
    fail_outcome = "reenter" if profile == "2026-05" else "fallback"
    common = dict(path="hmx", m=m, k=k, n=n, qtype=qt, profile=profile, vtcm=vtcm_size, row_stride=row_stride)
    # hmx_matmul_q_f32 / hmx_matmul_f16_f32 refuse K or N not multiples of 32 before anything else
    if k % HMX_TILE or n % HMX_TILE:
        return MatmulPlan(**common, mc=None, nc=None, areas=(), used=0, status="no_chunking",
                          outcome=fail_outcome, reason=f"K={k} or N={n} is not a multiple of 32")
    found = hmx_compute_chunks(vtcm_size, HMX_SCALES_BYTES, per_n, per_m, per_mn, m32, n, m_cost, n_cost, exact)
    if found is None:
        return MatmulPlan(**common, mc=None, nc=None, areas=(), used=0, status="no_chunking",
                          outcome=fail_outcome, reason="no (mc, nc) chunking fits VTCM")
    mc, nc, estimate = found
    b = _spec_alloc(spec(mc, nc))
    ok = b.used <= vtcm_size
    return MatmulPlan(**common, mc=mc, nc=nc, areas=tuple(b.areas), used=b.used,
                      status="ok" if ok else "overflow", outcome="runs" if ok else fail_outcome,
                      reason="" if ok else f"VTCM overflow: used {b.used} budget {vtcm_size}", estimate=estimate,
                      info={"m_chunks": ceil_div(m, mc), "n_chunks": ceil_div(n, nc)})


def _q8x4x2_row_bytes(k: int, q4_1: bool) -> int:
    """matmul-ops.c: q8x4x2_row_size / q8_1x4x2_row_size: k int8 quants then 8 fp16 scales per super-block (Q4_1
    weights pair with q8_1: 8 (d, s) fp16 pairs), rounded to 128 B."""
    nb = ceil_div(k, SUPER_BLOCK)
    return align_up(k + nb * (32 if q4_1 else 16), VLEN)


def hvx_matmul_plan(m: int, k: int, n: int, qtype: str = "q4_0", n_threads: int = DEFAULT_HVX_THREADS,
                    vtcm_size: int = DEFAULT_VTCM_SIZE, *, batched: bool = False, permuted: bool = False,
                    profile: str = DEFAULT_PROFILE) -> MatmulPlan:
    """matmul-ops.c: op_matmul_hvx + htp_mminit_spad. Layout from base: [src1: all M activation rows, quantized]
    [src0 ring of thread 0..n-1: 16 weight rows each, row stride round_up(nb01, 128)][dst: 2 output rows per
    thread]; each per-thread size rounded to 256 B. Thread t's ring also holds its zero-padded fp32 temp row
    during quantization, so it is at least round_up(quantized row, 1024) B. F16 weights quantize src1 to fp16
    rows when everything fits and nothing is batched/permuted, else run the DDR `matmul_4d` with 16-row spads.
    More than VTCM -> VTCM_TOO_SMALL (returned, then dropped by the batch loop). src1's `written` assumes src1 is
    (re)quantized; when the shortcut matches, the op writes nothing there."""
    check_profile(profile)
    qt = norm_qtype(qtype)
    if m <= 0 or k <= 0 or n <= 0 or n_threads <= 0:
        raise KazeiaError(f"matmul shape and threads must be positive (m={m} k={k} n={n} threads={n_threads})")
    nb01 = ggml_row_bytes(qt, k)
    src0_stride = align_up(nb01, VLEN)
    dst_row = n * 4  # MUL_MAT dst is F32, one row of N per activation row
    dst_pt = align_up(2 * dst_row, 256)
    rows_pt = ceil_div(n, n_threads)
    info: dict[str, Any] = {"src0_rows_per_thread": rows_pt + (rows_pt & 1)}  # rounded up to even (row pairs)
    kernel = "quantized"
    if qt == "f16":
        f16_row = align_up(k * 2, VLEN)
        src1_size = align_up(f16_row * m, 256)
        src0_pt = align_up(16 * src0_stride, 256)
        if not batched and not permuted and src1_size + (src0_pt + dst_pt) * n_threads <= vtcm_size:
            src1_row, kernel = f16_row, "f16-vtcm"
        else:  # matmul_4d reads src1 from DDR through 16-row per-thread spads, with the unpadded weight rows
            src1_row, kernel = k * 4, "f16-ddr"
            src1_size = align_up(16 * src1_row, 256) * n_threads
            src0_pt = align_up(16 * nb01, 256)
            src0_stride = nb01
    else:
        src1_row = _q8x4x2_row_bytes(k, qt == "q4_1")
        src1_size = align_up(src1_row * m, 256)
        src0_pt = max(align_up(16 * src0_stride, 256), align_up(src1_row, SUPER_BLOCK * 4))
    info.update(kernel=kernel, src1_row=src1_row)
    b = BumpAllocator()
    b.alloc("src1", src1_size, written=None if kernel == "f16-ddr" else _row_extent(m, src1_row, src1_row))
    for t in range(n_threads):
        b.alloc(f"src0[{t}]", src0_pt)
    for t in range(n_threads):
        b.alloc(f"dst[{t}]", dst_pt)
    ok = b.used <= vtcm_size
    return MatmulPlan(path="hvx", m=m, k=k, n=n, qtype=qt, profile=profile, vtcm=vtcm_size, mc=None, nc=None,
                      areas=tuple(b.areas), used=b.used, status="ok" if ok else "vtcm_too_small",
                      outcome="runs" if ok else "dropped", n_threads=n_threads, row_stride=src0_stride, info=info,
                      reason="" if ok else f"VTCM_TOO_SMALL: needs {b.used} of {vtcm_size}")


def matmul_dispatch(m: int, k: int, n: int, qtype: str = "q4_0", *, hmx_enabled: bool = True,
                    hmx_built: bool = True, batched: bool = False, permuted: bool = False) -> tuple[str, str]:
    """("hmx"|"hvx", reason) by the gates of matmul-ops.c: op_matmul, in its order. m = src1->ne[1] (tokens),
    k = src0->ne[0], n = src0->ne[1]. The whole M, including a partial last 32-row tile, goes to HMX.
    `hmx_built`: HMX is compiled for v73/v75/v79/v81 only. On HMX failure see `hmx_failure_fallback`."""
    qt = norm_qtype(qtype)
    if not hmx_built:
        return "hvx", "HMX not built for this arch (v73/v75/v79/v81 only)"
    if not hmx_enabled:
        return "hvx", "HMX disabled (GGML_HEXAGON_USE_HMX=0)"
    if n % 32:
        return "hvx", f"N={n} is not a multiple of 32"
    if qt not in HMX_TYPES:
        return "hvx", f"{qt} has no HMX kernel"
    if qt != "f16" and k % 256:
        return "hvx", f"K={k} is not a multiple of 256 (quantized HMX)"
    if qt == "f16" and k % 32:
        return "hvx", f"K={k} is not a multiple of 32 (F16 HMX)"
    if batched and qt != "f16":
        return "hvx", "batched quantized matmul"
    if permuted:
        return "hvx", "permuted src0/src1 strides"
    if m < 32:
        return "hvx", f"M={m} < 32"
    return "hmx", f"M={m} >= 32, N % 32 == 0, {qt} with K={k}: HMX"


def plan_matmul(m: int, k: int, n: int, qtype: str = "q4_0", *, vtcm_size: int = DEFAULT_VTCM_SIZE,
                profile: str = DEFAULT_PROFILE, n_threads: int = DEFAULT_HVX_THREADS, hmx_enabled: bool = True,
                hmx_built: bool = True, batched: bool = False, permuted: bool = False,
                act_stride: int | None = None) -> MatmulPlan:
    """The MUL_MAT decision the backend executes: dispatch, then the HMX plan; if HMX fails, "2026-05" returns
    the failing HMX plan (outcome "reenter": op_matmul recurses forever) and "robust" the HVX plan it falls back
    to (with the failed attempt in `hmx_attempt`). Batched F16 HMX is planned per batch (the legacy loop)."""
    check_profile(profile)
    path, reason = matmul_dispatch(m, k, n, qtype, hmx_enabled=hmx_enabled, hmx_built=hmx_built,
                                   batched=batched, permuted=permuted)
    if path == "hvx":
        p = hvx_matmul_plan(m, k, n, qtype, n_threads, vtcm_size, batched=batched, permuted=permuted,
                            profile=profile)
        return replace(p, reason=reason if p.fits else f"{reason}; {p.reason}")
    h = hmx_matmul_plan(m, k, n, qtype, vtcm_size, profile, act_stride=act_stride)
    if h.fits:
        return replace(h, reason=reason)
    if profile == "2026-05":
        return replace(h, reason=f"{reason}; {h.reason}: HMX returns -1 and op_matmul re-enters itself")
    p = hvx_matmul_plan(m, k, n, qtype, n_threads, vtcm_size, batched=batched, permuted=permuted, profile=profile)
    why = f"HMX failed ({h.reason}), falling back to HVX"
    return replace(p, reason=why if p.fits else f"{why}; {p.reason}", hmx_attempt=h)


# --------------------------------------------------------------------------------------------------------------
# HMX deep loads (notes 6.6)


@dataclass(frozen=True)
class DeepLoad:
    """One HMX mxmem load run of core_dot_chunk_fp16: `size` bytes (up to 32 tiles of 2048 B) at `offset`.
    kind "activation" (deep load of row tile `tile`) or "weight" (column tile `tile`), from K-tile `k0`."""

    kind: str
    area: str
    offset: int
    size: int
    tile: int
    k0: int

    @property
    def end(self) -> int:
        return self.offset + self.size

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "area": self.area, "offset": self.offset, "size": self.size, "tile": self.tile,
                "k0": self.k0}


def hmx_deep_loads(plan: MatmulPlan) -> list[DeepLoad]:
    """Every distinct activation/weight load run an HMX matmul plan issues (hmx-matmul-ops.c:
    core_dot_chunk_fp16: per output tile (r, c), K in runs of <= 32 tiles; activation runs start at row tile r,
    weight runs at column tile c of the chunk's weight buffer: wt0/wt1 alternate over N chunks for quantized
    weights, one `weight` buffer for F16). Output stores are single 2048 B tiles at 2048-aligned offsets and
    cannot straddle a bank, so they are not listed."""
    if plan.path != "hmx" or plan.mc is None or plan.nc is None:
        return []
    k_tiles = plan.k // HMX_TILE
    runs = [(k0, min(HMX_DEEP_RUN_TILES, k_tiles - k0)) for k0 in range(0, k_tiles, HMX_DEEP_RUN_TILES)]
    m_chunks = [min(plan.mc, plan.m - mr) for mr in range(0, plan.m, plan.mc)]
    row_tiles = max(ceil_div(r, HMX_TILE) for r in m_chunks)
    act = plan.area("activation")
    out: list[DeepLoad] = []
    for r in range(row_tiles):
        for k0, nt in runs:
            out.append(DeepLoad("activation", act.name, act.offset + (r * k_tiles + k0) * HMX_TILE_BYTES,
                                nt * HMX_TILE_BYTES, r, k0))
    col_tiles: dict[str, int] = {}  # weight buffer -> most column tiles any chunk loads from it
    for i, nc0 in enumerate(range(0, plan.n, plan.nc)):
        name = "weight" if plan.qtype == "f16" else ("wt0", "wt1")[i % 2]
        col_tiles[name] = max(col_tiles.get(name, 0), ceil_div(min(plan.nc, plan.n - nc0), HMX_TILE))
    for name, ct in col_tiles.items():
        wt = plan.area(name)
        for c in range(ct):
            for k0, nt in runs:
                out.append(DeepLoad("weight", name, wt.offset + (c * k_tiles + k0) * HMX_TILE_BYTES,
                                    nt * HMX_TILE_BYTES, c, k0))
    return sorted(out, key=lambda d: (d.offset, d.kind))


def bank_crossings(plan: MatmulPlan, bank: int = BANK_BYTES) -> list[DeepLoad]:
    """The deep-load runs of `plan` that straddle a `bank`-byte VTCM boundary (offsets from a bank-aligned base),
    for the optional 0x2601 bus-error fault of notes 6.6 (unverified hypothesis)."""
    return [d for d in hmx_deep_loads(plan) if d.offset // bank != (d.end - 1) // bank]


# --------------------------------------------------------------------------------------------------------------
# other ops: scratch layouts


@dataclass(frozen=True)
class OpScratch:
    """The VTCM scratch one op carves from base. Nothing is written unless status == "ok" (a VTCM_TOO_SMALL op
    returns before touching VTCM or the src1 shortcut); "none" means the op does not use VTCM at all."""

    op: str
    areas: tuple[Area, ...]
    used: int
    vtcm: int
    status: str
    n_threads: int
    source: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def writes(self) -> tuple[Area, ...]:
        return self.areas if self.status == "ok" else ()

    def area(self, name: str) -> Area:
        for a in self.areas:
            if a.name == name:
                return a
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "areas": [a.to_dict() for a in self.areas], "used": self.used, "vtcm": self.vtcm,
                "status": self.status, "n_threads": self.n_threads, "source": self.source, "info": dict(self.info)}


def _scratch(op: str, b: BumpAllocator, vtcm: int, ok: bool, n_threads: int, source: str,
             **info: Any) -> OpScratch:
    return OpScratch(op, tuple(b.areas), b.used, vtcm, "ok" if ok else "VTCM_TOO_SMALL", n_threads, source, info)


def _pingpong(b: BumpAllocator, name: str, per_thread: int, rows: list[int], stride: int, row_bytes: int,
              block: int) -> None:
    """Per-thread ping-pong row spads: thread t's `per_thread` bytes split in two halves; rows stream through in
    blocks of `block`, block j into half j % 2, so each half's high-water mark is its first block."""
    half = per_thread // 2
    for t, r in enumerate(rows):
        b.alloc(f"{name}[{t}].0", half, written=_row_extent(min(block, r), stride, row_bytes))
        b.alloc(f"{name}[{t}].1", per_thread - half, written=_row_extent(min(block, max(0, r - block)), stride,
                                                                          row_bytes))


def unary_scratch(ne0: int, nrows: int, n_threads: int = DEFAULT_HVX_THREADS,
                  vtcm_size: int = DEFAULT_VTCM_SIZE, op: str = "RMS_NORM", dst_ne0: int | None = None) -> OpScratch:
    """RMS_NORM, NORM, SCALE, SQR, SQRT, NEG, EXP, SIGMOID, SOFTPLUS, TANH, L2_NORM, TRI (f32):
    unary-ops.c: execute_op_unary_f32. Threads = min(n, rows). Rows per thread r = VTCM // (threads * 2 *
    (src row + dst row)), rows aligned to 128 B: the op takes (nearly) all of VTCM. Layout [src0 of each thread:
    2 halves of r rows][dst of each thread: 2 halves of r rows]."""
    dst_ne0 = ne0 if dst_ne0 is None else dst_ne0
    nt = max(1, min(n_threads, nrows))
    src_row, dst_row = ne0 * 4, dst_ne0 * 4
    src_al, dst_al = align_up(src_row, VLEN), align_up(dst_row, VLEN)
    rpt = vtcm_size // (nt * 2 * (src_al + dst_al))
    rows = _thread_rows(nrows, nt)
    b = BumpAllocator()
    if rpt:
        _pingpong(b, "src0", src_al * rpt * 2, rows, src_al, src_row, rpt)
        _pingpong(b, "dst", dst_al * rpt * 2, rows, dst_al, dst_row, rpt)
    return _scratch(op, b, vtcm_size, rpt > 0, nt, "unary-ops.c: execute_op_unary_f32", rows_per_half=rpt)


def binary_scratch(src0_ne: tuple[int, ...], src1_ne: tuple[int, ...], n_threads: int = DEFAULT_HVX_THREADS,
                   vtcm_size: int = DEFAULT_VTCM_SIZE, op: str = "ADD", elem_size: int = 4,
                   transposed: bool = False) -> OpScratch:
    """MUL, ADD, SUB, DIV, ADD_ID: binary-ops.c: execute_op_binary. Mode from the shapes: same-shape (src1
    rows streamed too), row-broadcast (src1 one row, kept once), scalar / complex / repeat (src1 read from DDR).
    rows_per_buffer = VTCM (minus the broadcast row) // (threads * 2 * sum of 128-aligned row sizes).
    Layout [src0 per thread, 2 halves][src1: per thread halves | one row | nothing][dst per thread, 2 halves]."""
    s0 = tuple(src0_ne) + (1,) * (4 - len(src0_ne))
    s1 = tuple(src1_ne) + (1,) * (4 - len(src1_ne))
    nrows = s0[1] * s0[2] * s0[3]
    nt = max(1, min(n_threads, nrows))
    row0, row1 = s0[0] * elem_size, s1[0] * elem_size
    al0, al1 = align_up(row0, VLEN), align_up(row1, VLEN)
    add_id = op == "ADD_ID"
    scalar = not add_id and s1[0] == 1
    same = (not add_id and not scalar and not transposed and s1[0] == s0[0] and s0[0] % VLEN == 0
            and all(s1[i] in (s0[i], 1) for i in (1, 2, 3)))
    bcast = same and s1[1] == s1[2] == s1[3] == 1
    mode = ("add_id" if add_id else "scalar" if scalar else "row_bcast" if bcast else "same_shape" if same
            else "complex" if s1[0] == s0[0] else "repeat")
    per_row = 2 * (al0 + al1 + al0) if same else 2 * (al0 + al0)  # dst row size == src0 row size
    avail = vtcm_size - (al1 if bcast else 0)
    rpb = avail // (nt * per_row) if avail >= 0 else 0
    rows = _thread_rows(nrows, nt)
    b = BumpAllocator()
    ok = rpb >= 1
    if ok:
        _pingpong(b, "src0", rpb * 2 * al0, rows, al0, row0, rpb)
        if bcast:
            b.alloc("src1", al1, written=row1)
        elif mode == "same_shape":
            _pingpong(b, "src1", rpb * 2 * al1, rows, al1, row1, rpb)
        _pingpong(b, "dst", rpb * 2 * al0, rows, al0, row0, rpb)
        ok = b.used <= vtcm_size
    return _scratch(op, b, vtcm_size, ok, nt, "binary-ops.c: execute_op_binary", mode=mode, rows_per_half=rpb)


def act_scratch(src0_row_bytes: int, nrows: int, n_threads: int = DEFAULT_HVX_THREADS,
                vtcm_size: int = DEFAULT_VTCM_SIZE, op: str = "GLU_SWIGLU", src1_row_bytes: int | None = None,
                dst_row_bytes: int | None = None) -> OpScratch:
    """SILU, GELU, SWIGLU, SWIGLU_OAI, GEGLU (f32): act-ops.c: execute_op_activations_f32. Row sizes are the
    tensors' nb[1] (src1 defaults to src0's, as for a fused GLU input). r = VTCM // (threads * (src0 + src1 + dst
    aligned rows)); each per-thread spad is r rows, used as two halves of r/2 rows.
    Layout [src0 per thread][src1 per thread][dst per thread]."""
    row1 = src0_row_bytes if src1_row_bytes is None else src1_row_bytes
    rowd = src0_row_bytes if dst_row_bytes is None else dst_row_bytes
    nt = max(1, min(n_threads, nrows))
    al0, al1, ald = (align_up(x, VLEN) for x in (src0_row_bytes, row1, rowd))
    rpt = vtcm_size // (nt * (al0 + al1 + ald))
    block = (al0 * rpt // 2) // al0 if rpt else 0
    rows = _thread_rows(nrows, nt)
    b = BumpAllocator()
    if rpt:
        _pingpong(b, "src0", al0 * rpt, rows, al0, src0_row_bytes, block)
        _pingpong(b, "src1", al1 * rpt, rows, al1, row1, block)
        _pingpong(b, "dst", ald * rpt, rows, ald, rowd, block)
    return _scratch(op, b, vtcm_size, rpt > 0, nt, "act-ops.c: execute_op_activations_f32", rows_per_thread=rpt,
                    rows_per_half=block)


def softmax_scratch(row_bytes: int, nrows: int, n_threads: int = DEFAULT_HVX_THREADS,
                    vtcm_size: int = DEFAULT_VTCM_SIZE, dst_row_bytes: int | None = None,
                    ne00: int | None = None) -> OpScratch:
    """SOFT_MAX (f32): softmax-ops.c: execute_op_softmax_f32. Per thread round_up(4 rows, 128) for src0, src1
    (sized like src0) and dst; softmax_job_f32 only uses the first row of each as work rows wp0/wp1/wp2 (wp2 only
    on the unaligned path). Layout [src0 per thread][src1 per thread][dst per thread]."""
    rowd = row_bytes if dst_row_bytes is None else dst_row_bytes
    ne00 = row_bytes // 4 if ne00 is None else ne00
    nt = max(1, min(n_threads, nrows))
    opt = row_bytes % VLEN == 0  # the fast path (aligned data assumed) never touches wp2
    b = BumpAllocator()
    live = [r > 0 for r in _thread_rows(nrows, nt)]
    spads = [("src0", align_up(4 * row_bytes, 128), True), ("src1", align_up(4 * row_bytes, 128), True),
             ("dst", align_up(4 * rowd, 128), not opt)]
    for name, size, used in spads:
        for t in range(nt):
            b.alloc(f"{name}[{t}]", size, written=ne00 * 4 if used and live[t] else 0)
    return _scratch("SOFTMAX", b, vtcm_size, b.used <= vtcm_size, nt, "softmax-ops.c: execute_op_softmax_f32",
                    fast_path=opt)


def rope_scratch(ne0: int, nrows: int, n_threads: int = DEFAULT_HVX_THREADS, vtcm_size: int = DEFAULT_VTCM_SIZE,
                 src0_row_bytes: int | None = None, dst_row_bytes: int | None = None) -> OpScratch:
    """ROPE (f32): rope-ops.c: execute_op_rope_f32. Per thread: [theta cache round_up(ne0*4, 256)][16 src rows]
    then, after all threads, [16 dst rows] per thread; rows 128-aligned. Layout [src0 of each thread (theta +
    rows)][dst of each thread]."""
    row0 = ne0 * 4 if src0_row_bytes is None else src0_row_bytes
    rowd = ne0 * 4 if dst_row_bytes is None else dst_row_bytes
    nt = max(1, min(n_threads, nrows))
    al0, ald = align_up(row0, VLEN), align_up(rowd, VLEN)
    theta = align_up(ne0 * 4, 256)
    rows = _thread_rows(nrows, nt)
    need = (theta + 16 * al0 + 16 * ald) * nt
    b = BumpAllocator()
    for t, r in enumerate(rows):
        b.alloc(f"theta[{t}]", theta, written=ne0 * 4 if r else 0)
        b.alloc(f"src0[{t}]", 16 * al0, written=_row_extent(min(16, r), al0, row0))
    for t, r in enumerate(rows):
        b.alloc(f"dst[{t}]", 16 * ald, written=_row_extent(min(16, r), ald, rowd))
    return _scratch("ROPE", b, vtcm_size, need <= vtcm_size, nt, "rope-ops.c: execute_op_rope_f32")


def argsort_scratch(ne00: int, nrows: int, n_threads: int = DEFAULT_HVX_THREADS,
                    vtcm_size: int = DEFAULT_VTCM_SIZE) -> OpScratch:
    """ARGSORT (f32): argsort-ops.c: op_argsort: per thread round_up(values + indices rows (128-aligned), 256)."""
    nt = max(1, min(n_threads, nrows))
    per = align_up(align_up(ne00 * 4, 128) + align_up(ne00 * 4, 128), 256)
    b = BumpAllocator()
    for t in range(nt):
        b.alloc(f"src0[{t}]", per)
    return _scratch("ARGSORT", b, vtcm_size, b.used <= vtcm_size, nt, "argsort-ops.c: op_argsort")


def no_scratch(op: str, vtcm_size: int = DEFAULT_VTCM_SIZE) -> OpScratch:
    """SET_ROWS, GET_ROWS, CPY (also CONT), REPEAT, SUM_ROWS, FILL, SOLVE_TRI: no VTCM use in this snapshot
    (set-rows-ops.c, get-rows-ops.c, cpy-ops.c, ... never reference vtcm_base or a spad)."""
    return OpScratch(op, (), 0, vtcm_size, "none", 0, f"{op.lower().replace('_', '-')}-ops.c: no VTCM")


FLASH_ATTN_BLOCK = 64  # flash-attn-ops.c: FLASH_ATTN_BLOCK_SIZE (K/V rows per block)
DMA_CACHE_LINES = 64  # hex-dma.h: DMA_CACHE_MAX_SIZE (mask rows cached per thread)


def hvx_flash_attn_scratch(dk: int, dv: int, n_threads: int = DEFAULT_HVX_THREADS,
                           vtcm_size: int = DEFAULT_VTCM_SIZE, q_f32: bool = True,
                           has_mask: bool = True) -> OpScratch:
    """HVX FLASH_ATTN_EXT: flash-attn-ops.c: op_flash_attn_ext. Uses all n_threads (not min with rows).
    Per thread: one Q row (128-aligned, f32 or f16), K and V blocks of 64 rows x2, 64 cached mask lines of
    round_up(64*2, 128), one fp32 accumulator row. Layout [Q x threads][K x threads][V x threads]
    [mask x threads][acc x threads]."""
    q_row = align_up(dk * (4 if q_f32 else 2), 128)
    k_blk = align_up(dk * 2, 128) * FLASH_ATTN_BLOCK
    v_blk = align_up(dv * 2, 128) * FLASH_ATTN_BLOCK
    m_blk = align_up(FLASH_ATTN_BLOCK * 2, 128)
    acc = align_up(dv * 4, 128)
    b = BumpAllocator()
    spads = [("q", q_row), ("k", 2 * k_blk), ("v", 2 * v_blk), ("mask", m_blk * DMA_CACHE_LINES), ("acc", acc)]
    for name, per in spads:
        if name == "mask" and not has_mask:
            continue
        for t in range(n_threads):
            b.alloc(f"{name}[{t}]", per)
    return _scratch("FLASH_ATTN_EXT", b, vtcm_size, b.used <= vtcm_size, n_threads,
                    "flash-attn-ops.c: op_flash_attn_ext", path="hvx")


def _hmx_fa_layout(g: int, dk: int, dv: int, br: int, bc: int, n_threads: int) -> BumpAllocator:
    """hmx-flash-attn-ops.c: hmx_flash_attn_ext allocation order (hmx_fa_compute_vtcm_usage sums the same):
    Q tiles, O tiles x2 (ping-pong), K raw x2, V raw x2 (DMA), K tiles, V tiles, S, P, D tiles (4096 B
    granule); m, l, rowmax, rowsum vectors (256 B); per-thread row buffers; two 256 B HMX scale blocks (identity,
    then qk scale); the mask buffer (Br lines); the ALiBi slopes (128 B)."""
    g_br = align_up(g * br, HMX_TILE)
    b = BumpAllocator(granule=4096)
    b.alloc("q_tiles", g_br * dk * 2)
    b.alloc("o_tiles0", g_br * dv * 2)
    b.alloc("o_tiles1", g_br * dv * 2)
    for name, row in (("k_raw0", dk), ("k_raw1", dk), ("v_raw0", dv), ("v_raw1", dv)):
        b.alloc(name, bc * align_up(row * 2, 128))
    b.alloc("k_tiles", bc * dk * 2)
    b.alloc("v_tiles", bc * dv * 2)
    b.alloc("s_tiles", g_br * bc * 2)
    b.alloc("p_tiles", g_br * bc * 2)
    b.alloc("d_tiles", g_br * g_br * 2)
    for name in ("m_vec", "l_vec", "s_rowmax", "p_rowsum"):
        b.alloc(name, g_br * 2, granule=256)
    b.alloc("row_bufs", align_up(bc * 2, 256) * 2 * n_threads, granule=1)
    b.alloc("scales_id", HMX_SCALES_BYTES, granule=1)
    b.alloc("scales_qk", HMX_SCALES_BYTES, granule=1)
    b.alloc("mask_buf", br * align_up(bc * 2, 128))
    b.alloc("slopes", g_br * 2, granule=128)
    return b


def hmx_fa_chunks(g: int, dk: int, dv: int, qo_len: int, kv_len: int, vtcm_size: int,
                  n_threads: int) -> tuple[int, int] | None:
    """(Br, Bc) of hmx-flash-attn-ops.c: hmx_fa_find_chunk_size, or None (-> VTCM_TOO_SMALL, HVX FA runs)."""
    br_unit = ceil_div(HMX_TILE, g)
    bc_unit = 64
    per_gbr = (dk + 2 * dv) * 2 + 4 * 2
    per_bc = 3 * (dk + dv) * 2 + 2 * n_threads * 2
    overhead = 256 * 2 + 13 * 4096
    if vtcm_size <= overhead:
        return None
    usable = vtcm_size - overhead
    br_max = align_down(qo_len, br_unit) if qo_len >= br_unit else br_unit
    if kv_len >= 3 * bc_unit and n_threads >= 2:  # keep >= 3 KV blocks so the pipeline has work
        bc_limit = align_down(kv_len // 3, bc_unit)
    else:
        bc_limit = align_down(kv_len, bc_unit) if kv_len >= bc_unit else bc_unit
    best: tuple[int, int, int, int] | None = None  # cost, mn, Br, Bc
    for br in range(br_max, br_unit - 1, -br_unit):
        g_br = align_up(g * br, HMX_TILE)
        gbr_cost = g_br * per_gbr + g_br * g_br * 2
        if gbr_cost >= usable:
            continue
        bc = min(align_down((usable - gbr_cost) // (per_bc + g_br * 4 + br * 2), bc_unit), bc_limit)
        while bc >= bc_unit and _hmx_fa_layout(g, dk, dv, br, bc, n_threads).used > vtcm_size:
            bc -= bc_unit
        if bc < bc_unit:
            continue
        cost = ceil_div(qo_len, br) * (1400 + ceil_div(kv_len, bc) * 200)
        if best is None or cost < best[0] or (cost == best[0] and br * bc > best[1]):
            best = (cost, br * bc, br, bc)
    return None if best is None else (best[2], best[3])


def hmx_flash_attn_scratch(dk: int, dv: int, n_q: int, n_kv: int, n_head: int, n_head_kv: int,
                           n_threads: int = DEFAULT_HVX_THREADS, vtcm_size: int = DEFAULT_VTCM_SIZE) -> OpScratch:
    """HMX FLASH_ATTN_EXT: hmx-flash-attn-ops.c: hmx_flash_attn_ext. n_q = q->ne[1] (tokens), n_kv = k->ne[1],
    GQA factor G = n_head / n_head_kv; g_br = round_up(G*Br, 32). Needs DK, DV multiples of 32. The two scale
    blocks are `hmx_scale_block(1.0)` and `hmx_scale_block(qk scale)`."""
    g = max(1, n_head // max(1, n_head_kv))
    src = "hmx-flash-attn-ops.c: hmx_flash_attn_ext"
    if dk % 32 or dv % 32:
        return OpScratch("FLASH_ATTN_EXT", (), 0, vtcm_size, "NO_SUPPORT", n_threads, src, {"path": "hmx"})
    found = hmx_fa_chunks(g, dk, dv, n_q, n_kv, vtcm_size, n_threads)
    if found is None:
        return OpScratch("FLASH_ATTN_EXT", (), 0, vtcm_size, "VTCM_TOO_SMALL", n_threads, src, {"path": "hmx"})
    br, bc = found
    b = _hmx_fa_layout(g, dk, dv, br, bc, n_threads)
    n_kv_blocks = ceil_div(n_kv, bc)
    return _scratch("FLASH_ATTN_EXT", b, vtcm_size, b.used <= vtcm_size, n_threads, src, path="hmx", Br=br, Bc=bc,
                    g_br=align_up(g * br, HMX_TILE), G=g, n_kv_blocks=n_kv_blocks,
                    pipeline=n_kv_blocks >= 3 and n_threads >= 2)


def flash_attn_scratch(dk: int, dv: int, n_q: int, n_kv: int, n_head: int, n_head_kv: int,
                       n_threads: int = DEFAULT_HVX_THREADS, vtcm_size: int = DEFAULT_VTCM_SIZE, *,
                       hmx_enabled: bool = True, hmx_built: bool = True, q_f32: bool = True,
                       has_mask: bool = True) -> OpScratch:
    """FLASH_ATTN_EXT as op_flash_attn_ext runs it (F16 K/V): HMX first when built+enabled and DK % 32 == 0;
    on any HMX failure (before it writes VTCM) the HVX version. The result's info["path"] says which ran."""
    if hmx_built and hmx_enabled and dk % 32 == 0:
        h = hmx_flash_attn_scratch(dk, dv, n_q, n_kv, n_head, n_head_kv, n_threads, vtcm_size)
        if h.status == "ok":
            return h
    return hvx_flash_attn_scratch(dk, dv, n_threads, vtcm_size, q_f32=q_f32, has_mask=has_mask)


# --------------------------------------------------------------------------------------------------------------
# the src1 "already quantized in VTCM" shortcut (notes 3.2 item 1)

@dataclass(frozen=True)
class Src1Rule:
    """What an op does to octx->src1_spad.src (the pointer HVX matmul compares to skip re-quantizing src1 at base)
    in the 2026-05 snapshot, once its VTCM size check has passed:
    "reset" clears it; "stale" writes VTCM from base but leaves it (the hazard); "keep" touches neither VTCM nor
    it; "reuse" is HVX matmul itself (keeps it only for the same src1 descriptor, sets it after quantizing)."""

    effect: str
    source: str
    note: str = ""


_UNARY = "unary-ops.c: execute_op_unary_f32 (sets src0/dst spads only)"
SRC1_RULES: dict[str, Src1Rule] = {
    "MUL_MAT/hmx": Src1Rule("reset", "matmul-ops.c: op_matmul", "cleared before calling the HMX kernel"),
    "MUL_MAT/hvx": Src1Rule("reuse", "matmul-ops.c: op_matmul_hvx",
                            "pointer compare only: a Q4_1 (q8_1 rows) or F16 (fp16 rows) matmul would reuse another "
                            "format's bytes; the F16 DDR path keeps it without re-quantizing"),
    "MUL_MAT_ID": Src1Rule("reuse", "matmul-ops.c: op_matmul_id"),
    **{op: Src1Rule("stale", _UNARY) for op in ("RMS_NORM", "NORM", "SCALE", "SQR", "SQRT", "UNARY_NEG",
                                                 "UNARY_EXP", "UNARY_SIGMOID", "UNARY_SOFTPLUS", "UNARY_TANH",
                                                 "L2_NORM", "TRI")},
    **{op: Src1Rule("reset", "binary-ops.c: execute_op_binary") for op in ("MUL", "ADD", "SUB", "DIV", "ADD_ID")},
    **{op: Src1Rule("reset", "act-ops.c: execute_op_activations_f32")
       for op in ("UNARY_SILU", "UNARY_GELU", "GLU_SWIGLU", "GLU_SWIGLU_OAI", "GLU_GEGLU")},
    "SOFTMAX": Src1Rule("reset", "softmax-ops.c: execute_op_softmax_f32"),
    "ROPE": Src1Rule("reset", "rope-ops.c: execute_op_rope_f32"),
    "FLASH_ATTN_EXT/hmx": Src1Rule("stale", "hmx-flash-attn-ops.c: hmx_flash_attn_ext",
                                   "allocates from vtcm_base directly, never touches the octx spads"),
    "FLASH_ATTN_EXT/hvx": Src1Rule("reset", "flash-attn-ops.c: op_flash_attn_ext"),
    **{op: Src1Rule("keep", f"{op.lower().replace('_', '-')}-ops.c: no VTCM use")
       for op in ("SET_ROWS", "GET_ROWS", "CPY", "REPEAT", "SUM_ROWS", "FILL", "SOLVE_TRI")},
    "ARGSORT": Src1Rule("stale", "argsort-ops.c: op_argsort"),
    "CONCAT": Src1Rule("stale", "concat-ops.c: op_concat", "only its transposed 2-D path uses VTCM"),
    "PAD": Src1Rule("stale", "pad-ops.c: op_pad", "only its DMA path (ne00 >= 512) uses VTCM"),
    "CUMSUM": Src1Rule("stale", "cumsum-ops.c: op_cumsum", "clears the src0/dst spad pointers, not src1's"),
    "DIAG": Src1Rule("stale", "diag-ops.c: op_diag", "clears the src0/dst spad pointers, not src1's"),
    "GATED_DELTA_NET": Src1Rule("stale", "gated-delta-net-ops.c: op_gated_delta_net",
                                "VTCM state only for one token"),
    "SSM_CONV": Src1Rule("reset", "ssm-conv.c: op_ssm_conv"),
}

SRC1_CACHE_EFFECTS = ("reset", "stale", "keep", "reuse")


def src1_cache_effect(op: str, profile: str = "2026-05", path: str | None = None) -> str:
    """The op's effect on the src1 shortcut: one of SRC1_CACHE_EFFECTS. `path` ("hmx"/"hvx") disambiguates
    MUL_MAT and FLASH_ATTN_EXT. Under "robust" every op that writes VTCM resets it (the later upstream fix,
    #23989, "clear spad pointers in the ops that clobber it")."""
    check_profile(profile)
    op = op.upper().removeprefix("HTP_OP_")
    if op in ("MUL_MAT", "FLASH_ATTN_EXT"):
        if path not in ("hmx", "hvx"):
            raise KazeiaError(f"{op}: say which path ran (hmx or hvx)")
        op = f"{op}/{path}"
    rule = SRC1_RULES.get(op)
    if rule is None:
        raise KazeiaError(f"no src1-shortcut rule for op {op}")
    if profile == "robust" and rule.effect == "stale":
        return "reset"
    return rule.effect


def src1_cache_table(profile: str = "2026-05") -> list[dict[str, str]]:
    """The whole table, for reports."""
    rows = []
    for key, rule in SRC1_RULES.items():
        op, _, path = key.partition("/")
        rows.append({"op": key, "effect": src1_cache_effect(op, profile, path or None), "source": rule.source,
                     "note": rule.note})
    return rows


def overlaps(areas: Iterable[Area]) -> list[tuple[Area, Area]]:
    """Pairs of areas that share bytes (an allocator bug if ever non-empty)."""
    s = sorted((a for a in areas if a.size), key=lambda a: a.offset)
    return [(a, b) for a, b in zip(s, s[1:]) if b.offset < a.end]
