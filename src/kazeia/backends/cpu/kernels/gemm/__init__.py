"""The `cpu` backend's GEMM family, its prefill matmuls: IR for ymm (AVX2) or zmm (AVX-512 F and BW) compiled by
native/compile.py, and its front `gemm`. y (M, N) = x (M, K) @ W^T with W in Q4_0 / Q4_1 / Q8_0 blocks and x
quantized to int16 per 32-element block (gemv.quantize_activations: scale d_x = amax/32767). Its portable twin
(portable.py, `gemm_portable`) gives its bits where the native kernels do not run.

Per panel of 2L weight rows (L = 8 int32 lanes with ymm, 16 with zmm: `lanes`), the codes are unpacked once into
int16 k-pairs interleaved by row (for each pair of elements, one vector holds the pair of each of L rows: register
transposes of 8 rows, two of them joined for zmm), with the rows' d (and m) beside them. Then every `rows_per_tile`
rows of x run through the panel: per block, 16 steps of one broadcast pair of x per row and one pmaddwd per L
weight rows accumulate the exact int32 block dot of each output; per block these are converted and accumulated by
one FMA with d_w*d_x into float32 (Q4_1: plus m_w * d_x * sum(x_q) by a second FMA), so each output is its blocks
summed in order: the same at any thread count and either width (tests/test_isa_variants.py). pmaddwd does 2L
multiply-adds where an fp32 FMA does L, with no float copy of the weight: zmm doubles both (on a Zen 5, Qwen3-4B's
layer GEMMs at M = 128 and 2 threads: 722 GOP/s with zmm, 364 with ymm).

K runs in chunks whose int16 x fits in half of a 1 MiB L2 (`k_chunk`), each chunk over every panel of a thread's
rows, as BLIS orders its loops: without them ffn_down's x (128 rows x 9728) came from L3 once per panel. A chunk
resumes the float32 sums the earlier chunks stored in y, so the bits are those of one chunk
(tests/test_qmatmul.py); ffn_down at M = 128 went from 655-682 to 713-741 GOP/s, and from 623 to ~710 GOP/s
(36 layers' time 369 -> 322 ms) inside a pp128 of the 36-layer model.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from kazeia.backends.cpu.kernels.gemm.portable import gemm_exact_portable
from kazeia.backends.cpu.kernels.gemv import quantize_activations, run_portable, zmm
from kazeia.backends.cpu.kernels.gemv.ir import DESC, PACK_ROWS, packed_block, packed_header
from kazeia.gguf.quants import QK, block_bytes
from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import Library
from kazeia.native.idioms import nibbles_i16, transpose8
from kazeia.native.irkit import (
    F32,
    I8,
    I16,
    I32,
    I64,
    V8I32,
    V16I8,
    V16I16,
    Kernel,
    i64,
    ptr,
    splat,
    vec,
)


def lanes() -> int:
    """int32 / float32 lanes of the kernel's vectors on this host: 16 (zmm: AVX-512 F and BW, whose pmaddwd takes
    32 int16) or 8 (ymm). A panel is two vectors of weight rows. Which outputs sit side by side only: each
    output's operations and their order are the same at either width."""
    return 16 if zmm() else 8


def rows_per_tile() -> int:
    """Rows of x per micro-kernel: 3 with ymm (3 x 2 int32 + 3 x 2 float32 accumulators, 2 weights and 1 broadcast:
    15 of 16 registers), 4 with zmm (19 of 32; on a Zen 5, 722 GOP/s on Qwen3-4B's layer GEMMs at M = 128 against
    670 for 3 and 687 for 5)."""
    return 4 if lanes() == 16 else 3
KINDS = ("q4_0", "q4_1", "q8_0")
BLOCK_BYTES = block_bytes(KINDS)
GEMM_ARGS = [("w", ptr(I8)), ("pk", ptr(I8)), ("wstride", I64), ("nb", I64), ("xq", ptr(I16)), ("xd", ptr(F32)),
             ("xs", ptr(I32)), ("m", I64), ("y", ptr(F32)), ("ystride", I64), ("kc", I64), ("r0", I64), ("r1", I64)]


def _row_pairs(k: Kernel, kind: str, base: ir.Value) -> tuple[ir.Value, ir.Value]:
    """A block's codes as 16 int16 pairs (2 x <8 x i32>: element pairs 0..7 and 8..15). Q4_0: q - 8."""
    b = k.b
    if kind == "q8_0":
        lo, hi = b.sext(k.load_vec(base, V16I8, 2), V16I16), b.sext(k.load_vec(base, V16I8, 18), V16I16)
    else:
        lo, hi = nibbles_i16(k, k.load_vec(base, V16I8, 4 if kind == "q4_1" else 2))
        if kind == "q4_0":
            lo, hi = b.sub(lo, splat(V16I16, 8)), b.sub(hi, splat(V16I16, 8))
    return b.bitcast(lo, V8I32), b.bitcast(hi, V8I32)


