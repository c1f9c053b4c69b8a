"""test-backend-ops' error limits (max_nmse_err), the one place compare, replay, oracle and bisect read them.

NMSE = sum((a-b)^2)/sum(a^2), a = the backend under test, b = the reference. Per op: MUL_MAT and FLASH_ATTN_EXT
5e-4, SOFT_MAX 1e-6, data movement within one type exact, everything else 1e-7; whole-model outputs (logits)
2e-3.
"""

from __future__ import annotations

from kazeia.graph.tensor import Tensor

NMSE_DEFAULT = 1e-7
NMSE_BY_OP = {"MUL_MAT": 5e-4, "FLASH_ATTN_EXT": 5e-4, "SOFT_MAX": 1e-6}
DATA_MOVEMENT_OPS = frozenset({"CPY", "CONT", "GET_ROWS", "SET_ROWS"})
WHOLE_MODEL_NMSE = 2e-3  # logits of a whole run


def op_threshold(op: str, converts: bool = False) -> float:
    """The max NMSE of `op`. Data movement between tensors of one type must be exact; a conversion
    (`converts`: to F16, a dequantizing GET_ROWS) includes its rounding in the op, so it gets the default."""
    if op in NMSE_BY_OP:
        return NMSE_BY_OP[op]
    if op in DATA_MOVEMENT_OPS and not converts:
        return 0.0
    return NMSE_DEFAULT


def node_threshold(node: Tensor) -> float:
    """`op_threshold` of a graph node: it converts when its first source is missing or of another type."""
    src = node.src[0] if node.src else None
    return op_threshold(node.op, converts=src is None or src.type != node.type)
