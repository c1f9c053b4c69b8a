"""The activations' quantization for the `cpu` backend's weight matmuls (the GEMV and the GEMM read it): x rows to
int16 per 32-element block with one float32 scale d_x = amax/32767, as AVX2 IR (compiled by native/compile.py),
its front `quantize_activations` and its portable numba twin.

ggml quantizes its vec_dot activations to int8 with an fp16 scale; int16 with a float32 scale keeps the matmul
within ~1e-9 NMSE of the float product at no extra cost (the products run in int32 lanes either way).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from kazeia.gguf.quants import QK
from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import Library, available
from kazeia.native.irkit import F32, I8, I16, I32, I64, V8F32, V8I32, Kernel, f32, i64, ptr, splat, vec
from kazeia.native.portable import jit, prange


def emit_quantize_x(module: ir.Module) -> ir.Function:
    """x (nblk x 32 float32) -> xq int16 codes rint(x / d) in [-32767, 32767], xd = d = amax/32767 (float32
    division, as the portable kernel does), xs = sum of the codes. A block holding inf or NaN gets d = NaN and
    zero codes; an all-zero block d = 0. Arguments: x, xq, xd, xs, nblk."""
    k = Kernel(module, "quantize_x", [("x", ptr(F32)), ("xq", ptr(I16)), ("xd", ptr(F32)), ("xs", ptr(I32)),
                                      ("nblk", I64)])
    b, a = k.b, k.a
    absmask = splat(V8I32, 0x7FFFFFFF)
    inf = f32(float("inf"))
    with k.loop(0, a.nblk, name="blk") as blk:
        base = b.mul(blk, i64(QK))
        v = [k.load_vec(a.x, V8F32, b.add(base, i64(8 * j))) for j in range(4)]
        av = [b.bitcast(b.and_(b.bitcast(x, V8I32), absmask), V8F32) for x in v]
        fmax = lambda p, q: k.call("llvm.maxnum.v8f32", V8F32, p, q)  # noqa: E731
        mx = fmax(fmax(av[0], av[1]), fmax(av[2], av[3]))
        # bad: some |x| is inf or NaN (unordered or >= inf), checked on every lane, not on the max
        badv = [b.fcmp_unordered(">=", x, k.broadcast(inf, 8)) for x in av]
        anyb = b.or_(b.or_(badv[0], badv[1]), b.or_(badv[2], badv[3]))
        bad = b.icmp_unsigned("!=", b.bitcast(anyb, I8), ir.Constant(I8, 0))
        m4 = fmax(mx, k.shuffle(mx, None, [4, 5, 6, 7, 0, 1, 2, 3]))
        m2 = fmax(m4, k.shuffle(m4, None, [2, 3, 0, 1, 6, 7, 4, 5]))
        m1 = fmax(m2, k.shuffle(m2, None, [1, 0, 3, 2, 5, 4, 7, 6]))
        amax = b.extract_element(m1, ir.Constant(I32, 0))
        d = b.fdiv(amax, f32(32767.0))
        inv = k.broadcast(b.fdiv(f32(1.0), d), 8)
        zero = b.fcmp_ordered("==", amax, f32(0.0))
        skip = b.or_(bad, zero)
        lim = k.broadcast(f32(32767.0), 8)
        total = ir.Constant(V8I32, [0] * 8)
        for j in range(4):
            q = k.call("llvm.rint.v8f32", V8F32, b.fmul(v[j], inv))
            q = k.call("llvm.minnum.v8f32", V8F32, fmax(q, b.fneg(lim)), lim)
            qi = b.select(skip, ir.Constant(V8I32, [0] * 8), b.fptosi(q, V8I32))
            total = b.add(total, qi)
            k.store_vec(b.trunc(qi, vec(I16, 8)), a.xq, b.add(base, i64(8 * j)))
        t4 = b.add(total, k.shuffle(total, None, [4, 5, 6, 7, 0, 1, 2, 3]))
        t2 = b.add(t4, k.shuffle(t4, None, [2, 3, 0, 1, 6, 7, 4, 5]))
        t1 = b.add(t2, k.shuffle(t2, None, [1, 0, 3, 2, 5, 4, 7, 6]))
        k.store(b.extract_element(t1, ir.Constant(I32, 0)), a.xs, blk)
        dval = b.select(bad, f32(float("nan")), b.select(zero, f32(0.0), d))
        k.store(dval, a.xd, blk)
    k.ret()
    return k.fn

LIB = Library(__name__, "kazeia_simd_quantize")
QUANTIZE = LIB.kernel("quantize_x", emit_quantize_x)


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (M, K) float32 -> (int16 codes (M, K/32, 32), float32 scale (M, K/32), int32 code sums).

    d = amax/32767, q = rint(x / d). A block holding inf or NaN gets d = NaN, so its products stay non-finite."""
    m, k = x.shape
    xq = np.empty((m, k // QK, QK), dtype=np.int16)
    xd = np.empty((m, k // QK), dtype=np.float32)
    xs = np.empty((m, k // QK), dtype=np.int32)
    xc = np.ascontiguousarray(x, dtype=np.float32)
    if available():
        QUANTIZE.fn(addr(xc), addr(xq), addr(xd), addr(xs), m * (k // QK))
    else:
        quantize_x_portable(xc.reshape(m, k // QK, QK), xq, xd, xs)
    return xq, xd, xs

# --- portable twin (numba) -------------------------------------------------------------------------------------

_i16, _i32, _f32 = np.int16, np.int32, np.float32


@jit(parallel=True, cache=True)
def quantize_x_portable(x, xq, xd, xs):
    """x (M, nb, 32) float32 -> xq int16 codes in [-32767, 32767], xd float32 scales (amax / 32767), xs int32
    sums of the codes. A block holding inf or NaN gets xd = NaN, so its products stay non-finite."""
    m, nb = x.shape[0], x.shape[1]
    for i in prange(m * nb):
        r, b = i // nb, i % nb
        amax = _f32(0.0)
        bad = False
        for j in range(32):
            v = x[r, b, j]
            if v != v or v == np.inf or v == -np.inf:
                bad = True
            a = abs(v)
            if a > amax:
                amax = a
        s = _i32(0)
        if bad or amax == 0:
            xd[r, b] = np.nan if bad else _f32(0.0)
            for j in range(32):
                xq[r, b, j] = 0
        else:
            d = amax / _f32(32767.0)
            inv = _f32(1.0) / d
            xd[r, b] = d
            for j in range(32):
                q = _i16(min(max(np.rint(x[r, b, j] * inv), _f32(-32767.0)), _f32(32767.0)))
                xq[r, b, j] = q
                s += _i32(q)
        xs[r, b] = s
