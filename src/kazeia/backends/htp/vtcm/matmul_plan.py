"""MUL_MAT plans: the path `op_matmul` takes for given shapes and the VTCM layout of its kernel.

The HMX chunk search of the May 2026 snapshot (hmx-matmul-ops.c: hmx_compute_chunks) and the rounded bump
allocation of hmx_matmul_q_f32, which can exceed VTCM; the HVX matmul spads (matmul-ops.c: op_matmul_hvx); the
dispatch gates of matmul-ops.c: op_matmul; and what happens on an HMX failure under each profile. The mxmem load
runs of an HMX plan are in deep_loads.py. Offsets are bytes from `vtcm_base`. `plan_for_node` is the entry point
for a graph node: the backend, the cost model, the routing gates and the forensic tools all plan through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kazeia.backends.htp.profiles import get_profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.arena import (
    DEFAULT_HVX_THREADS,
    DEFAULT_PROFILE,
    DEFAULT_VTCM_SIZE,
    HMX_ARCHS,
    HMX_SCALES_BYTES,
    HMX_TILE,
    HMX_TILE_BYTES,
    VLEN,
    Area,
    BumpAllocator,
    align_down,
    align_up,
    ceil_div,
    check_profile,
    find_area,
    row_extent,
)
from kazeia.errors import KazeiaError
from kazeia.gguf.quants import bytes_per_32
from kazeia.graph import builder as gb
from kazeia.graph.tensor import GGMLType, Tensor, TFlag, make_tensor

SUPER_BLOCK = 256  # x4x2 super-block: 8 ggml blocks of 32

# ggml block bytes per 32 elements, i.e. the tensor descriptor's nb[1] per 32 columns (REPACK keeps ggml strides)
QTYPES = ("q4_0", "q4_1", "q8_0", "iq4_nl", "mxfp4", "f16")
_BLOCK32_BYTES = {q: int(bytes_per_32(q)) for q in QTYPES}  # gguf/quants.py
HMX_TYPES = ("f16", "q4_0", "q4_1", "q8_0", "iq4_nl", "mxfp4")  # matmul-ops.c: op_matmul type gate


def norm_qtype(qtype: Any) -> str:
    """'q4_0' / 'Q4_0' / GGMLType.Q4_0 -> 'q4_0'."""
    name = getattr(qtype, "name", qtype)
    name = str(name).lower()
    if name not in _BLOCK32_BYTES:
        raise KazeiaError(f"unsupported HTP matmul weight type '{qtype}' (supported: {', '.join(QTYPES)})")
    return name


def ggml_row_bytes(qtype: str, k: int) -> int:
    """The weight tensor's nb[1] (what the HVX path DMAs per row)."""
    return _BLOCK32_BYTES[norm_qtype(qtype)] * ceil_div(k, 32)


def x4x2_row_stride(qtype: str, k: int) -> int:
    """Bytes of one repacked x4x2 weight row as the HMX kernel strides it (hmx-matmul-ops.c: get_x4x2_row_stride).

    Quants of whole super-blocks then the scales: Q4_0/IQ4_NL 128+16 B, Q4_1 128+32 B (d,m pairs), Q8_0 256+16 B,
    MXFP4 128+8 B per super-block. F16 has no x4x2 form (its HMX kernel is a sibling function); 0 there.
    """
    nb = ceil_div(k, SUPER_BLOCK)
    per = {"q4_0": 144, "iq4_nl": 144, "q4_1": 160, "q8_0": 272, "mxfp4": 136}.get(norm_qtype(qtype), 0)
    return nb * per


