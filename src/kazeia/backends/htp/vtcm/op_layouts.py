"""The VTCM scratch of the HTP ops other than MUL_MAT, as the May 2026 snapshot carves it from `vtcm_base`.

The per-thread row ping-pong spads of the element-wise ops (unary, binary, activations), softmax, rope and
argsort, and both flash attentions: HVX, and HMX with its own chunk search (which, unlike the matmul's, checks
the rounded layout). `kazeia.backends.htp.scratch` writes what these layouts say each op leaves in VTCM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kazeia.backends.htp.vtcm.arena import (
    DEFAULT_HVX_THREADS,
    DEFAULT_VTCM_SIZE,
    HMX_SCALES_BYTES,
    HMX_TILE,
    VLEN,
    Area,
    BumpAllocator,
    align_down,
    align_up,
    ceil_div,
    find_area,
    row_extent,
    thread_rows,
)


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
        return find_area(self.areas, name)

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
        b.alloc(f"{name}[{t}].0", half, written=row_extent(min(block, r), stride, row_bytes))
        b.alloc(f"{name}[{t}].1", per_thread - half, written=row_extent(min(block, max(0, r - block)), stride,
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
    rows = thread_rows(nrows, nt)
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
    rows = thread_rows(nrows, nt)
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
    rows = thread_rows(nrows, nt)
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
    live = [r > 0 for r in thread_rows(nrows, nt)]
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
    rows = thread_rows(nrows, nt)
    need = (theta + 16 * al0 + 16 * ald) * nt
    b = BumpAllocator()
    for t, r in enumerate(rows):
        b.alloc(f"theta[{t}]", theta, written=ne0 * 4 if r else 0)
        b.alloc(f"src0[{t}]", 16 * al0, written=row_extent(min(16, r), al0, row0))
    for t, r in enumerate(rows):
        b.alloc(f"dst[{t}]", 16 * ald, written=row_extent(min(16, r), ald, rowd))
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
