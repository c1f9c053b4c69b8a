"""The float64 sum of squares of float32 rows that the device model's RMS_NORM and L2_NORM take (as ggml sums in
double), in one order that kazeia owns: `sum_squares`, and RMS_NORM's whole row in one pass, `RmsRows`.

The order is the one numpy's einsum("...i,...i->...", x, x, dtype=float64) used when the device's bits were first
recorded (numpy's x86-64-v2 baseline build: einsum's sum_of_products_contig_contig_outstride0_two in two float64
lanes, four steps unrolled; einsum is not dispatched at run time, so this was numpy's order on every host, and
would move with a numpy built for another baseline). For a row x of k elements, with every square exact in
float64 (24 + 24 significant bits):

    lanes (s0, s1) = (+0, +0)
    for t in 0, 8, 16, ... while t + 8 <= k:       (element 2i + j of the step in lane j)
        s = x[t+6:t+8]^2 + s;  s = x[t+4:t+6]^2 + s;  s = x[t+2:t+4]^2 + s;  s = x[t:t+2]^2 + s
    then the rest two at a time, a missing second element as +0
    sum = +0 + (s0 + s1)

tests/test_sum_squares.py holds this to numpy's einsum on this host and the native kernel to its numba twin.
RMS_NORM then scales in numpy's steps: mean = sum / k, inv = float32(1 / sqrt(mean + eps)) (float64 until the
last rounding), y = x * inv in float32.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from kazeia.native.compile import Library, available
from kazeia.native.irkit import F32, F64, I64, Kernel, i32, i64, ptr, splat, vec
from kazeia.native.portable import jit

V2F64, V2F32, V8F32 = vec(F64, 2), vec(F32, 2), vec(F32, 8)


def _row_sum(k: Kernel, row: ir.Value, n: ir.Value) -> ir.Value:
    """The module's sum of squares of the n float32 at `row`, as a double."""
    b = k.b
    acc = k.var(V2F64, splat(V2F64, 0.0), name="acc")

    def sq(t: ir.Value) -> ir.Value:
        v = b.fpext(k.load_vec(row, V2F32, t), V2F64)
        return b.fmul(v, v)

    n8 = b.mul(b.sdiv(n, i64(8)), i64(8))
    with k.loop(0, n8, 8, name="s8") as t:
        s = b.load(acc)
        for i in (3, 2, 1, 0):
            s = b.fadd(sq(b.add(t, i64(2 * i))), s)
        b.store(s, acc)
    n2 = b.add(n8, b.mul(b.sdiv(b.sub(n, n8), i64(2)), i64(2)))
    with k.loop(n8, n2, 2, name="s2") as t:
        b.store(b.fadd(sq(t), b.load(acc)), acc)
    with k.if_(b.icmp_signed("<", n2, n)):  # one element left: its pair's second lane is +0
        x = b.fpext(k.load(row, n2), F64)
        pair = b.insert_element(splat(V2F64, 0.0), b.fmul(x, x), i32(0))
        b.store(b.fadd(pair, b.load(acc)), acc)
    s = b.load(acc)
    lanes = b.fadd(b.extract_element(s, i32(0)), b.extract_element(s, i32(1)))
    return b.fadd(ir.Constant(F64, 0.0), lanes)


