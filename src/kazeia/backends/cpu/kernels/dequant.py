"""The `cpu` backend's dequantization family: rows of ggml blocks (and F16 / BF16) to float32, the exact values
gguf-py gives; AVX2 IR (compiled by native/compile.py), its front `dequantize_rows` (the tiles of the prefill
GEMMs BLAS multiplies, GET_ROWS of a quantized embedding) and its portable numba twin. Blocks: native/idioms.py.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from llvmlite import ir

from kazeia.gguf.quants import QK, block_bytes, dequantize
from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import Library, available
from kazeia.native.idioms import q4_k_scale_min, q6_k_code
from kazeia.native.irkit import F32, F64, I8, I16, I64, V8F32, V8I32, V16I8, Kernel, i64, ptr, splat, vec
from kazeia.native.pool import run
from kazeia.native.portable import jit, prange
from kazeia.native.threads import threads

T = GGMLQuantizationType
KINDS = ("q4_0", "q4_1", "q8_0")
BLOCK_BYTES = block_bytes(KINDS)
NATIVE = {T.Q4_0: "q4_0", T.Q4_1: "q4_1", T.Q8_0: "q8_0", T.F16: "f16", T.BF16: "bf16"}
PARALLEL_MIN_BYTES = 1 << 20  # rows below this are dequantized on one thread (a hand-off costs ~10-30 us)

def _args(out: ir.Type) -> list:
    return [("w", ptr(I8)), ("wstride", I64), ("nb", I64), ("out", ptr(out)), ("ostride", I64), ("r0", I64),
            ("r1", I64)]


DEQ_ARGS = _args(F32)
EXACT_F64 = ("q4_0", "q8_0", "f16")  # kinds whose float32 values widen to the float64 ones (REF's weights)


def _dequant(module: ir.Module, kind: str, f64: bool = False) -> str:
    """Rows r0..r1 of blocks -> out[r, 32*b + j] float32, the exact products d*(q-8), d*q (then + m for Q4_1,
    one rounding): gguf-py's values. `nb` counts 32-element blocks (F16/BF16: elements / 32 too, with the
    tail `wstride` bytes past nb*32 elements handled by the caller). `f64`: the same values widened to float64
    as they are stored (REF's exact weights, EXACT_F64 kinds: no float32 copy to widen afterwards)."""
    name = f"dequant_{kind}" + ("_f64" if f64 else "")
    k = Kernel(module, name, _args(F64 if f64 else F32))
    widen = (lambda v: k.b.fpext(v, vec(F64, 8))) if f64 else (lambda v: v)
    b, a = k.b, k.a
    with k.loop(a.r0, a.r1, name="row") as r:
        rowp = k.gep(a.w, b.mul(r, a.wstride))
        outp = k.gep(a.out, b.mul(r, a.ostride))
        with k.loop(0, a.nb, name="blk") as blk:
            o = b.mul(blk, i64(QK))
            if kind in ("f16", "bf16"):
                src = k.gep(rowp, b.mul(blk, i64(2 * QK)))
                for j in range(4):
                    h = k.load_vec(src, vec(I16, 8), 16 * j)
                    if kind == "f16":
                        f = b.fpext(b.bitcast(h, vec(ir.HalfType(), 8)), V8F32)
                    else:
                        f = b.bitcast(b.shl(b.zext(h, V8I32), splat(V8I32, 16)), V8F32)
                    k.store_vec(widen(f), outp, b.add(o, i64(8 * j)))
            else:
                base = k.gep(rowp, b.mul(blk, i64(BLOCK_BYTES[kind])))
                d = k.broadcast(k.half_to_f32(k.load_as(base, I16, 0)), 8)
                if kind == "q8_0":
                    parts = [b.sext(k.load_vec(base, vec(I8, 8), 2 + 8 * j), V8I32) for j in range(4)]
                else:
                    q = k.load_vec(base, V16I8, 4 if kind == "q4_1" else 2)
                    lo = b.and_(q, splat(V16I8, 15))
                    hi = b.lshr(q, splat(V16I8, 4))
                    if kind == "q4_0":
                        lo, hi = b.sub(lo, splat(V16I8, 8)), b.sub(hi, splat(V16I8, 8))
                    ext = b.sext if kind == "q4_0" else b.zext
                    parts = []
                    for h in (lo, hi):
                        parts.append(ext(k.shuffle(h, None, list(range(8))), V8I32))
                        parts.append(ext(k.shuffle(h, None, list(range(8, 16))), V8I32))
                mv = k.broadcast(k.half_to_f32(k.load_as(base, I16, 2)), 8) if kind == "q4_1" else None
                for j, p in enumerate(parts):
                    f = b.fmul(b.sitofp(p, V8F32), d)
                    if mv is not None:
                        f = b.fadd(f, mv)
                    k.store_vec(widen(f), outp, b.add(o, i64(8 * j)))
    k.ret()
    return name


LIB = Library(__name__, "kazeia_simd_dequant")
DEQUANT = {kind: LIB.kernel(f"dequant_{kind}", _dequant, kind, par=True) for kind in (*KINDS, "f16", "bf16")}
DEQUANT_F64 = {kind: LIB.kernel(f"dequant_{kind}_f64", _dequant, kind, True, par=True) for kind in EXACT_F64}


# --- front -----------------------------------------------------------------------------------------------------

_F16_LUT = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)  # fp16 bits -> value


