"""The HTP's fp16 rounding family: float32 -> the float32 of its fp16 hardware rounding (RNE, every |x| > 65504 ->
+-inf: the HVX/HMX converters' saturation; NaN kept), fp16 KV rows widened to float32 with numpy's NaN bits, and
the staging converter that uses the rounding. AVX2 IR (compiled by native/compile.py), the fronts (`round_hw`,
`f16_to_f32`, `shuffled_fp16`), which fall back to numpy's form of the same function (fp16.py) where the kernel
does not run, and the numba rounding twins the other families' portable twins are built on.

- `round_f16_hw`: vcvtps2ph (F16C) and a compare and blend for the saturation.
- `round_f16_hw_t`: the same rounding written transposed (8 x 8 blocks through a register transpose): the HMX
  matmul's tile products, computed as (W_tile @ A^T), land in the (M, N) output rounded in one pass.
- `f16_rows_f32`: vcvtph2ps is exact except that it quiets NaN; numpy keeps the payload as it is (sign |
  0x7F800000 | mant << 13), so NaN lanes take that pattern instead.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from kazeia.backends.htp.fp16 import f32_to_f16_shuffled, round_fp16_hw
from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import Library, available
from kazeia.native.idioms import transpose8
from kazeia.native.irkit import F16, F32, I8, I16, I32, I64, V8F32, V8I32, Kernel, i64, ptr, splat, vec
from kazeia.native.pool import run_rows
from kazeia.native.portable import intrinsic, jit

V8I16 = vec(I16, 8)
ROUND_ROW = 1024                 # elements per row of the native rounding kernel
PARALLEL_MIN_ELEMS = 1 << 18     # arrays below this run on one thread


def hw16(k: Kernel, v: ir.Value) -> ir.Value:
    """<8 x float> -> the float32 of its fp16 RNE rounding, |x| > 65504 -> +-inf, NaN kept."""
    b = k.b
    h = k.call("llvm.x86.vcvtps2ph.256", V8I16, v, ir.Constant(I32, 0))  # imm 0: round to nearest even
    r = b.fpext(b.bitcast(h, vec(F16, 8)), V8F32)
    bits = b.bitcast(v, V8I32)
    mag = b.bitcast(b.and_(bits, splat(V8I32, 0x7FFFFFFF)), V8F32)
    big = b.fcmp_ordered(">", mag, splat(V8F32, 65504.0))  # false for NaN
    inf = b.bitcast(b.or_(b.and_(bits, splat(V8I32, -0x80000000)), splat(V8I32, 0x7F800000)), V8F32)
    return b.select(big, inf, r)


def hw_bits8(k: Kernel, v: ir.Value) -> ir.Value:
    """<8 x float> -> <8 x i16>: the fp16 bits of round_fp16_hw (RNE, |x| > 65504 -> +-inf; a NaN comes out
    quiet, as the float32 products this is used on always are)."""
    b = k.b
    h = k.call("llvm.x86.vcvtps2ph.256", V8I16, v, ir.Constant(I32, 0))
    bits = b.bitcast(v, V8I32)
    mag = b.bitcast(b.and_(bits, splat(V8I32, 0x7FFFFFFF)), V8F32)
    big = b.fcmp_ordered(">", mag, splat(V8F32, 65504.0))
    inf = b.trunc(b.or_(b.lshr(b.and_(bits, splat(V8I32, -0x80000000)), splat(V8I32, 16)),
                        splat(V8I32, 0x7C00)), V8I16)
    return b.select(big, inf, h)


def _round_kernel(module: ir.Module) -> str:
    """round_f16_hw(x, y, r0, r1): y[i] = hw16(x[i]) for i in [1024*r0, 1024*r1) (x == y allowed); the caller
    passes a whole number of 1024-element rows and rounds the tail with numpy."""
    k = Kernel(module, "round_f16_hw", [("x", ptr(F32)), ("y", ptr(F32)), ("r0", I64), ("r1", I64)], noalias=False)
    b = k.b
    with k.loop(b.mul(k.a.r0, i64(128)), b.mul(k.a.r1, i64(128)), name="i") as i:
        o = b.mul(i, i64(8))
        k.store_vec(hw16(k, k.load_vec(k.a.x, V8F32, o)), k.a.y, o)
    k.ret()
    return "round_f16_hw"


def _round_t_kernel(module: ir.Module) -> str:
    """round_f16_hw_t(x, xstride, m8, y, ystride, r0, r1): y[c, 8*r + i] = hw16(x[8*r + i, c]) for the 8-row
    blocks r in [r0, r1) and c < m8 (a multiple of 8): x's rows xstride elements apart, y's ystride (x != y)."""
    k = Kernel(module, "round_f16_hw_t", [("x", ptr(F32)), ("xstride", I64), ("m8", I64), ("y", ptr(F32)),
                                          ("ystride", I64), ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    with k.loop(a.r0, a.r1, name="rb") as rb:
        src = k.gep(a.x, b.mul(rb, b.mul(a.xstride, i64(8))))
        dst = k.gep(a.y, b.mul(rb, i64(8)))
        with k.loop(0, a.m8, step=8, name="c") as c:
            rows = [k.load_vec(src, V8F32, b.add(b.mul(a.xstride, i64(i)), c)) for i in range(8)]
            cols = transpose8(k, rows)
            for j, v in enumerate(cols):
                k.store_vec(hw16(k, v), dst, b.mul(b.add(c, i64(j)), a.ystride))
    k.ret()
    return "round_f16_hw_t"


def _f16_rows_kernel(module: ir.Module) -> str:
    """f16_rows_f32(src, nb1, nb2, n1, d, dst, os1, os2, r0, r1): the fp16 rows r in [r0, r1) of a strided
    2-level view (row r = c + n1*h at byte src + h*nb2 + c*nb1, d elements, d a multiple of 8) widened to
    float32 into dst (row r at element h*os2 + c*os1). vcvtph2ps is exact except that it quiets NaN; numpy
    keeps the payload as it is (sign | 0x7F800000 | mant << 13), so NaN lanes take that pattern instead: the
    same bits as numpy."""
    k = Kernel(module, "f16_rows_f32", [("src", ptr(I8)), ("nb1", I64), ("nb2", I64), ("n1", I64), ("d", I64),
                                        ("dst", ptr(F32)), ("os1", I64), ("os2", I64), ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    v8i16 = vec(I16, 8)
    with k.loop(a.r0, a.r1, name="row") as r:
        h2, c1 = b.sdiv(r, a.n1), b.srem(r, a.n1)
        base = b.add(b.mul(h2, a.nb2), b.mul(c1, a.nb1))
        obase = b.add(b.mul(h2, a.os2), b.mul(c1, a.os1))
        with k.loop(0, b.sdiv(a.d, i64(8)), name="j") as j:
            h = k.load_vec(k.gep(a.src, base), v8i16, b.mul(j, i64(16)))  # src is a byte pointer
            k.store_vec(widen_f16(k, h), a.dst, b.add(obase, b.mul(j, i64(8))))
    k.ret()
    return "f16_rows_f32"


def widen_f16(k: Kernel, h: ir.Value) -> ir.Value:
    """<n x i16> fp16 bits -> <n x float> with numpy's bits: vcvtph2ps, NaN lanes given numpy's payload (sign |
    0x7F800000 | mant << 13) instead of the quieted one."""
    b = k.b
    n = h.type.count
    vi = vec(I32, n)
    wide = b.fpext(b.bitcast(h, vec(F16, n)), vec(F32, n))
    hz = b.zext(h, vi)
    is_nan = b.and_(b.icmp_unsigned("==", b.and_(hz, splat(vi, 0x7C00)), splat(vi, 0x7C00)),
                    b.icmp_unsigned("!=", b.and_(hz, splat(vi, 0x3FF)), splat(vi, 0)))
    nan = b.or_(b.or_(b.shl(b.and_(hz, splat(vi, 0x8000)), splat(vi, 16)), splat(vi, 0x7F800000)),
                b.shl(b.and_(hz, splat(vi, 0x3FF)), splat(vi, 13)))
    return b.select(is_nan, b.bitcast(nan, vec(F32, n)), wide)


LIB = Library(__name__, "kazeia_htp_rounding")
ROUND = LIB.kernel("round_f16_hw", _round_kernel, par=True)
ROUND_T = LIB.kernel("round_f16_hw_t", _round_t_kernel, par=True)
F16_ROWS = LIB.kernel("f16_rows_f32", _f16_rows_kernel, par=True)


# --- fronts ----------------------------------------------------------------------------------------------------

def round_hw(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """round_fp16_hw(x) (RNE to fp16, |x| > 65504 -> +-inf, NaN kept) as a new float32 array, or into `out`
    (same shape, float32; `out` may be `x` itself)."""
    native = available()
    x = np.asarray(x)
    if out is not None:
        if out.shape != x.shape or out.dtype != np.float32:
            raise ValueError(f"round_hw out must be float32 of shape {x.shape}")
        if not native or x.dtype != np.float32 or x.size < ROUND_ROW or not (
                x.flags.c_contiguous and out.flags.c_contiguous):
            out[...] = round_fp16_hw(x)
            return out
    if not native or x.dtype != np.float32 or x.size < ROUND_ROW:
        return round_fp16_hw(x)
    xc = np.ascontiguousarray(x)
    y = np.empty_like(xc) if out is None else out
    flat_x, flat_y = xc.reshape(-1), y.reshape(-1)
    rows = xc.size // ROUND_ROW
    run_rows(ROUND, (addr(xc), addr(y)), rows, 64, xc.size >= PARALLEL_MIN_ELEMS)
    tail = rows * ROUND_ROW
    if tail < xc.size:
        flat_y[tail:] = round_fp16_hw(flat_x[tail:])
    return y


def round_hw_transposed(x: np.ndarray, out: np.ndarray) -> None:
    """out[...] = round_hw(x.T): x (R, M) float32 with unit column stride (the first M columns of a wider
    array, too), out (M, R) float32 with unit column stride (a column range of a wider C-contiguous array); the
    same bits as round_hw, written through 8 x 8 register transposes (numpy's strided transpose copy runs at ~1
    element a ns here)."""
    r, m = x.shape
    if out.shape != (m, r) or out.dtype != np.float32 or x.dtype != np.float32:
        raise ValueError(f"round_hw_transposed: out must be float32 of shape {(m, r)}")
    m8, r8 = m // 8 * 8, r // 8 * 8
    if not available() or x.strides[1] != 4 or out.strides[1] != 4 or m8 == 0 or r8 == 0:
        out[...] = round_hw(x.T)
        return
    run_rows(ROUND_T, (addr(x), x.strides[0] // 4, m8, addr(out), out.strides[0] // 4), r8 // 8, 16,
             x.size >= PARALLEL_MIN_ELEMS)
    if m8 < m:
        out[m8:, :r8] = round_fp16_hw(x[:r8, m8:].T)
    if r8 < r:
        out[:, r8:] = round_fp16_hw(x[r8:].T)


F16_LOAD_MIN_ELEMS = 1 << 14     # fp16 arrays below this are widened by numpy
F16_ROWS_CHUNK = 256             # rows a claim of the threaded widening (32 cells of an 8-head cache)


def f16_to_f32(a: np.ndarray, order: str = "K", linger: bool = False) -> np.ndarray:
    """np.asarray(a, dtype=np.float32) of a float16 array (a KV cache view: (1, heads, cells, D), strided), the
    same bits, NaN payloads included, in the same memory order numpy picks (numpy widens fp16 in software:
    ~2 ns an element, this ~7x less); order="C": np.ascontiguousarray of that (made C-contiguous directly).
    Large views are widened on the kernel threads (`linger`: they keep spinning afterwards, a decode step)."""
    if (not available() or a.dtype != np.float16 or a.ndim != 4 or a.shape[0] != 1 or a.size < F16_LOAD_MIN_ELEMS
            or a.shape[3] % 8 or a.strides[3] != 2):
        return np.asarray(a, dtype=np.float32, order=order)
    out = np.empty_like(a, dtype=np.float32, order=order)  # "K": as np.asarray lays its copy out
    if out.strides[3] != 4:
        return np.asarray(a, dtype=np.float32, order=order)
    _, n2, n1, d = a.shape
    if a.strides[2] > a.strides[1]:  # rows in source order (a KV cache's cells hold every head: cells outer)
        args = (addr(a), a.strides[1], a.strides[2], n2, d, addr(out), out.strides[1] // 4, out.strides[2] // 4)
    else:
        args = (addr(a), a.strides[2], a.strides[1], n1, d, addr(out), out.strides[2] // 4, out.strides[1] // 4)
    run_rows(F16_ROWS, args, n2 * n1, F16_ROWS_CHUNK, a.size >= PARALLEL_MIN_ELEMS, linger=linger)
    return out


def shuffled_fp16(x: np.ndarray, arch: int | None = None) -> np.ndarray:
    """fp16.f32_to_f16_shuffled (the HMX activation staging converter), rounding with `round_hw`."""
    return f32_to_f16_shuffled(x, arch, round_hw)


# --- portable twins (numba): the rounding the other families' twins use -------------------------------------

_f32, _u32 = np.float32, np.uint32


@intrinsic
def _f32_bits(typingctx, x):
    """The IEEE bits of a float32 (an LLVM bitcast)."""
    from numba.core import types

    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, u):
    """The float32 of IEEE bits: the low 32 bits of an integer (numba widens uint32 arithmetic), bitcast."""
    from numba.core import types

    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())
    return types.float32(u), codegen


@jit(cache=True)
def round_f16_f32(x):
    """float32 -> float32 holding its fp16 RNE rounding, |x| > 65504 -> +-inf (round_fp16_hw), NaN kept.
    Normal fp16 range: the 13 low mantissa bits rounded away on the bits (ties to even); below 2^-14 the fp16
    quantum is 2^-24: rint(|x| * 2^24) * 2^-24, exact in float32. Every case is computed and one is selected
    (no branches, so loops over it vectorize)."""
    # every integer result is cast back to uint32 (numba computes in 64 bits otherwise: half the SIMD lanes)
    u = _f32_bits(x)
    sign = _u32(u & _u32(0x80000000))
    a = _u32(u & _u32(0x7FFFFFFF))
    normal = _u32(_u32(_u32(a + _u32(0xFFF)) + _u32(_u32(a >> _u32(13)) & _u32(1))) & _u32(0xFFFFE000))
    tiny = _f32_bits(np.rint(abs(x) * _f32(16777216.0)) * _f32(5.9604644775390625e-08))
    r = normal if a >= _u32(0x38800000) else tiny
    r = _u32(0x7F800000) if a > _u32(0x477FE000) else r
    r = a if a > _u32(0x7F800000) else r
    return _bits_f32(_u32(sign | r))


@jit(cache=True)
def round_f16(v):
    """float64 -> float32 holding the fp16 RNE rounding of v; |v| > 65504 -> +-inf; NaN stays NaN."""
    if v != v:
        return _f32(v)
    a = abs(v)
    if a > 65504.0:
        return _f32(math.copysign(math.inf, v))
    if a == 0.0:
        return _f32(v)
    _, e = math.frexp(a)  # a in [2^(e-1), 2^e): 11 significant bits -> ulp 2^(e-11), at least 2^-24
    sh = max(e - 11, -24)
    r = math.ldexp(np.rint(math.ldexp(a, -sh)), sh)
    return _f32(math.copysign(r, v))