def _sum_squares_kernel(module: ir.Module) -> str:
    """sum_squares_f64(x, xs, out, n, r0, r1): out[r] = the sum of squares of row r (x + r * xs floats, n of them)."""
    k = Kernel(module, "sum_squares_f64", [("x", ptr(F32)), ("xs", I64), ("out", ptr(F64)), ("n", I64),
                                           ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    with k.loop(a.r0, a.r1, name="r") as r:
        k.store(_row_sum(k, k.gep(a.x, b.mul(r, a.xs)), a.n), a.out, r)
    k.ret()
    return "sum_squares_f64"


def _rms_kernel(module: ir.Module) -> str:
    """rms_scale_f32(x, xs, y, ys, n, eps, r0, r1): y row r = x row r * float32(1 / sqrt(sum / n + eps)); a row is
    summed before it is written, so y may be x."""
    k = Kernel(module, "rms_scale_f32", [("x", ptr(F32)), ("xs", I64), ("y", ptr(F32)), ("ys", I64), ("n", I64),
                                         ("eps", F64), ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    with k.loop(a.r0, a.r1, name="r") as r:
        xr, yr = k.gep(a.x, b.mul(r, a.xs)), k.gep(a.y, b.mul(r, a.ys))
        mean = b.fdiv(_row_sum(k, xr, a.n), b.sitofp(a.n, F64))
        inv = b.fptrunc(b.fdiv(ir.Constant(F64, 1.0), k.call("llvm.sqrt.f64", F64, b.fadd(mean, a.eps))), F32)
        n8 = b.mul(b.sdiv(a.n, i64(8)), i64(8))
        iv = k.broadcast(inv, 8)
        with k.loop(0, n8, 8, name="m8") as t:
            k.store_vec(b.fmul(k.load_vec(xr, V8F32, t), iv), yr, t)
        with k.loop(n8, a.n, name="m1") as t:
            k.store(b.fmul(k.load(xr, t), inv), yr, t)
    k.ret()
    return "rms_scale_f32"


LIB = Library(__name__, "kazeia_sum_squares")
SUM = LIB.kernel("sum_squares_f64", _sum_squares_kernel)
RMS = LIB.kernel("rms_scale_f32", _rms_kernel)


def _rows(x: np.ndarray) -> np.ndarray | None:
    """x as a (rows, n) float32 view of unit element stride (its leading axes collapsed into one row stride), or
    None where no such view exists."""
    if x.dtype != np.float32 or x.ndim == 0:
        return None
    v = x.view()
    try:
        v.shape = (-1, x.shape[-1]) if x.size else (int(np.prod(x.shape[:-1])), x.shape[-1])
    except (AttributeError, ValueError):  # the axes do not collapse without a copy
        return None
    return v if (v.strides[1] == 4 or v.shape[1] == 1) and v.strides[0] % 4 == 0 else None


def sum_squares(x: np.ndarray) -> np.ndarray:
    """float64 (x.shape[:-1]): each row's sum of squares of the float32 x, in the module's order."""
    x = np.asarray(x, dtype=np.float32)
    rows = _rows(x)
    if rows is None:
        rows = _rows(np.ascontiguousarray(x))
    out = np.empty(rows.shape[0], dtype=np.float64)
    if available():
        if rows.shape[0]:
            SUM.fn(rows.ctypes.data, rows.strides[0] // 4, out.ctypes.data, rows.shape[1], 0, rows.shape[0])
    else:
        sum_squares_portable(np.ascontiguousarray(rows), out)
    return out.reshape(x.shape[:-1])


class RmsRows:
    """y = RMS_NORM(x) (the module's sum, then numpy's steps) in one native pass over float32 rows of unit element
    stride, its arguments worked out once for these two arrays (a decode runs the same norm every token)."""

    __slots__ = ("fn", "args", "keep")

    @staticmethod
    def of(x: np.ndarray, y: np.ndarray, eps: float) -> RmsRows | None:
        """The pass for x into y, or None where the kernel does not run (the caller's numpy steps give the same
        bits)."""
        if not available() or x.shape != y.shape or y.dtype != np.float32 or not y.flags.writeable:
            return None
        xr, yr = _rows(x), _rows(y)
        if xr is None or yr is None:
            return None
        r = RmsRows()
        r.fn, r.keep = RMS.fn, (x, y)
        r.args = (xr.ctypes.data, xr.strides[0] // 4, yr.ctypes.data, yr.strides[0] // 4, xr.shape[1], float(eps),
                  0, xr.shape[0])
        return r

    def __call__(self) -> None:
        self.fn(*self.args)


@jit(cache=True)
def sum_squares_portable(rows, out):
    """out[r] = the module's sum of squares of rows[r] (float32 rows, C-contiguous), in float64."""
    n = rows.shape[1]
    for r in range(rows.shape[0]):
        s0 = 0.0
        s1 = 0.0
        t = 0
        while t + 8 <= n:
            for i in (3, 2, 1, 0):
                a = np.float64(rows[r, t + 2 * i])
                c = np.float64(rows[r, t + 2 * i + 1])
                s0 = a * a + s0
                s1 = c * c + s1
            t += 8
        while t + 2 <= n:
            a = np.float64(rows[r, t])
            c = np.float64(rows[r, t + 1])
            s0 = a * a + s0
            s1 = c * c + s1
            t += 2
        if t < n:
            a = np.float64(rows[r, t])
            s0 = a * a + s0
            s1 = 0.0 + s1
        out[r] = 0.0 + (s0 + s1)
