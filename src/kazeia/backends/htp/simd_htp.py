"""AVX2 kernels of the HTP numerics, emitted as LLVM IR (irkit) and compiled by native.py. Each computes
bitwise what its portable numba twin in kernels.py computes (tests/test_htp_simd.py), from the ggml blocks.

- `round_f16_hw`: float32 -> float32 holding its fp16 RNE rounding (vcvtps2ph, F16C), every |x| > 65504 ->
  +-inf (the HVX/HMX converters' saturation: a compare and a blend), NaN stays NaN.
- `hmx_weight_<kind>`: rows of ggml blocks -> the fp16 weight values the HMX dequant tasks write, as float32:
  fp16(q*d) (exact float32 product, one hw rounding); Q4_1 fp16(fp16(q*d) + m) with the sum exact in
  float64 and one hw rounding from there (see `_q4_1_sum`).
- `hvx_pairs`, `hvx_dot_<kind>`: the HVX vec_dot, emitted by simd_hvx.py into this module.
"""

from __future__ import annotations

from llvmlite import ir

from kazeia.backends.htp import simd_hvx
from kazeia.backends.htp.simd_blocks import BLOCK_BYTES, CODE_OFFSET, IQ4_NL, QK, codes_i8
from kazeia.backends.irkit import (
    F16,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    V8F32,
    V8I32,
    V16I8,
    Kernel,
    chunked,
    f32,
    i64,
    lanes,
    ptr,
    splat,
    vec,
)

V8I16, V4F64 = vec(I16, 8), vec(F64, 4)
INV127 = 2.0 ** -7 * (1 + 8 / 1024)  # hvx_quant.INV127_F16 (0x2008), the quantizer's fp16 1/127, as a float


def _hw16(k: Kernel, v: ir.Value) -> ir.Value:
    """<8 x float> -> the float32 of its fp16 RNE rounding, |x| > 65504 -> +-inf, NaN kept."""
    b = k.b
    h = k.call("llvm.x86.vcvtps2ph.256", V8I16, v, ir.Constant(I32, 0))  # imm 0: round to nearest even
    r = b.fpext(b.bitcast(h, vec(F16, 8)), V8F32)
    bits = b.bitcast(v, V8I32)
    mag = b.bitcast(b.and_(bits, splat(V8I32, 0x7FFFFFFF)), V8F32)
    big = b.fcmp_ordered(">", mag, splat(V8F32, 65504.0))  # false for NaN
    inf = b.bitcast(b.or_(b.and_(bits, splat(V8I32, -0x80000000)), splat(V8I32, 0x7F800000)), V8F32)
    return b.select(big, inf, r)


def _round_kernel(module: ir.Module) -> str:
    """round_f16_hw(x, y, r0, r1): y[i] = hw16(x[i]) for i in [1024*r0, 1024*r1) (x == y allowed); the caller
    passes a whole number of 1024-element rows and rounds the tail with numpy."""
    k = Kernel(module, "round_f16_hw", [("x", ptr(F32)), ("y", ptr(F32)), ("r0", I64), ("r1", I64)], noalias=False)
    b = k.b
    with k.loop(b.mul(k.a.r0, i64(128)), b.mul(k.a.r1, i64(128)), name="i") as i:
        o = b.mul(i, i64(8))
        k.store_vec(_hw16(k, k.load_vec(k.a.x, V8F32, o)), k.a.y, o)
    k.ret()
    return "round_f16_hw"


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
            wide = b.fpext(b.bitcast(h, vec(F16, 8)), V8F32)
            hz = b.zext(h, V8I32)
            is_nan = b.and_(b.icmp_unsigned("==", b.and_(hz, splat(V8I32, 0x7C00)), splat(V8I32, 0x7C00)),
                            b.icmp_unsigned("!=", b.and_(hz, splat(V8I32, 0x3FF)), splat(V8I32, 0)))
            nan = b.or_(b.or_(b.shl(b.and_(hz, splat(V8I32, 0x8000)), splat(V8I32, 16)), splat(V8I32, 0x7F800000)),
                        b.shl(b.and_(hz, splat(V8I32, 0x3FF)), splat(V8I32, 13)))
            out = b.select(is_nan, b.bitcast(nan, V8F32), wide)
            k.store_vec(out, a.dst, b.add(obase, b.mul(j, i64(8))))
    k.ret()
    return "f16_rows_f32"


