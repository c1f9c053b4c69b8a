"""May 2026's HMX plan, the DSP's own (hmx-matmul-ops.c: hmx_compute_chunks, then the rounded bump allocation of
hmx_matmul_q_f32, which can exceed VTCM: the seed's 256 B overflow), and what each profile does when it fails
(`2026-05`: op_matmul re-enters; `robust`: the HVX plan instead)."""

from __future__ import annotations

from kazeia.backends.htp.profiles import get_profile
from kazeia.backends.htp.vtcm.arena import (
    DEFAULT_PROFILE,
    DEFAULT_VTCM_SIZE,
    HMX_SCALES_BYTES,
    HMX_TILE,
    HMX_TILE_BYTES,
    BumpAllocator,
    align_up,
    ceil_div,
    check_profile,
)
from kazeia.backends.htp.vtcm.matmul.hmx_chunks import hmx_compute_chunks
from kazeia.backends.htp.vtcm.matmul.record import MatmulPlan, norm_qtype, x4x2_row_stride
from kazeia.errors import KazeiaError

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
    return get_profile(check_profile(profile)).hmx_failure


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

    prof = get_profile(profile)
    exact = (lambda mc, nc: _spec_used(spec(mc, nc))) if prof.plan_counts_rounding else None
    fail_outcome = "reenter" if prof.hmx_failure == "reenter" else "fallback"
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
