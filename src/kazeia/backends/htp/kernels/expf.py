"""exp of float32 values in an order kazeia owns (the device model's softmax, flash attention and SiLU): numpy's
float32 exp is a different SIMD routine per CPU family (its bits change with the host's vector width), so the
device model computes its own, the same bits on every host.

The rule, in float64, every step one IEEE operation (no fused multiply-add):
    x clamped to [-110, 100] (beyond, exp underflows to 0 or overflows to inf in float32);
    n = rint(x * log2(e)); r = (x - n * LN2_HI) - n * LN2_LO      (Cody-Waite, fdlibm's split of ln 2);
    p = Horner of the Taylor series of exp to degree 11 at r       (|r| <= 0.347: relative error < 1e-15);
    exp(x) = float32(p * 2^n)                                      (one rounding; float32's overflow, subnormals).
A NaN comes out as the same NaN. Native (IR kit, <4 x double> lanes, <8 x double> with AVX-512) and its numba twin:
the same bits (tests/test_htp_expf.py, against this module's numpy statement of the rule too).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from kazeia.backends import libm
from kazeia.backends.libm import OwnedMath
from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import Library, available, f32_lanes
from kazeia.native.irkit import F32, F64, I64, V8F32, Kernel, i64, ptr, splat, vec
from kazeia.native.pool import run_rows
from kazeia.native.portable import jit, prange

LOG2E = 1.4426950408889634
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
COEFFS = tuple(1.0 / math.factorial(i) for i in range(11, -1, -1))  # Horner, degree 11 first
HI, LO = 100.0, -110.0
ROW = 1024                      # elements a row of the native kernel
UNROLL = 4                      # vectors of 8 a step of the main loop (exp's Horner chain is latency-bound)
PARALLEL_MIN_ELEMS = 1 << 18

V4F64, V4I64 = vec(F64, 4), vec(I64, 4)


def _horner(k: Kernel, z: ir.Value, coeffs: tuple[float, ...]) -> ir.Value:
    """Horner's rule on a double vector (any width), highest degree first: one multiply and one add a step (no
    FMA)."""
    b = k.b
    p = splat(z.type, coeffs[0])
    for c in coeffs[1:]:
        p = b.fadd(b.fmul(p, z), splat(z.type, c))
    return p


def exp_lanes(k: Kernel, x: ir.Value) -> ir.Value:
    """A <w x double> (no NaN; w 4 or 8) -> p * 2^n, the rule's steps lane by lane (the same bits at either
    width)."""
    b, t = k.b, x.type
    w = t.count
    ti = vec(I64, w)
    x = b.select(b.fcmp_ordered(">", x, splat(t, HI)), splat(t, HI), x)
    x = b.select(b.fcmp_ordered("<", x, splat(t, LO)), splat(t, LO), x)
    n = k.call(f"llvm.rint.v{w}f64", t, b.fmul(x, splat(t, LOG2E)))
    r = b.fsub(b.fsub(x, b.fmul(n, splat(t, LN2_HI))), b.fmul(n, splat(t, LN2_LO)))
    p = _horner(k, r, COEFFS)
    e = b.shl(b.add(b.fptosi(n, ti), splat(ti, 1023)), splat(ti, 52))
    return b.fmul(p, b.bitcast(e, t))


def exp8(k: Kernel, x: ir.Value) -> ir.Value:
    """<8 x float> (no NaN) -> exp by the rule: one <8 x double> where the host has zmm (AVX-512), else two <4 x
    double> halves; each lane's operations are the same either way."""
    b = k.b
    if f32_lanes() == 16:
        return b.fptrunc(exp_lanes(k, b.fpext(x, vec(F64, 8))), V8F32)
    halves = [b.fptrunc(exp_lanes(k, b.fpext(k.shuffle(x, None, list(range(j, j + 4))), V4F64)), vec(F32, 4))
              for j in (0, 4)]
    return k.shuffle(halves[0], halves[1], list(range(8)))