def dequantize_rows_f64(raw: np.ndarray, qtype: T, k: int) -> np.ndarray:
    """Rows (R, row_bytes) of an EXACT_F64 type -> float64 (R, K): the float32 values, widened (exact: an fp16
    scale times a small code), written once by the native kernel when it runs, else widened from float32."""
    name = NATIVE.get(qtype)
    if not (available() and name in EXACT_F64 and k % QK == 0 and raw.strides[1] == 1):
        return dequantize_rows(raw, qtype, k).astype(np.float64)
    dst = np.empty((raw.shape[0], k), dtype=np.float64)
    _native_rows(DEQUANT_F64[name], raw, dst, k)
    return dst


def _native_rows(kernel, raw: np.ndarray, dst: np.ndarray, k: int) -> None:
    """Rows of `raw` into `dst` by a native dequantization kernel, on the pool's threads when they are worth it."""
    r = raw.shape[0]
    args = (addr(raw), raw.strides[0], k // QK, addr(dst), k)
    if raw.nbytes >= PARALLEL_MIN_BYTES and threads() > 1:
        run(kernel.par, (*args, addr(np.zeros(1, dtype=np.int64)), r, max(8, r // 16)))
    else:
        kernel.fn(*args, 0, r)


def dequantize_rows(raw: np.ndarray, qtype: T, k: int, scratch: np.ndarray | None = None) -> np.ndarray:
    """Rows (R, row_bytes) -> float32 (R, K), the values `gguf.quants.dequantize` gives (bitwise)."""
    r = raw.shape[0]
    dst = scratch[:r] if scratch is not None else np.empty((r, k), dtype=np.float32)
    name = NATIVE.get(qtype)
    if available() and name is not None and k % QK == 0 and raw.strides[1] == 1 and dst.flags.c_contiguous:
        _native_rows(DEQUANT[name], raw, dst, k)
    elif qtype in (T.Q4_0, T.Q4_1, T.Q8_0):
        ts = BLOCK_BYTES[NATIVE[qtype]]
        b8, b16 = raw.reshape(r, k // QK, ts), raw.view(np.uint16).reshape(r, k // QK, ts // 2)
        d3 = dst.reshape(r, k // QK, QK)
        if qtype == T.Q4_0:
            dequant_q4_0_portable(b8, b16, d3, _F16_LUT)
        elif qtype == T.Q4_1:
            dequant_q4_1_portable(b8, b16, d3, _F16_LUT)
        else:
            dequant_q8_0_portable(b8.view(np.int8), b16, d3, _F16_LUT)
    elif qtype == T.F16:
        np.copyto(dst, raw.view(np.float16))
    elif qtype in (T.Q4_K, T.Q6_K) and k % 256 == 0 and dst.flags.c_contiguous:
        blocks = np.ascontiguousarray(raw).reshape(r, k // 256, -1)
        kernel = dequant_q4_k_portable if qtype == T.Q4_K else dequant_q6_k_portable
        kernel(blocks, dst.reshape(r, k // 256, 256), _F16_LUT)
    else:
        dst[...] = dequantize(raw, qtype, np.float32)
    return dst


# --- portable twin (numba) -------------------------------------------------------------------------------------

_i16, _f32 = np.int16, np.float32
U15, U4 = np.uint8(15), np.uint8(4)


@jit(parallel=True, cache=True)
def dequant_q4_0_portable(w, d, out, lut):
    """Q4_0 rows -> out (R, nb, 32) float32 = d * (q - 8) (exact products: gguf-py's values). Two rows per
    iteration; an odd last row is done once more by itself."""
    r, nb = w.shape[0], w.shape[1]
    for p in prange(r // 2):
        n = 2 * p
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            d1 = lut[d[n + 1, b, 0]]
            for j in range(16):
                q0 = w[n, b, 2 + j]
                q1 = w[n + 1, b, 2 + j]
                out[n, b, j] = d0 * _f32(_i16(q0 & U15) - _i16(8))
                out[n, b, 16 + j] = d0 * _f32(_i16(q0 >> U4) - _i16(8))
                out[n + 1, b, j] = d1 * _f32(_i16(q1 & U15) - _i16(8))
                out[n + 1, b, 16 + j] = d1 * _f32(_i16(q1 >> U4) - _i16(8))
    if r % 2:
        n = r - 1
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            for j in range(16):
                q0 = w[n, b, 2 + j]
                out[n, b, j] = d0 * _f32(_i16(q0 & U15) - _i16(8))
                out[n, b, 16 + j] = d0 * _f32(_i16(q0 >> U4) - _i16(8))


@jit(parallel=True, cache=True)
def dequant_q4_1_portable(w, d, out, lut):
    """Q4_1 rows -> d * q + m (one float32 product, exact, then one rounded add: gguf-py's values)."""
    r, nb = w.shape[0], w.shape[1]
    for p in prange(r // 2):
        n = 2 * p
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            m0 = lut[d[n, b, 1]]
            d1 = lut[d[n + 1, b, 0]]
            m1 = lut[d[n + 1, b, 1]]
            for j in range(16):
                q0 = w[n, b, 4 + j]
                q1 = w[n + 1, b, 4 + j]
                out[n, b, j] = d0 * _f32(_i16(q0 & U15)) + m0
                out[n, b, 16 + j] = d0 * _f32(_i16(q0 >> U4)) + m0
                out[n + 1, b, j] = d1 * _f32(_i16(q1 & U15)) + m1
                out[n + 1, b, 16 + j] = d1 * _f32(_i16(q1 >> U4)) + m1
    if r % 2:
        n = r - 1
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            m0 = lut[d[n, b, 1]]
            for j in range(16):
                q0 = w[n, b, 4 + j]
                out[n, b, j] = d0 * _f32(_i16(q0 & U15)) + m0
                out[n, b, 16 + j] = d0 * _f32(_i16(q0 >> U4)) + m0


@jit(parallel=True, cache=True)
def dequant_q8_0_portable(w, d, out, lut):
    """Q8_0 rows (int8 view) -> d * q."""
    r, nb = w.shape[0], w.shape[1]
    for p in prange(r // 2):
        n = 2 * p
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            d1 = lut[d[n + 1, b, 0]]
            for j in range(32):
                out[n, b, j] = d0 * _f32(w[n, b, 2 + j])
                out[n + 1, b, j] = d1 * _f32(w[n + 1, b, 2 + j])
    if r % 2:
        n = r - 1
        for b in range(nb):
            d0 = lut[d[n, b, 0]]
            for j in range(32):
                out[n, b, j] = d0 * _f32(w[n, b, 2 + j])


@jit(parallel=True, cache=True)
def dequant_q4_k_portable(w, out, lut):
    """Q4_K rows (R, nsb, 144) -> out (R, nsb, 256) float32 = (d*sc)*q - (dmin*m) per 32-element sub-block, each
    product and the difference rounded once, in gguf-py's order (get_scale_min_k4's six-bit sc, m)."""
    r, nsb = w.shape[0], w.shape[1]
    for n in prange(r):
        for s in range(nsb):
            d = lut[np.int32(w[n, s, 0]) | (np.int32(w[n, s, 1]) << 8)]
            dmin = lut[np.int32(w[n, s, 2]) | (np.int32(w[n, s, 3]) << 8)]
            for j in range(8):
                sc, m = q4_k_scale_min(w, n, s, j)
                ds = _f32(d * _f32(sc))
                dm = _f32(dmin * _f32(m))
                c = 16 + (j >> 1) * 32
                for e in range(32):
                    q = w[n, s, c + e] >> U4 if j & 1 else w[n, s, c + e] & U15
                    out[n, s, 32 * j + e] = _f32(ds * _f32(q)) - dm


@jit(parallel=True, cache=True)
def dequant_q6_k_portable(w, out, lut):
    """Q6_K rows (R, nsb, 210) -> out (R, nsb, 256) float32 = (d*sc)*(q - 32) per 16 elements, gguf-py's order."""
    r, nsb = w.shape[0], w.shape[1]
    for n in prange(r):
        for s in range(nsb):
            d = lut[np.int32(w[n, s, 208]) | (np.int32(w[n, s, 209]) << 8)]
            for h in range(2):
                for j in range(4):
                    for lane in range(32):
                        e = h * 128 + j * 32 + lane
                        sc = _f32(np.int8(w[n, s, 192 + e // 16]))
                        out[n, s, e] = _f32(d * sc) * _f32(q6_k_code(w, n, s, h, j, lane) - 32)
