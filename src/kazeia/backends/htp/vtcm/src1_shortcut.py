"""The src1 "already quantized in VTCM" shortcut (matmul-ops.c: op_matmul_hvx, octx->src1_spad.src; upstream
cleared it in the ops that clobber VTCM with ggml-org/llama.cpp #23989): what each op does to it.

HVX matmul skips re-quantizing src1 at `vtcm_base` when the pointer it remembers (octx->src1_spad.src) still
matches the op's src1. An op that writes VTCM from base but leaves that pointer set makes the next matmul reuse
bytes that are no longer there. The table says, per op of the May 2026 snapshot, which ops do; under "robust"
every op that writes VTCM clears it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazeia.backends.htp.profiles import get_profile
from kazeia.backends.htp.vtcm.arena import check_profile
from kazeia.errors import KazeiaError


@dataclass(frozen=True)
class Src1Rule:
    """What an op does to octx->src1_spad.src (the pointer HVX matmul compares to skip re-quantizing src1 at base)
    in the 2026-05 snapshot, once its VTCM size check has passed:
    "reset" clears it; "stale" writes VTCM from base but leaves it (the hazard); "keep" touches neither VTCM nor
    it; "reuse" is HVX matmul itself (keeps it only for the same src1 descriptor, sets it after quantizing)."""

    effect: str
    source: str
    note: str = ""


_UNARY = "unary-ops.c: execute_op_unary_f32 (sets src0/dst spads only)"
SRC1_RULES: dict[str, Src1Rule] = {
    "MUL_MAT/hmx": Src1Rule("reset", "matmul-ops.c: op_matmul", "cleared before calling the HMX kernel"),
    "MUL_MAT/hvx": Src1Rule("reuse", "matmul-ops.c: op_matmul_hvx",
                            "pointer compare only: a Q4_1 (q8_1 rows) or F16 (fp16 rows) matmul would reuse another "
                            "format's bytes; the F16 DDR path keeps it without re-quantizing"),
    "MUL_MAT_ID": Src1Rule("reuse", "matmul-ops.c: op_matmul_id"),
    **{op: Src1Rule("stale", _UNARY) for op in ("RMS_NORM", "NORM", "SCALE", "SQR", "SQRT", "UNARY_NEG",
                                                 "UNARY_EXP", "UNARY_SIGMOID", "UNARY_SOFTPLUS", "UNARY_TANH",
                                                 "L2_NORM", "TRI")},
    **{op: Src1Rule("reset", "binary-ops.c: execute_op_binary") for op in ("MUL", "ADD", "SUB", "DIV", "ADD_ID")},
    **{op: Src1Rule("reset", "act-ops.c: execute_op_activations_f32")
       for op in ("UNARY_SILU", "UNARY_GELU", "GLU_SWIGLU", "GLU_SWIGLU_OAI", "GLU_GEGLU")},
    "SOFTMAX": Src1Rule("reset", "softmax-ops.c: execute_op_softmax_f32"),
    "ROPE": Src1Rule("reset", "rope-ops.c: execute_op_rope_f32"),
    "FLASH_ATTN_EXT/hmx": Src1Rule("stale", "hmx-flash-attn-ops.c: hmx_flash_attn_ext",
                                   "allocates from vtcm_base directly, never touches the octx spads"),
    "FLASH_ATTN_EXT/hvx": Src1Rule("reset", "flash-attn-ops.c: op_flash_attn_ext"),
    **{op: Src1Rule("keep", f"{op.lower().replace('_', '-')}-ops.c: no VTCM use")
       for op in ("SET_ROWS", "GET_ROWS", "CPY", "REPEAT", "SUM_ROWS", "FILL", "SOLVE_TRI")},
    "ARGSORT": Src1Rule("stale", "argsort-ops.c: op_argsort"),
    "CONCAT": Src1Rule("stale", "concat-ops.c: op_concat", "only its transposed 2-D path uses VTCM"),
    "PAD": Src1Rule("stale", "pad-ops.c: op_pad", "only its DMA path (ne00 >= 512) uses VTCM"),
    "CUMSUM": Src1Rule("stale", "cumsum-ops.c: op_cumsum", "clears the src0/dst spad pointers, not src1's"),
    "DIAG": Src1Rule("stale", "diag-ops.c: op_diag", "clears the src0/dst spad pointers, not src1's"),
    "GATED_DELTA_NET": Src1Rule("stale", "gated-delta-net-ops.c: op_gated_delta_net",
                                "VTCM state only for one token"),
    "SSM_CONV": Src1Rule("reset", "ssm-conv.c: op_ssm_conv"),
}

SRC1_CACHE_EFFECTS = ("reset", "stale", "keep", "reuse")


def src1_cache_effect(op: str, profile: str = "2026-05", path: str | None = None) -> str:
    """The op's effect on the src1 shortcut: one of SRC1_CACHE_EFFECTS. `path` ("hmx"/"hvx") disambiguates
    MUL_MAT and FLASH_ATTN_EXT. Under "robust" every op that writes VTCM resets it (the later upstream fix,
    #23989, "clear spad pointers in the ops that clobber it")."""
    check_profile(profile)
    op = op.upper().removeprefix("HTP_OP_")
    if op in ("MUL_MAT", "FLASH_ATTN_EXT"):
        if path not in ("hmx", "hvx"):
            raise KazeiaError(f"{op}: say which path ran (hmx or hvx)")
        op = f"{op}/{path}"
    rule = SRC1_RULES.get(op)
    if rule is None:
        raise KazeiaError(f"no src1-shortcut rule for op {op}")
    if get_profile(profile).vtcm_writers_clear_shortcut and rule.effect == "stale":
        return "reset"
    return rule.effect


def src1_cache_table(profile: str = "2026-05") -> list[dict[str, str]]:
    """The whole table, for reports."""
    rows = []
    for key, rule in SRC1_RULES.items():
        op, _, path = key.partition("/")
        rows.append({"op": key, "effect": src1_cache_effect(op, profile, path or None), "source": rule.source,
                     "note": rule.note})
    return rows