def _elementwise(module: ir.Module, name: str) -> tuple[Kernel, ir.Value, ir.Value]:
    """A kernel name(x, y, n, r0, r1) over float32 elements [ROW*r0, min(ROW*r1, n)) (x == y allowed): it, and that
    range's ends."""
    k = Kernel(module, name, [("x", ptr(F32)), ("y", ptr(F32)), ("n", I64), ("r0", I64), ("r1", I64)],
               noalias=False)
    b, a = k.b, k.a
    hi = b.mul(a.r1, i64(ROW))
    return k, b.mul(a.r0, i64(ROW)), b.select(b.icmp_signed("<", hi, a.n), hi, a.n)


def _exp_kernel(module: ir.Module) -> None:
    """exp_f32(x, y, n, r0, r1): y[i] = exp(x[i]) by the rule for i in [ROW*r0, min(ROW*r1, n)) (x == y allowed)."""
    k, lo, hi = _elementwise(module, "exp_f32")
    b, a = k.b, k.a
    span = b.sub(hi, lo)
    hi8 = b.add(lo, b.mul(b.sdiv(span, i64(8)), i64(8)))
    hi32 = b.add(lo, b.mul(b.sdiv(span, i64(UNROLL * 8)), i64(UNROLL * 8)))

    def one(i: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
        x = k.load_vec(a.x, V8F32, i)
        nan = b.fcmp_unordered("uno", x, x)
        return x, nan, exp8(k, b.select(nan, splat(V8F32, 0.0), x))

    with k.loop(lo, hi32, UNROLL * 8, name="u") as i:  # independent vectors: the Horner chains overlap
        outs = [one(b.add(i, i64(8 * u))) for u in range(UNROLL)]
        for u, (x, nan, y) in enumerate(outs):
            k.store_vec(b.select(nan, x, y), a.y, b.add(i, i64(8 * u)))
    with k.loop(hi32, hi8, 8, name="i") as i:
        x, nan, y = one(i)
        k.store_vec(b.select(nan, x, y), a.y, i)
    with k.loop(hi8, hi, name="t") as i:
        x = k.load(a.x, i)
        nan = b.fcmp_unordered("uno", x, x)
        xs = b.select(nan, ir.Constant(F32, 0.0), x)
        x4 = k.broadcast(b.fpext(xs, F64), 4)
        y = b.fptrunc(b.extract_element(exp_lanes(k, x4), ir.Constant(ir.IntType(32), 0)), F32)
        k.store(b.select(nan, x, y), a.y, i)
    k.ret()


def _swiglu_kernel(module: ir.Module) -> None:
    """swiglu_f32(a, g, y, bad, n, r0, r1): y[i] = a[i] / (1 + exp(-a[i])) * g[i] (exp by the rule; float32
    negate, add, divide, multiply, as bound_ops._swiglu's ufuncs) for i in [ROW*r0, min(ROW*r1, n)); *bad = 1
    when some a or g in the range is not finite (the caller then runs the ufuncs: NaN payloads stay theirs).
    n is a multiple of 8."""
    k = Kernel(module, "swiglu_f32", [("a", ptr(F32)), ("g", ptr(F32)), ("y", ptr(F32)), ("bad", ptr(I64)),
                                      ("n", I64), ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    lo = b.mul(a.r0, i64(ROW))
    hi = b.mul(a.r1, i64(ROW))
    hi = b.select(b.icmp_signed("<", hi, a.n), hi, a.n)
    hi32 = b.add(lo, b.mul(b.sdiv(b.sub(hi, lo), i64(UNROLL * 8)), i64(UNROLL * 8)))
    bad = k.var(V8F32, splat(V8F32, 0.0), name="bad")  # x - x summed: NaN once an input was not finite
    one = splat(V8F32, 1.0)

    def step(i: ir.Value) -> tuple[ir.Value, ir.Value]:
        x, g = k.load_vec(a.a, V8F32, i), k.load_vec(a.g, V8F32, i)
        b.store(b.fadd(b.load(bad), b.fadd(b.fsub(x, x), b.fsub(g, g))), bad)
        e = exp8(k, b.fsub(splat(V8F32, -0.0), x))  # np.negative: the sign flipped (no NaN here)
        return b.fmul(b.fdiv(x, b.fadd(one, e)), g), i

    with k.loop(lo, hi32, UNROLL * 8, name="u") as i:
        for y, j in [step(b.add(i, i64(8 * u))) for u in range(UNROLL)]:
            k.store_vec(y, a.y, j)
    with k.loop(hi32, hi, 8, name="i") as i:
        y, j = step(i)
        k.store_vec(y, a.y, j)
    acc = b.load(bad)
    with k.if_(k.b.fcmp_unordered("uno", k.hsum8(acc), k.hsum8(acc))):
        k.store(i64(1), a.bad, 0)
    k.ret()


def tanh4(k: Kernel, x: ir.Value) -> ir.Value:
    """<4 x double> (float32 values, no NaN) -> backends/libm.tanh's value, its steps in its order: a = min(|x|, 22),
    em1 = expm1(2a) (Taylor below 0.5, else libm.exp's rule minus 1), em1 / (em1 + 2), 1 from 22 on, x's sign."""
    b = k.b
    a = k.call("llvm.fabs.v4f64", V4F64, x)
    a = b.select(b.fcmp_ordered(">", a, splat(V4F64, 22.0)), splat(V4F64, 22.0), a)
    t = b.fmul(splat(V4F64, 2.0), a)
    small = b.fcmp_ordered("<", t, splat(V4F64, 0.5))
    series = b.fmul(t, _horner(k, t, libm.EXPM1_COEFFS))
    n = k.call("llvm.rint.v4f64", V4F64, b.fmul(t, splat(V4F64, libm.LOG2E)))
    r = b.fsub(b.fadd(b.fsub(t, b.fmul(n, splat(V4F64, libm.LN2_HI))), splat(V4F64, 0.0)),
               b.fmul(n, splat(V4F64, libm.LN2_LO)))
    e = b.shl(b.add(b.fptosi(n, V4I64), splat(V4I64, 1023)), splat(V4I64, 52))
    big = b.fsub(b.fmul(_horner(k, r, libm.EXP_COEFFS), b.bitcast(e, V4F64)), splat(V4F64, 1.0))
    em1 = b.select(small, series, big)
    th = b.fdiv(em1, b.fadd(em1, splat(V4F64, 2.0)))
    th = b.select(b.fcmp_ordered(">=", a, splat(V4F64, 22.0)), splat(V4F64, 1.0), th)
    return k.call("llvm.copysign.v4f64", V4F64, th, x)


def _tanh_kernel(module: ir.Module) -> None:
    """tanh_f32(x, y, n, r0, r1): y[i] = float32(libm.tanh(x[i])) for i in [ROW*r0, min(ROW*r1, n)); NaN stays."""
    k, lo, hi = _elementwise(module, "tanh_f32")
    b, a = k.b, k.a
    hi4 = b.add(lo, b.mul(b.sdiv(b.sub(hi, lo), i64(4)), i64(4)))
    v4f32 = vec(F32, 4)

    def one(x: ir.Value) -> ir.Value:
        nan = b.fcmp_unordered("uno", x, x)
        y = b.fptrunc(tanh4(k, b.fpext(b.select(nan, ir.Constant(v4f32, [0.0] * 4), x), V4F64)), v4f32)
        return b.select(nan, x, y)

    with k.loop(lo, hi4, 4, name="i") as i:
        k.store_vec(one(k.load_vec(a.x, v4f32, i)), a.y, i)
    with k.loop(hi4, hi, name="t") as i:
        x4 = k.broadcast(k.load(a.x, i), 4)
        k.store(b.extract_element(one(x4), ir.Constant(ir.IntType(32), 0)), a.y, i)
    k.ret()


LIB = Library(__name__, "kazeia_htp_expf")
EXP = LIB.kernel("exp_f32", _exp_kernel, par=True)
SWIGLU = LIB.kernel("swiglu_f32", _swiglu_kernel, par=True)
TANH = LIB.kernel("tanh_f32", _tanh_kernel, par=True)


def tanh_f32(x: np.ndarray) -> np.ndarray:
    """float32(libm.tanh(x)) of a float32 array by the native kernel, or libm's numpy statement without it."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not available() or x.size == 0:
        return libm.f32(libm.tanh, x)
    y = np.empty(x.shape, dtype=np.float32)
    run_rows(TANH, (addr(x), addr(y), x.size), -(-x.size // ROW), 16, x.size >= PARALLEL_MIN_ELEMS)
    return y


def swiglu_f32(a: np.ndarray, g: np.ndarray, out: np.ndarray, linger: bool = False) -> bool:
    """out = a / (1 + exp(-a)) * g for C-contiguous float32 arrays of one shape whose size is a multiple of 8, the
    bits of bound_ops._swiglu's ufuncs; False (out may hold anything) where it does not apply or an input is
    not finite. `linger`: a decode step's (native.pool.run)."""
    n = a.size
    if (not available() or n % 8 or not n or a.shape != g.shape or a.shape != out.shape
            or any(x.dtype != np.float32 or not x.flags.c_contiguous for x in (a, g, out))):
        return False
    bad = np.zeros(1, dtype=np.int64)
    run_rows(SWIGLU, (addr(a), addr(g), addr(out), addr(bad), n), -(-n // ROW), 4, n >= PARALLEL_MIN_ELEMS,
             linger=linger)
    return not bad[0]


def exp_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """exp of a float32 array by the rule (module doc), as a new C-contiguous array or into `out` (C-contiguous,
    may be x itself)."""
    x = np.asarray(x, dtype=np.float32)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    y = np.empty(x.shape, dtype=np.float32) if out is None else out
    if y.shape != x.shape or y.dtype != np.float32 or not y.flags.c_contiguous:
        raise ValueError(f"exp_f32: out must be C-contiguous float32 of shape {x.shape}")
    n = x.size
    if n == 0:
        return y
    if available():
        run_rows(EXP, (addr(x), addr(y), n), -(-n // ROW), 16, n >= PARALLEL_MIN_ELEMS)
    else:
        exp_f32_portable(x.reshape(-1), y.reshape(-1), np.array(COEFFS))
    return y


@jit(parallel=True, cache=True)
def exp_f32_portable(x, y, coeffs):
    """The rule, element by element (the native kernel's twin)."""
    for i in prange(x.size):
        v = x[i]
        if v != v:
            y[i] = v
            continue
        d = np.float64(v)
        if d > HI:
            d = HI
        if d < LO:
            d = LO
        n = np.rint(d * LOG2E)
        r = (d - n * LN2_HI) - n * LN2_LO
        p = coeffs[0]
        for j in range(1, coeffs.size):
            p = p * r + coeffs[j]
        y[i] = np.float32(math.ldexp(p, int(n)))  # exact: p * 2^n is a normal float64 for every n here


def exp_rule_numpy(x: np.ndarray) -> np.ndarray:
    """The rule stated with numpy's element-wise float64 operations (IEEE, one rounding each): the tests' oracle."""
    x = np.asarray(x, dtype=np.float32)
    d = np.clip(np.where(np.isnan(x), 0.0, x).astype(np.float64), LO, HI)
    n = np.rint(d * LOG2E)
    r = (d - n * LN2_HI) - n * LN2_LO
    p = np.full_like(r, COEFFS[0])
    for c in COEFFS[1:]:
        p = p * r + c
    scale = ((n.astype(np.int64) + 1023) << 52).view(np.float64)
    with np.errstate(over="ignore", under="ignore"):
        y = (p * scale).astype(np.float32)
    return np.where(np.isnan(x), x, y)


class DspMath(OwnedMath):
    """The device model's transcendental functions: backends/libm.py's rules (float32's tanh by its native kernel,
    the same bits), float32's exp by this module's."""

    def exp(self, x) -> np.ndarray:
        x = np.asarray(x)
        return exp_f32(x) if x.dtype == np.float32 else super().exp(x)

    def tanh(self, x) -> np.ndarray:
        x = np.asarray(x)
        return tanh_f32(x) if x.dtype == np.float32 else super().tanh(x)


DSP_MATH = DspMath()
