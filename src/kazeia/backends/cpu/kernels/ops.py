"""The `cpu` backend's small-op family (everything around the weight matmuls and the attention of a decode step):
AVX2 IR compiled by native/compile.py; cpu/bind.py binds them to graph nodes (their front), and the float32
numpy kernels of cpu/f32_ops.py are what runs without them.

A decode step of a small model runs hundreds of these ops on a few hundred floats each: numpy pays ~5-50 us of
call overhead per op where the arithmetic takes well under a microsecond. Each kernel here is one ctypes call
on one thread, with a fixed order of every reduction (the same bits at any thread count).

- rms_norm: sum of squares in float64 (4 lanes, then a fixed tree), 1/sqrt(mean + eps) rounded to float32, x*inv.
- add / mul: y = a op b, b row-broadcast (row stride 0) or not; one float32 rounding, as numpy.
- swiglu: y = a / (1 + exp(-a)) * b (exp: Cephes' polynomial, ~1 ulp; NaN kept, overflow -> inf).
- rope_table: the cos/sin table (T, n_dims/2) of ggml_rope (libm cos/sin of float64 angles, as
  numpy_ops.rope_angles); the pair rotation that reads it is backends/rope_pass.py's (shared with the device model).
- set_rows_f16: rows of float32 -> rows of an F16 tensor at int64 row ids (vcvtps2ph: round to nearest even, as
  numpy's astype(float16)); every id is checked before anything is written (returns -1 when one is out of range).
  With ids 0..n-1 it is also the F32 -> F16 CPY of the KQ mask.
"""

from __future__ import annotations

from llvmlite import ir

from kazeia.native.compile import Library
from kazeia.native.irkit import F16, F32, F64, I16, I32, I64, V8F32, V8I32, Kernel, f32, i64, ptr, splat, vec

V4F64 = vec(F64, 4)
V8F16 = vec(F16, 8)
V8I16 = vec(I16, 8)
LOG2E = 1.44269504088896341
EXP_HI = 88.72283935546875    # ln(FLT_MAX) rounded up: above, exp is inf
EXP_LO = -103.97208404541016  # below, exp is 0 (past the smallest denormal)
EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)

def exp8(k: Kernel, x: ir.Value) -> ir.Value:
    """exp of <8 x float> lanes (Cephes expf: 2^n * p(r), r = x - n ln2 in two parts); NaN stays NaN."""
    b = k.b
    xc = k.call("llvm.minnum.v8f32", V8F32, k.call("llvm.maxnum.v8f32", V8F32, x, splat(V8F32, EXP_LO)),
                splat(V8F32, EXP_HI))
    fx = k.call("llvm.floor.v8f32", V8F32, b.fadd(b.fmul(xc, splat(V8F32, LOG2E)), splat(V8F32, 0.5)))
    r = b.fsub(b.fsub(xc, b.fmul(fx, splat(V8F32, 0.693359375))), b.fmul(fx, splat(V8F32, -2.12194440e-4)))
    p = splat(V8F32, EXP_P[0])
    for c in EXP_P[1:]:
        p = b.fadd(b.fmul(p, r), splat(V8F32, c))
    y = b.fadd(b.fadd(b.fmul(p, b.fmul(r, r)), r), splat(V8F32, 1.0))
    n = b.fptosi(fx, V8I32)  # in [-150, 128]: 2^n as two powers of two, each a normal float
    n1 = b.ashr(n, splat(V8I32, 1))
    n2 = b.sub(n, n1)
    for e in (n1, n2):
        y = b.fmul(y, b.bitcast(b.shl(b.add(e, splat(V8I32, 127)), splat(V8I32, 23)), V8F32))
    return b.select(b.fcmp_unordered("uno", x, x), x, y)


def exp1(k: Kernel, x: ir.Value) -> ir.Value:
    """exp of one float, by the vector routine (the same bits as a lane of exp8)."""
    return k.b.extract_element(exp8(k, k.broadcast(x, 8)), ir.Constant(I32, 0))


