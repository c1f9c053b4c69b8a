"""supports_op: which ops the host hands to the HTP, with upstream's limits (ggml-hexagon.cpp, bb4dc86a; for MUL_MAT
under the `2026-10` profile, ggml_hexagon_supported_mul_mat of 0c1e57098bba: no row limits, the host's plan decides).

Ops it refuses run on the CPU backend. GGML_HEXAGON_OPFILTER (a case-insensitive regex that must match the
whole op description, e.g. "MUL_MAT" or "SWIGLU") refuses matching ops first. Weights count as living in
the REPACK buffer (llama.cpp -ngl 99 puts every layer weight there, and a tied lm_head gets a device copy).
"""

from __future__ import annotations

from kazeia.backends.htp.host.kquants import K_QUANT_TYPES
from kazeia.backends.htp.host.repack import REPACK_QTYPES
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_for_node
from kazeia.graph.builder import gdn_snapshots, gdn_state_slots
from kazeia.graph.tensor import GGMLType as T
from kazeia.graph.tensor import Tensor, TFlag

# Upstream's supports_op also takes MXFP4 weights (and plan.py plans them as upstream does), but this model's
# REPACK buffer has no MXFP4 x4x2 form (repack.py: RepackedWeight.from_ggml would raise), so the HTP here refuses
# MXFP4 MUL_MATs and they run on the CPU. The quantized types the HTP takes are exactly those it can repack.
QUANT_MATMUL_TYPES = REPACK_QTYPES
MAX_WEIGHT_ROWS = 16 * 1024  # "typically the lm-head which would be too large for VTCM"
MAX_SRC1_ROWS = 1024


def _same_shape(a: Tensor, b: Tensor) -> bool:
    return a.ne == b.ne


def _can_repeat(b: Tensor, a: Tensor) -> bool:
    return all(a.ne[i] % b.ne[i] == 0 for i in range(4))


def _is_permuted(t: Tensor) -> bool:
    return not (t.nb[0] <= t.nb[1] <= t.nb[2] <= t.nb[3])


def _mul_mat(n: Tensor) -> bool:
    w, x = n.src[0], n.src[1]
    if n.type != T.F32 or x.type not in (T.F32, T.F16):
        return False
    if w.type in QUANT_MATMUL_TYPES:
        if w.ne[0] % 32 or w.nrows > MAX_WEIGHT_ROWS:
            return False
        if x.nrows > MAX_SRC1_ROWS or x.ne[2] != 1 or x.ne[3] != 1:
            return False
        return bool(w.flags & TFlag.WEIGHT)  # must be in the REPACK buffer
    if w.type == T.F16:
        return w.nb[1] >= w.nb[0] and x.nrows <= MAX_SRC1_ROWS
    return False


# what 2026-10's ggml_hexagon_supported_mul_mat takes as src0 (contiguous, not permuted; K-quants need K % 256)
OCTOBER_QUANT_TYPES = (T.Q4_0, T.Q4_1, T.Q8_0, T.IQ4_NL, T.MXFP4, T.Q4_K, T.Q5_K, T.Q6_K)
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
# ... of which this model computes on the HTP the types its REPACK store holds, Q4_K and Q6_K (host/kquants.py), and
# F16. MXFP4, Q5_K and F32 weights, which October also takes, run on the CPU here: kazeia has no HTP numerics for
# MXFP4 and F32 weights, and no Q5_K block format at all.
OCTOBER_MODELLED = (*QUANT_MATMUL_TYPES, *K_QUANT_TYPES, T.F16)


def _broadcasts(w: Tensor, x: Tensor) -> bool:
    return all(x.ne[i] >= w.ne[i] and x.ne[i] % w.ne[i] == 0 for i in (2, 3))


