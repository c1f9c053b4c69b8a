"""fa_decode's kernels as LLVM IR: `fa_pairwise` (numpy's pairwise float32 sum) and `fa_decode_<hmx|hvx>` (one KV
head's pass); see the family's __init__ for what they compute and when they decline."""

from __future__ import annotations

from llvmlite import ir

from kazeia.backends.htp.kernels.expf import exp8
from kazeia.backends.htp.kernels.fa import big_or_nan, flag_any, max_update, rne16, row_max, vec_loop
from kazeia.backends.htp.kernels.fa_decode.tail import computed_cells
from kazeia.native.idioms import transpose8
from kazeia.native.irkit import (
    F16,
    F32,
    I8,
    I16,
    I32,
    I64,
    V8F16,
    V8F32,
    V8I16,
    V8I32,
    Kernel,
    f32,
    i64,
    ptr,
    splat,
    vec,
)

W = 8                     # float32 lanes of the vectors here
MR = 4                    # query rows of a register tile (S and P V)
BLOCK = 128               # KV cells of one HMX P V block (ops/flash_attn.FA_KV_BLOCK)
PW_BLOCK = 128            # numpy's PW_BLOCKSIZE
PARALLEL_MIN_MACS = 1 << 18


def _widen(k: Kernel, base: ir.Value, byte_off: ir.Value) -> ir.Value:
    """8 fp16 values at an I8 pointer + byte offset -> <8 x float> (exact; NaN lanes are declined later)."""
    h = k.load_vec(k.gep(base, byte_off), V8I16, 0)
    return k.b.fpext(k.b.bitcast(h, V8F16), V8F32)


def emit_pairwise(module: ir.Module) -> str:
    """fa_pairwise(a, n) -> float: numpy's pairwise_sum of n float32 values (init +0 added by the caller)."""
    k = Kernel(module, "fa_pairwise", [("a", ptr(F32)), ("n", I64)], ret=F32)
    b, a = k.b, k.a
    small = b.icmp_signed("<", a.n, i64(8))
    leaf = b.icmp_signed("<=", a.n, i64(PW_BLOCK))
    with b.if_then(small):
        res = k.var(F32, f32(0.0), name="res")
        with k.loop(0, a.n, name="s") as i:
            b.store(b.fadd(b.load(res), k.load(a.a, i)), res)
        k.ret(b.load(res))
    with b.if_then(leaf):
        r = k.var(V8F32, name="r")
        b.store(k.load_vec(a.a, V8F32, 0), r)
        n8 = b.sub(a.n, b.srem(a.n, i64(8)))
        with k.loop(8, n8, 8, name="v") as i:
            b.store(b.fadd(b.load(r), k.load_vec(a.a, V8F32, i)), r)
        rv = b.load(r)
        e = [b.extract_element(rv, ir.Constant(I32, j)) for j in range(8)]
        res2 = k.var(F32, b.fadd(b.fadd(b.fadd(e[0], e[1]), b.fadd(e[2], e[3])),
                                 b.fadd(b.fadd(e[4], e[5]), b.fadd(e[6], e[7]))), name="res2")
        with k.loop(n8, a.n, name="t") as i:
            b.store(b.fadd(b.load(res2), k.load(a.a, i)), res2)
        k.ret(b.load(res2))
    n2 = b.sdiv(a.n, i64(2))
    n2 = b.sub(n2, b.srem(n2, i64(8)))
    lo = b.call(k.fn, [a.a, n2])
    hi = b.call(k.fn, [k.gep(a.a, n2), b.sub(a.n, n2)])
    k.ret(b.fadd(lo, hi))
    return "fa_pairwise"


ARGS = [("prm", ptr(I64)), ("q", ptr(F32)), ("kb", ptr(I8)), ("vb", ptr(I8)), ("mask", ptr(I8)), ("ws", ptr(F32)),
        ("out", ptr(F32)), ("bad", ptr(I64)), ("h0", I64), ("h1", I64)]
# the sizes and strides, passed as one int64 array (the thread pool's mailbox takes 16 integer arguments)
PARAMS = ("qsh", "qst", "knb1", "knb2", "vnb1", "vnb2", "mst", "mf16", "t", "g", "n", "d", "dv", "scale_bits",
          "wsh", "osh", "ost")