def vec_loop(k: Kernel, n: ir.Value, body8, body1) -> None:
    """body8(j) for j = 0, 8, ... while j + 8 <= n, then body1(j) for the rest."""
    b = k.b
    n8 = b.mul(b.sdiv(n, i64(8)), i64(8))
    with k.loop(0, b.sdiv(n, i64(8)), name="v8") as c:
        body8(b.mul(c, i64(8)))
    with k.loop(n8, n, name="v1") as j:
        body1(j)


def _rows(k: Kernel, name: str = "row"):
    return k.loop(0, k.a.nrows, name=name)


# --- elementwise ------------------------------------------------------------------------------------------

BIN_ARGS = [("a", ptr(F32)), ("b", ptr(F32)), ("y", ptr(F32)), ("nrows", I64), ("ne0", I64), ("ars", I64),
            ("brs", I64), ("yrs", I64)]
BIN_SIG = "v:pppiiiii"


def _binary(module: ir.Module, name: str, op) -> None:
    """name(a, b, y, nrows, ne0, ars, brs, yrs): y[r, j] = op(a[r, j], b[r, j]) (row strides in floats; brs 0 for
    a broadcast row). y may be a or b (in place)."""
    k = Kernel(module, name, BIN_ARGS, noalias=False)
    b, a = k.b, k.a
    with _rows(k) as r:
        pa, pb, py = k.gep(a.a, b.mul(r, a.ars)), k.gep(a.b, b.mul(r, a.brs)), k.gep(a.y, b.mul(r, a.yrs))
        vec_loop(k, a.ne0,
                  lambda j: k.store_vec(op(k, k.load_vec(pa, V8F32, j), k.load_vec(pb, V8F32, j)), py, j),
                  lambda j: k.store(op(k, k.load(pa, j), k.load(pb, j)), py, j))
    k.ret()


def _swiglu_op(k: Kernel, x: ir.Value, g: ir.Value) -> ir.Value:
    b = k.b
    if isinstance(x.type, ir.VectorType):
        e = exp8(k, b.fneg(x))
        one = splat(V8F32, 1.0)
    else:
        e, one = exp1(k, b.fneg(x)), f32(1.0)
    return b.fmul(b.fdiv(x, b.fadd(one, e)), g)


def _rms_norm(module: ir.Module) -> None:
    """rms_norm(x, y, nrows, ne0, xrs, yrs, eps): y = x * (float)(1 / sqrt(sum(x^2) / ne0 + eps)), eps given as the
    bits of a double (every argument of these kernels is an integer: run_program can call any of them)."""
    k = Kernel(module, "rms_norm", [("x", ptr(F32)), ("y", ptr(F32)), ("nrows", I64), ("ne0", I64), ("xrs", I64),
                                    ("yrs", I64), ("eps", I64)], noalias=False)
    b, a = k.b, k.a
    with _rows(k) as r:
        px, py = k.gep(a.x, b.mul(r, a.xrs)), k.gep(a.y, b.mul(r, a.yrs))
        acc = k.var(V4F64, ir.Constant(V4F64, [0.0] * 4))
        tail = k.var(F64, ir.Constant(F64, 0.0))

        def sq8(j):
            v = k.load_vec(px, V8F32, j)
            s = b.load(acc)
            for h in (0, 4):
                d = b.fpext(k.shuffle(v, None, list(range(h, h + 4))), V4F64)
                s = b.fadd(s, b.fmul(d, d))
            b.store(s, acc)

        def sq1(j):
            d = b.fpext(k.load(px, j), F64)
            b.store(b.fadd(b.load(tail), b.fmul(d, d)), tail)

        vec_loop(k, a.ne0, sq8, sq1)
        s = b.load(acc)
        tot = b.fadd(b.fadd(b.extract_element(s, ir.Constant(I32, 0)), b.extract_element(s, ir.Constant(I32, 2))),
                     b.fadd(b.extract_element(s, ir.Constant(I32, 1)), b.extract_element(s, ir.Constant(I32, 3))))
        mean = b.fdiv(b.fadd(tot, b.load(tail)), b.sitofp(a.ne0, F64))
        sq = k.call("llvm.sqrt.f64", F64, b.fadd(mean, b.bitcast(a.eps, F64)))
        inv = b.fptrunc(b.fdiv(ir.Constant(F64, 1.0), sq), F32)
        inv8 = k.broadcast(inv, 8)
        vec_loop(k, a.ne0, lambda j: k.store_vec(b.fmul(k.load_vec(px, V8F32, j), inv8), py, j),
                  lambda j: k.store(b.fmul(k.load(px, j), inv), py, j))
    k.ret()