def _pack(k: Kernel, kind: str, n0: ir.Value, nrows: ir.Value, kb0: ir.Value, nkb: ir.Value, panel, dpan,
          mpan) -> None:
    """Unpack blocks kb0 .. kb0+nkb of the panel's rows n0 .. n0+2L (rows at or past `nrows` read as zero) into
    panel[b][pair][half] (<L x i32> = the pair of L rows; L = lanes(); b counted from kb0) and dpan/mpan[b][row]
    (float32 d, m): 8 rows at a time through a register transpose, two such groups joined into one zmm. The next
    panel's bytes are prefetched on the way (a panel's micro-kernels take long enough for them to arrive)."""
    b, a = k.b, k.a
    nl = lanes()
    npanel = 2 * nl
    bb = BLOCK_BYTES[kind]
    zero = ir.Constant(V8I32, [0] * 8)
    bases = [k.gep(a.w, b.mul(b.add(n0, i64(r)), a.wstride)) for r in range(npanel)]
    live = [b.icmp_signed("<", b.add(n0, i64(r)), nrows) for r in range(npanel)]
    with k.loop(0, nkb, name="pk") as blk:
        off = b.mul(b.add(kb0, blk), i64(bb))
        for h in range(2):
            groups = []  # per 8 rows of the half: the 16 pairs, each <8 x i32> of the 8 rows
            for r0 in range(nl * h, nl * h + nl, 8):
                los, his = [], []
                for r in range(r0, r0 + 8):
                    base = k.gep(bases[r], off)
                    k.prefetch(k.gep(base, b.mul(a.wstride, i64(npanel))))
                    lo_s, hi_s = k.var(V8I32, zero), k.var(V8I32, zero)
                    d_s, m_s = k.var(F32, 0.0), k.var(F32, 0.0)
                    with k.if_(live[r]):
                        lo, hi = _row_pairs(k, kind, base)
                        b.store(lo, lo_s)
                        b.store(hi, hi_s)
                        b.store(k.half_to_f32(k.load_as(base, I16, 0)), d_s)
                        if kind == "q4_1":
                            b.store(k.half_to_f32(k.load_as(base, I16, 2)), m_s)
                    los.append(b.load(lo_s))
                    his.append(b.load(hi_s))
                    k.store(b.load(d_s), dpan, b.add(b.mul(blk, i64(npanel)), i64(r)))
                    if kind == "q4_1":
                        k.store(b.load(m_s), mpan, b.add(b.mul(blk, i64(npanel)), i64(r)))
                groups.append(transpose8(k, los) + transpose8(k, his))
            for j in range(16):
                v = groups[0][j] if nl == 8 else k.shuffle(groups[0][j], groups[1][j], list(range(16)))
                k.store(v, panel, b.add(b.mul(blk, i64(32)), i64(2 * j + h)))