class _Head:
    """The pointers and sizes of one KV head's pass (built inside the head loop)."""

    def __init__(self, k: Kernel, h: ir.Value) -> None:
        b, a = k.b, k.a
        self.r = b.mul(a.g, a.t)                                   # query rows of the group
        ws = k.gep(a.ws, b.mul(h, a.wsh))
        self.q16 = ws                                              # (R, d)
        self.tile = k.gep(ws, b.mul(self.r, a.d))                  # (d, 16): K^T of 16 cells
        self.vbuf = k.gep(self.tile, b.mul(a.d, i64(2 * W)))       # (BLOCK, dv): a block's V widened
        self.p = k.gep(self.vbuf, b.mul(i64(BLOCK), a.dv))         # (R, n)
        self.lsums = k.gep(self.p, b.mul(self.r, a.n))             # (R,)
        self.kb = k.gep(a.kb, b.mul(h, a.knb2))
        self.vb = k.gep(a.vb, b.mul(h, a.vnb2))
        self.h = h

    def q_row(self, k: Kernel, r: ir.Value) -> ir.Value:
        """The query row r of the group: head h*g + r // T, position r % T."""
        b, a = k.b, k.a
        hq = b.add(b.mul(self.h, a.g), b.sdiv(r, a.t))
        return k.gep(a.q, b.mul(hq, a.qsh), b.mul(b.srem(r, a.t), a.qst))

    def out_row(self, k: Kernel, r: ir.Value) -> ir.Value:
        b, a = k.b, k.a
        hq = b.add(b.mul(self.h, a.g), b.sdiv(r, a.t))
        return k.gep(a.out, b.mul(hq, a.osh), b.mul(b.srem(r, a.t), a.ost))


def _round_q(k: Kernel, hd: _Head, bad) -> None:
    """q16[r, :] = rne16(q[r, :]); bad on NaN or |q| > 65504."""
    b, a = k.b, k.a
    with k.loop(0, hd.r, name="qr") as r:
        src = hd.q_row(k, r)
        with k.loop(0, a.d, W, name="qd") as j:
            x = k.load_vec(src, V8F32, j)
            flag_any(k, bad, big_or_nan(k, x, 65504.0))
            k.store_vec(rne16(k, x), hd.q16, b.mul(r, a.d), j)


def _k_tile(k: Kernel, hd: _Head, j0: ir.Value, groups: int) -> None:
    """tile[d, c] = K[j0 + c, d] widened for c < 8 * groups: 8 x 8 blocks through a register transpose into a
    contiguous (d, 8 * groups) tile (the cache's rows are a whole KV row apart: transposing the head's K into one
    (d, n) array made every access of a column walk a stride the L1 sets alias on)."""
    b, a = k.b, k.a
    width = 8 * groups
    with k.loop(0, a.d, 8, name="kd") as d0:
        for gi in range(groups):
            cells = [b.add(j0, i64(8 * gi + r)) for r in range(8)]
            rows = [b.bitcast(_widen(k, hd.kb, b.add(b.mul(c, a.knb1), b.mul(d0, i64(2)))), V8I32) for c in cells]
            for c, v in enumerate(transpose8(k, rows)):
                k.store_vec(b.bitcast(v, V8F32), hd.tile, b.mul(b.add(d0, i64(c)), i64(width)), 8 * gi)


def _scores_product(k: Kernel, hd: _Head, nc: ir.Value) -> None:
    """p[r, j] = S[r, j] = sum_d q16[r, d] * K[j, d] for the cells j < nc, d ascending from +0 (fused: the products
    are exact): 16 cells, then 8, through a transposed tile; the last nc % 8 cells one at a time."""
    b, a = k.b, k.a

    def cells(j0: ir.Value, groups: int) -> None:
        _k_tile(k, hd, j0, groups)
        width = 8 * groups

        def tile(r0: ir.Value, mr: int) -> None:
            accs = [[k.var(V8F32, splat(V8F32, 0.0)) for _ in range(groups)] for _ in range(mr)]
            with k.loop(0, a.d, name="sd") as d:
                kv = [k.load_vec(hd.tile, V8F32, b.mul(d, i64(width)), 8 * v) for v in range(groups)]
                for i in range(mr):
                    x = k.broadcast(k.load(hd.q16, b.mul(b.add(r0, i64(i)), a.d), d), W)
                    for v in range(groups):
                        b.store(k.fma(x, kv[v], b.load(accs[i][v])), accs[i][v])
            for i in range(mr):
                for v in range(groups):
                    k.store_vec(b.load(accs[i][v]), hd.p, b.mul(b.add(r0, i64(i)), a.n), j0, 8 * v)
        vec_loop(k, hd.r, tile, MR)

    n16 = b.mul(b.sdiv(nc, i64(2 * W)), i64(2 * W))
    n8 = b.mul(b.sdiv(nc, i64(W)), i64(W))
    with k.loop(0, n16, 2 * W, name="c16") as j0:
        cells(j0, 2)
    with k.loop(n16, n8, W, name="c8") as j0:
        cells(j0, 1)
    with k.loop(n8, nc, name="c1") as j:
        with k.loop(0, hd.r, name="c1r") as r:
            acc = k.var(F32, f32(0.0), name="acc1")
            with k.loop(0, a.d, 8, name="c1d") as d0:
                kv = _widen(k, hd.kb, b.add(b.mul(j, a.knb1), b.mul(d0, i64(2))))
                for c in range(8):
                    x = k.load(hd.q16, b.mul(r, a.d), b.add(d0, i64(c)))
                    b.store(k.fma(x, b.extract_element(kv, ir.Constant(I32, c)), b.load(acc)), acc)
            k.store(b.load(acc), hd.p, b.mul(r, a.n), j)