def mul_mat_2026_10(n: Tensor, settings: HtpSettings) -> bool:
    """ggml_hexagon_supported_mul_mat (2026-10): the type and layout checks, then the host's plan: UNSUPPORTED
    (neither the HMX nor the HVX solver fits, or MM_SELECT=0) leaves the op to the CPU. No row limits."""
    w, x = n.src[0], n.src[1]
    if n.type != T.F32 or x.type not in (T.F32, T.F16):
        return False
    if w.type in OCTOBER_QUANT_TYPES:
        if not w.is_contiguous() or _is_permuted(w) or w.ne[0] % (256 if w.type in K_QUANTS else 32):
            return False
        if not bool(w.flags & TFlag.WEIGHT) or w.ne[2] * w.ne[3] > 1:  # (3-D quantized weights: not modelled)
            return False
    elif w.type == T.F16 or (w.type == T.F32 and x.type == T.F32):
        if w.nb[1] < w.nb[0]:
            return False
    else:
        return False
    if not _broadcasts(w, x) or w.type not in OCTOBER_MODELLED:
        return False
    return plan_for_node(n, settings).path != "cpu"


def _binary(n: Tensor) -> bool:
    a, b = n.src[0], n.src[1]
    if a.type == T.F32:
        ok = b.type == T.F32 and n.type == T.F32
    elif a.type == T.F16:
        ok = b.type == T.F16 and n.type == T.F16
    else:
        return False
    return ok and _same_shape(a, n) and _can_repeat(b, a) and not _is_permuted(b)


def _unary(n: Tensor) -> bool:
    a = n.src[0]
    return a.type == T.F32 and n.type == T.F32 and _same_shape(a, n) and n.is_contiguous()


def _activation(n: Tensor) -> bool:
    a = n.src[0]
    b = n.src[1] if len(n.src) > 1 else None
    if a.type != T.F32 or n.type != T.F32 or not a.is_contiguous() or not n.is_contiguous():
        return False
    return b is None or (b.type == T.F32 and _same_shape(a, b) and b.is_contiguous())


def _softmax(n: Tensor) -> bool:
    a = n.src[0]
    m = n.src[1] if len(n.src) > 1 else None
    if a.type != T.F32 or n.type != T.F32 or len(n.src) > 2:
        return False
    if m is not None:
        if m.type not in (T.F32, T.F16) or m.ne[0] != a.ne[0] or m.ne[1] < a.ne[1]:
            return False
        if a.ne[2] % m.ne[2] or a.ne[3] % m.ne[3] or not m.is_contiguous():
            return False
    if not a.is_contiguous() or not n.is_contiguous():
        return False
    return not (a.ne[0] > 32 and a.ne[0] % 32) and a.ne[0] <= 131072


