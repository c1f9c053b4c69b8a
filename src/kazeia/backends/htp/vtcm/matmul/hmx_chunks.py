"""The HMX chunk search both code generations share (May's DSP-side hmx-matmul-ops.c: hmx_compute_chunks; October's
host-side matmul-ops.h: htp_mm_hmx_compute_chunks, the same search): which (mc, nc) tiles of M and N one pass
of the HMX matmul works on, given the VTCM it may use."""

from __future__ import annotations

from collections.abc import Callable

from kazeia.backends.htp.vtcm.arena import HMX_TILE, align_down, ceil_div


def hmx_compute_chunks(vtcm_total: int, overhead: int, per_n: int, per_m: int, per_mn: int, m: int, n: int,
                       m_block_cost: int, n_block_cost: int,
                       exact: Callable[[int, int], int] | None = None) -> tuple[int, int, int] | None:
    """The (mc, nc) search of hmx-matmul-ops.c: hmx_compute_chunks, unchanged in October's host-side
    matmul-ops.h: htp_mm_hmx_compute_chunks; returns (mc, nc, estimated total) or None.

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
    # nc above usable // per_n cannot fit its weight columns (the `continue` below): October starts there
    for nc in range(align_down(min(n, usable // per_n), HMX_TILE), HMX_TILE - 1, -HMX_TILE):
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