def _softmax_row(k: Kernel, hd: _Head, r: ir.Value, bad, lsum, hmx: bool, nc: ir.Value) -> None:
    """Row r of p: the scores' pass (fa_scores) over the cells j < nc, -inf (what it gives a masked cell of the
    tail `tail.computed_cells` checked) over the rest, exp, the pairwise row sum into lsum, HMX's rne16(p)."""
    b, a = k.b, k.a
    has_mask = b.icmp_unsigned("!=", b.ptrtoint(a.mask, I64), i64(0))
    mf16 = b.icmp_signed("!=", a.mf16, i64(0))
    row = k.gep(hd.p, b.mul(r, a.n))
    mrow = k.gep(a.mask, b.mul(b.srem(r, a.t), a.mst))
    vmax = k.var(V8F32, splat(V8F32, float("-inf")), name="vmax")
    smax = k.var(F32, f32(float("-inf")), name="smax")

    def score(j: ir.Value, width: int) -> None:
        t = vec(F32, width)
        x = b.fmul(k.load_vec(row, t, j), k.broadcast(a.scale, width))
        if hmx:  # the S read-out is fp16, with the qk scale applied by the conversion
            flag_any(k, bad, big_or_nan(k, x, 65504.0))
            x = rne16(k, x)
        slot = k.var(t)
        b.store(x, slot)
        with k.if_(has_mask):  # (no mask: x as it is, not x + 0.0)
            with b.if_else(mf16) as (half, single):
                with half:
                    mh = k.load_vec(k.gep(mrow, b.mul(j, i64(2))), vec(I16, width), 0)
                    b.store(b.fadd(b.load(slot), b.fpext(b.bitcast(mh, vec(F16, width)), t)), slot)
                with single:
                    b.store(b.fadd(b.load(slot), b.load(b.bitcast(k.gep(mrow, b.mul(j, i64(4))), ptr(t)), align=1)),
                            slot)
        x = b.load(slot)
        flag_any(k, bad, b.fcmp_unordered("==", x, splat(t, float("inf"))))
        k.store_vec(x, row, j)
        max_update(k, x, vmax, smax)
    vec_loop(k, nc, score)
    with k.loop(nc, a.n, name="tailx") as j:
        k.store(f32(float("-inf")), row, j)
    m = row_max(k, vmax, smax)

    def expo(j: ir.Value, width: int) -> None:
        x = b.fsub(k.load_vec(row, vec(F32, width), j), k.broadcast(m, width))
        if width == W:
            p = exp8(k, x)
        else:
            x8 = k.broadcast(b.extract_element(x, ir.Constant(I32, 0)), W)
            p = k.shuffle(exp8(k, x8), None, [0])
        k.store_vec(p, row, j)
    vec_loop(k, a.n, expo)
    b.store(b.fadd(f32(0.0), k.call("fa_pairwise", F32, row, a.n)), lsum)  # numpy's reduce starts from +0
    if hmx:
        vec_loop(k, a.n, lambda j, width: k.store_vec(rne16(k, k.load_vec(row, vec(F32, width), j)), row, j))