@dataclass(frozen=True)
class MatmulPlan:
    """One MUL_MAT's path and VTCM layout.

    status: "ok"; "overflow" (HMX rounded layout > VTCM, the kernel returns -1); "no_chunking" (HMX chunk search
    found nothing); "vtcm_too_small" (HVX spads > VTCM, the op returns VTCM_TOO_SMALL, which the batch drops).
    outcome: what the DSP then does: "runs", "reenter" (2026-05: op_matmul calls itself again, forever),
    "fallback" (robust HMX failure: op_matmul runs the HVX plan instead), "dropped" (HVX VTCM_TOO_SMALL: dst
    keeps stale contents).
    """

    path: str
    m: int
    k: int
    n: int
    qtype: str
    profile: str
    vtcm: int
    mc: int | None
    nc: int | None
    areas: tuple[Area, ...]
    used: int
    status: str
    outcome: str
    reason: str = ""
    estimate: int | None = None  # the HMX chunk search's own size estimate (what it believed it would use)
    n_threads: int | None = None
    row_stride: int | None = None  # HMX: raw weight row stride; HVX: padded src0 row stride in the ring
    hmx_attempt: MatmulPlan | None = None  # robust: the failed HMX plan that made it fall back to HVX
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def overflow(self) -> int:
        return max(0, self.used - self.vtcm)

    @property
    def fits(self) -> bool:
        return self.status == "ok"

    def area(self, name: str) -> Area:
        return find_area(self.areas, name)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "path": self.path, "m": self.m, "k": self.k, "n": self.n, "type": self.qtype, "profile": self.profile,
            "mc": self.mc, "nc": self.nc, "areas": [a.to_dict() for a in self.areas], "used": self.used,
            "vtcm": self.vtcm, "overflow": self.overflow, "status": self.status, "outcome": self.outcome,
            "reason": self.reason, "estimate": self.estimate, "n_threads": self.n_threads,
            "row_stride": self.row_stride,
        }
        if self.info:
            d["info"] = dict(self.info)
        if self.hmx_attempt is not None:
            d["hmx_attempt"] = self.hmx_attempt.to_dict()
        return d


