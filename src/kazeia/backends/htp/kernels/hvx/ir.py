"""The HVX vec_dot kernels as LLVM IR (`hvx_dot_<kind>`, `hvx_pairs`); see the family's __init__ for the lane
model they share with hvx/dot.py and the portable twin."""

from __future__ import annotations

from llvmlite import ir

from kazeia.gguf.quants import QK, block_bytes
from kazeia.native.idioms import CODE_OFFSET, codes_i8, transpose8, tree8
from kazeia.native.irkit import (
    F16,
    F32,
    I8,
    I16,
    I32,
    I64,
    V8F32,
    V8I32,
    V16I8,
    V16I16,
    V32I8,
    Kernel,
    i64,
    lanes,
    ptr,
    splat,
    vec,
)

KINDS = ("q4_0", "q4_1", "q8_0", "iq4_nl")
BLOCK_BYTES = block_bytes(KINDS)
# bytes of the weight stream the chunk loop prefetches ahead (the hw prefetchers stop at pages): with 8192 rather than
# 4096, the 36-layer Qwen3-4B's HVX dots (M = 1, 2 threads, from DRAM) took 993 instead of 1110 us a layer, the mean
# of six alternating runs on a Zen 5 (each pair 5-15 % apart); 2048 was 30 % slower than 4096
PREFETCH = 8192
ROWS_SEQ = 8  # weight rows hvx_dot_seq works on at once (one accumulator lane each)
SEQ_SLICE = 64  # groups of 8 blocks whose products hvx_dot_seq makes before folding them (16 KB of stack)
NIBBLES = ("q4_0", "q4_1")  # kinds whose dot reads the image's int8 quants (the others: their int16 widening)
V8I16 = vec(I16, 8)


HVX_ARGS = [("w", ptr(I8)), ("wstride", I64), ("nb", I64), ("x16", ptr(I16)), ("xs", ptr(I32)), ("img", ptr(I8)),
            ("imgstride", I64), ("kq", I64), ("m", I64), ("y", ptr(F32)), ("ystride", I64), ("ntotal", I64),
            ("r0", I64), ("r1", I64)]


def _reduce_far(k: Kernel, acc: list[ir.Value]) -> ir.Value:
    """32 lanes (4 x <8 x float>) -> float by the far tree, v[i] += v[i+h] for h = 16, 8, 4, 2, 1
    (hvx_matmul.reduce_far), each level one vector add: the same additions in the same order."""
    b = k.b
    h8 = b.fadd(b.fadd(acc[0], acc[2]), b.fadd(acc[1], acc[3]))  # h=16 (lanes 0..7 | 8..15), then h=8
    h4 = b.fadd(k.shuffle(h8, None, [0, 1, 2, 3]), k.shuffle(h8, None, [4, 5, 6, 7]))
    h2 = b.fadd(k.shuffle(h4, None, [0, 1]), k.shuffle(h4, None, [2, 3]))
    return b.fadd(b.extract_element(h2, ir.Constant(I32, 0)), b.extract_element(h2, ir.Constant(I32, 1)))


