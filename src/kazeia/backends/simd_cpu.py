"""AVX2 kernels of the `cpu` backend's weight matmuls, emitted as LLVM IR (irkit) and compiled by native.py.

GEMV (x rows quantized by `quantize_x` to int16 per 32-element block, one float32 scale d_x = amax/32767):
per block and weight row, the 32 codes are widened to int16 and multiplied with the activations by pmaddwd
(exact int32 pair sums in 8 lanes), converted to float32 and accumulated by one FMA with d_w*d_x into 8
float32 lanes that run over the whole row; the lanes are summed once at the end in a fixed tree
(irkit.Kernel.hsum8). Every output is computed by one call in one fixed order: bitwise the same at any
thread count. Several weight rows share each activation load (ROWS), and several activation rows (the
kernel's M) share each weight row's widened codes.

Blocks (ggml): Q4_0 = fp16 d, 16 bytes of nibbles (low nibble = element j, high = element j+16), value
d*(q-8); Q4_1 = fp16 d, fp16 m, 16 bytes, value d*q + m; Q8_0 = fp16 d, 32 int8, value d*q.
"""

from __future__ import annotations

from llvmlite import ir

from kazeia.backends.irkit import (
    F32,
    I8,
    I16,
    I32,
    I64,
    V8F32,
    V8I32,
    V16I8,
    V16I16,
    Kernel,
    chunked,
    f32,
    i64,
    ptr,
    splat,
    vec,
)

QK = 32
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}
GEMV_M = (1, 2, 3, 4)          # activation rows per kernel call (compile-time)

GEMV_ARGS = [("w", ptr(I8)), ("wstride", I64), ("nb", I64), ("xq", ptr(I16)), ("xd", ptr(F32)),
             ("xs", ptr(I32)), ("y", ptr(F32)), ("ystride", I64), ("r0", I64), ("r1", I64)]


def _codes(k: Kernel, kind: str, base: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The 32 codes of the block at `base` as two <16 x i16>: elements 0..15 and 16..31 (Q4_0: q - 8)."""
    b = k.b
    if kind == "q8_0":
        lo = b.sext(k.load_vec(base, V16I8, 2), V16I16)
        hi = b.sext(k.load_vec(base, V16I8, 18), V16I16)
        return lo, hi
    # one vpmovzxbw, then the nibbles in 16-bit lanes (opaque: LLVM would split the bytes first, 3 more ops)
    q = k.opaque(b.zext(k.load_vec(base, V16I8, 4 if kind == "q4_1" else 2), V16I16))
    return b.and_(q, splat(V16I16, 15)), b.lshr(q, splat(V16I16, 4))


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
            codes.append(_codes(k, kind, base))
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


def _tree8(k: Kernel, ps: list[ir.Value]) -> ir.Value:
    """8 x <8 x i32> -> <8 x i32> whose lane r is the sum of the lanes of ps[r] (exact: any order is)."""
    b = k.b
    hadd = lambda u, v: k.call("llvm.x86.avx2.phadd.d", V8I32, u, v)  # noqa: E731
    h01, h23, h45, h67 = hadd(ps[0], ps[1]), hadd(ps[2], ps[3]), hadd(ps[4], ps[5]), hadd(ps[6], ps[7])
    lo, hi = hadd(h01, h23), hadd(h45, h67)  # lane j: row j%4 (+4 for hi), half j//4 of its lanes
    return b.add(k.shuffle(lo, hi, [0, 1, 2, 3, 8, 9, 10, 11]), k.shuffle(lo, hi, [4, 5, 6, 7, 12, 13, 14, 15]))


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
    # interleaved short rows (K=576: 7 GB/s from DRAM without this)
    nxt = k.gep(a.w, b.mul(b.add(n, i64(8)), a.wstride))
    with k.loop(0, a.nb, name="blk") as blk:
        off = b.mul(blk, i64(bb))
        pf = k.gep(nxt, b.mul(blk, i64(8 * bb)))
        for j in range(-(-8 * bb // 64)):
            k.prefetch(k.gep(pf, 64 * j))
        bases = [k.gep(row_base[r], off) for r in range(8)]
        codes = [_codes(k, kind, base) for base in bases]

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
            b.store(k.fma(b.sitofp(_tree8(k, ps), V8F32), sc, b.load(acc[mi])), acc[mi])
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
GROUP_SIG = "v:piipipipi"


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


# --- activation quantization ------------------------------------------------------------------------------


def _quantize_x(module: ir.Module) -> ir.Function:
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


# --- tile dequantization -----------------------------------------------------------------------------------

DEQ_ARGS = [("w", ptr(I8)), ("wstride", I64), ("nb", I64), ("out", ptr(F32)), ("ostride", I64), ("r0", I64),
            ("r1", I64)]
DEQ_SIG = "v:piipiii"


def _dequant(module: ir.Module, kind: str) -> str:
    """Rows r0..r1 of blocks -> out[r, 32*b + j] float32, the exact products d*(q-8), d*q (then + m for Q4_1,
    one rounding): gguf-py's values. `nb` counts 32-element blocks (F16/BF16: elements / 32 too, with the
    tail `wstride` bytes past nb*32 elements handled by the caller)."""
    name = f"dequant_{kind}"
    k = Kernel(module, name, DEQ_ARGS)
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
                    k.store_vec(f, outp, b.add(o, i64(8 * j)))
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
                    k.store_vec(f, outp, b.add(o, i64(8 * j)))
    k.ret()
    return name


def build() -> tuple[ir.Module, dict[str, str]]:
    module = ir.Module(name="kazeia_simd_cpu")
    quantize = _quantize_x(module)
    sigs = {"quantize_x": "v:ppppi"}
    for kind in BLOCK_BYTES:
        for m in GEMV_M:
            sigs[_matvec(module, kind, m, _gemv(module, kind, m), quantize)] = GROUP_SIG
    for kind in (*BLOCK_BYTES, "f16", "bf16"):
        name = _dequant(module, kind)
        sigs[name] = DEQ_SIG
        chunked(module, module.globals[name], name + "_par")  # the chunked twin, for the thread pool
        sigs[name + "_par"] = DEQ_SIG[:-2] + "pii"
    return module, sigs
