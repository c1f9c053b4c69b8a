"""The 4-stage pipeline of the quantized HMX matmul (hmx-matmul-ops.c: hmx_matmul_q_f32), in program order.

Per M chunk, over the column chunks i = 0..n-1 of the weights:
  A(i) DMA of the raw x4x2 rows into `qweight` (one buffer), B(i) HVX dequant into `wt[i%2]`, C(i) the HMX job
  (on the HMX queue thread) into `out[i%2]`, D(i) HVX store of `out[i%2]` to DDR.
Order: A0, activation staging, B0, A1, C0 queued, B1, then for each i: A(i+2) queued, wait C(i), queue C(i+1),
D(i), B(i+2). C(i+1) overlaps D(i) and B(i+2); the cost model's max(DMA, dequant, HMX) per chunk rests on that.

`schedule` lists the events; `final_contents` replays them to say which chunk each VTCM area holds when the
op ends (what the next op finds there).
"""

from __future__ import annotations


def schedule(n_chunks: int) -> list[tuple[str, int]]:
    """(stage, column chunk) events of one M chunk; stage "act" is the activation staging (chunk -1)."""
    if n_chunks <= 0:
        return []
    ev: list[tuple[str, int]] = [("A", 0), ("act", -1), ("B", 0)]
    if n_chunks > 1:
        ev.append(("A", 1))
    ev.append(("C", 0))
    if n_chunks > 1:
        ev.append(("B", 1))
    for i in range(n_chunks):
        if i + 2 < n_chunks:
            ev.append(("A", i + 2))
        ev.append(("waitC", i))
        if i + 1 < n_chunks:
            ev.append(("C", i + 1))
        ev.append(("D", i))
        if i + 2 < n_chunks:
            ev.append(("B", i + 2))
    return ev


_WRITES = {"A": "qweight", "B": "wt", "C": "out"}  # which area a stage writes (ping-pong areas take i % 2)


def final_contents(n_chunks: int) -> dict[str, int]:
    """Area name -> the column chunk whose data it holds after the op (last writer wins)."""
    held: dict[str, int] = {}
    for stage, i in schedule(n_chunks):
        area = _WRITES.get(stage)
        if area is None:
            continue
        held[area if area == "qweight" else f"{area}{i % 2}"] = i
    return held


def describe(n_chunks: int) -> str:
    return " ".join(f"{s}{i}" if i >= 0 else s for s, i in schedule(n_chunks))