def _rope_factors(n: Tensor) -> bool:
    """ROPE's frequency factors (src[2]), when present: F32, contiguous, at least n_dims/2 of them."""
    ff = n.src[2] if len(n.src) > 2 else None
    return ff is None or (ff.type == T.F32 and ff.is_contiguous() and ff.ne[0] >= n.params["n_dims"] // 2)


def _rope(n: Tensor) -> bool:
    """supported_rope (bb4dc86a): every tensor contiguous (so the strided Q/K views of a fused QKV stay on the CPU
    in prefill)."""
    a, pos = n.src[0], n.src[1]
    if n.params["mode"] & 1 or n.params["mode"] == 24:  # GGML_ROPE_TYPE_VISION; MROPE and IMROPE run
        return False
    return (a.type == T.F32 and n.type == T.F32 and pos.type == T.I32 and a.is_contiguous()
            and pos.is_contiguous() and n.is_contiguous() and _rope_factors(n))


# NORM, NEOX, MROPE, IMROPE. Upstream also takes VISION (24) when n_dims = ne0/2; kazeia has no vision-rope
# numerics (no graph here builds one), so it stays on the CPU as under May.
ROPE_MODES_2026_10 = (0, 2, 8, 40)


def _rope_2026_10(n: Tensor) -> bool:
    """ggml_hexagon_supported_rope (0c1e57098bba): rows of contiguous floats (src0 and dst may be strided views),
    an even n_dims within the row, a known mode, enough positions, the factors as in May. (Its VTCM-fit check
    and rope offsets, n_offs = 0 in every graph kazeia builds, are not modelled.)"""
    a, pos, p = n.src[0], n.src[1], n.params
    nd, mode = p["n_dims"], p["mode"]
    if a.type != T.F32 or n.type != T.F32 or pos.type != T.I32 or a.ne != n.ne or mode not in ROPE_MODES_2026_10:
        return False
    if nd < 0 or nd % 2 or nd > a.ne[0] or p["freq_base"] < 0:
        return False
    if pos.ne[0] < a.ne[2] * (4 if mode & 8 else 1):
        return False
    rows_ok = all(t.nb[0] == 4 and t.nb[1] >= 4 * t.ne[0] for t in (a, n))
    return rows_ok and pos.is_contiguous() and _rope_factors(n)


def _flash_attn(n: Tensor, kv_types: tuple = (T.F16,)) -> bool:
    q, k, v = n.src[0], n.src[1], n.src[2]
    mask = n.src[3] if len(n.src) > 3 else None
    if q.type not in (T.F16, T.F32) or k.type not in kv_types or v.type not in kv_types:
        return False
    if mask is not None and mask.type != T.F16:
        return False
    return n.type in (T.F32, T.F16) and n.ne[3] == 1


def _set_rows(n: Tensor) -> bool:
    return n.src[0].type == T.F32 and n.src[1].type in (T.I32, T.I64) and n.type == T.F16


def _set_rows_2026_10(n: Tensor) -> bool:
    """ggml_hexagon_supported_set_rows (2026-10): F32 values, I32/I64 ids, an F32, F16 or Q8_0 destination (Q8_0
    rows of at least 32 values: a quantized KV cache)."""
    if n.type == T.Q8_0 and n.src[0].ne[0] < 32:
        return False
    return n.src[0].type == T.F32 and n.src[1].type in (T.I32, T.I64) and n.type in (T.F32, T.F16, T.Q8_0)


def _get_rows(n: Tensor) -> bool:
    return n.src[0].type == T.F32 and n.src[1].type in (T.I32, T.I64) and n.type == T.F32


def _cpy(n: Tensor) -> bool:
    a = n.src[0]
    if a.type not in (T.F32, T.F16) or n.type not in (T.F32, T.F16):
        return False
    if a.type == n.type:
        return True
    transposed = a.nb[0] > a.nb[1] or n.nb[0] > n.nb[1]
    return not transposed and _same_shape(a, n)


def _cont(n: Tensor) -> bool:
    return n.src[0].type in (T.F32, T.F16)


def _ssm_conv(n: Tensor) -> bool:
    """ggml_hexagon_supported_ssm_conv (the 'SSM_CONV gate'): F32 only, sx [d_conv - 1 + n_t, d_inner, n_s] with
    contiguous rows, kernel [d_conv, d_inner], dst [d_inner, n_t, n_s]."""
    sx, c = n.src[0], n.src[1]
    if sx.type != T.F32 or c.type != T.F32 or n.type != T.F32:
        return False
    if sx.ne[3] != 1 or c.ne[2] != 1 or c.ne[3] != 1 or n.ne[3] != 1:
        return False
    d_conv, d_inner, n_t, n_s = c.ne[0], sx.ne[1], n.ne[1], n.ne[2]
    if sx.ne[:3] != (d_conv - 1 + n_t, d_inner, n_s) or c.ne[:2] != (d_conv, d_inner):
        return False
    if n.ne[:3] != (d_inner, n_t, n_s) or {sx.nb[0], c.nb[0], n.nb[0]} != {4}:
        return False
    return sx.nb[1] == sx.ne[0] * 4 and c.nb[1] == c.ne[0] * 4


def _contiguous_rows(t: Tensor) -> bool:
    return t.nb[0] == 4


def _gated_delta_net(n: Tensor) -> bool:
    """ggml_hexagon_supported_gated_delta_net: all F32, S_v <= 128, q/k broadcast over heads and sequences,
    state holding S_v*S_v*H*n_seqs*K values, dst [S_v*H, T*n_seqs + S_v*n_seqs*K]."""
    q, k, v, g, beta, state = n.src[:6]
    if any(t.type != T.F32 for t in (q, k, v, g, beta, state, n)):
        return False
    if not all(_contiguous_rows(t) for t in (q, k, v)) or not all(
            t.is_contiguous() for t in (g, beta, state, n)):
        return False
    S, H, Tn, n_seqs = v.ne
    K = gdn_snapshots(n)
    if not (0 < S <= 128 and H > 0 and Tn > 0 and n_seqs > 0):
        return False
    if q.ne[0] != S or k.ne[0] != S or q.ne[2] != Tn or k.ne[2] != Tn or n_seqs % q.ne[3] or n_seqs % k.ne[3]:
        return False
    if g.ne[0] not in (1, S) or beta.ne[0] != 1 or state.nelements != S * S * H * n_seqs * gdn_state_slots(n):
        return False
    return n.ne[0] == S * H and n.ne[1] == Tn * n_seqs + S * n_seqs * K


def _concat(n: Tensor) -> bool:
    """ggml_hexagon_supported_concat: a valid dim and F32, F16 or I32 sources."""
    return 0 <= n.params["dim"] < 4 and all(s.type in (T.F32, T.F16, T.I32) for s in n.src if s is not None)


UNARY_CHECKS = {"SILU": _activation, "SIGMOID": _unary, "SOFTPLUS": _unary}  # (no TANH case: the CPU's)
GLU_OPS = ("SWIGLU", "GEGLU")



_CHECKS = {
    "MUL_MAT": _mul_mat, "ADD": _binary, "MUL": _binary, "SUB": _binary, "DIV": _binary,
    "RMS_NORM": _unary, "SCALE": _unary, "SOFT_MAX": _softmax, "ROPE": _rope, "FLASH_ATTN_EXT": _flash_attn,
    "SET_ROWS": _set_rows, "GET_ROWS": _get_rows, "CPY": _cpy, "CONT": _cont,
    "L2_NORM": _unary, "SSM_CONV": _ssm_conv, "GATED_DELTA_NET": _gated_delta_net, "CONCAT": _concat,
}
# 2026-10 (ggml_hexagon_supported_set_rows, ggml_hexagon_supported_flash_attn_ext): a Q8_0 KV cache is the HTP's too
_CHECKS_2026_10 = {**_CHECKS, "SET_ROWS": _set_rows_2026_10, "ROPE": _rope_2026_10,
                   "FLASH_ATTN_EXT": lambda n: _flash_attn(n, kv_types=(T.F16, T.Q8_0))}


def supports_op(node: Tensor, settings: HtpSettings) -> bool:
    if settings.opfilter is not None and settings.opfilter.fullmatch(node.desc()):
        return False
    if not node.is_computed:
        return True
    if node.op == "UNARY":
        check = UNARY_CHECKS.get(node.params["unary_op"])
        return bool(check and check(node))
    if node.op == "GLU":  # ggml_hexagon_supported_activations: SWIGLU and GEGLU, split or fused
        return node.params["glu_op"] in GLU_OPS and _activation(node)
    checks = _CHECKS
    if settings.caps.host_solves_plans:
        if node.op == "MUL_MAT":
            return mul_mat_2026_10(node, settings)
        if (node.op == "FLASH_ATTN_EXT" and settings.fa_select == 0) or (
                node.op == "GATED_DELTA_NET" and settings.gdn_select == 0):
            return False  # FA_SELECT / GDN_SELECT = 0: unsupported, the CPU runs it
        checks = _CHECKS_2026_10
    check = checks.get(node.op)
    return bool(check and check(node))
