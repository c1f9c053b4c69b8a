"""The HMX weight-dequant family: rows of ggml blocks -> the fp16 weight values the HMX dequant tasks write into
weight tiles, as float32: fp16(q*d) (exact float32 product, one hw rounding); Q4_1 fp16(fp16(q*d) + m) with the
sum exact in float64 and one hw rounding from there (see `_q4_1_sum`). AVX2 IR (Q4_0 / IQ4_NL looked up by vpermps
where the host has AVX-512: `_lut_block_zmm`) compiled by native/compile.py, its front `hmx_weight_rows`
(host/repack.py's RepackedWeight reads tiles through it) and its portable numba twin: the same bits
(tests/test_htp_simd.py, tests/test_htp_hmx_weight_lut.py).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from llvmlite import ir

from kazeia.backends.htp.kernels.rounding import hw16, round_f16, round_f16_f32
from kazeia.gguf.quants import IQ4_NL, QK, block_bytes
from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import Library, available, f32_lanes
from kazeia.native.idioms import (
    CODE_OFFSET,
    KIND_CODE,
    KIND_IQ4_NL,
    KIND_Q4_0,
    KIND_Q4_1,
    KIND_Q8_0,
    block_code,
    codes_i8,
)
from kazeia.native.irkit import (
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
    i64,
    lanes,
    ptr,
    splat,
    vec,
)
from kazeia.native.pool import run_rows
from kazeia.native.portable import jit, prange

GGMLType = GGMLQuantizationType
KINDS = ("q4_0", "q4_1", "q8_0", "iq4_nl")
BLOCK_BYTES = block_bytes(KINDS)
V8I16, V4F64 = vec(I16, 8), vec(F64, 4)
PARALLEL_MIN_ELEMS = 1 << 18     # outputs below this are made on one thread


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
    r = hw16(k, s32)
    mag = k.call("llvm.fabs.v8f64", vec(F64, 8), s64)
    big = b.fcmp_ordered(">", mag, ir.Constant(vec(F64, 8), [65504.0] * 8))
    bits = b.bitcast(s32, V8I32)
    inf = b.bitcast(b.or_(b.and_(bits, splat(V8I32, -0x80000000)), splat(V8I32, 0x7F800000)), V8F32)
    return b.select(big, inf, r)


def emit_hmx_weight(module: ir.Module, kind: str, name: str | None = None) -> str:
    """hmx_weight_<kind>(w, wstride, nb, out, ostride, r0, r1): out[r, 32*b + j] = the HMX fp16 weight value.
    `name`: another name for the same function (the GEMM family emits it into its own module)."""
    name = name or f"hmx_weight_{kind}"
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
                    v = hw16(k, b.fmul(p, d))  # the product is exact in float32
                    if mv is not None:
                        v = _q4_1_sum(k, v, mv)
                    k.store_vec(v, outp, b.add(o, i64(8 * j)))
    k.ret()
    return name


# the value each 4-bit code stands for in the product with d (Q4_0 q - 8, IQ4_NL the code book). Q4_1 keeps
# the per-element form: where both fp16(q*d) and m are NaN its float64 add returns one of the two NaNs, and
# which one LLVM's operand order made it differs between lanes of the compiled kernel (NaN payloads are not
# part of LLVM's semantics), so one value per code could not reproduce it.
CODE_VALUES = {"q4_0": [c - 8 for c in range(16)], "iq4_nl": list(IQ4_NL.codebook)}


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
    if f32_lanes() == 16:
        _lut_block_zmm(k, kind, base, outp, o)
        return
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


def _lut_block_zmm(k: Kernel, kind: str, base: ir.Value, outp: ir.Value, o: ir.Value) -> None:
    """`_lut_block` where the host has AVX-512: the 16 table values widened once into one zmm, each half block's
    16 codes looked up by one vpermps (a float32 table of 16 entries indexed by the codes). The same table values
    (`_code_table`), so the same bits; a third of the uops of the pshufb path."""
    b = k.b
    v16f, v16i = vec(F32, 16), vec(I32, 16)
    t = _code_table(k, kind, base)
    table = b.fpext(b.bitcast(k.shuffle(t[0], t[1], list(range(16))), vec(F16, 16)), v16f)
    q = b.zext(k.load_vec(base, V16I8, CODE_OFFSET[kind]), v16i)
    for half, codes in enumerate((b.and_(q, splat(v16i, 15)), b.lshr(q, splat(v16i, 4)))):
        v = k.call("llvm.x86.avx512.permvar.sf.512", v16f, table, codes)
        k.store_vec(v, outp, b.add(o, i64(16 * half)))


LIB = Library(__name__, "kazeia_htp_hmx")
WEIGHT = LIB.kernels("hmx_weight", emit_hmx_weight, KINDS, par=True)


# --- front -----------------------------------------------------------------------------------------------------

def hmx_weight_rows(b8: np.ndarray, b16: np.ndarray, qtype: GGMLType, out: np.ndarray, iq4: np.ndarray,
                    lut: np.ndarray) -> None:
    """out (R, nb, 32) float32 = the HMX fp16 weight values of the ggml rows b8 (R, nb, type_size) (b16: the
    same bytes as uint16)."""
    r, nb = b8.shape[0], b8.shape[1]
    kind = GGMLType(qtype).name.lower()
    if not available() or not out.flags.c_contiguous or b8.strides[2] != 1:
        hmx_weight_rows_portable(b8, b16, KIND_CODE[kind], iq4, lut, out)
        return
    args = (addr(b8), b8.strides[0], nb, addr(out), nb * 32)
    run_rows(WEIGHT[kind], args, r, 16, out.size >= PARALLEL_MIN_ELEMS)

# --- portable twin (numba) -------------------------------------------------------------------------------------

_f32, _f64, _i32 = np.float32, np.float64, np.int32
U15, U4 = np.uint8(15), np.uint8(4)


@jit(parallel=True, cache=True)
def hmx_weight_rows_portable(blocks, dbits, kind, iq4, lut, out):
    """ggml rows (R, nb, ts) -> out (R, nb, 32): fp16(q*d) (Q4_0 q-8, IQ4_NL table value, Q8_0 q), or
    fp16(fp16(q*d) + m) for Q4_1 (the products are exact in float32; the fp16 + fp16 sum is exact in float64,
    and rounded from there once)."""
    r, nb = blocks.shape[0], blocks.shape[1]
    for n in prange(r):
        for b in range(nb):
            d = lut[dbits[n, b, 0]]
            if kind == KIND_Q4_0:
                for j in range(16):
                    q = blocks[n, b, 2 + j]
                    out[n, b, j] = round_f16_f32(_f32(_i32(q & U15) - _i32(8)) * d)
                    out[n, b, 16 + j] = round_f16_f32(_f32(_i32(q >> U4) - _i32(8)) * d)
            elif kind == KIND_Q8_0:
                for j in range(32):
                    out[n, b, j] = round_f16_f32(_f32(np.int8(blocks[n, b, 2 + j])) * d)
            elif kind == KIND_IQ4_NL:
                for j in range(16):
                    q = blocks[n, b, 2 + j]
                    out[n, b, j] = round_f16_f32(_f32(iq4[q & U15]) * d)
                    out[n, b, 16 + j] = round_f16_f32(_f32(iq4[q >> U4]) * d)
            else:
                m = _f64(lut[dbits[n, b, 1]])
                for j in range(32):
                    c = block_code(blocks, n, b, j, 4, KIND_Q4_1)
                    out[n, b, j] = round_f16(_f64(round_f16_f32(_f32(c) * d)) + m)