def hmx_compute_chunks(vtcm_total: int, overhead: int, per_n: int, per_m: int, per_mn: int, m: int, n: int,
                       m_block_cost: int, n_block_cost: int,
                       exact: Callable[[int, int], int] | None = None) -> tuple[int, int, int] | None:
    """The (mc, nc) search of hmx-matmul-ops.c: hmx_compute_chunks; returns (mc, nc, estimated total) or None.

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
    for nc in range(align_down(n, HMX_TILE), HMX_TILE - 1, -HMX_TILE):
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


def matmul_dispatch(m: int, k: int, n: int, qtype: str = "q4_0", *, hmx_enabled: bool = True,
                    hmx_built: bool = True, batched: bool = False, permuted: bool = False) -> tuple[str, str]:
    """("hmx"|"hvx", reason) by the gates of matmul-ops.c: op_matmul, in its order. m = src1->ne[1] (tokens),
    k = src0->ne[0], n = src0->ne[1]. The whole M, including a partial last 32-row tile, goes to HMX.
    `hmx_built`: HMX is compiled for v73/v75/v79/v81 only. On HMX failure see `hmx_failure_fallback`."""
    qt = norm_qtype(qtype)
    if not hmx_built:
        return "hvx", "HMX not built for this arch (v73/v75/v79/v81 only)"
    if not hmx_enabled:
        return "hvx", "HMX disabled (GGML_HEXAGON_USE_HMX=0)"
    if n % 32:
        return "hvx", f"N={n} is not a multiple of 32"
    if qt not in HMX_TYPES:
        return "hvx", f"{qt} has no HMX kernel"
    if qt != "f16" and k % 256:
        return "hvx", f"K={k} is not a multiple of 256 (quantized HMX)"
    if qt == "f16" and k % 32:
        return "hvx", f"K={k} is not a multiple of 32 (F16 HMX)"
    if batched and qt != "f16":
        return "hvx", "batched quantized matmul"
    if permuted:
        return "hvx", "permuted src0/src1 strides"
    if m < 32:
        return "hvx", f"M={m} < 32"
    return "hmx", f"M={m} >= 32, N % 32 == 0, {qt} with K={k}: HMX"


def plan_matmul(m: int, k: int, n: int, qtype: str = "q4_0", *, vtcm_size: int = DEFAULT_VTCM_SIZE,
                profile: str = DEFAULT_PROFILE, n_threads: int = DEFAULT_HVX_THREADS, hmx_enabled: bool = True,
                hmx_built: bool = True, batched: bool = False, permuted: bool = False,
                act_stride: int | None = None) -> MatmulPlan:
    """The MUL_MAT decision the backend executes: dispatch, then the HMX plan; if HMX fails, "2026-05" returns
    the failing HMX plan (outcome "reenter": op_matmul recurses forever) and "robust" the HVX plan it falls back
    to (with the failed attempt in `hmx_attempt`). Batched F16 HMX is planned per batch (the legacy loop)."""
    check_profile(profile)
    path, reason = matmul_dispatch(m, k, n, qtype, hmx_enabled=hmx_enabled, hmx_built=hmx_built,
                                   batched=batched, permuted=permuted)
    if path == "hvx":
        p = hvx_matmul_plan(m, k, n, qtype, n_threads, vtcm_size, batched=batched, permuted=permuted,
                            profile=profile)
        return replace(p, reason=reason if p.fits else f"{reason}; {p.reason}")
    h = hmx_matmul_plan(m, k, n, qtype, vtcm_size, profile, act_stride=act_stride)
    if h.fits:
        return replace(h, reason=reason)
    if get_profile(profile).hmx_failure == "reenter":
        return replace(h, reason=f"{reason}; {h.reason}: HMX returns -1 and op_matmul re-enters itself")
    p = hvx_matmul_plan(m, k, n, qtype, n_threads, vtcm_size, batched=batched, permuted=permuted, profile=profile)
    why = f"HMX failed ({h.reason}), falling back to HVX"
    return replace(p, reason=why if p.fits else f"{why}; {p.reason}", hmx_attempt=h)


def src_layout(w: Tensor, x: Tensor) -> tuple[bool, bool]:
    """(batched, permuted) of a MUL_MAT's src0 `w` and src1 `x`: the descriptor layouts op_matmul's dispatch and
    the HVX plan look at (matmul-ops.c: op_matmul)."""
    batched = w.ne[2] * w.ne[3] > 1 or x.ne[2] * x.ne[3] > 1
    permuted = w.nb[0] > w.nb[1] or x.nb[0] > x.nb[1]
    return batched, permuted


def matmul_node(m: int, k: int, n: int, qtype: Any = "q4_0") -> Tensor:
    """A contiguous MUL_MAT node without data: M=m F32 activation rows of K=k against N=n weight rows of `qtype`
    (what `kazeia htp plan --m --k --n --type` and a grid of shapes plan)."""
    if m <= 0 or k <= 0 or n <= 0:
        raise KazeiaError(f"matmul shape must be positive (m={m} k={k} n={n})")
    wtype = GGMLType[norm_qtype(qtype).upper()]
    try:
        w = make_tensor(wtype, (k, n), name="weight", flags=TFlag.WEIGHT, weight_name="weight")
    except ValueError as e:  # K not a whole number of blocks
        raise KazeiaError(str(e)) from None
    return gb.mul_mat(w, make_tensor(GGMLType.F32, (k, m), name="activations"), "matmul")


def plan_for_node(node: Tensor, settings: HtpSettings, m: int | None = None) -> MatmulPlan:
    """The plan of a MUL_MAT node on an HTP with `settings`: the one way the backend, the cost model, the routing
    gates and the forensic tools get it, so they can never disagree. It reads what op_matmul reads: the shapes
    (M = src1 rows, K, N), the weight type, src1's layout (batched, permuted, its row stride for the F16 kernel),
    the arch (HMX is built for some arches only), GGML_HEXAGON_USE_HMX, the profile, the VTCM size and NHVX.
    `m`: the plan the same node would get with another number of activation rows (a scan over prompt lengths).
    A routing rule's path on the node (`route_path` "hvx", engine/policy.py) turns HMX off for this node only,
    as GGML_HEXAGON_USE_HMX=0 does for all."""
    if node.op != "MUL_MAT":
        raise KazeiaError(f"{node.name}: a MUL_MAT plan needs a MUL_MAT node, not {node.op}")
    w, x = node.src[0], node.src[1]
    batched, permuted = src_layout(w, x)
    act_stride = None
    if w.type == GGMLType.F16 and x.type in (GGMLType.F32, GGMLType.F16):
        act_stride = x.nb[1] // (4 if x.type == GGMLType.F32 else 2)  # src1 row stride in elements
    return plan_matmul(x.ne[1] if m is None else m, w.ne[0], w.ne[1], w.type, vtcm_size=settings.vtcm_bytes,
                       profile=settings.profile, n_threads=settings.nhvx,
                       hmx_enabled=settings.use_hmx and node.route_path != "hvx",
                       hmx_built=settings.arch in HMX_ARCHS, batched=batched, permuted=permuted, act_stride=act_stride)
