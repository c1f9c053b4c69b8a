"""The HVX activation quantizer's family (hvx/quant.py models it: fp16 rows to int8 quants with one fp16 scale per
group, laid out as q8x4x2 images): AVX2 IR (compiled by native/compile.py) and its fronts. Where the kernel does not
run or declines (no native kernels, some |x| > 65504 or NaN), the caller runs hvx/quant.py's numpy quantizer, which
is its portable form: the same bits (tests/test_htp_native_quant.py, tests/test_htp_quant_image.py).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from kazeia.backends.htp.fp16 import FP16_MAX, from_fp16_bits
from kazeia.backends.htp.kernels.rounding import hw_bits8
from kazeia.gguf.quants import QK
from kazeia.native.buffers import kept_ptr
from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import Library, available
from kazeia.native.irkit import F16, F32, I8, I16, I32, I64, V8F32, V8I32, Kernel, f32, i64, ptr, splat, vec

V8I16 = vec(I16, 8)
INV127 = 2.0 ** -7 * (1 + 8 / 1024)  # hvx/quant.INV127_F16 (0x2008), the quantizer's fp16 1/127, as a float


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
                    h = b.and_(hw_bits8(k, k.load_vec(xrow, V8F32, idx)), splat(V8I16, 0x7FFF))
                    m = b.load(amax_v)
                    b.store(b.select(b.icmp_signed(">", h, m), h, m), amax_v)
            m = b.load(amax_v)
            am = b.extract_element(m, ir.Constant(I32, 0))
            for lane in range(1, 8):
                x_l = b.extract_element(m, ir.Constant(I32, lane))
                am = b.select(b.icmp_signed(">", x_l, am), x_l, am)
            amax_f = k.half_to_f32(am)
            prod = k.broadcast(b.fmul(amax_f, inv127), 8)
            d = b.extract_element(hw_bits8(k, prod), ir.Constant(I32, 0))
            k.store(d, a.dbits, b.add(b.mul(r, ngroups), g))
            inv = k.broadcast(k.half_to_f32(k.load(a.tinv, b.zext(d, I64))), 8)
            with k.loop(0, a.group, 8, name="e2") as e:
                idx = b.add(g0, e)
                inside = b.icmp_signed("<", idx, a.k)
                with k.if_(inside):
                    xv = k.load_vec(xrow, V8F32, idx)
                    xh = b.fpext(b.bitcast(hw_bits8(k, xv), vec(F16, 8)), V8F32)  # x as fp16, exactly widened
                    _store_int8(k, hw_bits8(k, b.fmul(xh, inv)), qrow, idx)
                with k.if_(b.not_(inside)):  # padding: +0.0 quantized the same way
                    _store_int8(k, hw_bits8(k, b.fmul(ir.Constant(V8F32, [0.0] * 8), inv)), qrow, idx)
    k.ret()
    return "q8_groups"


FP16_MAX_BITS = 0x477FE000  # float32 bits of 65504.0: |x| <= 65504 iff its magnitude bits are <= these (NaN above)


def _q8x4x2_image_kernel(module: ir.Module) -> str:
    """q8x4x2_image(x, xstride, k, kp, group, tinv, ti8, img, stride, dbits, ok, r0, r1): hvx_quant's
    quantize_q8x4x2_into for the rows [r0, r1) in one call. First every |x| of those rows is checked against
    65504 (NaN fails too); if one fails, *ok = 0 and nothing is written. Else *ok = 1, q8_groups (emitted
    before, same module) stores the quants into the image rows (stride bytes apart) and the fp16 scale bits
    into dbits, and every sub-block j of the padded row (kp/32 of them) gets its group's scale bits at byte
    k + 2j of its row, over the quants, as hvx_quant places them."""
    k = Kernel(module, "q8x4x2_image", [("x", ptr(F32)), ("xstride", I64), ("k", I64), ("kp", I64), ("group", I64),
                                        ("tinv", ptr(I16)), ("ti8", ptr(I8)), ("img", ptr(I8)), ("stride", I64),
                                        ("dbits", ptr(I16)), ("ok", ptr(I64)), ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    big = k.var(V8I32, ir.Constant(V8I32, [0] * 8), name="big")
    with k.loop(a.r0, a.r1, name="crow") as r:
        xrow = k.gep(a.x, b.mul(r, a.xstride))
        with k.loop(0, a.k, 8, name="ce") as e:  # k is a multiple of 32
            mag = b.and_(b.bitcast(k.load_vec(xrow, V8F32, e), V8I32), splat(V8I32, 0x7FFFFFFF))
            m = b.load(big)
            b.store(b.select(b.icmp_signed(">", mag, m), mag, m), big)
    m = b.load(big)
    top = b.extract_element(m, ir.Constant(I32, 0))
    for lane in range(1, 8):
        v = b.extract_element(m, ir.Constant(I32, lane))
        top = b.select(b.icmp_signed(">", v, top), v, top)
    fits = b.icmp_signed("<=", top, ir.Constant(I32, FP16_MAX_BITS))
    k.store(b.zext(fits, I64), a.ok, 0)
    with k.if_(fits):
        b.call(module.globals["q8_groups"], [a.x, a.xstride, a.k, a.kp, a.group, a.tinv, a.ti8, a.img, a.stride,
                                             a.dbits, a.r0, a.r1])
        ngroups = b.sdiv(a.kp, a.group)
        with k.loop(a.r0, a.r1, name="srow") as r:
            base = k.gep(a.img, b.add(b.mul(r, a.stride), a.k))
            drow = k.gep(a.dbits, b.mul(r, ngroups))
            with k.loop(0, b.sdiv(a.kp, i64(QK)), name="sub") as j:
                d = k.load(drow, b.sdiv(b.mul(j, i64(QK)), a.group))
                b.store(d, b.bitcast(k.gep(base, b.mul(j, i64(2))), ptr(I16)), align=1)
    k.ret()
    return "q8x4x2_image"


LIB = Library(__name__, "kazeia_htp_quant")
Q8_GROUPS = LIB.kernel("q8_groups", _q8_groups_kernel)
Q8X4X2_IMAGE = LIB.kernel("q8x4x2_image", _q8x4x2_image_kernel)


# --- fronts ----------------------------------------------------------------------------------------------------

def q8_groups(x: np.ndarray, k: int, kp: int, group: int, tinv: np.ndarray,
              ti8: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """hvx_quant._quantize_groups of the rows x (M, k) float32 zero-padded to kp: (int8 quants (M, kp), fp16
    scales (M, kp/group) as float32), the same bits, from the two fp16 tables of hvx_quant (`tinv` uint16,
    `ti8` int8, both indexed by fp16 bits). None when the native kernels are missing or a value is outside
    what the kernel takes (|x| > 65504, inf or NaN): the numpy quantizer handles those."""
    m = x.shape[0]
    if not available() or m == 0:
        return None
    xc = np.ascontiguousarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        if not np.abs(xc).max() <= FP16_MAX:  # False for NaN too
            return None
    q = np.empty((m, kp), dtype=np.int8)
    d = np.empty((m, kp // group), dtype=np.uint16)
    tinv, ti8 = np.ascontiguousarray(tinv, dtype=np.uint16), np.ascontiguousarray(ti8, dtype=np.int8)
    Q8_GROUPS.fn(addr(xc), k, k, kp, group, kept_ptr(tinv), kept_ptr(ti8), addr(q), kp, addr(d), 0, m)
    return q, from_fp16_bits(d)


def q8x4x2_image(x: np.ndarray, kp: int, group: int, tinv: np.ndarray, ti8: np.ndarray, img: np.ndarray,
                 dbits: np.ndarray) -> bool:
    """hvx_quant.quantize_q8x4x2_into of the rows x (M, k) float32 over `img` (uint8 (M, stride), C-contiguous,
    stride >= kp) in one native call, quants and scale bits placed (`dbits`: uint16 (M, kp/group) scratch);
    False (img untouched) where `q8_groups` gives None: no native kernels, or some |x| > 65504 or NaN."""
    m, k = x.shape
    if not available() or m == 0 or img.shape[1] < kp or not img.flags.c_contiguous or img.dtype != np.uint8:
        return False
    xc = np.ascontiguousarray(x, dtype=np.float32)
    ok = np.zeros(1, dtype=np.int64)
    Q8X4X2_IMAGE.fn(addr(xc), k, k, kp, group, kept_ptr(tinv), kept_ptr(ti8), addr(img), img.shape[1], addr(dbits),
                    addr(ok), 0, m)
    return bool(ok[0])


class BoundQuant:
    """`q8x4x2_image` of fixed rows x (M, k) float32, C-contiguous, into a fixed image (uint8 (M, stride),
    C-contiguous, stride >= kp): the arguments worked out once; calling it reads x as it is then."""

    __slots__ = ("fn", "args", "ok", "dbits", "keep")

    def __init__(self, x: np.ndarray, kp: int, group: int, tinv: np.ndarray, ti8: np.ndarray, img: np.ndarray):
        m, k = x.shape
        if not (x.flags.c_contiguous and x.dtype == np.float32 and img.flags.c_contiguous and img.shape[1] >= kp):
            raise ValueError("BoundQuant needs C-contiguous float32 rows and an image of rows >= kp bytes")
        self.fn = Q8X4X2_IMAGE.fn
        self.ok = np.zeros(1, dtype=np.int64)
        self.dbits = np.empty((m, kp // group), dtype=np.uint16)
        self.keep = (x, tinv, ti8, img)  # the arrays whose addresses the arguments hold
        self.args = (addr(x), k, k, kp, group, addr(tinv), addr(ti8), addr(img), img.shape[1], addr(self.dbits),
                     addr(self.ok), 0, m)

    def __call__(self) -> bool:
        self.fn(*self.args)
        return self.ok[0] == 1
