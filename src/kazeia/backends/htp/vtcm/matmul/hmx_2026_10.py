"""October 2026's host-side HMX matmul plan: the chunk search, the exact VTCM layout and the solver that keeps a
candidate only when its exact layout fits (upstream `htp/matmul-ops.h` of llama.cpp 0c1e57098bba, restated).

In May the DSP chose its chunks and, when the rounded layout did not fit, re-entered op_matmul (the seed's
crash). In October the host solves the plan per node before anything is queued
(`ggml-hexagon.cpp:ggml_hexagon_precompute_hmx_mm_params`): for act_threads = n_threads, n/2, ..., 1 it takes the
chunk search's candidate (`htp_mm_hmx_compute_chunks`, the same search as May's: hmx_chunks.py),
builds the exact layout (`htp_mm_hmx_vtcm_layout_build`) and keeps it only if it fits the session's VTCM; it
prefers fewer M blocks, then more act threads. There is no retry with a smaller chunk: when nothing fits, HMX is
not used (HVX, else the CPU). This module is the 2-D kernel's plan (`HTP_MM_KERNEL_HMX_2D`, every quantized and
F32 weight, and F16 when not batched) and the batched F16 kernel's (`HTP_MM_KERNEL_HMX_F16_BATCHED`); MUL_MAT_ID's
is not restated here.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazeia.backends.htp.vtcm.arena import align_up, ceil_div
from kazeia.backends.htp.vtcm.matmul.hmx_chunks import hmx_compute_chunks

TILE = 2048  # HTP_MM_HMX_TILE_SIZE: 32 x 32 fp16
MIN_ROWS = 4  # HTP_MM_HMX_MIN_NROWS: HMX only when M > 4
COST_W_DEQUANT = 3  # HTP_MM_HMX_COST_W_DEQUANT
COST_A_CONVERT = 2  # HTP_MM_HMX_COST_A_CONVERT
ACT_ROWS_MULTIPLIER = 4  # HTP_MM_DMA_ACT_MULTIPLIER (2 rows per step, x2)
QK_TILED = 256  # QK_Q4_0_TILED (htp-ops.h)

# HTP_MM_WEIGHT_TILE_SIZE_* and HTP_MM_WEIGHT_ALIGNED_TILE_SIZE_* (htp_mm_get_weight_[aligned_]tile_size)
WEIGHT_TILE = {"q4_0": 576, "iq4_nl": 576, "q4_1": 640, "q4_k": 640, "q8_0": 1088, "q5_k": 768, "q6_k": 896,
               "mxfp4": 544}
ALIGNED_TILE = {"q4_0": 640, "iq4_nl": 640, "q4_1": 640, "q4_k": 640, "q8_0": 1152, "q5_k": 768, "q6_k": 896,
                "mxfp4": 640}
HMX_WEIGHT_TYPES = ("f16", "f32", *WEIGHT_TILE)  # ggml_hexagon_is_hmx_weight_type


def is_quant(wtype: str) -> bool:
    return wtype not in ("f16", "f32")


def tiled_row_stride(wtype: str, k: int) -> int:
    """htp_mm_get_tiled_row_stride: bytes of one weight row in the repacked (tiled) layout."""
    if wtype == "f16":
        return 2 * k
    if wtype == "f32":
        return 4 * k
    return ceil_div(k, QK_TILED) * WEIGHT_TILE[wtype]


def pipelined(m: int) -> bool:
    """htp_mm_hmx_pipeline: double-buffered weights, scratch and outputs when M > 32."""
    return m > 32


def chunk_costs_2d(wtype: str, k: int, pipeline: bool) -> tuple[int, int, int]:
    """htp_mm_hmx_get_2d_chunk_costs: VTCM bytes per output column, per activation row, per output element."""
    p = 2 if pipeline else 1
    vec_dot = 2 * k
    weight_row = (k // 32) * ALIGNED_TILE[wtype] // 32 if is_quant(wtype) else tiled_row_stride(wtype, k)
    return p * weight_row + p * vec_dot, vec_dot, p * 2


def overhead_2d(pipeline: bool, is_matmul_id: bool = False) -> int:
    """htp_mm_hmx_get_2d_overhead: rounding slack for the areas (7, 5 or 4 tiles) plus 256 B."""
    return (7 if pipeline else 4 if is_matmul_id else 5) * TILE + 256


@dataclass(frozen=True)
class HmxLayout2d:
    """htp_mm_hmx_vtcm_layout_build for HTP_MM_KERNEL_HMX_2D. Group A (scales, activation tiles, fused src2)
    persists; group B (weights, outputs, dequant scratch) and group C (fp32 activation staging) overlap after it."""

    scales: int
    act: int
    src2: int
    weight: int  # one weight buffer (two when pipelined)
    dst: int  # one output buffer (two when pipelined)
    scratch: int  # one dequant scratch (two when pipelined)
    act_f32: int
    pipeline: bool

    @property
    def group_a(self) -> int:
        return self.scales + self.act + self.src2

    @property
    def group_b(self) -> int:
        n = 2 if self.pipeline else 1
        return n * (self.weight + self.dst + self.scratch)

    @property
    def total(self) -> int:
        return self.group_a + max(self.group_b, self.act_f32)


def layout_2d(wtype: str, k: int, mc: int, nc: int, pipeline: bool, act_threads: int,
              src2_bytes: int = 0) -> HmxLayout2d:
    vec_dot = 2 * k
    weight = (align_up((nc // 32) * (k // 32) * ALIGNED_TILE[wtype], TILE) if is_quant(wtype)
              else align_up(nc * tiled_row_stride(wtype, k), TILE))
    act = align_up(mc * vec_dot, TILE)
    dst = align_up(mc * nc * 2, TILE)
    scratch = align_up(nc * vec_dot, TILE)
    src2 = align_up(src2_bytes, TILE) if src2_bytes > 0 else 0
    group_b = (2 if pipeline else 1) * (weight + dst + scratch)
    min_f32 = align_up(act_threads * ACT_ROWS_MULTIPLIER * k * 4, 128)
    act_f32 = align_up(min(act_threads * 64 * k * 4, max(min_f32, group_b)), 128)
    return HmxLayout2d(TILE, act, src2, weight, dst, scratch, act_f32, pipeline)


@dataclass(frozen=True)
class HmxSolution:
    m_chunk: int
    n_chunk: int
    act_threads: int
    vtcm_bytes: int  # the exact layout's total
    pipeline: bool


def solve_2d(wtype: str, k: int, n: int, m: int, n_threads: int, vtcm_budget: int,
             src2_bytes: int = 0) -> HmxSolution | None:
    """The host's HMX plan of a 2-D MUL_MAT (weight k x n of `wtype`, m activation rows): htp_mm_hmx_solve_2d_params
    with the arguments ggml_hexagon_precompute_hmx_mm_params passes (K and N padded to 32 for repacked types, M
    padded to 32 for the chunk search, the raw M for the cost). None: HMX refused for this budget."""
    k_pad, n_pad = (align_up(k, 32), align_up(n, 32)) if is_quant(wtype) else (k, n)
    m_pad = align_up(m, 32)
    pipeline = pipelined(m)
    per_n, per_m, per_mn = chunk_costs_2d(wtype, k_pad, pipeline)
    overhead = overhead_2d(pipeline) + (align_up(src2_bytes, TILE) if src2_bytes > 0 else 0)
    best: HmxSolution | None = None
    best_mblocks = None
    act_threads = n_threads
    while act_threads >= 1:
        found = hmx_compute_chunks(vtcm_budget, overhead, per_n, per_m, per_mn, m_pad, n_pad,
                                   n_pad * COST_W_DEQUANT, m * COST_A_CONVERT)  # the search May had
        if found is not None:
            mc, nc, _ = found
            exact = layout_2d(wtype, k_pad, mc, nc, pipeline, act_threads, src2_bytes).total
            mblocks = ceil_div(m, mc)
            if exact <= vtcm_budget and (best_mblocks is None or mblocks < best_mblocks):
                best, best_mblocks = HmxSolution(mc, nc, act_threads, exact, pipeline), mblocks
        act_threads = 0 if act_threads == 1 else act_threads // 2
    return best


def hmx_eligible(wtype: str, k: int, n: int, m: int, src1_f32: bool = True, batched: bool = False) -> bool:
    """ggml_hexagon_matmul_is_hmx_eligible for a contiguous 2-D MUL_MAT: src1 F32, an HMX weight type, N padded
    to 32 (repacked types are padded), K % 32 == 0, not batched unless F16, and M > HTP_MM_HMX_MIN_NROWS."""
    n_pad = align_up(n, 32) if is_quant(wtype) else n
    return (src1_f32 and wtype in HMX_WEIGHT_TYPES and n_pad % 32 == 0 and k % 32 == 0
            and (not batched or wtype == "f16") and m > MIN_ROWS)


# --- the batched F16 kernel (HTP_MM_KERNEL_HMX_F16_BATCHED: KQ and KQV without flash attention) -------------


def batched_chunk_costs(k: int, group_size: int) -> tuple[int, int, int]:
    """htp_mm_hmx_get_batched_chunk_costs: per output column 3 fp16 rows of K, per activation row one per head of the
    group, per output element 2 B."""
    vec_dot = 2 * k
    return 3 * vec_dot, group_size * vec_dot, 2


BATCHED_OVERHEAD = 5 * TILE + 256  # htp_mm_hmx_get_batched_overhead


def batched_layout_total(k: int, mc: int, nc: int, group_size: int, act_threads: int, src2_bytes: int = 0) -> int:
    """htp_mm_hmx_vtcm_layout_build for HTP_MM_KERNEL_HMX_F16_BATCHED: group A [activation tiles of the group's heads]
    [scales 2 KiB][src2], group B [weight][outputs of the group][scratch0][scratch1], group C (fp32 staging) over
    group B."""
    vec_dot = 2 * k
    weight = align_up(nc * vec_dot, TILE)
    act = align_up(group_size * mc * k * 2, TILE)
    dst = align_up(group_size * mc * nc * 2, TILE)
    scratch = align_up(nc * vec_dot, TILE)
    group_a = act + TILE + (align_up(src2_bytes, TILE) if src2_bytes > 0 else 0)
    group_b = weight + dst + 2 * scratch
    min_f32 = align_up(act_threads * ACT_ROWS_MULTIPLIER * k * 4, 128)
    act_f32 = align_up(min(act_threads * 64 * k * 4, max(min_f32, group_b)), 128)
    return group_a + max(group_b, act_f32)


def solve_batched(k: int, n: int, m: int, group_size: int, n_threads: int, vtcm_budget: int,
                  src2_bytes: int = 0) -> HmxSolution | None:
    """htp_mm_hmx_solve_batched_params (ggml_hexagon_precompute_hmx_mm_params tries it first for a batched F16
    MUL_MAT whose src1 heads share a weight head, group_size > 1): the act-threads loop of solve_2d with the batched
    costs, overhead and layout. m: src1 rows per head (ne11); n: the weight's rows (ne01, F16: not padded)."""
    per_n, per_m, per_mn = batched_chunk_costs(k, group_size)
    overhead = BATCHED_OVERHEAD + (align_up(src2_bytes, TILE) if src2_bytes > 0 else 0)
    best, best_mblocks = None, None
    act_threads = n_threads
    while act_threads >= 1:
        found = hmx_compute_chunks(vtcm_budget, overhead, per_n, per_m, per_mn, align_up(m, 32), n,
                                   n * COST_W_DEQUANT, m * COST_A_CONVERT)
        if found is not None:
            mc, nc, _ = found
            exact = batched_layout_total(k, mc, nc, group_size, act_threads, src2_bytes)
            mblocks = ceil_div(m, mc)
            if exact <= vtcm_budget and (best_mblocks is None or mblocks < best_mblocks):
                best, best_mblocks = HmxSolution(mc, nc, act_threads, exact, False), mblocks
        act_threads = 0 if act_threads == 1 else act_threads // 2
    return best
