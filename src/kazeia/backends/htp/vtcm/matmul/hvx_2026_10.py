"""October 2026's host-side HVX matmul plan, the path a MUL_MAT takes when HMX is not eligible (M <= 4) or its
solver finds nothing that fits: the kernel choice, the prefetch depth, the grouped VTCM layout and the M-chunk
solver (upstream `htp/matmul-ops.h` htp_mm_hvx_vtcm_layout_build / htp_mm_hvx_solve_vtcm_params, and
`ggml-hexagon.cpp:ggml_hexagon_precompute_hvx_mm_params` for a 2-D MUL_MAT, llama.cpp 0c1e57098bba, restated).

When this solver finds nothing either, the kernel is UNSUPPORTED and `supports_op` sends the op to the CPU. The
fused (MUL_MAT_NX) and MUL_MAT_ID layouts are not restated here yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazeia.backends.htp.vtcm.arena import align_up, ceil_div
from kazeia.backends.htp.vtcm.matmul.hmx_2026_10 import ALIGNED_TILE, MIN_ROWS
from kazeia.gguf.quants import bytes_per_32

QK_Q8_0_TILED = 128  # htp-ops.h
ACT_TILE_Q8_0 = 1152  # HTP_MM_ACT_TILE_SIZE_Q8_0: 128 activations quantized to int8 in the tiled layout
ACT_TILE_Q8_1 = 1280  # ... with block sums, for weights with an offset
MAX_PREFETCH = 16  # HTP_MM_MAX_PREFETCH
REPACKED = ("q4_0", "q4_1", "q8_0", "iq4_nl", "mxfp4", "q6_k", "q4_k", "q5_k")
WITH_OFFSET = ("q4_1", "q4_k", "q5_k")  # htp_mm_weight_has_offset: activations carry block sums (q8_1)


def act_row_bytes(wtype: str, k: int) -> int:
    """htp_mm_q8_0_tiled_row_size / htp_mm_q8_1_tiled_row_size: K padded to 128, in 32-element tiles."""
    tiles = align_up(k, 128) // 32
    return tiles * (ACT_TILE_Q8_1 if wtype in WITH_OFFSET else ACT_TILE_Q8_0)


def weight_row_bytes(wtype: str, k: int) -> int:
    """ggml's nb[1] of the weight (src0->nb[1]), which the host passes as src0_row_size."""
    return int(k * bytes_per_32(wtype) / 32)


@dataclass(frozen=True)
class HvxLayout:
    """Group A (activations, fused src2) persists; group B (weight prefetch, output slices) and group C (raw fp32
    activation staging) overlap after it."""

    src1: int
    src2: int
    src0: int
    dst: int
    act_raw: int

    @property
    def total(self) -> int:
        return self.src1 + self.src2 + max(self.src0 + self.dst, self.act_raw)


