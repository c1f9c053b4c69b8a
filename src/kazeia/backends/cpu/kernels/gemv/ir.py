"""The GEMV family's IR (see the family's __init__ for the operations and their order): `matvec_<kind>_m<m>`,
the ymm row kernels (`_emit_rows`, `_emit_rows8`), where the host has AVX-512 F and BW the zmm group kernel
(`_emit_rows16`), and the group kernel on a packed copy of the rows (`_emit_rows16_packed`, pack.py's layout, in
zmm or ymm)."""

from __future__ import annotations

from gguf import GGMLQuantizationType
from llvmlite import ir

from kazeia.backends.cpu.kernels.quantize import emit_quantize_x
from kazeia.gguf.quants import QK, block_bytes
from kazeia.native.compile import f32_lanes, host_has
from kazeia.native.idioms import codes_i16, nibbles_i16, tree8
from kazeia.native.irkit import (
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
    vec,
)

T = GGMLQuantizationType
KINDS = ("q4_0", "q4_1", "q8_0")
BLOCK_BYTES = block_bytes(KINDS)
GEMV_M = (1, 2, 3, 4)          # activation rows per kernel call (compile-time)

GEMV_ARGS = [("w", ptr(I8)), ("pk", ptr(I8)), ("wstride", I64), ("nb", I64), ("xq", ptr(I16)), ("xd", ptr(F32)),
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


def _emit_group(k: Kernel, kind: str, m: int, n: ir.Value, rows: int, read_block, prefetch) -> None:
    """y[0..m, n..n+rows]: `rows` weight rows whose per-block integer dots land in the lanes of one vector (lane r =
    row n+r): one convert and one FMA per block for all the rows, and no reduction at the end (each lane accumulates
    its row's blocks in order). `read_block(blk)` gives (codes, d_w, m_w or None) of the rows' block `blk` and
    the function computing their exact <rows x i32> block dots with one activation row's block (codes, xlo, xhi);
    `prefetch(blk)` asks for the bytes to come."""
    b, a = k.b, k.a
    vf = vec(F32, rows)
    zero = ir.Constant(vf, [0.0] * rows)
    acc = [k.var(vf, zero) for _ in range(m)]
    cm = [k.var(vf, zero) for _ in range(m)] if kind != "q8_0" else None
    xrow = b.mul(a.nb, i64(QK))
    with k.loop(0, a.nb, name="blk") as blk:
        prefetch(blk)
        codes, dw, mw, dots_of = read_block(blk)
        for mi in range(m):
            xlo, xhi, bi, dx = _x_block(k, xrow, blk, mi)
            sc = b.fmul(dw, k.broadcast(dx, rows))
            b.store(k.fma(b.sitofp(dots_of(codes, xlo, xhi), vf), sc, b.load(acc[mi])), acc[mi])
            if kind != "q8_0":
                dxs = b.fmul(dx, b.sitofp(k.load(a.xs, bi), F32))
                if kind == "q4_0":
                    dxs = b.fmul(dxs, f32(-8.0))
                b.store(k.fma(mw if kind == "q4_1" else dw, k.broadcast(dxs, rows), b.load(cm[mi])), cm[mi])
    for mi in range(m):
        s = b.load(acc[mi])
        if kind != "q8_0":
            s = b.fadd(s, b.load(cm[mi]))
        k.store_vec(s, a.y, b.add(b.mul(i64(mi), a.ystride), n))


def _emit_rows_mapped(k: Kernel, kind: str, m: int, n: ir.Value, rows: int, codes_of, dots_of) -> None:
    """`_emit_group` on the file's own rows (row n + r at w + (n + r) * wstride): `codes_of(bases)` reads the
    rows' codes of a block, their d_w (and m_w) are gathered lane by lane."""
    b, a = k.b, k.a
    bb = BLOCK_BYTES[kind]
    vf = vec(F32, rows)
    row_base = [k.gep(a.w, b.mul(b.add(n, i64(r)), a.wstride)) for r in range(rows)]
    # the next group's bytes, a group's worth per block step: the hardware prefetchers lose track of 8
    # interleaved short rows (K=576: 7 GB/s from DRAM without this). Into L2 (prefetcht1): a whole group ahead is
    # more than L1 holds for long rows (K=9728: 44 KB); ~1.5 % faster over the 36 layers (4 interleaved pairs)
    nxt = k.gep(a.w, b.mul(b.add(n, i64(rows)), a.wstride))

    def prefetch(blk):
        k.prefetch_bytes(k.gep(nxt, b.mul(blk, i64(rows * bb))), rows * bb, 2)

    def read_block(blk):
        off = b.mul(blk, i64(bb))
        bases = [k.gep(row_base[r], off) for r in range(rows)]

        def gather(byte_off):
            v = ir.Constant(vec(I16, rows), ir.Undefined)
            for r in range(rows):
                v = b.insert_element(v, k.load_as(bases[r], I16, byte_off), ir.Constant(I32, r))
            return b.fpext(b.bitcast(v, vec(ir.HalfType(), rows)), vf)
        return codes_of(bases), gather(0), gather(2) if kind == "q4_1" else None, dots_of
    _emit_group(k, kind, m, n, rows, read_block, prefetch)


def _emit_rows8(k: Kernel, kind: str, m: int, n: ir.Value) -> None:
    """y[0..m, n..n+8] in ymm: each row's block codes widened (codes_i16), two pmaddwd against the activations'
    halves, the 8 rows' pair sums transposed into one vector (tree8)."""
    b = k.b

    def dots(codes, xlo, xhi):
        return tree8(k, [b.add(k.call("llvm.x86.avx2.pmadd.wd", V8I32, lo, xlo),
                               k.call("llvm.x86.avx2.pmadd.wd", V8I32, hi, xhi)) for lo, hi in codes])
    _emit_rows_mapped(k, kind, m, n, 8, lambda bases: [codes_i16(k, kind, base) for base in bases], dots)


V16I32, V32I16 = vec(I32, 16), vec(I16, 32)
# block groups the packed kernel prefetches ahead (into L1; 3.4 KB for Q4_0). Qwen3-4B's 36 layers, 2 threads, a
# Zen 5, against a streaming read in the same process: 12 gave 88-90 % where 4 gave 81-88 % and none 81-88 %
# (the read at 44-48 GB/s); 24, 48 and 96 no better at 44-50 GB/s nor at 60-72 GB/s (67-77 % for all)
PACKED_AHEAD = 12


def zmm() -> bool:
    """Whether the kernels take zmm registers here: AVX-512 F and BW (pmaddwd on 32 int16)."""
    return f32_lanes() == 16 and host_has("avx512bw")


def _pair_codes(k: Kernel, kind: str, base_a: ir.Value, base_b: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The codes of one block of two rows a and b as two <32 x i16>: (a's elements 0..15 | b's 0..15) and
    (a's 16..31 | b's 16..31), the values `codes_i16` gives."""
    b = k.b
    if kind == "q8_0":
        def half(o):
            both = k.shuffle(k.load_vec(base_a, V16I8, o), k.load_vec(base_b, V16I8, o), list(range(32)))
            return b.sext(both, V32I16)
        return half(2), half(18)
    o = 4 if kind == "q4_1" else 2
    return nibbles_i16(k, k.shuffle(k.load_vec(base_a, V16I8, o), k.load_vec(base_b, V16I8, o), list(range(32))))


def _tree16(k: Kernel, ps: list[ir.Value]) -> ir.Value:
    """8 x <16 x i32> (ps[p]: lanes 0..7 row 2p's pair sums, 8..15 row 2p+1's) -> <16 x i32> whose lane r is row
    r's sum (integers: exact in any order). Three levels of two shuffles and an add: lanes of a row 8 -> 4 -> 2 -> 1."""
    b = k.b

    def level(vs, width):
        # each input holds 16/width rows of `width` lanes; keep the first and second half of every row's lanes
        h = width // 2
        lo = [j * width + i for j in range(2 * 16 // width) for i in range(h)]
        out = []
        for u, v in zip(vs[0::2], vs[1::2]):
            out.append(b.add(k.shuffle(u, v, lo), k.shuffle(u, v, [x + h for x in lo])))
        return out
    q = level(ps, 8)      # 4 vectors, 4 lanes a row
    r = level(q, 4)       # 2 vectors, 2 lanes a row
    return level(r, 2)[0]  # lane j: row j


def _emit_rows16(k: Kernel, kind: str, m: int, n: ir.Value) -> None:
    """y[0..m, n..n+16] in zmm, `_emit_rows8`'s operations for 16 rows (each row's block dot the same exact int32,
    then the same FMAs in block order), so every output has its bits: two rows share a zmm of codes against the
    block's activations doubled, the 16 rows' pair sums are reduced by `_tree16`. With the weights in L3 (Qwen3-4B's
    4096 x 2560 and 9728 x 2560 Q4_0 at M = 1, one thread, a Zen 5) 34-37 GB/s where the ymm groups gave 23-26;
    from DRAM 41-42 against 35-37 GB/s while a streaming read reached 64-69 GB/s, equal while it reached 44."""
    def codes(bases):
        return [_pair_codes(k, kind, bases[2 * p], bases[2 * p + 1]) for p in range(8)]
    _emit_rows_mapped(k, kind, m, n, 16, codes, _dots16(k))


def _dots16(k: Kernel):
    """(pairs, xlo, xhi) -> the 16 rows' exact block dots (<16 x i32>, lane r: row r): each pair's two zmm of
    codes against the block's activation halves doubled, the pair sums reduced by `_tree16`."""
    b = k.b

    def dots(pairs, xlo, xhi):
        x2lo, x2hi = (k.shuffle(h, h, list(range(16)) * 2) for h in (xlo, xhi))
        return _tree16(k, [b.add(k.call("llvm.x86.avx512.pmaddw.d.512", V16I32, lo, x2lo),
                                 k.call("llvm.x86.avx512.pmaddw.d.512", V16I32, hi, x2hi)) for lo, hi in pairs])
    return dots


PACK_ROWS = 16  # rows per group of the packed layout


def packed_header(kind: str) -> int:
    """Bytes before the codes in one block of a packed group: the 16 rows' d_w (fp16), and m_w for Q4_1."""
    return 4 * PACK_ROWS if kind == "q4_1" else 2 * PACK_ROWS


def packed_block(k: Kernel, kind: str, group: ir.Value, blk: ir.Value) -> ir.Value:
    """I8 pointer to block `blk` of 16-row group `group` in the kernel's packed copy `pk` (pack.py's layout)."""
    b, a = k.b, k.a
    return k.gep(a.pk, b.mul(b.add(b.mul(group, a.nb), blk), i64(PACK_ROWS * BLOCK_BYTES[kind])))


def _emit_rows16_packed(k: Kernel, kind: str, m: int, n: ir.Value, group: ir.Value) -> None:
    """y[0..m, n..n+16] from the packed copy of the rows (pack.py's layout: group `group`, its blocks in order, each
    16 * block_bytes: the rows' d_w, m_w for Q4_1, then word p of every row's codes). A row's block dot is one
    lane: pmaddwd of the 16 rows' word p (the codes of elements 2p, 2p+1 side by side) against those two
    activations broadcast, summed over the words: the same exact integer as `_emit_rows16`'s, and the same FMAs
    after it, so the same bits; with the scales read by one load, no reduction across lanes, one sequential stream.
    In ymm (AVX2) the 16 lanes are two vectors of 8 rows."""
    b = k.b
    hdr = packed_header(kind)
    vf, vh = vec(F32, 16), vec(ir.HalfType(), 16)

    def prefetch(blk):
        k.prefetch_bytes(packed_block(k, kind, group, b.add(blk, i64(PACKED_AHEAD))), PACK_ROWS * BLOCK_BYTES[kind])

    def read_block(blk):
        base = packed_block(k, kind, group, blk)
        dw = b.fpext(b.bitcast(k.load_vec(base, V16I16, 0), vh), vf)
        mw = b.fpext(b.bitcast(k.load_vec(base, V16I16, 2 * PACK_ROWS), vh), vf) if kind == "q4_1" else None
        return _packed_words(k, kind, k.gep(base, hdr)), dw, mw, _word_dots(k, kind)
    _emit_group(k, kind, m, n, 16, read_block, prefetch)


def _packed_words(k: Kernel, kind: str, words: ir.Value) -> list[list[tuple[ir.Value, int]]]:
    """The 16 rows' codes of a packed block as int16 pairs, per vector of rows (one in zmm, two in ymm): a list of
    (<2L x i16>: lane pair i = row i's codes of elements e, e+1; e) over the element pairs."""
    b = k.b
    nl = 16 if zmm() else 8
    vi8, vi16 = vec(I8, 2 * nl), vec(I16, 2 * nl)
    halves = []
    for h in range(PACK_ROWS // nl):
        pairs = []
        for p in range(16 if kind == "q8_0" else 8):
            q = k.load_vec(words, vi8, 32 * p + 2 * nl * h)
            if kind == "q8_0":
                pairs.append((b.sext(q, vi16), 2 * p))
            else:
                lo, hi = nibbles_i16(k, q)
                pairs += [(lo, 2 * p), (hi, 16 + 2 * p)]
        halves.append(pairs)
    return halves


def _word_dots(k: Kernel, kind: str):
    """(`_packed_words`' pairs, xlo, xhi) -> the 16 rows' exact block dots (<16 x i32>): each pair's pmaddwd
    against activations e, e+1 broadcast to every lane, the products summed (integers: any order is exact)."""
    b = k.b
    nl = 16 if zmm() else 8
    pmadd = "llvm.x86.avx512.pmaddw.d.512" if nl == 16 else "llvm.x86.avx2.pmadd.wd"
    vi = vec(I32, nl)

    def dots(halves, xlo, xhi):
        xw = [b.bitcast(xlo, V8I32), b.bitcast(xhi, V8I32)]  # activation pairs (e, e+1) as one int32 each

        def xpair(e):
            return b.bitcast(k.shuffle(xw[e // 16], None, [(e % 16) // 2] * nl), vec(I16, 2 * nl))
        out = []
        for pairs in halves:
            prods = [k.call(pmadd, vi, codes, xpair(e)) for codes, e in pairs]
            while len(prods) > 1:  # a balanced tree: short dependency chains
                prods = [b.add(u, v) for u, v in zip(prods[0::2], prods[1::2])] + prods[len(prods) & ~1:]
            out.append(prods[0])
        return out[0] if nl == 16 else k.shuffle(out[0], out[1], list(range(16)))
    return dots


def _gemv(module: ir.Module, kind: str, m: int) -> ir.Function:
    """gemv_<kind>_m<m>(w, pk, wstride, nb, xq, xd, xs, y, ystride, r0, r1): y[0..m, r0..r1] from quantized x;
    pk: the packed copy of the rows' whole 16-row groups (pack.py), or null. r0 is a multiple of 16."""
    k = Kernel(module, f"gemv_{kind}_m{m}", GEMV_ARGS)
    k.fn.linkage = "internal"
    b, a = k.b, k.a
    # whole groups of 16 weight rows from the packed copy where there is one, else in zmm where the host has them;
    # then groups of 8 and the rest one by one from the file's rows
    n16 = b.sdiv(b.sub(a.r1, a.r0), i64(PACK_ROWS))
    has_pack = b.icmp_unsigned("!=", b.ptrtoint(a.pk, I64), i64(0))
    with b.if_else(has_pack) as (packed, mapped):
        with packed:
            g0 = b.sdiv(a.r0, i64(PACK_ROWS))
            with k.loop(0, n16, name="pgrp16") as g:
                _emit_rows16_packed(k, kind, m, b.add(a.r0, b.mul(g, i64(16))), b.add(g0, g))
        with mapped:
            if zmm():
                with k.loop(0, n16, name="grp16") as g:
                    _emit_rows16(k, kind, m, b.add(a.r0, b.mul(g, i64(16))))
    done16 = b.mul(n16, i64(16)) if zmm() else b.select(has_pack, b.mul(n16, i64(16)), i64(0))
    r0 = b.add(a.r0, done16)
    ngroups = b.sdiv(b.sub(a.r1, r0), i64(8))
    with k.loop(0, ngroups, name="grp") as g:
        _emit_rows8(k, kind, m, b.add(r0, b.mul(g, i64(8))))
    with k.loop(b.add(r0, b.mul(ngroups, i64(8))), a.r1, name="tail") as n:
        _emit_rows(k, kind, m, 1, n)
    k.ret()
    return k.fn


DESC = 5  # int64 fields a weight's descriptor has (see _matvec)
GROUP_ARGS = [("desc", ptr(I64)), ("nw", I64), ("nb", I64), ("x", ptr(F32)), ("xstride", I64), ("y", ptr(F32)),
              ("ystride", I64), ("ctr", ptr(I64)), ("chunk", I64)]


def _matvec(module: ir.Module, kind: str, m: int, gemv: ir.Function, quantize: ir.Function) -> str:
    """matvec_<kind>_m<m>(desc, nw, nb, x, xstride, y, ystride, ctr, chunk): for each of the nw weights
    described by desc[5g..5g+5) = (address, row stride in bytes, rows n, first output column c0, address of the
    rows' packed copy or 0), y[:, c0 + r]
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
        d = [k.load(a.desc, b.add(b.mul(g, i64(DESC)), i64(j))) for j in range(DESC)]
        wp, pk = (b.inttoptr(d[j], ptr(I8)) for j in (0, 4))
        b.call(inner, [wp, pk, d[1], a.nb, xq, xd, xs, k.gep(a.y, d[3]), a.ystride, k.gep(a.ctr, g), d[2], a.chunk])
    k.ret()
    return name


def emit_matvec(module: ir.Module, kind: str, m: int) -> str:
    """matvec_<kind>_m<m>, with the activation quantizer it calls (quantize.py's IR, emitted into this library
    once: the call stays inside the object file, as the kernel is tuned for)."""
    quantize = module.globals.get("quantize_x") or emit_quantize_x(module)
    return _matvec(module, kind, m, _gemv(module, kind, m), quantize)