def _reduce_adjacent(k: Kernel, acc: list[ir.Value]) -> ir.Value:
    """32 lanes -> float by the adjacent tree, v[i] += v[i+d] for d = 1, 2, 4, 8, 16 (hvx_matmul.reduce_adjacent)."""
    b = k.b
    adj = [b.extract_element(acc[i // 8], ir.Constant(I32, i % 8)) for i in range(32)]
    d = 1
    while d < 32:
        adj = [b.fadd(adj[i], adj[i + d]) if i % (2 * d) == 0 else adj[i] for i in range(32)]
        d *= 2
    return adj[0]


def _block_dot(k: Kernel, kind: str, base: ir.Value, xrow: ir.Value, blk: ir.Value) -> ir.Value:
    """<8 x i32> whose lanes add up to the integer dot of the block's 32 codes with x16[blk] (int16
    pmaddwd: every pair sum exact): Q8_0 and IQ4_NL, whose signed codes meet signed activations."""
    b = k.b
    c0, c1 = codes_i8(k, kind, base)
    lo, hi = b.sext(c0, V16I16), b.sext(c1, V16I16)
    o = b.mul(blk, i64(QK))
    return b.add(k.call("llvm.x86.avx2.pmadd.wd", V8I32, lo, k.load_vec(xrow, V16I16, o)),
                 k.call("llvm.x86.avx2.pmadd.wd", V8I32, hi, k.load_vec(xrow, V16I16, b.add(o, i64(16)))))


def _nibble_pair(k: Kernel, kind: str, base_a: ir.Value, base_b: ir.Value, xp: ir.Value) -> ir.Value:
    """Q4_0 / Q4_1: <8 x i32>, lanes 0..3 adding up to block a's integer dot of its raw nibbles 0..15 with its
    32 int8 activation quants, lanes 4..7 to block b's (Q4_0's -8 is taken off the whole sub-block dot
    afterwards, see `_group`). The two blocks' 16 code bytes share a ymm (a low, b high); its low nibbles
    meet the 32 bytes at xp (a's elements 0..15, b's 0..15), its high nibbles the 32 at xp+32 (elements
    16..31): the front lays the quants out so (`hvx_dot`). pmaddubsw (unsigned nibble x signed int8,
    |pair sum| <= 2*15*128), the two added (<= 7680) and pmaddwd by 1: exact integers throughout."""
    b = k.b
    off = CODE_OFFSET[kind]
    q = k.shuffle(k.load_vec(base_a, V16I8, off), k.load_vec(base_b, V16I8, off), list(range(32)))
    lo = b.and_(q, splat(V32I8, 15))
    hi = b.and_(b.bitcast(b.lshr(b.bitcast(q, V16I16), splat(V16I16, 4)), V32I8), splat(V32I8, 15))
    p16 = b.add(k.call("llvm.x86.avx2.pmadd.ub.sw", V16I16, lo, k.load_vec(xp, V32I8, 0)),
                k.call("llvm.x86.avx2.pmadd.ub.sw", V16I16, hi, k.load_vec(xp, V32I8, 32)))
    return k.call("llvm.x86.avx2.pmadd.wd", V8I32, p16, splat(V16I16, 1))


def _tree4(k: Kernel, ps: list[ir.Value]) -> ir.Value:
    """4 pair vectors (blocks j | j+4, see `_nibble_pair`) -> <8 x i32>, lane j = block j's sum: three phaddd
    (integers: exact in any order)."""
    hadd = lambda u, v: k.call("llvm.x86.avx2.phadd.d", V8I32, u, v)  # noqa: E731
    return hadd(hadd(ps[0], ps[1]), hadd(ps[2], ps[3]))


def _prefetch_groups(k: Kernel, kind: str, rowp: ir.Value, g: ir.Value, count: int) -> None:
    """Prefetch the weight bytes of `count` groups of 8 blocks from group g of the row at rowp, PREFETCH bytes
    ahead of them (the stream the dots read in memory order)."""
    if not PREFETCH:
        return
    b = k.b
    k.prefetch_bytes(k.gep(rowp, b.add(b.mul(g, i64(8 * BLOCK_BYTES[kind])), i64(PREFETCH))),
                     8 * count * BLOCK_BYTES[kind])


def _group(k: Kernel, kind: str, rowp: ir.Value, xrow: ir.Value, xsrow: ir.Value, x8row: ir.Value, irow: ir.Value,
           g: ir.Value, tail: bool) -> ir.Value:
    """The fp32 contributions of the 8 sub-blocks of group g (lane j = sub-block 8g+j): fp32(ia * (d_x*d_w))
    (Q4_1: + fp32(s_x*m_w), rounded first). `tail`: the group may run past nb; its blocks past nb are read at
    block nb-1 (never past the row) and their lanes masked to 0, like the DSP's masked lanes."""
    b, a = k.b, k.a
    bb = BLOCK_BYTES[kind]
    b0 = b.mul(g, i64(8))
    last = b.sub(a.nb, i64(1))
    bases, ps = [], []
    for j in range(8):
        blk = b.add(b0, i64(j))
        src = b.select(b.icmp_signed("<", blk, a.nb), blk, last) if tail else blk
        bases.append(k.gep(rowp, b.mul(src, i64(bb))))
        if kind not in NIBBLES:
            ps.append(_block_dot(k, kind, bases[j], xrow, blk))
    if kind in NIBBLES:  # pairs (j, j+4); x8row: the quants in pair order, 256 bytes a group
        xg = k.gep(x8row, b.mul(g, i64(8 * QK)))
        ia = _tree4(k, [_nibble_pair(k, kind, bases[j], bases[j + 4], k.gep(xg, 64 * j)) for j in range(4)])
    else:
        ia = tree8(k, ps)
    if kind == "q4_0":  # sum (q-8) x = sum q x - 8 sum x: integers, exact (|ia| <= 2^15)
        ia = b.sub(ia, b.shl(k.load_vec(xsrow, V8I32, b0), splat(V8I32, 3)))

    def gather(byte_off: int) -> ir.Value:
        # the 8 halves put together 4 at a time in general registers (scalar loads, shifts, ors: no vector
        # shuffle port), then 2 moves to the vector unit, instead of 8 pinsrw
        quads = []
        for q0 in (0, 4):
            w = b.zext(k.load_as(bases[q0], I16, byte_off), I64)
            for j in range(1, 4):
                w = b.or_(w, b.shl(b.zext(k.load_as(bases[q0 + j], I16, byte_off), I64), i64(16 * j)))
            quads.append(w)
        v = b.insert_element(ir.Constant(vec(I64, 2), ir.Undefined), quads[0], ir.Constant(I32, 0))
        v = b.insert_element(v, quads[1], ir.Constant(I32, 1))
        return b.fpext(b.bitcast(v, vec(F16, 8)), V8F32)
    dw = gather(0)
    if kind == "q4_1":  # (d, s) pairs: 16 halves
        pairs = b.fpext(b.bitcast(k.load_vec(irow, vec(I16, 16), b.mul(b0, i64(4))), vec(F16, 16)), vec(F32, 16))
        ad = k.shuffle(pairs, None, list(range(0, 16, 2)))
        asum = k.shuffle(pairs, None, list(range(1, 16, 2)))
    else:
        ad = b.fpext(b.bitcast(k.load_vec(irow, V8I16, b.mul(b0, i64(2))), vec(F16, 8)), V8F32)
    v = b.fmul(b.sitofp(ia, V8F32), b.fmul(ad, dw))  # d_w*d_x exact; one rounding each
    if kind == "q4_1":
        v = b.fadd(v, b.fmul(asum, gather(2)))
    if tail:
        # sub-blocks past nb are masked (their lanes do not change): their scales may be garbage
        live = b.icmp_signed("<", b.add(k.broadcast(b.trunc(b0, I32), 8), lanes(V8I32, range(8))),
                             k.broadcast(b.trunc(a.nb, I32), 8))
        v = b.select(live, v, ir.Constant(V8F32, [0.0] * 8))
    return v


def emit_pairs(module: ir.Module) -> str:
    """hvx_pairs(img, imgstride, nb, npad, xp, xs, r0, r1): for the image rows r in [r0, r1), their nb*32 int8
    quants in the pair order of `_nibble_pair` into xp (row r at r*npad*32 bytes: per group of 8 sub-blocks
    and pair j, elements 0..15 of block j, of block j+4, then 16..31 of j, of j+4; zero for blocks past nb)
    and their sums per sub-block into xs (row r at r*npad; 0 past nb)."""
    k = Kernel(module, "hvx_pairs", [("img", ptr(I8)), ("imgstride", I64), ("nb", I64), ("npad", I64),
                                     ("xp", ptr(I8)), ("xs", ptr(I32)), ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    zero = ir.Constant(V16I8, [0] * 16)
    with k.loop(a.r0, a.r1, name="row") as r:
        src = k.gep(a.img, b.mul(r, a.imgstride))
        dst = k.gep(a.xp, b.mul(r, b.mul(a.npad, i64(QK))))
        xsrow = k.gep(a.xs, b.mul(r, a.npad))
        with k.loop(0, a.npad, name="blk") as blk:
            sub = b.and_(blk, i64(7))
            pos = b.add(b.add(b.mul(b.lshr(blk, i64(3)), i64(8 * QK)), b.mul(b.and_(sub, i64(3)), i64(64))),
                        b.mul(b.lshr(sub, i64(2)), i64(16)))
            inside = b.icmp_signed("<", blk, a.nb)
            with k.if_(inside):
                lo = k.load_vec(src, V16I8, b.mul(blk, i64(QK)))
                hi = k.load_vec(src, V16I8, b.add(b.mul(blk, i64(QK)), i64(16)))
                k.store_vec(lo, dst, pos)
                k.store_vec(hi, dst, b.add(pos, i64(32)))
                wide = b.sext(k.shuffle(lo, hi, list(range(32))), vec(I32, 32))
                k.store(k.call("llvm.vector.reduce.add.v32i32", I32, wide), xsrow, blk)
            with k.if_(b.not_(inside)):
                k.store_vec(zero, dst, pos)
                k.store_vec(zero, dst, b.add(pos, i64(32)))
                k.store(ir.Constant(I32, 0), xsrow, blk)
    k.ret()
    return "hvx_pairs"


def emit_dot(module: ir.Module, kind: str) -> str:
    """hvx_dot_<kind>(w, wstride, nb, x16, xs, img, imgstride, kq, m, y, ystride, ntotal, r0, r1): y[i, n] for
    the weight rows n in [r0, r1) and the m activation rows i: x16 (m, npad*32) int16 = the image's int8 quants
    widened, zero past nb*32 (npad = nb rounded up to 8; Q4_0 / Q4_1: (m, npad*32) int8, the quants in pair
    order, see `_nibble_pair`), xs (m, npad) int32 = their sums per sub-block (used by Q4_0); the fp16 scales
    (Q4_1: (d, s) pairs) are read from the image rows (img, stride imgstride) at byte kq. The weight codes and
    scales are read from the ggml row for every activation row (for m > 1 the row is in L1 after the first).
    Groups of 8 sub-blocks go to accumulator vector g % 4: the loop takes whole chunks (4 groups) while every
    sub-block is inside the row, then up to 4 tail groups."""
    name = f"hvx_dot_{kind}"
    k = Kernel(module, name, HVX_ARGS)
    b, a = k.b, k.a
    ngroups = b.sdiv(b.add(a.nb, i64(7)), i64(8))
    npad = b.mul(ngroups, i64(8))
    nfull = b.sdiv(b.sdiv(a.nb, i64(8)), i64(4))     # chunks whose 32 sub-blocks are all in the row
    ntail = b.sub(ngroups, b.mul(nfull, i64(4)))     # 0..4 groups left
    zero8 = ir.Constant(V8F32, [0.0] * 8)
    acc = [k.var(V8F32, zero8, name=f"acc{j}") for j in range(4)]
    def row(n: ir.Value, adjacent: bool) -> None:
        rowp = k.gep(a.w, b.mul(n, a.wstride))
        with k.loop(0, a.m, name="act") as mi:
            xrow = k.gep(a.x16, b.mul(mi, b.mul(npad, i64(QK))))
            xsrow = k.gep(a.xs, b.mul(mi, npad))
            x8row = k.gep(b.bitcast(a.x16, ptr(I8)), b.mul(mi, b.mul(npad, i64(QK))))  # NIBBLES: x16 holds bytes
            irow = k.gep(a.img, b.add(b.mul(mi, a.imgstride), a.kq))
            for j in range(4):
                b.store(zero8, acc[j])
            with k.loop(0, nfull, name="chunk") as c:
                _prefetch_groups(k, kind, rowp, b.mul(c, i64(4)), 4)
                for j in range(4):
                    g = b.add(b.mul(c, i64(4)), i64(j))
                    b.store(b.fadd(b.load(acc[j]), _group(k, kind, rowp, xrow, xsrow, x8row, irow, g, False)), acc[j])
            for j in range(4):
                # a tail group whose 8 sub-blocks are all in the row (K = 2560: 2 of its 10 groups) takes the plain
                # path; the lanes the masked one would mask do not exist there, so the bits are the same
                g = b.add(b.mul(nfull, i64(4)), i64(j))
                live = b.icmp_signed(">", ntail, i64(j))
                whole = b.icmp_signed("<=", b.mul(b.add(g, i64(1)), i64(8)), a.nb)
                with k.if_(live):  # the tail's stream too (K = 2560: a fifth of every row)
                    _prefetch_groups(k, kind, rowp, g, 1)
                with k.if_(b.and_(live, whole)):
                    b.store(b.fadd(b.load(acc[j]), _group(k, kind, rowp, xrow, xsrow, x8row, irow, g, False)), acc[j])
                with k.if_(b.and_(live, b.not_(whole))):
                    b.store(b.fadd(b.load(acc[j]), _group(k, kind, rowp, xrow, xsrow, x8row, irow, g, True)), acc[j])
            vs = [b.load(x) for x in acc]
            res = _reduce_adjacent(k, vs) if adjacent else _reduce_far(k, vs)
            k.store(res, a.y, b.add(b.mul(mi, a.ystride), n))

    # the last row of an odd row count is reduced by the adjacent tree (hvx_matmul's odd tail): that row alone,
    # after the loop, so the other rows carry no branch for it
    odd_last = b.select(b.icmp_signed("==", b.srem(a.ntotal, i64(2)), i64(1)), b.sub(a.ntotal, i64(1)), i64(-1))
    in_range = b.and_(b.icmp_signed(">=", odd_last, a.r0), b.icmp_signed("<", odd_last, a.r1))
    plain_end = b.select(in_range, odd_last, a.r1)
    with k.loop(a.r0, plain_end, name="row") as n:
        row(n, False)
    with k.if_(in_range):
        row(odd_last, True)
    k.ret()
    return name


def emit_dot_seq(module: ir.Module, kind: str) -> str:
    """hvx_dot_seq_<kind>: the same arguments and per-block products as `hvx_dot_<kind>` (fp32(ia * (d_x*d_w)), Q4_1
    plus its rounded m_w*s_x), summed the way October 2026's tiled HVX kernels sum them (hvx-mm-kernels-tiled.h:
    one fp32 accumulator per output, the blocks one after the other in K order). Weight rows go ROWS_SEQ (8) at a
    time, one accumulator lane each: per group, the 8 rows' 8 block products are transposed so that vector j holds
    block 8g+j of every row, and added to the accumulator in j order: each lane sees exactly the scalar fold's
    additions in its order (8 dependent vector adds a group for 8 rows, instead of 8 scalar ones a row). Masked
    tail lanes add +0.0 (the accumulator starts at +0.0 and a round-to-nearest sum is never -0.0 from there, so
    the adds change nothing). Rows past the range are the range's last row again, computed and stored again.

    The products of SEQ_SLICE groups are made row after row into a stack buffer first, then folded group after
    group: the weight bytes are read in memory order, one stream, as May's kernel reads them (the 8 rows read side
    by side were 8 streams, ~1.5x slower at M = 1); each product is the same float32, stored and loaded back."""
    name = f"hvx_dot_seq_{kind}"
    k = Kernel(module, name, HVX_ARGS)
    b, a = k.b, k.a
    ngroups = b.sdiv(b.add(a.nb, i64(7)), i64(8))
    npad = b.mul(ngroups, i64(8))
    nfull = b.sdiv(a.nb, i64(8))  # groups whose 8 sub-blocks are all in the row
    acc = k.var(V8F32, ir.Constant(V8F32, [0.0] * 8), name="acc")
    buf = b.alloca(V8F32, size=i64(ROWS_SEQ * SEQ_SLICE), name="products")  # [row][group of the slice]

    def fold(vs: list[ir.Value]) -> None:
        s = b.load(acc)
        for col in transpose8(k, vs):  # (vector j: block 8g+j of every row)
            s = b.fadd(s, col)
        b.store(s, acc)

    with k.loop(a.r0, a.r1, step=ROWS_SEQ, name="row") as n:
        last = b.sub(a.r1, i64(1))
        ns = [n] + [b.select(b.icmp_signed("<", b.add(n, i64(j)), a.r1), b.add(n, i64(j)), last)
                    for j in range(1, ROWS_SEQ)]
        rows = [k.gep(a.w, b.mul(x, a.wstride)) for x in ns]
        with k.loop(0, a.m, name="act") as mi:
            xrow = k.gep(a.x16, b.mul(mi, b.mul(npad, i64(QK))))
            xsrow = k.gep(a.xs, b.mul(mi, npad))
            x8row = k.gep(b.bitcast(a.x16, ptr(I8)), b.mul(mi, b.mul(npad, i64(QK))))
            irow = k.gep(a.img, b.add(b.mul(mi, a.imgstride), a.kq))
            b.store(ir.Constant(V8F32, [0.0] * 8), acc)
            with k.loop(0, ngroups, step=SEQ_SLICE, name="slice") as g0:
                g1 = b.add(g0, i64(SEQ_SLICE))
                gfull = b.select(b.icmp_signed("<", g1, nfull), g1, nfull)  # whole groups of this slice end here
                for r, rowp in enumerate(rows):
                    with k.loop(g0, gfull, name=f"p{r}") as g:
                        _prefetch_groups(k, kind, rowp, g, 1)  # the row's stream, as May's chunk loop
                        v = _group(k, kind, rowp, xrow, xsrow, x8row, irow, g, False)
                        k.store_vec(v, buf, b.add(i64(r * SEQ_SLICE), b.sub(g, g0)), align=32)
                    with k.if_(b.and_(b.icmp_signed(">", ngroups, nfull), b.icmp_signed("<", nfull, g1))):
                        v = _group(k, kind, rowp, xrow, xsrow, x8row, irow, nfull, True)  # the partial group
                        k.store_vec(v, buf, b.add(i64(r * SEQ_SLICE), b.sub(nfull, g0)), align=32)
                gend = b.select(b.icmp_signed("<", g1, ngroups), g1, ngroups)
                with k.loop(g0, gend, name="fold") as g:
                    off = b.sub(g, g0)
                    fold([b.load(k.gep(buf, b.add(i64(r * SEQ_SLICE), off)), align=32) for r in range(ROWS_SEQ)])
            out = b.mul(mi, a.ystride)
            res = b.load(acc)
            for j, x in enumerate(ns):  # (past the range: the last row's value again, at its own place)
                k.store(b.extract_element(res, ir.Constant(I32, j)), a.y, b.add(out, x))
    k.ret()
    return name
