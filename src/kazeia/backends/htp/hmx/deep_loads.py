"""HMX deep loads: the mxmem load runs an HMX matmul plan issues (hmx-matmul-ops.c: core_dot_chunk_fp16), and
which cross a VTCM bank.

The March 2026 hmx-matmul-ops.c warned that an mxmem run must not straddle a 4 MiB bank (the comment went away in
ggml-org/llama.cpp #21554 with no stated reason); the optional
`vtcm-bank-crossing` fault (an unverified hypothesis) turns such a run into a bus error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kazeia.backends.htp.vtcm.arena import HMX_TILE, HMX_TILE_BYTES, ceil_div
from kazeia.backends.htp.vtcm.matmul.record import MatmulPlan

HMX_DEEP_RUN_TILES = 32  # core_dot_chunk_fp16 loads at most 32 K-tiles per activation/weight load
BANK_BYTES = 4 * 1024 * 1024  # the VTCM bank size the March 2026 hmx-matmul-ops.c warned mxmem runs must not cross


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
    weights, one `weight` buffer for F16; 2026-10: the dequant scratch buffers, alternating when pipelined).
    Output stores are single 2048 B tiles at 2048-aligned offsets and cannot straddle a bank, so they are not
    listed."""
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
    names = {a.name for a in plan.areas}
    if "act_f32" in names:  # 2026-10: HMX reads the dequantized tiles from scratch0 / scratch1 (pipelined)
        bufs = ("scratch0", "scratch1") if "scratch1" in names else ("scratch0",)
    else:
        bufs = ("weight",) if plan.qtype == "f16" else ("wt0", "wt1")
    col_tiles: dict[str, int] = {}  # weight buffer -> most column tiles any chunk loads from it
    for i, nc0 in enumerate(range(0, plan.n, plan.nc)):
        name = bufs[i % len(bufs)]
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
    for the optional 0x2601 bus-error fault (`vtcm-bank-crossing`, an unverified hypothesis)."""
    return [d for d in hmx_deep_loads(plan) if d.offset // bank != (d.end - 1) // bank]