# --- rope (the pair rotation itself is backends/rope_pass.py's, shared with the device model) ------------------

def _rope_table(module: ir.Module) -> None:
    """rope_table(pos, inv, fs, af, T, half, cos, sin): cos/sin[t, i] = (float)cos/sin((pos[t] * fs) * inv[i]) * af
    (float64 angles, libm's cos and sin, one rounding to float32, then the float32 product with af); fs given as the
    bits of a double, af as those of a float."""
    k = Kernel(module, "rope_table", [("pos", ptr(I32)), ("inv", ptr(F64)), ("fs", I64), ("af", I64), ("T", I64),
                                      ("half", I64), ("cos", ptr(F32)), ("sin", ptr(F32))])
    b, a = k.b, k.a
    fs, af = b.bitcast(a.fs, F64), b.bitcast(b.trunc(a.af, I32), F32)
    with k.loop(0, a.T, name="t") as t:
        pt = b.fmul(b.sitofp(k.load(a.pos, t), F64), fs)
        with k.loop(0, a.half, name="i") as i:
            th = b.fmul(pt, k.load(a.inv, i))
            o = b.add(b.mul(t, a.half), i)
            for name, dst in (("cos", a.cos), ("sin", a.sin)):
                k.store(b.fmul(b.fptrunc(k.call(name, F64, th), F32), af), dst, o)
    k.ret()


# --- KV store ----------------------------------------------------------------------------------------------


def _set_rows_f16(module: ir.Module) -> None:
    """set_rows_f16(src, ids, dst, n, ne0, srs, drs, nrows) -> 0, or -1 (nothing written) when an id is outside
    [0, nrows): dst row ids[i] = fp16(src row i). Row strides in elements."""
    k = Kernel(module, "set_rows_f16", [("src", ptr(F32)), ("ids", ptr(I64)), ("dst", ptr(I16)), ("n", I64),
                                        ("ne0", I64), ("srs", I64), ("drs", I64), ("nrows", I64)], ret=I64)
    b, a = k.b, k.a
    bad = k.var(ir.IntType(1), ir.Constant(ir.IntType(1), 0))
    with k.loop(0, a.n, name="chk") as i:
        r = k.load(a.ids, i)
        out = b.or_(b.icmp_signed("<", r, i64(0)), b.icmp_signed(">=", r, a.nrows))
        b.store(b.or_(b.load(bad), out), bad)
    with k.if_(b.load(bad)):
        k.ret(i64(-1))
    with k.loop(0, a.n, name="row") as i:
        ps = k.gep(a.src, b.mul(i, a.srs))
        pd = k.gep(a.dst, b.mul(k.load(a.ids, i), a.drs))
        vec_loop(k, a.ne0,
                  lambda j: k.store_vec(b.bitcast(b.fptrunc(k.load_vec(ps, V8F32, j), V8F16), V8I16), pd, j),
                  lambda j: k.store(b.bitcast(b.fptrunc(k.load(ps, j), F16), I16), pd, j))
    k.ret(i64(0))


# --- flash attention ---------------------------------------------------------------------------------------


LIB = Library(__name__, "kazeia_simd_ops")
ADD = LIB.kernel("add", _binary, "add", lambda k, x, y: k.b.fadd(x, y))
MUL = LIB.kernel("mul", _binary, "mul", lambda k, x, y: k.b.fmul(x, y))
SWIGLU = LIB.kernel("swiglu", _binary, "swiglu", _swiglu_op)
RMS_NORM = LIB.kernel("rms_norm", _rms_norm)
ROPE_TABLE = LIB.kernel("rope_table", _rope_table)
SET_ROWS_F16 = LIB.kernel("set_rows_f16", _set_rows_f16)
