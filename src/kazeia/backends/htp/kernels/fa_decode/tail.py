"""Which cells fa_decode's pass computes (ir.py `emit_decode`): a decode's cache is padded past the cells any row
sees, and from the last seen one on every row's mask is -inf. `computed_cells` finds that cell and checks the tail
behind it, so the pass can leave it out with the same bits (fa_decode's docstring says when)."""

from __future__ import annotations

from llvmlite import ir

from kazeia.native.irkit import F16, F32, I16, I32, I64, V8I16, Kernel, f32, i64, ptr, splat

TAIL_CELLS = 16   # a left-out tail starts at the last seen cell rounded up to this (ops/flash_attn.py's too)
S_LIMIT = 0.99 * 65504.0  # the HMX bound on a tail's |S * scale|: fp16's largest, less a margin for float32 sums
TAIL_AHEAD = 16   # rows the scan of a masked tail prefetches ahead (8: 73 us a cold layer; 16: 68-71)


def _last_seen(k: Kernel) -> ir.Value:
    """1 + the last cell some query position's mask row does not hold at -inf (n without a mask)."""
    b, a = k.b, k.a
    last = k.var(I64, a.n, name="lastseen")
    with k.if_(b.icmp_unsigned("!=", b.ptrtoint(a.mask, I64), i64(0))):
        b.store(i64(0), last)
        mf16 = b.icmp_signed("!=", a.mf16, i64(0))
        with k.loop(0, a.t, name="mt") as t:
            mrow = k.gep(a.mask, b.mul(t, a.mst))
            with k.loop(0, a.n, name="mj") as j:
                h16 = b.zext(k.load(b.bitcast(mrow, ptr(I16)), j), I32)
                w32 = k.load(b.bitcast(mrow, ptr(I32)), j)
                bits = b.select(mf16, h16, w32)
                ninf = b.select(mf16, ir.Constant(I32, 0xFC00), ir.Constant(I32, 0xFF800000))
                with k.if_(b.icmp_unsigned("!=", bits, ninf)):
                    nxt = b.add(j, i64(1))
                    b.store(b.select(b.icmp_signed(">", nxt, b.load(last)), nxt, b.load(last)), last)
    return b.load(last)


def _tail_max_bits(k: Kernel, base: ir.Value, stride: ir.Value, j0: ir.Value, j1: ir.Value, d: ir.Value) -> ir.Value:
    """The largest |x| of the fp16 rows j0 .. j1 (d values each, `stride` bytes apart) as its bits (0x7C00 and
    above: an inf or a NaN among them): four running maxima over 32 values a step, then 8 at a time."""
    b = k.b
    zero = ir.Constant(V8I16, [0] * 8)
    mx = [k.var(V8I16, zero, name=f"tailmax{i}") for i in range(4)]
    d32 = b.mul(b.sdiv(d, i64(32)), i64(32))

    def fold(row: ir.Value, c: ir.Value, acc) -> None:
        h = b.and_(k.load_vec(k.gep(row, b.mul(c, i64(2))), V8I16, 0), splat(V8I16, 0x7FFF))
        m0 = b.load(acc)
        b.store(b.select(b.icmp_signed(">", h, m0), h, m0), acc)

    with k.loop(j0, j1, name="tj") as j:
        row = k.gep(base, b.mul(j, stride))
        ahead = k.gep(base, b.mul(b.add(j, i64(TAIL_AHEAD)), stride))  # (rows a KV row apart: pages apart)
        with k.loop(0, b.mul(d, i64(2)), 64, name="tpf") as o:
            k.prefetch(k.gep(ahead, o))
        with k.loop(0, d32, 32, name="td") as c:
            for i in range(4):
                fold(row, b.add(c, i64(8 * i)), mx[i])
        with k.loop(d32, d, 8, name="td8") as c:
            fold(row, c, mx[0])
    v = b.load(mx[0])
    for i in range(1, 4):
        w = b.load(mx[i])
        v = b.select(b.icmp_signed(">", w, v), w, v)
    out = b.extract_element(v, ir.Constant(I32, 0))
    for i in range(1, 8):
        e = b.extract_element(v, ir.Constant(I32, i))
        out = b.select(b.icmp_signed(">", e, out), e, out)
    return out


def computed_cells(k: Kernel, kb: ir.Value, vb: ir.Value, q16: ir.Value, rows: ir.Value, hmx: bool) -> ir.Value:
    """The cells the pass computes, for the KV head whose K and V rows start at kb and vb and whose `rows` query
    rows, rounded, are q16: from `_last_seen` on, every row's mask is -inf, so those cells' scores are
    -inf and their p +0 whatever K holds, as long as nothing there turns a score into NaN (a non-finite K or
    scale), a product into NaN (a non-finite V) or, under HMX, the S read-out past 65504 (bounded here by
    max_r sum_d |q16[r, d]| * max |K| * |scale| with a margin for the float32 sums): where all of this holds, the
    cells from the last seen one rounded up to 16 on are left out (their K and V are read once to check); else
    every cell is computed, as before. A decode's cache is padded past its filled cells (256 cells for 17 seen)."""
    b, a = k.b, k.a
    nc = k.var(I64, a.n, name="ncells")
    seen = _last_seen(k)
    cut = b.mul(b.sdiv(b.add(seen, i64(TAIL_CELLS - 1)), i64(TAIL_CELLS)), i64(TAIL_CELLS))
    absscale = k.call("llvm.fabs.f32", F32, a.scale)
    scale_ok = b.fcmp_ordered("<", absscale, f32(float("inf")))
    with k.if_(b.and_(b.icmp_signed("<", cut, a.n), scale_ok)):
        kmax = _tail_max_bits(k, kb, a.knb1, cut, a.n, a.d)
        vmax = _tail_max_bits(k, vb, a.vnb1, cut, a.n, a.dv)
        finite = b.and_(b.icmp_signed("<", kmax, ir.Constant(I16, 0x7C00)),
                        b.icmp_signed("<", vmax, ir.Constant(I16, 0x7C00)))
        if hmx:
            q1 = k.var(F32, f32(0.0), name="q1max")
            with k.loop(0, rows, name="q1r") as r:
                acc = k.var(F32, f32(0.0), name="q1")
                with k.loop(0, a.d, name="q1d") as c:
                    x = k.call("llvm.fabs.f32", F32, k.load(q16, b.mul(r, a.d), c))
                    b.store(b.fadd(b.load(acc), x), acc)
                m0 = b.load(q1)
                b.store(b.select(b.fcmp_ordered(">", b.load(acc), m0), b.load(acc), m0), q1)
            kabs = b.fpext(b.bitcast(kmax, F16), F32)
            bound = b.fmul(b.fmul(b.load(q1), kabs), absscale)
            finite = b.and_(finite, b.fcmp_ordered("<=", bound, f32(S_LIMIT)))
        with k.if_(finite):
            b.store(cut, nc)
    return b.load(nc)