def _pack_copy(k: Kernel, kind: str, n0: ir.Value, kb0: ir.Value, nkb: ir.Value, panel, dpan, mpan) -> None:
    """`_pack`'s panel from the rows' packed copy (gemv/pack.py; a whole panel of whole 16-row groups): word p of
    L rows' codes, widened, is already the panel's element pair of those rows (no transpose), and their d (m) one
    load. The same values `_pack` stores. The next panel's groups are prefetched block by block."""
    b = k.b
    nl = lanes()
    npanel = 2 * nl
    gb = PACK_ROWS * BLOCK_BYTES[kind]
    hdr = packed_header(kind)
    group = b.sdiv(n0, i64(PACK_ROWS))
    vi8, vi16, vh = vec(I8, 2 * nl), vec(I16, 2 * nl), vec(ir.HalfType(), nl)

    def at(g: int, jb: ir.Value) -> ir.Value:  # group n0/16 + g's block jb
        return packed_block(k, kind, b.add(group, i64(g)), jb)
    with k.loop(0, nkb, name="pk") as blk:
        jb = b.add(kb0, blk)
        for g in range(npanel // PACK_ROWS):
            k.prefetch_bytes(at(npanel // PACK_ROWS + g, jb), gb)
        for h in range(2):  # the panel's rows h*L .. h*L+L: group (h*L) // 16, from its row (h*L) % 16
            base = at((h * nl) // PACK_ROWS, jb)
            sub = (h * nl) % PACK_ROWS
            slot = b.add(b.mul(blk, i64(npanel)), i64(nl * h))
            k.store_vec(b.fpext(b.bitcast(k.load_vec(base, vec(I16, nl), 2 * sub), vh), vec(F32, nl)), dpan, slot)
            if kind == "q4_1":
                mw = k.load_vec(base, vec(I16, nl), 2 * PACK_ROWS + 2 * sub)
                k.store_vec(b.fpext(b.bitcast(mw, vh), vec(F32, nl)), mpan, slot)
            for p in range(16 if kind == "q8_0" else 8):
                q = k.load_vec(base, vi8, hdr + 32 * p + 2 * sub)
                if kind == "q8_0":
                    pairs = [(p, b.sext(q, vi16))]
                else:
                    lo, hi = nibbles_i16(k, q)
                    if kind == "q4_0":
                        lo, hi = b.sub(lo, splat(vi16, 8)), b.sub(hi, splat(vi16, 8))
                    pairs = [(p, lo), (8 + p, hi)]
                for j, v in pairs:
                    k.store(b.bitcast(v, vec(I32, nl)), panel, b.add(b.mul(blk, i64(32)), i64(2 * j + h)))


def _resume(k: Kernel, m0: ir.Value, mr: int, n0: ir.Value, nrows: ir.Value, kb0: ir.Value) -> list:
    """The float32 accumulators of y[m0 .. m0+mr, n0 .. n0+2L]: zero for the first chunk of blocks, else the sums
    the earlier chunks stored in y (a float32 stored and loaded back is the same value: each output is still its
    blocks summed in order by one FMA chain)."""
    b, a = k.b, k.a
    nl = lanes()
    vf = vec(F32, nl)
    facc = [[k.var(vf, ir.Constant(vf, [0.0] * nl)) for _ in range(2)] for _ in range(mr)]
    full = b.icmp_signed("<=", b.add(n0, i64(2 * nl)), nrows)
    with k.if_(b.icmp_signed(">", kb0, i64(0))):
        for i in range(mr):
            yrow = b.add(b.mul(b.add(m0, i64(i)), a.ystride), n0)
            with b.if_else(full) as (then, other):
                with then:
                    for h in range(2):
                        b.store(k.load_vec(a.y, vf, b.add(yrow, i64(nl * h))), facc[i][h])
                with other:  # the last, partial panel: only its columns before nrows exist
                    for c in range(2 * nl):
                        with k.if_(b.icmp_signed("<", b.add(n0, i64(c)), nrows)):
                            slot = facc[i][c // nl]
                            yc = k.load(a.y, b.add(yrow, i64(c)))
                            b.store(b.insert_element(b.load(slot), yc, ir.Constant(I32, c % nl)), slot)
    return facc


def _micro(k: Kernel, kind: str, m0: ir.Value, mr: int, n0: ir.Value, nrows: ir.Value, kb0: ir.Value,
           nkb: ir.Value, panel, dpan, mpan) -> None:
    """y[m0 .. m0+mr, n0 .. n0+2L] from the packed panel of blocks kb0 .. kb0+nkb, continuing the sums of the
    earlier blocks (columns at or past nrows are not stored)."""
    b, a = k.b, k.a
    nl = lanes()
    npanel = 2 * nl
    vf, vi, vw = vec(F32, nl), vec(I32, nl), vec(I16, 2 * nl)
    pmadd = "llvm.x86.avx512.pmaddw.d.512" if nl == 16 else "llvm.x86.avx2.pmadd.wd"
    zi = ir.Constant(vi, [0] * nl)
    facc = _resume(k, m0, mr, n0, nrows, kb0)
    xrow = b.mul(a.nb, i64(QK))
    with k.loop(0, nkb, name="kb") as blk:
        iacc = [[k.var(vi, zi) for _ in range(2)] for _ in range(mr)]
        xp = [b.bitcast(k.gep(a.xq, b.add(b.mul(b.add(m0, i64(i)), xrow), b.mul(b.add(kb0, blk), i64(QK)))), ptr(I32))
              for i in range(mr)]
        pbase = b.mul(blk, i64(32))
        with k.loop(0, 16, name="kp") as j:  # a runtime loop: unrolled, LLVM spills the accumulators
            ws = [b.bitcast(k.load(panel, b.add(pbase, b.add(b.mul(j, i64(2)), i64(h)))), vw) for h in range(2)]
            for i in range(mr):
                xb = b.bitcast(k.broadcast(k.load(xp[i], j), nl), vw)
                for h in range(2):
                    p = k.call(pmadd, vi, ws[h], xb)
                    b.store(b.add(b.load(iacc[i][h]), p), iacc[i][h])
        dv = [k.load_vec(dpan, vf, b.add(b.mul(blk, i64(npanel)), i64(nl * h))) for h in range(2)]
        mv = [k.load_vec(mpan, vf, b.add(b.mul(blk, i64(npanel)), i64(nl * h))) for h in range(2)] \
            if kind == "q4_1" else None
        for i in range(mr):
            bi = b.add(b.mul(b.add(m0, i64(i)), a.nb), b.add(kb0, blk))
            dxs = k.load(a.xd, bi)
            dx = k.broadcast(dxs, nl)
            if kind == "q4_1":
                sx = k.broadcast(b.fmul(dxs, b.sitofp(k.load(a.xs, bi), F32)), nl)
            for h in range(2):
                acc = k.fma(b.sitofp(b.load(iacc[i][h]), vf), b.fmul(dv[h], dx), b.load(facc[i][h]))
                if kind == "q4_1":
                    acc = k.fma(mv[h], sx, acc)
                b.store(acc, facc[i][h])
    full = b.icmp_signed("<=", b.add(n0, i64(npanel)), nrows)
    for i in range(mr):
        yrow = b.add(b.mul(b.add(m0, i64(i)), a.ystride), n0)
        vals = [b.load(facc[i][h]) for h in range(2)]
        with b.if_else(full) as (then, other):
            with then:
                for h in range(2):
                    k.store_vec(vals[h], a.y, b.add(yrow, i64(nl * h)))
            with other:  # the last, partial panel
                for c in range(npanel):
                    with k.if_(b.icmp_signed("<", b.add(n0, i64(c)), nrows)):
                        k.store(b.extract_element(vals[c // nl], ir.Constant(I32, c % nl)), a.y, b.add(yrow, i64(c)))


def _gemm(module: ir.Module, kind: str) -> str:
    """gemm_<kind>(w, pk, wstride, nb, xq, xd, xs, m, y, ystride, kc, r0, r1): y[0..m, r0..r1] (pk: the rows'
    packed copy, gemv/pack.py, or null); r0 a multiple of the panel's 2L rows (r1 = N or such a multiple: chunks
    are whole panels). K runs in chunks of kc blocks, each over every panel of r0..r1 (BLIS's order: a chunk of x
    stays in the core's L2 while the panels pass through it)."""
    name = f"gemm_{kind}"
    k = Kernel(module, name, GEMM_ARGS)
    b, a = k.b, k.a
    npanel = 2 * lanes()
    panel = b.alloca(vec(I32, lanes()), size=b.mul(a.kc, i64(32)))
    dpan = b.alloca(F32, size=b.mul(a.kc, i64(npanel)))
    mpan = b.alloca(F32, size=b.mul(a.kc, i64(npanel))) if kind == "q4_1" else None
    npanels = b.sdiv(b.add(b.sub(a.r1, a.r0), i64(npanel - 1)), i64(npanel))
    nchunks = b.sdiv(b.add(a.nb, b.sub(a.kc, i64(1))), a.kc)
    with k.loop(0, nchunks, name="kch") as kch:
        kb0 = b.mul(kch, a.kc)
        left = b.sub(a.nb, kb0)
        nkb = b.select(b.icmp_signed("<", left, a.kc), left, a.kc)
        with k.loop(0, npanels, name="pan") as p:
            n0 = b.add(a.r0, b.mul(p, i64(npanel)))
            # the rows' packed copy where there is one and the panel is whole (then its groups are too)
            packed = b.and_(b.icmp_unsigned("!=", b.ptrtoint(a.pk, I64), i64(0)),
                            b.icmp_signed("<=", b.add(n0, i64(npanel)), a.r1))
            with b.if_else(packed) as (from_pack, from_file):
                with from_pack:
                    _pack_copy(k, kind, n0, kb0, nkb, panel, dpan, mpan)
                with from_file:
                    _pack(k, kind, n0, a.r1, kb0, nkb, panel, dpan, mpan)
            mr = rows_per_tile()
            nm = b.sdiv(a.m, i64(mr))
            with k.loop(0, nm, name="mt") as mt:
                _micro(k, kind, b.mul(mt, i64(mr)), mr, n0, a.r1, kb0, nkb, panel, dpan, mpan)
            with k.loop(b.mul(nm, i64(mr)), a.m, name="mtail") as mt:
                _micro(k, kind, mt, 1, n0, a.r1, kb0, nkb, panel, dpan, mpan)
    k.ret()
    return name


SET_ARGS = [("desc", ptr(I64)), ("nw", I64), ("nb", I64), ("xq", ptr(I16)), ("xd", ptr(F32)), ("xs", ptr(I32)),
            ("m", I64), ("y", ptr(F32)), ("ystride", I64), ("kc", I64), ("ctr", ptr(I64)), ("chunk", I64)]


def _gemm_set(module: ir.Module, kind: str) -> str:
    """gemm_set_<kind>(desc, nw, nb, xq, xd, xs, m, y, ystride, kc, ctr, chunk): for each of the nw weights of
    desc (the GEMV's descriptors, gemv/ir.py `_matvec`: address, row stride, rows, first column c0, packed copy's
    address or 0), y[:, c0 + r] = x @ W^T by gemm_<kind>'s chunks claimed from the weight's own counter ctr[g]: a thread
    that finds no chunk left in one weight goes on to the next instead of waiting for the others (one call, one
    wake of the pool, for Q/K/V or gate/up)."""
    name = f"gemm_set_{kind}"
    k = Kernel(module, name, SET_ARGS)
    b, a = k.b, k.a
    par = module.globals[f"gemm_{kind}_par"]  # (declared before: Library.build adds it right after gemm_<kind>)
    with k.loop(0, a.nw, name="wt") as g:
        d = [k.load(a.desc, b.add(b.mul(g, i64(DESC)), i64(j))) for j in range(DESC)]
        w, pk = (b.inttoptr(d[j], ptr(I8)) for j in (0, 4))
        b.call(par, [w, pk, d[1], a.nb, a.xq, a.xd, a.xs, a.m, k.gep(a.y, d[3]), a.ystride, a.kc,
                     k.gep(a.ctr, g), d[2], a.chunk])
    k.ret()
    return name


LIB = Library(__name__, "kazeia_simd_gemm")
GEMM = {kind: LIB.kernel(f"gemm_{kind}", _gemm, kind, par=True) for kind in KINDS}
GEMM_SET = {kind: LIB.kernel(f"gemm_set_{kind}", _gemm_set, kind) for kind in KINDS}
# weight rows per claimed chunk of the parallel GEMM (a multiple of the 16- and 32-row panels): a panel's pack
# prefetches the next panel into its own core's caches, which helps only when that panel is the same thread's. With
# zmm's 32-row panels, 32-row chunks left every panel of a DRAM-resident weight cold: Qwen3-4B's 36 layers at M = 128
# ran at 637-660 GOP/s with 32, 684-687 with 64, 687-695 with 128, 703-705 with 256 and 646-653 with 512 (two threads
# split the 1024-row K/V weights unevenly); ymm: 342-352 with 32 or 256
CHUNK = 256


X_CHUNK_BYTES = 384 << 10  # the int16 x of a K chunk (M rows): half of a 1 MiB L2, beside the panel and y's tiles


def k_chunk(m: int, nb: int) -> int:
    """Blocks of K per chunk for M rows of x: the fewest near-equal chunks whose x fits in X_CHUNK_BYTES (chunks of
    up to 8 blocks where not even that fits)."""
    most = max(8, X_CHUNK_BYTES // (m * QK * 2))
    n = -(-nb // most)
    return -(-nb // n)


def gemm_portable(raw: np.ndarray, qtype, k: int, x: np.ndarray, out: np.ndarray) -> None:
    """out (M, N) = x @ W^T by the GEMM's numba twin (portable.py): the native GEMM's bits."""
    run_portable(gemm_exact_portable, raw, qtype, k, x, out)


def gemm(kind: str, desc: np.ndarray, k: int, x: np.ndarray, out: np.ndarray, parallel: bool) -> None:
    """out[:, c0 + r] = x @ W^T for each weight of `desc` (the GEMV's descriptors, qmatmul.WeightSet.desc), in one
    call (`parallel`: the pool's threads may join)."""
    from kazeia.native.pool import run

    m = x.shape[0]
    xq, xd, xs = quantize_activations(x)
    y = out if out.strides[1] == 4 else np.empty(out.shape, dtype=np.float32)
    ctr = np.zeros(desc.shape[0], dtype=np.int64)
    args = (addr(desc), desc.shape[0], k // QK, addr(xq), addr(xd), addr(xs), m, addr(y), y.strides[0] // 4,
            k_chunk(m, k // QK), addr(ctr), CHUNK)
    run(GEMM_SET[kind].fn, args, parallel)
    if y is not out:
        out[...] = y