def layout(kernel: str, wtype: str, k: int, nrows: int, n_threads: int, dst_row: int, src0_row: int,
           n_prefetch: int, src2_row: int = 0) -> HvxLayout:
    """htp_mm_hvx_vtcm_layout_build for a 2-D MUL_MAT (not fused, not MUL_MAT_ID). kernel: quant-row,
    quant-block, f16 or f32."""
    src2 = align_up(src2_row, 128) if src2_row > 0 else 0
    src0_padded = align_up(src0_row, 128)
    dst_rows = 0 if nrows > 1 else 1
    if kernel == "f16":
        src1 = align_up(align_up(2 * k, 128) * nrows, 256)
        src0 = align_up(n_prefetch * src0_padded, 256) * n_threads
        dst = align_up(dst_row, 128) * n_threads if dst_rows else 0
        act_raw = align_up(align_up(4 * k, 128) * nrows, 128)
    elif kernel == "f32":
        src1 = align_up(align_up(4 * k, 128) * nrows, 256)
        src0 = align_up(n_prefetch * src0_padded, 256) * n_threads
        dst = align_up(dst_row, 128) * n_threads if dst_rows else 0
        act_raw = 0
    else:
        src1 = align_up(act_row_bytes(wtype, k) * nrows, 256)
        src0 = align_up(n_prefetch * src0_padded, 256) * n_threads
        if wtype in REPACKED:
            src0 = align_up(n_prefetch * (k // 32) * ALIGNED_TILE[wtype], 256) * n_threads
        dst = align_up(ceil_div(dst_row, n_threads), 128) * n_threads if dst_rows and nrows == 1 else 0
        act_raw = align_up(align_up(4 * k, 4 * QK_Q8_0_TILED) * nrows, 128)
    return HvxLayout(src1, src2, src0, dst, act_raw)


def solve_rows(kernel: str, wtype: str, k: int, nrows: int, n_threads: int, dst_row: int, src0_row: int,
               n_prefetch: int, vtcm_budget: int, src2_row: int = 0) -> tuple[HvxLayout, int] | None:
    """htp_mm_hvx_solve_vtcm_params: every row at once if it fits, else the largest even M chunk the room left by
    the fixed areas holds, stepped down by 2 until the layout fits. None: nothing fits."""
    L = layout(kernel, wtype, k, nrows, n_threads, dst_row, src0_row, n_prefetch, src2_row)
    if L.total <= vtcm_budget:
        return L, nrows
    fixed = L.src0 + L.src2 + L.dst
    if vtcm_budget <= fixed:
        return None
    quant = kernel in ("quant-row", "quant-block")
    row = act_row_bytes(wtype, k) if quant else align_up((2 if kernel == "f16" else 4) * k, 128)
    eff_row = row + (align_up(4 * k, 4 * QK_Q8_0_TILED) if quant else 0)
    m_chunk = (vtcm_budget - fixed) // eff_row
    if m_chunk > 1:
        m_chunk &= ~1
    m_chunk = min(m_chunk, nrows)
    if m_chunk < 1:
        return None
    L = layout(kernel, wtype, k, m_chunk, n_threads, dst_row, src0_row, n_prefetch, src2_row)
    while m_chunk > 2 and L.total > vtcm_budget:
        m_chunk -= 2
        L = layout(kernel, wtype, k, m_chunk, n_threads, dst_row, src0_row, n_prefetch, src2_row)
    return (L, m_chunk) if L.total <= vtcm_budget else None


@dataclass(frozen=True)
class HvxPlan:
    kernel: str  # quant-row, quant-block, f16, f32
    n_prefetch: int
    m_chunk: int  # 0: every row at once (the kernel parameter's meaning)
    layout: HvxLayout

    @property
    def vtcm_bytes(self) -> int:
        return self.layout.total


def plan(wtype: str, k: int, n: int, m: int, n_threads: int, vtcm_budget: int, src2_row: int = 0) -> HvxPlan | None:
    """ggml_hexagon_precompute_hvx_mm_params for a 2-D MUL_MAT (weight k x n, m rows of F32 activations). None:
    the kernel is UNSUPPORTED (K not a multiple of 32 for a quantized weight, or nothing fits): the op goes to the
    CPU."""
    dst_row, src0_row = 4 * n, weight_row_bytes(wtype, k)
    if wtype in ("f16", "f32"):
        found = solve_rows(wtype, wtype, k, m, n_threads, dst_row, src0_row, MAX_PREFETCH, vtcm_budget, src2_row)
        return None if found is None else HvxPlan(wtype, MAX_PREFETCH, found[1] if found[1] < m else 0, found[0])
    if k % 32:
        return None
    kernel = "quant-block" if m < n_threads else "quant-row"
    depth = 2
    for d in (MAX_PREFETCH, 8, 4, 2) if m <= MIN_ROWS else (2,):
        if layout(kernel, wtype, k, m, n_threads, dst_row, src0_row, d, src2_row).total <= vtcm_budget:
            depth = d
            break
    found = solve_rows(kernel, wtype, k, m, n_threads, dst_row, src0_row, depth, vtcm_budget, src2_row)
    return None if found is None else HvxPlan(kernel, depth, found[1] if found[1] < m else 0, found[0])


def nx_layout_bytes(wtype: str, k: int, nrows: int, n_threads: int, vtcm_budget: int) -> int:
    """The fused MUL_MAT_NX HVX layout (htp_mm_hvx_vtcm_layout_build with is_fused_nx, kernel QUANT_ROW, at the
    prefetch depth ggml_hexagon_precompute_fused_mmnx_params picks: 16, 8, 4, 2 for M <= 4, else 2): group A the
    quantized activations, then the per-thread weight prefetch over the raw fp32 staging."""
    def total(depth: int) -> int:
        tile_row = (align_up(k, 32) // 32) * ALIGNED_TILE[wtype]
        src0 = align_up(depth * tile_row, 128) * n_threads
        src1 = align_up(act_row_bytes(wtype, k) * nrows, 128)
        act_raw = align_up(align_up(4 * k, 4 * QK_Q8_0_TILED) * nrows, 128)
        return src1 + max(src0, act_raw)

    depths = (MAX_PREFETCH, 8, 4, 2) if nrows <= MIN_ROWS else (2,)
    return total(next((d for d in depths if total(d) <= vtcm_budget), 2))
