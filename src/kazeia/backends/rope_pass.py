"""ggml_rope's pair rotation as one native pass, shared by the CPU device (cpu/bind.py) and the device model's bound
ROPE (htp/ops/bound_ops.py): the same float32 operations as numpy_ops' ROPE kernel, in its order, so each caller
keeps its kernel's bits while the cos/sin table stays its own (the CPU's from numpy's cos and sin, the DSP's from
kazeia's libm).

For each pair i of a row (NORM: elements 2i, 2i+1; NEOX: i, i + n_dims/2), with c, s = cos/sin[t, i]:

    y0 = x0 * c - x1 * s        y1 = x0 * s + x1 * c

each product rounded to float32 before the sum (no fused multiply-add); the dims past n_dims are copied. A pair is
read before it is written, so y may be x (a rope in place).
"""

from __future__ import annotations

from llvmlite import ir

from kazeia.native.compile import Library
from kazeia.native.irkit import F32, I64, Kernel, i64, ptr

# the int64 parameter block: addresses x, y, cos, sin; sizes n3, T, H, D, n_dims; strides (floats) of x and y over
# heads, tokens and dim 3. The table is (T, n_dims/2) float32, C-contiguous.
ROPE_FIELDS = ("x", "y", "cos", "sin", "n3", "T", "H", "D", "nd", "x_h", "x_t", "x_3", "y_h", "y_t", "y_3")


class _Fields:
    """Kernel parameters read from an int64 array, by name (like irkit.Kernel.a)."""

    def __init__(self, d: dict) -> None:
        self.__dict__.update(d)


def _rope(module: ir.Module, neox: bool) -> None:
    """rope_<mode>(prm): prm holds ROPE_FIELDS. x (n3, T, H, D) rotated by cos/sin[t, i] (T, nd/2) per pair i."""
    k = Kernel(module, "rope_neox" if neox else "rope_norm", [("prm", ptr(I64))])
    b = k.b
    a = _Fields({f: k.load(k.a.prm, i) for i, f in enumerate(ROPE_FIELDS)})
    a.x, a.y, a.cos, a.sin = (b.inttoptr(v, ptr(F32)) for v in (a.x, a.y, a.cos, a.sin))
    half = b.sdiv(a.nd, i64(2))
    with k.loop(0, a.n3, name="i3") as i3, k.loop(0, a.T, name="t") as t, k.loop(0, a.H, name="h") as h:
        px = k.gep(a.x, b.add(b.add(b.mul(i3, a.x_3), b.mul(t, a.x_t)), b.mul(h, a.x_h)))
        py = k.gep(a.y, b.add(b.add(b.mul(i3, a.y_3), b.mul(t, a.y_t)), b.mul(h, a.y_h)))
        pc, ps = k.gep(a.cos, b.mul(t, half)), k.gep(a.sin, b.mul(t, half))
        with k.loop(0, half, name="i") as i:
            if neox:
                j0, j1 = i, b.add(i, half)
            else:
                j0 = b.mul(i, i64(2))
                j1 = b.add(j0, i64(1))
            x0, x1, c, s = k.load(px, j0), k.load(px, j1), k.load(pc, i), k.load(ps, i)
            k.store(b.fsub(b.fmul(x0, c), b.fmul(x1, s)), py, j0)
            k.store(b.fadd(b.fmul(x0, s), b.fmul(x1, c)), py, j1)
        with k.loop(a.nd, a.D, name="rest") as j:
            k.store(k.load(px, j), py, j)
    k.ret()


LIB = Library(__name__, "kazeia_rope")
ROPE_NORM = LIB.kernel("rope_norm", _rope, False)
ROPE_NEOX = LIB.kernel("rope_neox", _rope, True)
