"""supports_op: which ops the host hands to the HTP, with upstream's limits (ggml-hexagon.cpp, bb4dc86a).

Ops it refuses run on the CPU backend. GGML_HEXAGON_OPFILTER (a case-insensitive regex that must match the
whole op description, e.g. "MUL_MAT" or "SWIGLU") refuses matching ops first. Weights count as living in
the REPACK buffer (llama.cpp -ngl 99 puts every layer weight there, and a tied lm_head gets a device copy).
"""

from __future__ import annotations

from kazeia.backends.htp.settings import HtpSettings
from kazeia.graph.tensor import GGMLType as T
from kazeia.graph.tensor import Tensor, TFlag

QUANT_MATMUL_TYPES = (T.Q4_0, T.Q4_1, T.Q8_0, T.IQ4_NL, T.MXFP4)
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


def _rope(n: Tensor) -> bool:
    a, pos = n.src[0], n.src[1]
    if n.params["mode"] & 1:
        return False
    return (a.type == T.F32 and n.type == T.F32 and pos.type == T.I32 and a.is_contiguous()
            and pos.is_contiguous() and n.is_contiguous())


def _flash_attn(n: Tensor) -> bool:
    q, k, v = n.src[0], n.src[1], n.src[2]
    mask = n.src[3] if len(n.src) > 3 else None
    if q.type not in (T.F16, T.F32) or k.type != T.F16 or v.type != T.F16:
        return False
    if mask is not None and mask.type != T.F16:
        return False
    return n.type in (T.F32, T.F16) and n.ne[3] == 1


def _set_rows(n: Tensor) -> bool:
    return n.src[0].type == T.F32 and n.src[1].type in (T.I32, T.I64) and n.type == T.F16


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


_CHECKS = {
    "MUL_MAT": _mul_mat, "ADD": _binary, "MUL": _binary, "SUB": _binary, "DIV": _binary,
    "RMS_NORM": _unary, "SCALE": _unary, "SOFT_MAX": _softmax, "ROPE": _rope, "FLASH_ATTN_EXT": _flash_attn,
    "SET_ROWS": _set_rows, "GET_ROWS": _get_rows, "CPY": _cpy, "CONT": _cont,
}


def supports_op(node: Tensor, settings: HtpSettings) -> bool:
    if settings.opfilter is not None and settings.opfilter.fullmatch(node.desc()):
        return False
    if not node.is_computed:
        return True
    if node.op == "UNARY":
        return node.params["unary_op"] == "SILU" and _activation(node)
    if node.op == "GLU":
        return node.params["glu_op"] == "SWIGLU" and _activation(node)
    check = _CHECKS.get(node.op)
    return bool(check and check(node))
