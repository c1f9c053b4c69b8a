"""HMX (matrix unit) matmul numerics of ggml-hexagon: x4x2 -> fp16 weight dequant, 32x32 fp16 tiles, the
fp16 read-out.

Upstream reference: htp/hmx-matmul-ops.c (dequantize_x4x2_*_group_hvx / _x4groups_hvx and their tile tasks,
transfer_activation_chunk_fp32_to_fp16, core_dot_chunk_fp16, transfer_output_chunk_fp16_to_fp32,
hmx_matmul_q_f32, hmx_matmul_f16_f32), htp/hmx-utils.h (tile geometry, hmx_interleave_rows_to_tiles),
htp/hvx-base.h (hvx_vec_f32_to_f16_shuff); snapshot ggml-org/ggml bb4dc86a.

Numerics (layout-free; the tile helpers below only matter for VTCM images, padding and staleness):
- weights: W16 = fp16(q * d) for Q4_0 (q - 8), IQ4_NL (table value) and Q8_0 (one rounding of the exact
  product, the qf16 multiply); Q4_1: fp16(fp16(q * d) + m) (qf16 multiply, then qf16 add, two roundings);
  F16: the stored values. Computed per tile of rows from the ggml blocks (`hmx_weight_rows`).
- activations: A16 = fp16(x) by the shuffled converter (|x| > 65504 -> inf; optional arch quirks).
- products accumulated inside HMX (internal precision not public), modelled in kazeia's own order
  (kernels/gemm.py, docs/hmx-numerics.md: float32, k ascending, one accumulator per output), then the read-out
  (scale 1.0, bias 0) rounds each output once to fp16 (|y| > 65504 -> inf) and the store widens it exactly to
  fp32. Every output is therefore an fp16 value.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from kazeia.backends.htp.fp16 import (
    fp16_bits,
    from_fp16_bits,
)
from kazeia.backends.htp.host.repack import RepackedWeight
from kazeia.backends.htp.kernels.gemm import SOURCES, hmx_products, product_scratch
from kazeia.backends.htp.kernels.rounding import round_hw, round_hw_transposed, shuffled_fp16
from kazeia.gguf.quants import QK
from kazeia.native.buffers import GrowingScratch
from kazeia.native.compile import available

GGMLType = GGMLQuantizationType

TILE = 32                      # tile rows = tile cols
TILE_ELEMS = TILE * TILE       # 1024 fp16
TILE_BYTES = 2 * TILE_ELEMS    # 2048 B


# --- weight dequant ---------------------------------------------------------------------------------------


def hmx_weight_fp16(w: RepackedWeight) -> np.ndarray:
    """(N, K) float32 of fp16 values: the whole HMX weight (for checks; the matmul works per tile of rows,
    `RepackedWeight.w16_rows`)."""
    return w.w16_rows()


# --- tile layout ------------------------------------------------------------------------------------------
#
# A tile is 32x32 fp16 = 16 vectors of 128 B; vector p holds rows 2p and 2p+1 interleaved by element, so the
# fp16 index of (r, c) inside a tile is 64*(r//2) + 2*c + (r%2).


def tile_index(r: int | np.ndarray, c: int | np.ndarray) -> int | np.ndarray:
    """fp16 index of logical (row, col) inside one 32x32 tile."""
    return 64 * (r // 2) + 2 * c + (r % 2)


def pack_tiles(mat: np.ndarray) -> np.ndarray:
    """(R, C) matrix (R, C multiples of 32, any dtype) -> (R/32, C/32, 1024) tiles, row-tile major."""
    r, c = mat.shape
    if r % TILE or c % TILE:
        raise ValueError(f"tile packing needs multiples of 32, got {mat.shape}")
    t = mat.reshape(r // TILE, TILE // 2, 2, c // TILE, TILE)        # (rt, pair, r%2, ct, col)
    return np.ascontiguousarray(t.transpose(0, 3, 1, 4, 2)).reshape(r // TILE, c // TILE, TILE_ELEMS)


def unpack_tiles(tiles: np.ndarray) -> np.ndarray:
    """Inverse of `pack_tiles`: (RT, CT, 1024) -> (RT*32, CT*32)."""
    rt, ct, _ = tiles.shape
    t = tiles.reshape(rt, ct, TILE // 2, TILE, 2).transpose(0, 2, 4, 1, 3)
    return np.ascontiguousarray(t).reshape(rt * TILE, ct * TILE)


def _to_bytes(tiles_f: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(fp16_bits(tiles_f)).view(np.uint8).reshape(-1)


def _from_bytes(b: np.ndarray, rt: int, ct: int) -> np.ndarray:
    b = np.ascontiguousarray(b, dtype=np.uint8).reshape(-1)
    need = rt * ct * TILE_BYTES
    if b.size < need:
        raise ValueError(f"tile image has {b.size} bytes, {rt}x{ct} tiles need {need}")
    return from_fp16_bits(b[:need].view(np.uint16)).reshape(rt, ct, TILE_ELEMS)


def pad_rows(a: np.ndarray, rows: int) -> np.ndarray:
    """a (2-D) with zero rows appended up to `rows`."""
    if a.shape[0] == rows:
        return a
    out = np.zeros((rows, a.shape[1]), dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


def activation_to_tiles(a16: np.ndarray) -> np.ndarray:
    """(M, K) fp16 values -> VTCM bytes of the activation tiles [ceil(M/32)][K/32] (pad rows = 0)."""
    m = a16.shape[0]
    return _to_bytes(pack_tiles(pad_rows(np.asarray(a16, dtype=np.float32), -(-m // TILE) * TILE)))


def activation_from_tiles(b: np.ndarray, m: int, k: int) -> np.ndarray:
    """Activation tile bytes -> (ceil(M/32)*32, K) float32 (pad rows included)."""
    rt = -(-m // TILE)
    return unpack_tiles(_from_bytes(b, rt, k // TILE))


def weight_to_tiles(w16: np.ndarray) -> np.ndarray:
    """(N, K) fp16 weight -> VTCM bytes of weight tiles [N/32][K/32]; tile (nt, kt) is the K x N block:
    row = k, col = n, so row pairs run along K. (The fp16 bits are taken first and permuted in one copy:
    the same bytes as packing the float32 K x N matrix, at a quarter of the traffic.)"""
    n, k = w16.shape
    if n % TILE or k % TILE:
        raise ValueError(f"tile packing needs multiples of 32, got {(k, n)}")
    b = fp16_bits(w16).reshape(n // TILE, TILE, k // TILE, TILE // 2, 2)   # (nt, col, kt, pair, k%2)
    return np.ascontiguousarray(b.transpose(0, 2, 3, 1, 4)).view(np.uint8).reshape(-1)


def weight_from_tiles(b: np.ndarray, n: int, k: int) -> np.ndarray:
    """Weight tile bytes -> (N, K) float32."""
    t = _from_bytes(b, n // TILE, k // TILE).transpose(1, 0, 2)
    return unpack_tiles(np.ascontiguousarray(t)).T.copy()


def output_to_tiles(y16: np.ndarray) -> np.ndarray:
    """(M, N) fp16 outputs -> VTCM bytes of output tiles [ceil(M/32)][N/32] (pad rows = 0)."""
    m = y16.shape[0]
    return _to_bytes(pack_tiles(pad_rows(np.asarray(y16, dtype=np.float32), -(-m // TILE) * TILE)))


def output_from_tiles(b: np.ndarray, m: int, n: int) -> np.ndarray:
    """Output tile bytes -> the (M, N) float32 the store writes to DDR (rows >= M are not stored)."""
    rt = -(-m // TILE)
    return unpack_tiles(_from_bytes(b, rt, n // TILE))[:m]


def stage_activations(x: np.ndarray, arch: int | None = None, prev: np.ndarray | None = None) -> np.ndarray:
    """f32 src1 rows (M, K) -> the activation tile image [ceil(M/32)][K/32] the staging task writes.

    Converted with the shuffled converter (`f32_to_f16_shuffled`: |x| > 65504 -> inf; below v79 -inf -> NaN
    when `arch` is given). Rows M .. ceil(M/32)*32-1 of the last row tile are zero-filled (upstream since
    #22724) when `prev` is None; with `prev` (the bytes previously in that VTCM area, same size) every
    element of those pad rows keeps its previous value instead (pre-#22724 / htp-ops-lib behaviour).
    """
    x = np.asarray(x, dtype=np.float32)
    if x.shape[1] % TILE:
        raise ValueError(f"K={x.shape[1]} must be a multiple of 32")
    return stage_a16(shuffled_fp16(x, arch), prev)


def stage_a16(a16: np.ndarray, prev: np.ndarray | None = None) -> np.ndarray:
    """`stage_activations` from the converted rows a16 (M, K) (fp16 values as float32)."""
    m, k = a16.shape
    if k % TILE:
        raise ValueError(f"K={k} must be a multiple of 32")
    img = activation_to_tiles(a16)
    if prev is not None and m % TILE:
        old = np.asarray(prev, dtype=np.uint8).reshape(-1)
        if old.size != img.size:
            raise ValueError(f"prev must have {img.size} bytes, got {old.size}")
        stale = pad_rows(np.zeros((m, k), dtype=bool), img.size // (2 * k))
        stale[m:] = True
        mask = pack_tiles(stale).reshape(-1)               # per fp16 element
        img = img.view(np.uint16).copy()
        img[mask] = old.view(np.uint16)[mask]
        img = img.view(np.uint8)
    return img


# --- the matmul -------------------------------------------------------------------------------------------


def hmx_matmul(a16: np.ndarray, w16: np.ndarray) -> np.ndarray:
    """y (M, N) float32 = fp16(A16 @ W16^T), every element fp16-representable.

    a16: (M, K) float32 of fp16 values; w16: (N, K) float32 of fp16 values. The products are accumulated in
    kazeia's HMX order (kernels/gemm.py: float32, k ascending, one accumulator per output), then read out: one fp16
    rounding (|y| > 65504 -> inf) per output. The same bits on every host, and a row's bits do not depend on M."""
    a = np.ascontiguousarray(a16, dtype=np.float32)
    w = np.ascontiguousarray(w16, dtype=np.float32)
    if a.shape[1] != w.shape[1]:
        raise ValueError(f"K mismatch: {a.shape} vs {w.shape}")
    return read_out(hmx_products(a, w.shape[0], "f32", w, w.strides[0]), a.shape[0])


# float32 of one tile of fp16 weight rows, where the weight is dequantized before its products (the portable path,
# a fault's patch): the native kernels dequantize into their own blocks instead.
TILE_WEIGHT_BYTES = 16 << 20


_TILES = GrowingScratch(np.float32, minimum=TILE_WEIGHT_BYTES // 4)  # one tile of weight rows per thread


def _tile_scratch(n: int) -> np.ndarray:
    """A float32 scratch of at least n elements (n <= TILE_WEIGHT_BYTES / 4 for the matmul's tiles), reused by
    every matmul on this thread: its pages are touched once, not on every tile of every call."""
    return _TILES.take(n)


def weight_tile_rows(k: int) -> int:
    """Weight rows dequantized at a time where the weight is dequantized first: TILE_WEIGHT_BYTES of float32,
    whole 32-row tiles."""
    return max(TILE, TILE_WEIGHT_BYTES // (4 * k) // TILE * TILE)


def _fused_source(w: RepackedWeight) -> tuple[str, np.ndarray] | None:
    """(kernel source, its rows) where the native kernel dequantizes the weight itself (F16 rows and the ggml
    blocks of its kinds), else None (a K-quant's weight object dequantizes its own rows first)."""
    if not available() or w.k % QK or not isinstance(w, RepackedWeight):
        return None
    if w.qtype == GGMLType.F16:
        return "f16", w.ggml
    kind = w.qtype.name.lower()
    return (kind, w.blocks()[0]) if kind in SOURCES else None


def hmx_matmul_weight(a16: np.ndarray, w: RepackedWeight, patch=None, scale: float = 1.0,
                      out: np.ndarray | None = None) -> np.ndarray:
    """`hmx_matmul(a16, w.w16)` without ever holding the whole fp16 weight: the same bits.

    The native kernel dequantizes the weight into its own blocks; otherwise (the portable path, or a `patch`)
    the weight is dequantized per tile of rows first. `patch(r0, w16_tile)` may replace a tile before it is used
    (fault injections). `scale`, when it is not 1.0, multiplies each float32 sum before the read-out (a stale
    HMX bias/scale). `out`: a C-contiguous float32 (M, N) array to read the outputs into (the op's dst)."""
    a = np.ascontiguousarray(a16, dtype=np.float32)
    if a.shape[1] != w.k:
        raise ValueError(f"K mismatch: {a.shape} vs ({w.n}, {w.k})")
    if out is not None and (out.shape != (a.shape[0], w.n) or out.dtype != np.float32 or not out.flags.c_contiguous):
        raise ValueError(f"out must be a C-contiguous float32 array of shape {(a.shape[0], w.n)}")
    m = a.shape[0]
    ct = product_scratch(w.n, m)
    fused = None if patch is not None else _fused_source(w)
    if fused is not None:
        src, rows = fused
        hmx_products(a, w.n, src, rows, rows.strides[0], ct)
    else:
        step = weight_tile_rows(w.k)
        scratch = _tile_scratch(min(step, w.n) * w.k)
        for r0 in range(0, w.n, step):
            r1 = min(w.n, r0 + step)
            t = w.w16_rows(r0, r1, out=scratch)
            if patch is not None:
                t = np.ascontiguousarray(patch(r0, t), dtype=np.float32)
            hmx_products(a, r1 - r0, "f32", t, t.strides[0], ct[r0:r1])
    return read_out(ct, m, scale, out)


def read_out(ct: np.ndarray, m: int, scale: float = 1.0, out: np.ndarray | None = None) -> np.ndarray:
    """The HMX read-out of the sums ct (N, >= M): y (M, N) = fp16(scale * ct[:, :M].T) (|y| > 65504 -> inf), into
    `out` when given."""
    n = ct.shape[0]
    y = np.empty((m, n), dtype=np.float32) if out is None else out
    sums = ct[:, :m]
    if scale == 1.0:
        round_hw_transposed(sums, y)
        return y
    with np.errstate(all="ignore"):
        np.multiply(sums.T, np.float32(scale), out=y)
    return round_hw(y, out=y)


def hmx_mul_mat(w: RepackedWeight, x: np.ndarray, arch: int | None = None) -> np.ndarray:
    """Convenience: the HMX MUL_MAT of weight `w` and f32 src1 rows `x` (M, K) -> (M, N) float32."""
    a16 = shuffled_fp16(np.asarray(x, dtype=np.float32), arch)
    return hmx_matmul_weight(a16, w)