def _hw_bits8(k: Kernel, v: ir.Value) -> ir.Value:
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


def _store_int8(k: Kernel, sb: ir.Value, qrow: ir.Value, idx: ir.Value) -> None:
    """q[idx + lane] = ti8[sb[lane]] for the 8 fp16 bit patterns sb (hf_to_int8 by its table)."""
    b = k.b
    for lane in range(8):
        bits = b.zext(b.extract_element(sb, ir.Constant(I32, lane)), I64)
        k.store(k.load(k.a.ti8, bits), qrow, b.add(idx, i64(lane)))


def _q8_groups_kernel(module: ir.Module) -> str:
    """q8_groups(x, xstride, k, kp, group, tinv, ti8, q, qstride, dbits, r0, r1): hvx_quant._quantize_groups
    of the rows r in [r0, r1) of x (float32, every |x| <= 65504: the caller checks), zero past k up to kp:
    per group of `group` elements amax = the max fp16 bit pattern of |x|, d = fp16_hw(amax * fp16(1/127)),
    inv = tinv[d] (hvx_inverse_f16), q = ti8[fp16_hw(x * inv)] (hf_to_int8); d's bits go to dbits (row r at
    r*kp/group). The two tables are hvx_quant's, indexed by fp16 bits as there."""
    k = Kernel(module, "q8_groups", [("x", ptr(F32)), ("xstride", I64), ("k", I64), ("kp", I64), ("group", I64),
                                     ("tinv", ptr(I16)), ("ti8", ptr(I8)), ("q", ptr(I8)), ("qstride", I64),
                                     ("dbits", ptr(I16)), ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    ngroups = b.sdiv(a.kp, a.group)
    amax_v = k.var(V8I16, name="amax")
    zero16 = ir.Constant(V8I16, [0] * 8)
    inv127 = f32(INV127)
    with k.loop(a.r0, a.r1, name="row") as r:
        xrow = k.gep(a.x, b.mul(r, a.xstride))
        qrow = k.gep(a.q, b.mul(r, a.qstride))
        with k.loop(0, ngroups, name="g") as g:
            g0 = b.mul(g, a.group)
            b.store(zero16, amax_v)
            with k.loop(0, a.group, 8, name="e") as e:
                idx = b.add(g0, e)
                with k.if_(b.icmp_signed("<", idx, a.k)):
                    h = b.and_(_hw_bits8(k, k.load_vec(xrow, V8F32, idx)), splat(V8I16, 0x7FFF))
                    m = b.load(amax_v)
                    b.store(b.select(b.icmp_signed(">", h, m), h, m), amax_v)
            m = b.load(amax_v)
            am = b.extract_element(m, ir.Constant(I32, 0))
            for lane in range(1, 8):
                x_l = b.extract_element(m, ir.Constant(I32, lane))
                am = b.select(b.icmp_signed(">", x_l, am), x_l, am)
            amax_f = k.half_to_f32(am)
            prod = k.broadcast(b.fmul(amax_f, inv127), 8)
            d = b.extract_element(_hw_bits8(k, prod), ir.Constant(I32, 0))
            k.store(d, a.dbits, b.add(b.mul(r, ngroups), g))
            inv = k.broadcast(k.half_to_f32(k.load(a.tinv, b.zext(d, I64))), 8)
            with k.loop(0, a.group, 8, name="e2") as e:
                idx = b.add(g0, e)
                inside = b.icmp_signed("<", idx, a.k)
                with k.if_(inside):
                    xv = k.load_vec(xrow, V8F32, idx)
                    xh = b.fpext(b.bitcast(_hw_bits8(k, xv), vec(F16, 8)), V8F32)  # x as fp16, exactly widened
                    _store_int8(k, _hw_bits8(k, b.fmul(xh, inv)), qrow, idx)
                with k.if_(b.not_(inside)):  # padding: +0.0 quantized the same way
                    _store_int8(k, _hw_bits8(k, b.fmul(ir.Constant(V8F32, [0.0] * 8), inv)), qrow, idx)
    k.ret()
    return "q8_groups"


# --- HMX weight tiles --------------------------------------------------------------------------------------

def _eighths(k: Kernel, v16: ir.Value) -> list[ir.Value]:
    """<16 x i8> -> two <8 x float> (elements 0..7, 8..15)."""
    b = k.b
    return [b.sitofp(b.sext(k.shuffle(v16, None, list(range(j, j + 8))), V8I32), V8F32) for j in (0, 8)]


def _q4_1_sum(k: Kernel, a16: ir.Value, m: ir.Value) -> ir.Value:
    """hw16(a16 + m) with the sum of the two fp16 values taken exactly (float64) and rounded once: the
    overflow test is made on the exact sum; below it, rounding the float32 of the sum is the same as rounding
    the sum (when float32 cannot hold it, the smaller term is under a quarter of an fp16 ulp of the larger)."""
    b = k.b
    halves = []
    for j in (0, 4):
        s = b.fadd(b.fpext(k.shuffle(a16, None, list(range(j, j + 4))), V4F64),
                   b.fpext(k.shuffle(m, None, list(range(j, j + 4))), V4F64))
        halves.append(s)
    s64 = k.shuffle(halves[0], halves[1], list(range(8)))
    s32 = b.fptrunc(s64, V8F32)
    r = _hw16(k, s32)
    mag = k.call("llvm.fabs.v8f64", vec(F64, 8), s64)
    big = b.fcmp_ordered(">", mag, ir.Constant(vec(F64, 8), [65504.0] * 8))
    bits = b.bitcast(s32, V8I32)
    inf = b.bitcast(b.or_(b.and_(bits, splat(V8I32, -0x80000000)), splat(V8I32, 0x7F800000)), V8F32)
    return b.select(big, inf, r)


def _hmx_weight(module: ir.Module, kind: str) -> str:
    """hmx_weight_<kind>(w, wstride, nb, out, ostride, r0, r1): out[r, 32*b + j] = the HMX fp16 weight value."""
    name = f"hmx_weight_{kind}"
    k = Kernel(module, name, [("w", ptr(I8)), ("wstride", I64), ("nb", I64), ("out", ptr(F32)), ("ostride", I64),
                              ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    with k.loop(a.r0, a.r1, name="row") as r:
        rowp = k.gep(a.w, b.mul(r, a.wstride))
        outp = k.gep(a.out, b.mul(r, a.ostride))
        with k.loop(0, a.nb, name="blk") as blk:
            base = k.gep(rowp, b.mul(blk, i64(BLOCK_BYTES[kind])))
            o = b.mul(blk, i64(QK))
            if kind in CODE_VALUES:
                _lut_block(k, kind, base, outp, o)
            else:
                d = k.broadcast(k.half_to_f32(k.load_as(base, I16, 0)), 8)
                mv = k.broadcast(k.half_to_f32(k.load_as(base, I16, 2)), 8) if kind == "q4_1" else None
                lo, hi = codes_i8(k, kind, base)
                parts = _eighths(k, lo) + _eighths(k, hi)
                for j, p in enumerate(parts):
                    v = _hw16(k, b.fmul(p, d))  # the product is exact in float32
                    if mv is not None:
                        v = _q4_1_sum(k, v, mv)
                    k.store_vec(v, outp, b.add(o, i64(8 * j)))
    k.ret()
    return name


# the value each 4-bit code stands for in the product with d (Q4_0 q - 8, IQ4_NL the code book). Q4_1 keeps
# the per-element form: where both fp16(q*d) and m are NaN its float64 add returns one of the two NaNs, and
# which one LLVM's operand order made it differs between lanes of the compiled kernel (NaN payloads are not
# part of LLVM's semantics), so one value per code could not reproduce it.
CODE_VALUES = {"q4_0": [c - 8 for c in range(16)], "iq4_nl": list(IQ4_NL)}


def _hw16_bits(k: Kernel, v: ir.Value) -> ir.Value:
    """<8 x float> -> <8 x i16>, the fp16 bits whose widening is `_hw16(v)`: |v| > 65504 is replaced by +-inf
    before the conversion (vcvtps2ph keeps an inf, and widening it gives the inf `_hw16` selects)."""
    b = k.b
    bits = b.bitcast(v, V8I32)
    mag = b.bitcast(b.and_(bits, splat(V8I32, 0x7FFFFFFF)), V8F32)
    big = b.fcmp_ordered(">", mag, splat(V8F32, 65504.0))  # false for NaN
    inf = b.bitcast(b.or_(b.and_(bits, splat(V8I32, -0x80000000)), splat(V8I32, 0x7F800000)), V8F32)
    return k.call("llvm.x86.vcvtps2ph.256", V8I16, b.select(big, inf, v), ir.Constant(I32, 0))


def _code_table(k: Kernel, kind: str, base: ir.Value) -> list[ir.Value]:
    """The block's 16 possible weight values, one per code, as the fp16 bits of two <8 x i16> (codes 0..7,
    8..15) whose widening is what the per-element formula hw16(value * d) gives for that code (the product
    is exact in float32 and has one NaN operand at most, so its NaN is the same whatever the order)."""
    b = k.b
    d = k.broadcast(k.half_to_f32(k.load_as(base, I16, 0)), 8)
    return [_hw16_bits(k, b.fmul(lanes(V8F32, [float(c) for c in CODE_VALUES[kind][j:j + 8]]), d)) for j in (0, 8)]


def _lut_block(k: Kernel, kind: str, base: ir.Value, outp: ir.Value, o: ir.Value) -> None:
    """One block of a 4-bit kind by table look-up: the 16 fp16 values of `_code_table` split into a low-byte
    and a high-byte table that pshufb indexes with the codes; the looked-up fp16 bits widen (vcvtph2ps) to the
    float32 the per-element formula gives. Same bits as computing every element, with the conversions done
    for 16 codes instead of 32 elements."""
    b = k.b
    h = [b.bitcast(t, V16I8) for t in _code_table(k, kind, base)]
    tlo = k.shuffle(h[0], h[1], list(range(0, 32, 2)))
    thi = k.shuffle(h[0], h[1], list(range(1, 32, 2)))
    q = k.load_vec(base, V16I8, CODE_OFFSET[kind])
    for half, codes in enumerate((b.and_(q, splat(V16I8, 15)), b.lshr(q, splat(V16I8, 4)))):  # elements 0..15, 16..31
        lo = k.call("llvm.x86.ssse3.pshuf.b.128", V16I8, tlo, codes)
        hi = k.call("llvm.x86.ssse3.pshuf.b.128", V16I8, thi, codes)
        for j in (0, 8):
            bits = k.shuffle(lo, hi, [x for e in range(j, j + 8) for x in (e, 16 + e)])
            v = b.fpext(b.bitcast(bits, vec(F16, 8)), V8F32)
            k.store_vec(v, outp, b.add(o, i64(16 * half + j)))


def build() -> tuple[ir.Module, dict[str, str]]:
    module = ir.Module(name="kazeia_simd_htp")
    sigs = {}
    for name, sig in ((_round_kernel(module), "v:ppii"), (_f16_rows_kernel(module), "v:piiiipiiii"),
                      (_q8_groups_kernel(module), "v:piiiipppipii"),
                      *((_hmx_weight(module, kind), "v:piipiii") for kind in BLOCK_BYTES), *simd_hvx.kernels(module)):
        sigs[name] = sig
        chunked(module, module.globals[name], name + "_par")  # the chunked twin, for the thread pool
        sigs[name + "_par"] = sig[:-2] + "pii"
    return module, sigs
