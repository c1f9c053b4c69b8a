"""Which plan a MUL_MAT gets: the dispatch gates of matmul-ops.c: op_matmul under each profile, and
`plan_for_node`, the entry point the backend, the cost model, the routing gates and the forensic tools plan
through. The mxmem load runs of an HMX plan are in deep_loads.py; offsets are bytes from `vtcm_base`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kazeia.backends.htp.profiles import get_profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.arena import (
    DEFAULT_HVX_THREADS,
    DEFAULT_PROFILE,
    DEFAULT_VTCM_SIZE,
    HMX_ARCHS,
    align_up,
    check_profile,
)
from kazeia.backends.htp.vtcm.matmul.hmx_2026_05 import hmx_matmul_plan
from kazeia.backends.htp.vtcm.matmul.hvx_2026_05 import hvx_matmul_plan
from kazeia.backends.htp.vtcm.matmul.plan_2026_10 import plan_matmul_2026_10
from kazeia.backends.htp.vtcm.matmul.record import HMX_TYPES, MatmulPlan, norm_qtype
from kazeia.errors import KazeiaError
from kazeia.graph import builder as gb
from kazeia.graph.tensor import GGMLType, Tensor, TFlag, make_tensor


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
                act_stride: int | None = None, batch_rows: int | None = None, group_size: int = 1) -> MatmulPlan:
    """The MUL_MAT decision the backend executes: dispatch, then the HMX plan; if HMX fails, "2026-05" returns
    the failing HMX plan (outcome "reenter": op_matmul recurses forever) and "robust" the HVX plan it falls back
    to (with the failed attempt in `hmx_attempt`). Batched F16 HMX is planned per batch (the legacy loop).
    `batch_rows`, `group_size`: a batched MUL_MAT's rows per src1 head and src1 heads per weight head (2026-10's
    solver reads them; plan_for_node passes them from the node)."""
    if get_profile(check_profile(profile)).caps.host_solves_plans:
        return plan_matmul_2026_10(m, k, n, norm_qtype(qtype), vtcm_size=vtcm_size, n_threads=n_threads,
                                   hmx_enabled=hmx_enabled, hmx_built=hmx_built, batched=batched, permuted=permuted,
                                   batch_rows=batch_rows, group_size=group_size, profile=profile)
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


def plan_for_node(node: Tensor, settings: HtpSettings, m: int | None = None, src2: Tensor | None = None) -> MatmulPlan:
    """The plan of a MUL_MAT node on an HTP with `settings`: the one way the backend, the cost model, the routing
    gates and the forensic tools get it, so they can never disagree. It reads what op_matmul reads: the shapes
    (M = src1 rows, K, N), the weight type, src1's layout (batched, permuted, its row stride for the F16 kernel),
    the arch (HMX is built for some arches only), GGML_HEXAGON_USE_HMX, the profile, the VTCM size and NHVX.
    `m`: the plan the same node would get with another number of activation rows (a scan over prompt lengths).
    A routing rule's path on the node (`route_path` "hvx", engine/policy.py) turns HMX off for this node only,
    as GGML_HEXAGON_USE_HMX=0 does for all (NHMX=0 under 2026-10). `src2`: the residual of a fused MUL_MAT+ADD
    (2026-10: its bytes join the plan's group A)."""
    if node.op != "MUL_MAT":
        raise KazeiaError(f"{node.name}: a MUL_MAT plan needs a MUL_MAT node, not {node.op}")
    w, x = node.src[0], node.src[1]
    batched, permuted = src_layout(w, x)
    act_stride = None
    if w.type == GGMLType.F16 and x.type in (GGMLType.F32, GGMLType.F16):
        act_stride = x.nb[1] // (4 if x.type == GGMLType.F32 else 2)  # src1 row stride in elements
    hmx_on = settings.hmx_enabled and node.route_path != "hvx"
    if settings.caps.host_solves_plans:
        rows = x.ne[1] if m is None else m
        return plan_matmul_2026_10(rows * x.ne[2] * x.ne[3], w.ne[0], w.ne[1],
                                   norm_qtype(w.type), vtcm_size=settings.vtcm_bytes, n_threads=settings.nhvx,
                                   hmx_enabled=hmx_on, hmx_built=settings.arch in HMX_ARCHS,
                                   mm_select=settings.mm_select, batched=batched, permuted=permuted,
                                   src1_f32=x.type == GGMLType.F32,
                                   src2_bytes=align_up(src2.nbytes, 128) if src2 is not None else 0,
                                   batch_rows=rows, group_size=x.ne[2] // w.ne[2] if w.ne[2] else 1,
                                   profile=settings.profile)
    return plan_matmul(x.ne[1] if m is None else m, w.ne[0], w.ne[1], w.type, vtcm_size=settings.vtcm_bytes,
                       profile=settings.profile, n_threads=settings.nhvx,
                       hmx_enabled=hmx_on,
                       hmx_built=settings.arch in HMX_ARCHS, batched=batched, permuted=permuted, act_stride=act_stride)
