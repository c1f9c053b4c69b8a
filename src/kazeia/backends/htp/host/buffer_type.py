"""The HTP buffer type of October's host (ggml-hexagon.cpp `ggml_backend_hexagon_buffer_type_*`): which weights it
repacks (`ggml_hexagon_is_repack_type`) and the bytes one takes there (`get_alloc_size`). May's code keeps ggml's
sizes (its repack keeps the blocks' bytes)."""

from __future__ import annotations

from kazeia.graph.tensor import GGMLType, row_size

BUFFER_ALIGN = 128  # ggml_backend_hexagon_buffer_type_get_alignment (HVX)
REPACK = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.Q4_K,
          GGMLType.Q5_K, GGMLType.Q6_K)  # ggml_hexagon_is_repack_type
# ggml_hexagon_tiled_row_size: the K-quant tiles keep their scales and mins unpacked, HTP_MM_WEIGHT_TILE_SIZE_* / 32
# bytes per 32 values (Q4_K takes Q4_1's tile); the other repack types keep the blocks' bytes
TILED_BYTES_PER_32 = {GGMLType.Q6_K: 896 // 32, GGMLType.Q4_K: 640 // 32, GGMLType.Q5_K: 768 // 32}


def alloc_size(qtype: GGMLType, ne: tuple[int, ...], nbytes: int, generation: str) -> int:
    """The bytes one tensor takes in the HTP buffer type under `generation`: October's repack types in tiled rows,
    K and N rounded up to 32 (ggml_backend_hexagon_buffer_type_get_alloc_size); anything else, and May, `nbytes`."""
    if generation != "2026-10" or qtype not in REPACK:
        return nbytes
    k, n = -(-ne[0] // 32) * 32, -(-ne[1] // 32) * 32
    rest = 1
    for d in ne[2:]:
        rest *= d
    per_row = k // 32 * TILED_BYTES_PER_32[qtype] if qtype in TILED_BYTES_PER_32 else row_size(qtype, k)
    return per_row * n * rest
