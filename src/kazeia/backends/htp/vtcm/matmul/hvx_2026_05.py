"""May 2026's HVX matmul plan: the spads of matmul-ops.c: op_matmul_hvx (VTCM_TOO_SMALL when they do not fit)."""

from __future__ import annotations

from typing import Any

from kazeia.backends.htp.vtcm.arena import (
    DEFAULT_HVX_THREADS,
    DEFAULT_PROFILE,
    DEFAULT_VTCM_SIZE,
    VLEN,
    BumpAllocator,
    align_up,
    ceil_div,
    check_profile,
    row_extent,
)
from kazeia.backends.htp.vtcm.matmul.record import SUPER_BLOCK, MatmulPlan, ggml_row_bytes, norm_qtype
from kazeia.errors import KazeiaError


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
    b.alloc("src1", src1_size, written=None if kernel == "f16-ddr" else row_extent(m, src1_row, src1_row))
    for t in range(n_threads):
        b.alloc(f"src0[{t}]", src0_pt)
    for t in range(n_threads):
        b.alloc(f"dst[{t}]", dst_pt)
    ok = b.used <= vtcm_size
    return MatmulPlan(path="hvx", m=m, k=k, n=n, qtype=qt, profile=profile, vtcm=vtcm_size, mc=None, nc=None,
                      areas=tuple(b.areas), used=b.used, status="ok" if ok else "vtcm_too_small",
                      outcome="runs" if ok else "dropped", n_threads=n_threads, row_stride=src0_stride, info=info,
                      reason="" if ok else f"VTCM_TOO_SMALL: needs {b.used} of {vtcm_size}")
