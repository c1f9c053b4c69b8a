"""The ggml blocks as the HTP kernels (simd_htp.py, simd_hvx.py) read them: sizes, where the codes start, and the
codes as the operand the hardware sees."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kazeia.backends.irkit import V16I8, lanes, splat

if TYPE_CHECKING:
    from llvmlite import ir

    from kazeia.backends.irkit import Kernel

QK = 32
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34, "iq4_nl": 18}
CODE_OFFSET = {"q4_0": 2, "q4_1": 4, "q8_0": 2, "iq4_nl": 2}
IQ4_NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # ggml's kvalues_iq4nl


def codes_i8(k: Kernel, kind: str, base: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Block codes as the operand the hardware sees, two <16 x i8> (elements 0..15, 16..31): Q4_0 q-8,
    Q4_1 q, Q8_0 q, IQ4_NL the table value."""
    b = k.b
    if kind == "q8_0":
        return k.load_vec(base, V16I8, 2), k.load_vec(base, V16I8, 18)
    q = k.load_vec(base, V16I8, CODE_OFFSET[kind])
    lo, hi = b.and_(q, splat(V16I8, 15)), b.lshr(q, splat(V16I8, 4))
    if kind == "q4_0":
        return b.sub(lo, splat(V16I8, 8)), b.sub(hi, splat(V16I8, 8))
    if kind == "iq4_nl":
        table = lanes(V16I8, IQ4_NL)
        return (k.call("llvm.x86.ssse3.pshuf.b.128", V16I8, table, lo),
                k.call("llvm.x86.ssse3.pshuf.b.128", V16I8, table, hi))
    return lo, hi
