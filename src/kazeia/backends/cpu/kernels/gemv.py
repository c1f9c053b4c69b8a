"""The `cpu` backend's GEMV family: the decode matmul on the quantized bytes, and the activation quantization it
reads: AVX2 IR (compiled by native/compile.py), its front, and its portable numba twin.

GEMV (x rows quantized by quantize.py's `quantize_x` to int16 per 32-element block, one float32 scale d_x = amax/32767):
per block and weight row, the 32 codes are widened to int16 and multiplied with the activations by pmaddwd
(exact int32 pair sums in 8 lanes). Weight rows in whole groups of 8 (from the weight's row 0: claimed chunks are
multiples of 8) sum those lanes to one exact int32 a block and accumulate it with d_w*d_x by one FMA a block, in
block order, each row in its own lane of one vector (_emit_rows8); the last N % 8 rows keep the 8 lanes, each
accumulated by its own FMA chain, summed at the end in a fixed tree (irkit.Kernel.hsum8). Q4_0 and Q4_1 add a
second chain (the -8 bias, or m_w, times d_x * sum(x_q)). Every output is computed by one call in one fixed
order: bitwise the same at any thread count, and whatever the host's vector width.

The portable twin (numba, `gemv_exact_portable`) runs those operations in that order, the FMAs emulated exactly
(`fma32`): its outputs are the native kernel's bits (tests/test_isa_variants.py). The activations are int16 (scale
amax/32767), which keeps the GEMV within ~1e-9 NMSE of the float product. Blocks: native/idioms.py.
"""

from __future__ import annotations

import math

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
    """out (M, N) = x @ W^T by the numba twin (Q4_0 / Q4_1 / Q8_0 rows `raw`): the native kernel's bits."""
    xq, xd, xs = quantize_activations(x)
    b8, b16 = blocks(raw, qtype, k)
    y = out if out.flags.c_contiguous else np.empty(out.shape, dtype=np.float32)
    kind = {T.Q4_0: KIND_Q4_0, T.Q4_1: KIND_Q4_1, T.Q8_0: KIND_Q8_0}[T(qtype)]
    gemv_exact_portable(b8, b16, xq, xd, xs, y, _F16_LUT, kind)
    if y is not out:
        out[...] = y


# --- portable twin (numba) -------------------------------------------------------------------------------------

_i16, _i32, _f32 = np.int16, np.int32, np.float32
U15, U4 = np.uint8(15), np.uint8(4)
ROW_CHUNK = 32


KIND_Q4_0, KIND_Q4_1, KIND_Q8_0 = 0, 1, 2
GROUP = 8  # weight rows the native kernel transposes into the lanes of one vector (_emit_rows8)


@jit(cache=True, inline="always")
def fma32(a, b, c):
    """fl32(a * b + c), rounded once, as vfmadd: the float64 product of two float32 is exact; the float64 sum is
    made round-to-odd (TwoSum's error decides the last bit), and rounding that to float32 is then the correctly
    rounded result (53 >= 24 + 2 bits)."""
    p = np.float64(a) * np.float64(b)
    cc = np.float64(c)
    s = p + cc
    bp = s - p
    e = (p - (s - bp)) + (cc - bp)
    if e != 0.0 and np.isfinite(s):
        m, ex = math.frexp(s)
        ulp = math.ldexp(1.0, ex - 53)
        if np.int64(abs(s) / ulp) % 2 == 0:  # even: the odd neighbour on e's side
            up = (e > 0.0) == (s > 0.0)      # away from zero
            step = ulp if up or abs(m) != 0.5 else ulp * 0.5
            s = s + step if e > 0.0 else s - step
    return np.float32(s)


@jit(cache=True, inline="always")
def _code(w, n, b, j, kind):
    """Element j of block b of row n as the kernel widens it: Q4 nibbles raw (0..15), Q8_0 the int8 value."""
    if kind == KIND_Q8_0:
        return np.int32(np.int8(w[n, b, 2 + j]))
    q = w[n, b, (4 if kind == KIND_Q4_1 else 2) + (j & 15)]
    return np.int32(q >> np.uint8(4)) if j >= 16 else np.int32(q & np.uint8(15))


@jit(cache=True, inline="always")
def _lane(w, xq, n, b, m, lane, kind):
    """pmaddwd(lo) + pmaddwd(hi), lane `lane`: codes 2l, 2l+1, 16+2l, 17+2l times their activations (exact)."""
    t = np.int32(0)
    for j in (2 * lane, 2 * lane + 1, 16 + 2 * lane, 17 + 2 * lane):
        t += _code(w, n, b, j, kind) * np.int32(xq[m, b, j])
    return t


@jit(parallel=True, cache=True)
def gemv_exact_portable(w, d, xq, xd, xs, y, lut, kind):
    """y (M, N) = x @ W^T in the native GEMV's operations and order (kernels above): rows in whole groups of 8
    (from row 0) take each block's exact int32 dot, then acc = fma(dot, d_w*d_x, acc) in block order; the last
    N % 8 rows keep 8 lanes (pmaddwd's pair sums, one fma chain each) summed at the end by hsum8's tree; Q4_0 and
    Q4_1 add their own chain cm = fma(d_w (Q4_0) or m_w (Q4_1), d_x*sum(x_q) (*-8 for Q4_0), cm)."""
    n_rows, nb = w.shape[0], w.shape[1]
    m_rows = xq.shape[0]
    n_grouped = n_rows - n_rows % GROUP
    for n in prange(n_rows):
        lanes = np.empty(8, np.float32)
        for m in range(m_rows):
            acc = np.float32(0)
            cm = np.float32(0)
            lanes[:] = 0
            for b in range(nb):
                dw = lut[d[n, b, 0]]
                dx = xd[m, b]
                sc = np.float32(dw * dx)
                if n < n_grouped:
                    dot = np.int32(0)
                    for lane in range(8):
                        dot += _lane(w, xq, n, b, m, lane, kind)
                    acc = fma32(np.float32(dot), sc, acc)
                else:
                    for lane in range(8):
                        lanes[lane] = fma32(np.float32(_lane(w, xq, n, b, m, lane, kind)), sc, lanes[lane])
                if kind != KIND_Q8_0:
                    dxs = np.float32(dx * np.float32(xs[m, b]))
                    if kind == KIND_Q4_0:
                        cm = fma32(dw, np.float32(dxs * np.float32(-8.0)), cm)
                    else:
                        cm = fma32(lut[d[n, b, 1]], dxs, cm)
            if n >= n_grouped:
                acc = np.float32(np.float32(np.float32(lanes[0] + lanes[4]) + np.float32(lanes[2] + lanes[6]))
                                 + np.float32(np.float32(lanes[1] + lanes[5]) + np.float32(lanes[3] + lanes[7])))
            y[m, n] = np.float32(acc + cm) if kind != KIND_Q8_0 else acc
