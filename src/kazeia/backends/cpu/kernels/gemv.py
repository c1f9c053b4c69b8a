"""The `cpu` backend's GEMV family: the decode matmul on the quantized bytes, and the activation quantization it
reads: AVX2 IR (compiled by native/compile.py), its front, and its portable numba twin.

GEMV (x rows quantized by quantize.py's `quantize_x` to int16 per 32-element block, one float32 scale d_x = amax/32767):
per block and weight row, the 32 codes are widened to int16 and multiplied with the activations by pmaddwd
(exact int32 pair sums in 8 lanes), converted to float32 and accumulated by one FMA with d_w*d_x into 8
float32 lanes that run over the whole row; the lanes are summed once at the end in a fixed tree
(irkit.Kernel.hsum8). Every output is computed by one call in one fixed order: bitwise the same at any
thread count. Several weight rows share each activation load (ROWS), and several activation rows (the
kernel's M) share each weight row's widened codes.

The portable twin (numba, `gemv_portable`): integer products kept in int32 explicitly (numba widens small
integers to int64 otherwise, which defeats SIMD), each block's 16 lanes independent (the float sums keep a fixed
lane order, so no fastmath is needed or used). The activations are int16 (scale amax/32767): on AVX2 the products
run in 8 x int32 lanes whether x is int8 or int16, so the finer activations cost nothing and keep the GEMV within
~1e-9 NMSE of the float product. Blocks: native/idioms.py.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from llvmlite import ir

from kazeia.backends.cpu.kernels.quantize import emit_quantize_x, quantize_activations
from kazeia.gguf.quants import QK, block_bytes
from kazeia.native.compile import Library
from kazeia.native.idioms import codes_i16, tree8
from kazeia.native.irkit import (
    F32,
    I8,
    I16,
    I32,
    I64,
    V8F32,
    V8I32,
    V16I16,
    Kernel,
    chunked,
    f32,
    i64,
    ptr,
    vec,
)
from kazeia.native.portable import jit, prange

T = GGMLQuantizationType
KINDS = ("q4_0", "q4_1", "q8_0")
BLOCK_BYTES = block_bytes(KINDS)
GEMV_M = (1, 2, 3, 4)          # activation rows per kernel call (compile-time)

GEMV_ARGS = [("w", ptr(I8)), ("wstride", I64), ("nb", I64), ("xq", ptr(I16)), ("xd", ptr(F32)),
             ("xs", ptr(I32)), ("y", ptr(F32)), ("ystride", I64), ("r0", I64), ("r1", I64)]


def _x_block(k: Kernel, xrow: ir.Value, blk: ir.Value, mi: int) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """Block `blk` of x row `mi`: its 32 int16 codes as two <16 x i16> halves, its block index, its scale d_x."""
    b, a = k.b, k.a
    xo = b.add(b.mul(i64(mi), xrow), b.mul(blk, i64(QK)))
    xlo = k.load_vec(a.xq, V16I16, xo)
    xhi = k.load_vec(a.xq, V16I16, b.add(xo, i64(16)))
    bi = b.add(b.mul(i64(mi), a.nb), blk)
    return xlo, xhi, bi, k.load(a.xd, bi)


def _emit_rows(k: Kernel, kind: str, m: int, rows: int, n: ir.Value) -> None:
    """y[0..m, n..n+rows] for weight rows n.. (a compile-time number of rows and activation rows)."""
    b, a = k.b, k.a
    bb = BLOCK_BYTES[kind]
    acc = [[k.var(V8F32, ir.Constant(V8F32, [0.0] * 8)) for _ in range(m)] for _ in range(rows)]
    # Q4_1: d_x * m_w * sum(x_q) per block; Q4_0: -8 * d_w * d_x * sum(x_q) (the codes are used unbiased)
    cm = [[k.var(F32, f32(0.0)) for _ in range(m)] for _ in range(rows)] if kind != "q8_0" else None
    row_base = [k.gep(a.w, b.mul(b.add(n, i64(r)), a.wstride)) for r in range(rows)]
    xrow = b.mul(a.nb, i64(QK))
    with k.loop(0, a.nb, name="blk") as blk:
        off = b.mul(blk, i64(bb))
        codes, dws, mws = [], [], []
        for r in range(rows):
            base = k.gep(row_base[r], off)
            codes.append(codes_i16(k, kind, base))
            dws.append(k.half_to_f32(k.load_as(base, I16, 0)))
            if kind == "q4_1":
                mws.append(k.half_to_f32(k.load_as(base, I16, 2)))
        for mi in range(m):
            xlo, xhi, bi, dx = _x_block(k, xrow, blk, mi)
            if kind != "q8_0":
                dxs = b.fmul(dx, b.sitofp(k.load(a.xs, bi), F32))
                if kind == "q4_0":
                    dxs = b.fmul(dxs, f32(-8.0))
            for r in range(rows):
                lo, hi = codes[r]
                p = b.add(k.call("llvm.x86.avx2.pmadd.wd", V8I32, lo, xlo),
                          k.call("llvm.x86.avx2.pmadd.wd", V8I32, hi, xhi))
                sc = b.fmul(dws[r], dx)
                slot = acc[r][mi]
                b.store(k.fma(b.sitofp(p, V8F32), k.broadcast(sc, 8), b.load(slot)), slot)
                if kind != "q8_0":
                    cs = cm[r][mi]
                    b.store(k.fma(mws[r] if kind == "q4_1" else dws[r], dxs, b.load(cs)), cs)
    for mi in range(m):
        for r in range(rows):
            s = k.hsum8(b.load(acc[r][mi]))
            if kind != "q8_0":
                s = b.fadd(s, b.load(cm[r][mi]))
            k.store(s, a.y, b.add(b.mul(i64(mi), a.ystride), b.add(n, i64(r))))


def _emit_rows8(k: Kernel, kind: str, m: int, n: ir.Value) -> None:
    """y[0..m, n..n+8]: 8 weight rows, whose per-block integer dots are transposed into the 8 lanes of one
    vector (lane r = row n+r): one convert and one FMA per block for all 8 rows, and no reduction at the end
    (each lane accumulates its row's blocks in order)."""
    b, a = k.b, k.a
    bb = BLOCK_BYTES[kind]
    zero = ir.Constant(V8F32, [0.0] * 8)
    acc = [k.var(V8F32, zero) for _ in range(m)]
    cm = [k.var(V8F32, zero) for _ in range(m)] if kind != "q8_0" else None
    row_base = [k.gep(a.w, b.mul(b.add(n, i64(r)), a.wstride)) for r in range(8)]
    xrow = b.mul(a.nb, i64(QK))
    v8i16 = vec(I16, 8)
    # the next 8 rows' bytes, 8 blocks' worth per block step: the hardware prefetchers lose track of 8
    # interleaved short rows (K=576: 7 GB/s from DRAM without this). Into L2 (prefetcht1): a whole group ahead is
    # more than L1 holds for long rows (K=9728: 44 KB); ~1.5 % faster over the 36 layers (4 interleaved pairs)
    nxt = k.gep(a.w, b.mul(b.add(n, i64(8)), a.wstride))
    with k.loop(0, a.nb, name="blk") as blk:
        off = b.mul(blk, i64(bb))
        pf = k.gep(nxt, b.mul(blk, i64(8 * bb)))
        for j in range(-(-8 * bb // 64)):
            k.prefetch(k.gep(pf, 64 * j), 2)
        bases = [k.gep(row_base[r], off) for r in range(8)]
        codes = [codes_i16(k, kind, base) for base in bases]

        def gather(byte_off):
            v = ir.Constant(v8i16, ir.Undefined)
            for r in range(8):
                v = b.insert_element(v, k.load_as(bases[r], I16, byte_off), ir.Constant(I32, r))
            return b.fpext(b.bitcast(v, vec(ir.HalfType(), 8)), V8F32)
        dw = gather(0)
        mw = gather(2) if kind == "q4_1" else None
        for mi in range(m):
            xlo, xhi, bi, dx = _x_block(k, xrow, blk, mi)
            ps = [b.add(k.call("llvm.x86.avx2.pmadd.wd", V8I32, lo, xlo),
                        k.call("llvm.x86.avx2.pmadd.wd", V8I32, hi, xhi)) for lo, hi in codes]
            sc = b.fmul(dw, k.broadcast(dx, 8))
            b.store(k.fma(b.sitofp(tree8(k, ps), V8F32), sc, b.load(acc[mi])), acc[mi])
            if kind != "q8_0":
                dxs = b.fmul(dx, b.sitofp(k.load(a.xs, bi), F32))
                if kind == "q4_0":
                    dxs = b.fmul(dxs, f32(-8.0))
                b.store(k.fma(mw if kind == "q4_1" else dw, k.broadcast(dxs, 8), b.load(cm[mi])), cm[mi])
    for mi in range(m):
        s = b.load(acc[mi])
        if kind != "q8_0":
            s = b.fadd(s, b.load(cm[mi]))
        k.store_vec(s, a.y, b.add(b.mul(i64(mi), a.ystride), n))


def _gemv(module: ir.Module, kind: str, m: int) -> ir.Function:
    """gemv_<kind>_m<m>(w, wstride, nb, xq, xd, xs, y, ystride, r0, r1): y[0..m, r0..r1] from quantized x."""
    k = Kernel(module, f"gemv_{kind}_m{m}", GEMV_ARGS)
    k.fn.linkage = "internal"
    b, a = k.b, k.a
    # whole groups of 8 weight rows, then the rest one by one
    ngroups = b.sdiv(b.sub(a.r1, a.r0), i64(8))
    with k.loop(0, ngroups, name="grp") as g:
        _emit_rows8(k, kind, m, b.add(a.r0, b.mul(g, i64(8))))
    with k.loop(b.add(a.r0, b.mul(ngroups, i64(8))), a.r1, name="tail") as n:
        _emit_rows(k, kind, m, 1, n)
    k.ret()
    return k.fn


GROUP_ARGS = [("desc", ptr(I64)), ("nw", I64), ("nb", I64), ("x", ptr(F32)), ("xstride", I64), ("y", ptr(F32)),
              ("ystride", I64), ("ctr", ptr(I64)), ("chunk", I64)]


def _matvec(module: ir.Module, kind: str, m: int, gemv: ir.Function, quantize: ir.Function) -> str:
    """matvec_<kind>_m<m>(desc, nw, nb, x, xstride, y, ystride, ctr, chunk): for each of the nw weights
    described by desc[4g..4g+4) = (address, row stride in bytes, rows n, first output column c0), y[:, c0 + r]
    = x @ W_g^T for its rows r < n, with x (m rows of nb*32 float32, stride xstride) and y (stride ystride).
    x is quantized on this thread's stack (each thread does it: the same codes); then each weight's rows are
    claimed in chunks of `chunk` from its counter ctr[g] (irkit.chunked's protocol) until none is left."""
    name = f"matvec_{kind}_m{m}"
    k = Kernel(module, name, GROUP_ARGS)
    b, a = k.b, k.a
    nbm = b.mul(a.nb, i64(m))
    xq = b.alloca(I16, size=b.mul(nbm, i64(QK)))
    xd = b.alloca(F32, size=nbm)
    xs = b.alloca(I32, size=nbm)
    for mi in range(m):
        bo = b.mul(a.nb, i64(mi))
        b.call(quantize, [k.gep(a.x, b.mul(a.xstride, i64(mi))), k.gep(xq, b.mul(bo, i64(QK))), k.gep(xd, bo),
                          k.gep(xs, bo), a.nb])
    inner = chunked(module, gemv, f"{name}.chunks")
    inner.linkage = "internal"
    with k.loop(0, a.nw, name="wt") as g:
        d = [k.load(a.desc, b.add(b.mul(g, i64(4)), i64(j))) for j in range(4)]
        wp = b.inttoptr(d[0], ptr(I8))
        b.call(inner, [wp, d[1], a.nb, xq, xd, xs, k.gep(a.y, d[3]), a.ystride, k.gep(a.ctr, g), d[2], a.chunk])
    k.ret()
    return name


def _emit_matvec(module: ir.Module, kind: str, m: int) -> str:
    """matvec_<kind>_m<m>, with the activation quantizer it calls (quantize.py's IR, emitted into this library
    once: the call stays inside the object file, as the kernel is tuned for)."""
    quantize = module.globals.get("quantize_x") or emit_quantize_x(module)
    return _matvec(module, kind, m, _gemv(module, kind, m), quantize)


LIB = Library(__name__, "kazeia_simd_cpu")
MATVEC = {(kind, m): LIB.kernel(f"matvec_{kind}_m{m}", _emit_matvec, kind, m) for kind in KINDS for m in GEMV_M}


# --- front -----------------------------------------------------------------------------------------------------

_F16_LUT = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)  # fp16 bits -> value


def blocks(raw: np.ndarray, qtype: T, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, row_bytes) uint8 rows -> (uint8 (N, nb, type_size), uint16 (N, nb, type_size/2)) views, no copy."""
    ts = BLOCK_BYTES[T(qtype).name.lower()]
    n = raw.shape[0]
    return raw.reshape(n, k // QK, ts), raw.view(np.uint16).reshape(n, k // QK, ts // 2)


def gemv_portable(raw: np.ndarray, qtype: T, k: int, x: np.ndarray, out: np.ndarray) -> None:
    """out (M, N) = x @ W^T by the numba twin (Q4_0 / Q4_1 / Q8_0 rows `raw`)."""
    xq, xd, xs = quantize_activations(x)
    b8, b16 = blocks(raw, qtype, k)
    y = out if out.flags.c_contiguous else np.empty(out.shape, dtype=np.float32)
    if qtype == T.Q4_0:
        gemv_q4_0_portable(b8, b16, xq, xd, y, _F16_LUT)
    elif qtype == T.Q4_1:
        gemv_q4_1_portable(b8, b16, xq, xd, xs, y, _F16_LUT)
    else:
        gemv_q8_0_portable(b8.view(np.int8), b16, xq, xd, y, _F16_LUT)
    if y is not out:
        out[...] = y


# --- portable twin (numba) -------------------------------------------------------------------------------------

_i16, _i32, _f32 = np.int16, np.int32, np.float32
U15, U4 = np.uint8(15), np.uint8(4)
ROW_CHUNK = 32


@jit(parallel=True, cache=True)
def gemv_q4_0_portable(w, d, xq, xd, y, lut):
    """y (M, N) = x @ W^T, W Q4_0 blocks w (N, nb, 18) uint8 / d (N, nb, 9) uint16; x as quantize_x gives it.
    Lane j of a block holds the exact int32 (q_j - 8) x_j + (q_j+16 - 8) x_j+16, scaled by d_w d_x in float32."""
    n_rows, nb = w.shape[0], w.shape[1]
    m_rows = xq.shape[0]
    for c in prange((n_rows + ROW_CHUNK - 1) // ROW_CHUNK):
        sc = np.empty(nb, np.float32)  # d_w * d_x per block, gathered first: the block loop vectorizes better
        acc = np.empty(16, np.float32)
        for m in range(m_rows):
            for n in range(c * ROW_CHUNK, min(n_rows, c * ROW_CHUNK + ROW_CHUNK)):
                for b in range(nb):
                    sc[b] = lut[d[n, b, 0]] * xd[m, b]
                acc[:] = 0
                for b in range(nb):
                    sb = sc[b]
                    for j in range(16):
                        q = w[n, b, 2 + j]
                        t = ((_i32(q & U15) - _i32(8)) * _i32(xq[m, b, j])
                             + (_i32(q >> U4) - _i32(8)) * _i32(xq[m, b, 16 + j]))
                        acc[j] += sb * _f32(_i32(t))
                s = _f32(0)
                for j in range(16):
                    s += acc[j]
                y[m, n] = s


@jit(parallel=True, cache=True)
def gemv_q4_1_portable(w, d, xq, xd, xs, y, lut):
    """Q4_1 blocks w (N, nb, 20) / d (N, nb, 10): value d*q + m. The lanes hold (q - 8) x exactly like Q4_0's
    (written so, LLVM vectorizes the loop; with q alone it does not), so a block adds
    d_w d_x sum((q-8) x) + (8 d_w + m_w) d_x sum(x), the second term in a loop of its own."""
    n_rows, nb = w.shape[0], w.shape[1]
    m_rows = xq.shape[0]
    for c in prange((n_rows + ROW_CHUNK - 1) // ROW_CHUNK):
        sc = np.empty(nb, np.float32)  # d_w * d_x per block, gathered first: the block loop vectorizes better
        acc = np.empty(16, np.float32)
        for m in range(m_rows):
            for n in range(c * ROW_CHUNK, min(n_rows, c * ROW_CHUNK + ROW_CHUNK)):
                for b in range(nb):
                    sc[b] = lut[d[n, b, 0]] * xd[m, b]
                acc[:] = 0
                for b in range(nb):
                    sb = sc[b]
                    for j in range(16):
                        q = w[n, b, 4 + j]
                        t = ((_i32(q & U15) - _i32(8)) * _i32(xq[m, b, j])
                             + (_i32(q >> U4) - _i32(8)) * _i32(xq[m, b, 16 + j]))
                        acc[j] += sb * _f32(_i32(t))
                cm = _f32(0)
                for b in range(nb):
                    cm += (_f32(8) * lut[d[n, b, 0]] + lut[d[n, b, 1]]) * (xd[m, b] * _f32(xs[m, b]))
                s = _f32(0)
                for j in range(16):
                    s += acc[j]
                y[m, n] = s + cm


@jit(parallel=True, cache=True)
def gemv_q8_0_portable(w, d, xq, xd, y, lut):
    """Q8_0 blocks w (N, nb, 34) int8 / d (N, nb, 17); 32 lanes (one product each)."""
    n_rows, nb = w.shape[0], w.shape[1]
    m_rows = xq.shape[0]
    for c in prange((n_rows + ROW_CHUNK - 1) // ROW_CHUNK):
        sc = np.empty(nb, np.float32)  # d_w * d_x per block, gathered first: the block loop vectorizes better
        acc = np.empty(32, np.float32)
        for m in range(m_rows):
            for n in range(c * ROW_CHUNK, min(n_rows, c * ROW_CHUNK + ROW_CHUNK)):
                for b in range(nb):
                    sc[b] = lut[d[n, b, 0]] * xd[m, b]
                acc[:] = 0
                for b in range(nb):
                    sb = sc[b]
                    for j in range(32):
                        acc[j] += sb * _f32(_i32(w[n, b, 2 + j]) * _i32(xq[m, b, j]))
                s = _f32(0)
                for j in range(32):
                    s += acc[j]
                y[m, n] = s
