"""October 2026's MUL_MAT decision as the host makes it (`ggml-hexagon.cpp:ggml_hexagon_precompute_matmul_params_impl`,
llama.cpp 0c1e57098bba): HMX when it is enabled and eligible and its solver fits (hmx_2026_10.py), else the HVX
solver (hvx_2026_10.py), else UNSUPPORTED, which `ggml_hexagon_supported_mul_mat` turns into "the CPU runs it".

The result is a `MatmulPlan` like May's, so the backend, the cost model, the gates and the tools read it the same
way. Its areas are the solver's layout with the groups overlapping as upstream lays them out: group A from the VTCM
base, groups B and C both after it (`htp_mm_hmx_vtcm_layout_build`, `htp_mm_hvx_vtcm_layout_build`).
"""

from __future__ import annotations

from kazeia.backends.htp.vtcm.areas import Area
from kazeia.backends.htp.vtcm.matmul import hmx_2026_10 as hmx
from kazeia.backends.htp.vtcm.matmul import hvx_2026_10 as hvx
from kazeia.backends.htp.vtcm.matmul.record import MatmulPlan

PROFILE_TYPES = ("q4_0", "q4_1", "q8_0", "iq4_nl", "mxfp4", "q4_k", "q5_k", "q6_k", "f16", "f32")


def _stack(start: int, parts: list[tuple[str, int]]) -> list[Area]:
    """Areas laid one after the other from `start` (each already rounded by the layout)."""
    out, off = [], start
    for name, size in parts:
        if size > 0:
            out.append(Area(name, off, size))
            off += size
    return out


def hmx_areas(L: hmx.HmxLayout2d) -> tuple[Area, ...]:
    """Group A [scales][activation fp16 tiles][src2], then group B [weight0][weight1][out0][scratch0][scratch1]
    [out1] and, over the same bytes, group C (fp32 activation staging)."""
    a = _stack(0, [("scales", L.scales), ("activation", L.act), ("src2", L.src2)])
    b0 = L.group_a
    p = L.pipeline
    b = _stack(b0, [("weight0", L.weight), ("weight1", L.weight if p else 0), ("out0", L.dst),
                    ("scratch0", L.scratch), ("scratch1", L.scratch if p else 0), ("out1", L.dst if p else 0)])
    c = _stack(b0, [("act_f32", L.act_f32)])
    return tuple(a + b + c)


def hvx_areas(L: hvx.HvxLayout) -> tuple[Area, ...]:
    """Group A [src1 (quantized activations)][src2], then group B [src0 prefetch][dst] and group C [raw fp32
    activations] over the same bytes."""
    a = _stack(0, [("src1", L.src1), ("src2", L.src2)])
    b0 = L.src1 + L.src2
    return tuple(a + _stack(b0, [("src0", L.src0), ("dst", L.dst)]) + _stack(b0, [("act_raw", L.act_raw)]))


def batched_areas(k: int, mc: int, nc: int, group_size: int, act_threads: int, src2_bytes: int) -> tuple[Area, ...]:
    """The HMX_F16_BATCHED layout: group A [activation][scales][src2], group B [weight0][out0][scratch0][scratch1]
    and group C (fp32 staging) over group B (hmx_2026_10.batched_layout_total's sizes)."""
    vec = 2 * k
    a = _stack(0, [("activation", hmx.align_up(group_size * mc * k * 2, hmx.TILE)), ("scales", hmx.TILE),
                   ("src2", hmx.align_up(src2_bytes, hmx.TILE) if src2_bytes > 0 else 0)])
    b0 = a[-1].end
    w = hmx.align_up(nc * vec, hmx.TILE)
    b = _stack(b0, [("weight0", w), ("out0", hmx.align_up(group_size * mc * nc * 2, hmx.TILE)), ("scratch0", w),
                    ("scratch1", w)])
    group_b = b[-1].end - b0
    min_f32 = hmx.align_up(act_threads * hmx.ACT_ROWS_MULTIPLIER * k * 4, 128)
    c = _stack(b0, [("act_f32", hmx.align_up(min(act_threads * 64 * k * 4, max(min_f32, group_b)), 128))])
    return tuple(a + b + c)


def _hmx_batched(k: int, n: int, rows: int, group_size: int, n_threads: int, vtcm: int,
                 src2_bytes: int) -> tuple[hmx.HmxSolution, tuple[Area, ...], str] | None:
    """ggml_hexagon_precompute_hmx_mm_params for a batched F16 MUL_MAT: the grouped solver when heads share a weight
    head (group_size > 1), else (or when it finds nothing) the 2-D solver on one head's rows; the kernel is
    HMX_F16_BATCHED either way."""
    if group_size > 1:
        sol = hmx.solve_batched(k, n, rows, group_size, n_threads, vtcm, src2_bytes)
        if sol is not None:
            return sol, batched_areas(k, sol.m_chunk, sol.n_chunk, group_size, sol.act_threads, src2_bytes), "grouped"
    sol = hmx.solve_2d("f16", k, n, rows, n_threads, vtcm, src2_bytes)
    if sol is None:
        return None
    L = hmx.layout_2d("f16", k, sol.m_chunk, sol.n_chunk, sol.pipeline, sol.act_threads, src2_bytes)
    return sol, hmx_areas(L), "per head"