def _pv(k: Kernel, hd: _Head, bad, hmx: bool, nc: ir.Value) -> None:
    """out rows = P V over blocks of BLOCK cells, each block's V rows widened into a contiguous buffer first. HMX:
    o = sum of rne16(each block's products from +0); HVX: one sum over every cell (the running sums wait in the
    out rows between blocks: the same additions in the same order), float32 products. Then / the row sums. The
    cells from nc on are left out: their p is +0 and their V finite (`tail.computed_cells`), so each of their products
    is a zero, and adding a zero changes no sum here (none is -0: every sum starts from +0)."""
    b, a = k.b, k.a
    with k.loop(0, hd.r, name="zr") as r:
        with k.loop(0, a.dv, W, name="zd") as c:
            k.store_vec(splat(V8F32, 0.0), hd.out_row(k, r), c)
    with k.loop(0, nc, BLOCK, name="pb") as j0:
        j1 = b.add(j0, i64(BLOCK))
        j1 = b.select(b.icmp_signed("<", j1, nc), j1, nc)
        with k.loop(j0, j1, name="vw") as j:
            with k.loop(0, a.dv, W, name="vd") as c:
                k.store_vec(_widen(k, hd.vb, b.add(b.mul(j, a.vnb1), b.mul(c, i64(2)))), hd.vbuf,
                            b.mul(b.sub(j, j0), a.dv), c)
        full = b.mul(b.sdiv(a.dv, i64(2 * W)), i64(2 * W))

        def tiles(nvec: int, c_start, c_stop) -> None:
            def tile(r0: ir.Value, mr: int) -> None:
                outs = [hd.out_row(k, b.add(r0, i64(i))) for i in range(mr)]
                with k.loop(c_start, c_stop, nvec * W, name="pc") as c0:
                    _pv_block(k, hd, r0, mr, outs, c0, nvec, j0, j1, hmx, bad)
            vec_loop(k, hd.r, tile, MR)
        tiles(2, i64(0), full)
        tiles(1, full, a.dv)
    with k.loop(0, hd.r, name="dr") as r:
        lv = k.load(hd.lsums, r)
        lv = b.select(b.fcmp_ordered("==", lv, f32(0.0)), f32(1.0), lv)
        orow = hd.out_row(k, r)
        with k.loop(0, a.dv, W, name="dd") as c:
            o = b.fdiv(k.load_vec(orow, V8F32, c), k.broadcast(lv, W))
            inf_or_nan = b.fsub(o, o)
            flag_any(k, bad, b.fcmp_unordered("uno", inf_or_nan, inf_or_nan))
            k.store_vec(o, orow, c)


def _pv_block(k: Kernel, hd: _Head, r0, mr: int, outs, c0, nvec: int, j0, j1, hmx: bool, bad) -> None:
    """Output columns [c0, c0 + 8 * nvec) of rows r0 .. r0 + mr - 1 over the cells [j0, j1) in vbuf."""
    b, a = k.b, k.a
    acc = [[k.var(V8F32) for _ in range(nvec)] for _ in range(mr)]
    for i in range(mr):
        for v in range(nvec):
            b.store(splat(V8F32, 0.0) if hmx else k.load_vec(outs[i], V8F32, c0, v * W), acc[i][v])
    with k.loop(j0, j1, name="pj") as j:
        vrow = b.mul(b.sub(j, j0), a.dv)
        vv = [k.load_vec(hd.vbuf, V8F32, vrow, c0, v * W) for v in range(nvec)]
        for i in range(mr):
            pj = k.broadcast(k.load(hd.p, b.mul(b.add(r0, i64(i)), a.n), j), W)
            for v in range(nvec):
                s = acc[i][v]
                if hmx:  # fp16 x fp16: exact products
                    b.store(k.fma(pj, vv[v], b.load(s)), s)
                else:
                    b.store(b.fadd(b.load(s), b.fmul(pj, vv[v])), s)
    for i in range(mr):
        for v in range(nvec):
            pv = b.load(acc[i][v])
            if hmx:  # the block's fp16 read-out, added to o
                flag_any(k, bad, big_or_nan(k, pv, 65504.0))
                pv = b.fadd(k.load_vec(outs[i], V8F32, c0, v * W), rne16(k, pv))
            k.store_vec(pv, outs[i], c0, v * W)


def emit_decode(module: ir.Module, kind: str) -> str:
    """fa_decode_<kind>(ARGS...): the module's pass for the KV heads h in [h0, h1), kind "hmx" or "hvx"; bad[h] = 1
    where it declines."""
    hmx = kind == "hmx"
    k = Kernel(module, f"fa_decode_{kind}", ARGS)
    b, a = k.b, k.a
    for i, name in enumerate(PARAMS):
        setattr(a, name, k.load(a.prm, i))
    a.scale = b.bitcast(b.trunc(a.scale_bits, I32), F32)
    with k.loop(a.h0, a.h1, name="h") as h:
        bad = k.var(I64, i64(0), name="badh")
        hd = _Head(k, h)
        _round_q(k, hd, bad)
        nc = computed_cells(k, hd.kb, hd.vb, hd.q16, hd.r, hmx)  # the KV head's K, V, its rounded Q rows
        _scores_product(k, hd, nc)
        with k.loop(0, hd.r, name="sr") as r:
            _softmax_row(k, hd, r, bad, k.gep(hd.lsums, r), hmx, nc)
        _pv(k, hd, bad, hmx, nc)
        k.store(b.load(bad), a.bad, h)
    k.ret()
    return f"fa_decode_{kind}"
