"""The activation-conversion allowance of MUL_MAT, shared by `kazeia compare` and `kazeia replay`.

test-backend-ops compares a backend with ggml's CPU backend, which itself converts src1 to the weight type's
"vec_dot_type" before a quantized matmul (int8 blocks with one scale each). Its 5e-4 therefore never counted
that conversion's error. Against our exact float64 REF it does count, and on real activations with outlier
channels it alone can pass 5e-4 (SmolLM2's attn_v at some layers). To keep test-backend-ops' meaning, a
weight MUL_MAT is allowed, on top of its threshold, the NMSE that ggml's reference conversion of the same
inputs commits (computed in float64 during the REF run). `strict=True` turns the allowance off.
"""

from __future__ import annotations

import math

import numpy as np

from kazeia.backends.ref import RefBackend
from kazeia.debug.judge import nmse
from kazeia.debug.tensors import is_weight
from kazeia.graph.tensor import GGMLType, Tensor

_INT8_BLOCK = {GGMLType.Q4_0: 32, GGMLType.Q4_1: 32, GGMLType.Q5_0: 32, GGMLType.Q5_1: 32, GGMLType.Q8_0: 32,
               GGMLType.IQ4_NL: 32, GGMLType.Q4_K: 256, GGMLType.Q5_K: 256, GGMLType.Q6_K: 256,
               GGMLType.Q2_K: 256, GGMLType.Q3_K: 256}


def reference_activations(x: np.ndarray, wtype: GGMLType) -> np.ndarray | None:
    """src1 rows (..., K) as ggml's CPU path would feed the dot product for a `wtype` weight (float64): int8
    blocks with scale amax/127 (stored fp16 for the 32-blocks) for quantized weights, fp16 or bf16 values for
    F16 / BF16 weights; None when no conversion happens (F32)."""
    wtype = GGMLType(wtype)
    x = np.asarray(x, dtype=np.float64)
    if wtype == GGMLType.F16:
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float64)
    if wtype == GGMLType.BF16:
        b = x.astype(np.float32).view(np.uint32)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000  # round to nearest even on the upper 16 bits
        return b.view(np.float32).astype(np.float64)
    blk = _INT8_BLOCK.get(wtype)
    if blk is None or x.shape[-1] % blk:
        return None
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // blk, blk)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d = amax / 127.0
    if blk == 32:
        d = d.astype(np.float16).astype(np.float64)
    safe = np.where(d == 0, 1.0, d)
    q = np.clip(np.trunc(xb / safe + np.copysign(0.5, xb)), -127, 127)  # round half away from zero
    return (q * d).reshape(x.shape)


def conversion_floor(ref: RefBackend, node: Tensor) -> np.ndarray | None:
    """REF's float64 MUL_MAT output recomputed from ggml-converted activations, or None if not applicable."""
    if node.op != "MUL_MAT":
        return None
    w, x = node.src[0], node.src[1]
    if w is None or x is None or not is_weight(w) or w.ne[2] * w.ne[3] != 1 or w.type == GGMLType.F32:
        return None
    xv = ref.load(x)
    xq = reference_activations(xv, w.type)
    if xq is None:
        return None
    return ref.weight_matmul(w, xq.reshape(-1, w.ne[0])).reshape(node.ne[::-1])  # tiled when not kept


def conversion_allowance(converted: np.ndarray | None, exact: np.ndarray) -> float | None:
    """The allowance of a weight MUL_MAT: the NMSE of `conversion_floor`'s output against REF's exact one (None
    when no conversion happens or the error is not finite)."""
    if converted is None:
        return None
    v = nmse(converted, exact)
    return v if math.isfinite(v) else None