def plan_matmul_2026_10(m: int, k: int, n: int, qtype: str, *, vtcm_size: int, n_threads: int,
                        hmx_enabled: bool = True, hmx_built: bool = True, mm_select: int = 2, batched: bool = False,
                        permuted: bool = False, src1_f32: bool = True, src2_bytes: int = 0,
                        batch_rows: int | None = None, group_size: int = 1,
                        profile: str = "2026-10") -> MatmulPlan:
    """The host's plan of a MUL_MAT: path "hmx", "hvx" or "cpu" (UNSUPPORTED), with the solver's chunks, act
    threads, exact bytes and layout. `m`: src1's rows, every batch counted (src1_nrows: the HVX kernels flatten
    them); for a batched MUL_MAT, `batch_rows` is one head's rows (ne11) and `group_size` how many src1 heads share
    a weight head (ne12 / ne02). `reason` says why HMX was not taken, when it was not."""
    base = dict(m=m, k=k, n=n, qtype=qtype, profile=profile, vtcm=vtcm_size, n_threads=n_threads)

    def unsupported(reason: str) -> MatmulPlan:  # HTP_MM_KERNEL_UNSUPPORTED: supports_op leaves it to the CPU
        return MatmulPlan(path="cpu", mc=None, nc=None, areas=(), used=0, status="unsupported", outcome="cpu",
                          reason=reason, **base)
    if mm_select < 1:
        return unsupported("GGML_HEXAGON_MM_SELECT=0: every MUL_MAT is unsupported (CPU)")
    rows = batch_rows if batched and batch_rows is not None else m
    why = _hmx_refusal(rows, k, n, qtype, hmx_enabled, hmx_built, mm_select, batched, permuted, src1_f32)
    if why is None and batched:
        found = _hmx_batched(k, n, rows, group_size, n_threads, vtcm_size, src2_bytes)
        if found is not None:
            sol, areas, how = found
            info = {"act_threads": sol.act_threads, "pipeline": sol.pipeline, "kernel": "HMX_F16_BATCHED",
                    "group_size": group_size, "solver": how}
            return MatmulPlan(path="hmx", mc=sol.m_chunk, nc=sol.n_chunk, areas=areas, used=sol.vtcm_bytes,
                              status="ok", outcome="runs", info=info,
                              reason=f"HMX (batched F16, {how}): {rows} rows a head > {hmx.MIN_ROWS}, the solver "
                                     f"fits {sol.vtcm_bytes} B of {vtcm_size}", **base)
        why = f"the batched HMX solver finds no chunking that fits {vtcm_size} B"
    elif why is None:
        sol = hmx.solve_2d(qtype, k, n, m, n_threads, vtcm_size, src2_bytes)
        if sol is not None:
            L = hmx.layout_2d(qtype, hmx.align_up(k, 32) if hmx.is_quant(qtype) else k, sol.m_chunk, sol.n_chunk,
                              sol.pipeline, sol.act_threads, src2_bytes)
            info = {"act_threads": sol.act_threads, "pipeline": sol.pipeline, "kernel": "HMX_2D",
                    "group_a": L.group_a, "group_b": L.group_b, "group_c": L.act_f32}
            return MatmulPlan(path="hmx", mc=sol.m_chunk, nc=sol.n_chunk, areas=hmx_areas(L), used=sol.vtcm_bytes,
                              status="ok", outcome="runs", info=info,
                              reason=f"HMX: M={m} > {hmx.MIN_ROWS}, the solver fits {sol.vtcm_bytes} B of {vtcm_size}",
                              **base)
        why = (f"the HMX solver finds no chunking whose exact layout fits {vtcm_size} B "
               f"(any act threads {n_threads}..1)")
    if qtype not in hvx.REPACKED + ("f16", "f32"):
        return unsupported(f"{why}; no HVX kernel for {qtype} (UNSUPPORTED: CPU)")
    p = hvx.plan(qtype, k, n, m, n_threads, vtcm_size, 4 * n if src2_bytes else 0)  # src2->nb[1]: an F32 row
    if p is None:
        return unsupported(f"{why}; the HVX solver fits nothing in {vtcm_size} B either (UNSUPPORTED: CPU)")
    info = {"kernel": p.kernel, "n_prefetch": p.n_prefetch, "m_chunk": p.m_chunk}
    return MatmulPlan(path="hvx", mc=p.m_chunk or None, nc=None, areas=hvx_areas(p.layout), used=p.vtcm_bytes,
                      status="ok", outcome="runs", info=info, reason=f"HVX ({p.kernel}): {why}", **base)


def _hmx_refusal(m: int, k: int, n: int, qtype: str, hmx_enabled: bool, hmx_built: bool, mm_select: int,
                 batched: bool, permuted: bool, src1_f32: bool) -> str | None:
    """Why ggml_hexagon_matmul_is_hmx_eligible (or the session's HMX count / MM_SELECT) says no; None: eligible."""
    if not hmx_built:
        return "this arch has no HMX"
    if mm_select < 2:
        return f"GGML_HEXAGON_MM_SELECT={mm_select} keeps MUL_MAT off HMX"
    if not hmx_enabled:
        return "HMX is off (GGML_HEXAGON_NHMX=0, or a rule on this op)"
    if not src1_f32:
        return "src1 is not F32"
    if qtype not in hmx.HMX_WEIGHT_TYPES:
        return f"{qtype} has no HMX kernel"
    if k % 32:
        return f"K={k} is not a multiple of 32"
    if not hmx.is_quant(qtype) and n % 32:
        return f"N={n} is not a multiple of 32"
    if batched and qtype != "f16":
        return "batched and not F16"
    if permuted:
        return "permuted strides"
    if m <= hmx.MIN_ROWS:
        return f"M={m} <= {hmx.MIN_ROWS}"
    return None
