"""The HMX MUL_MAT in an order kazeia owns (`hmx_gemm_*`, the weight dequantized into the kernel's own blocks). No
BLAS: the bits are the same on every host, at any thread count, vector width, tiling or BLAS build
(docs/hmx-numerics.md). The device model's other products (flash attention's, the gated delta net's) follow the
same rule with float32 operands: backends/ordered.py.

The one rule, for every output (m, n):

    y[m, n] = fl(... fl(fl(+0 + a[m, 0] * w[n, 0]) + a[m, 1] * w[n, 1]) ... + a[m, K-1] * w[n, K-1])

in float32, k ascending, one accumulator per output, every product rounded to float32 before it is added. For the
HMX operands (fp16 values) every product is exact in float32 (11 + 11 significant bits < 24; 65504^2 < 2^32 and
2^-24 * 2^-24 is a normal float32), so a fused multiply-add gives the same bits as the multiply then the add:
the native kernels use FMA, the portable twin a multiply and an add.

What varies with the host is only which outputs a vector lane, a register tile or a thread computes at a time:
lanes run over m, the K blocks continue each output's one accumulator in memory, and a thread computes whole
weight rows.

NaN: an output that is NaN is stored as the one quiet NaN 0x7FC00000 (what a NaN's payload would be after a
product is not defined by LLVM, and x86 and numba disagree on the default NaN's sign).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from kazeia.backends.htp.kernels.hmx import KINDS, emit_hmx_weight
from kazeia.backends.htp.kernels.rounding import widen_f16
from kazeia.gguf.quants import QK, block_bytes
from kazeia.native.buffers import GrowingScratch
from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import Library, available, f32_lanes
from kazeia.native.idioms import transpose8
from kazeia.native.irkit import F32, I8, I16, I32, I64, Kernel, i64, ptr, splat, vec
from kazeia.native.pool import run_rows
from kazeia.native.portable import jit, prange

PANEL = 32             # activation rows per packed panel: [mpad/32][K][32], one HMX tile of rows
KC = 512              # K per block: a panel's block (64 KB) stays in L2, a micro-tile's rows (12-16 KB) in L1
SUB_TILES = 8          # micro-tiles of weight rows claimed by a thread at a time
SOURCES = ("f32", "f16") + KINDS   # float32 rows (given), F16 rows, ggml blocks
BLOCK_BYTES = {"f16": 2 * QK, **block_bytes(KINDS)}
CANONICAL_NAN = np.uint32(0x7FC00000).view(np.float32)
PARALLEL_MIN_MACS = 1 << 22
PARALLEL_MIN_PACK = 1 << 16  # activation elements from which the panels are packed on every thread


def _tiling() -> tuple[int, int, int]:
    """(float lanes a vector, m lanes a micro-tile, weight rows a micro-tile) for this host's registers: 16
    zmm-wide lanes x 2 x 8 rows with AVX-512 (16 accumulators of 32), else 8 x 2 x 6 (12 of 16 ymm). With zmm,
    8 rows ran at 79-80 % of the FMA peak on a Zen 5 (bench/bench_hmx_gemm.py, one and two threads) where 12 rows
    (24 accumulators, more broadcast streams per k) ran at 66-69 %; only which outputs a tile holds changes."""
    vl = f32_lanes()
    return vl, 2 * vl, 8 if vl == 16 else 6


def _sub_rows() -> int:
    """Weight rows claimed by a thread at a time (SUB_TILES micro-tiles): 64 with AVX-512 (48 rows ran at 74-75 %
    of the peak there, 64 at 78-79 %), 48 else."""
    return SUB_TILES * _tiling()[2]


# --- HMX MUL_MAT: lanes over m ------------------------------------------------------------------------------

def _emit_f16_rows(module: ir.Module, name: str) -> None:
    """name(w, wstride, nb, out, ostride, r0, r1): F16 weight rows widened exactly (numpy's NaN payloads)."""
    k = Kernel(module, name, [("w", ptr(I8)), ("wstride", I64), ("nb", I64), ("out", ptr(F32)), ("ostride", I64),
                              ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    k.fn.linkage = "internal"
    with k.loop(a.r0, a.r1, name="row") as r:
        src = b.bitcast(k.gep(a.w, b.mul(r, a.wstride)), ptr(I16))
        dst = k.gep(a.out, b.mul(r, a.ostride))
        with k.loop(0, b.mul(a.nb, i64(QK)), 8, name="e") as e:
            k.store_vec(widen_f16(k, k.load_vec(src, vec(I16, 8), e)), dst, e)
    k.ret()


def _micro(k: Kernel, vt: ir.VectorType, nv: int, rows: list, apan: ir.Value, kc: ir.Value, cps: list,
           first: ir.Value, last: ir.Value) -> None:
    """One register tile: len(rows) weight rows x nv*lanes activation rows over kc k's, continuing the
    accumulators held in ct (from +0 on the first K block; NaN made canonical on the last)."""
    b, vl = k.b, vt.count
    zero = splat(vt, 0.0)
    nan = b.bitcast(k.broadcast(ir.Constant(I32, 0x7FC00000), vl), vt)
    accs = []
    for cp in cps:
        for v in range(nv):
            slot = k.var(vt)
            b.store(b.select(first, zero, k.load_vec(cp, vt, v * vl)), slot)
            accs.append(slot)
    with k.loop(0, kc, name="kk") as kk:
        at = b.mul(kk, i64(PANEL))
        av = [k.load_vec(apan, vt, at, v * vl) for v in range(nv)]
        for j, rp in enumerate(rows):
            w = k.broadcast(k.load(rp, kk), vl)
            for v in range(nv):
                s = accs[j * nv + v]
                b.store(k.fma(av[v], w, b.load(s)), s)
    for j, cp in enumerate(cps):
        for v in range(nv):
            acc = b.load(accs[j * nv + v])
            canon = b.select(b.fcmp_unordered("uno", acc, acc), nan, acc)
            k.store_vec(b.select(last, canon, acc), cp, v * vl)


def _hmx_gemm(module: ir.Module, src: str) -> None:
    """hmx_gemm_<src>(ap, mpad, k, w, wstride, ct, r0, r1): ct[n, m] = sum_k a[m, k] * w[n, k] for the weight rows
    n in [r0, r1) and every m < mpad, in the one order (module doc). ap: the activation panels [mpad/32][k][32];
    w: the weight rows (wstride bytes apart) as float32, F16 or ggml blocks, dequantized here a micro-tile's rows
    x KC at a time into a stack buffer, just before the tile runs over the panels (it is then read from L1; with a
    whole claim's 64 rows dequantized first, the buffer was 128 KB); ct: (N, mpad) float32."""
    vl, lanes, nr = _tiling()
    vt, nv, sub = vec(F32, vl), lanes // vl, _sub_rows()
    k = Kernel(module, f"hmx_gemm_{src}", [("ap", ptr(F32)), ("mpad", I64), ("k", I64), ("w", ptr(I8)),
                                           ("wstride", I64), ("ct", ptr(F32)), ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    deq = None
    if src != "f32":
        deq_name = f"hmx_gemm_deq_{src}"
        if src == "f16":
            _emit_f16_rows(module, deq_name)
        else:
            emit_hmx_weight(module, src, deq_name)
        deq = module.globals[deq_name]
        deq.linkage = "internal"
        tmp = b.bitcast(k.var(ir.ArrayType(F32, nr * KC)), ptr(F32))
    with k.loop(a.r0, a.r1, sub, name="s") as s0:
        s1 = b.add(s0, i64(sub))
        s1 = b.select(b.icmp_signed("<", s1, a.r1), s1, a.r1)
        with k.loop(0, a.k, KC, name="kb") as k0:
            rest = b.sub(a.k, k0)
            kc = b.select(b.icmp_signed("<", rest, i64(KC)), rest, i64(KC))
            first = b.icmp_signed("==", k0, i64(0))
            last = b.icmp_signed("<=", rest, i64(KC))
            if deq is not None:
                wblocks = k.gep(a.w, b.mul(b.sdiv(k0, i64(QK)), i64(BLOCK_BYTES[src])))
                wst = i64(KC)
            else:
                wbase = b.bitcast(k.gep(a.w, b.add(b.mul(s0, a.wstride), b.mul(k0, i64(4)))), ptr(F32))
                wst = b.sdiv(a.wstride, i64(4))
            apanels = k.gep(a.ap, b.mul(k0, i64(PANEL)))
            npan = b.sdiv(b.sub(s1, s0), i64(nr))

            def tile(n_rel: ir.Value, count: int) -> None:
                if deq is not None:  # this tile's rows only, just before their use: 8 x KC floats stay in L1
                    n0 = b.add(s0, n_rel)
                    b.call(deq, [wblocks, a.wstride, b.sdiv(kc, i64(QK)), k.gep(tmp, b.mul(n0, i64(-KC))), wst,
                                 n0, b.add(n0, i64(count))])
                    rows = [k.gep(tmp, i64(j * KC)) for j in range(count)]
                else:
                    rows = [k.gep(wbase, b.mul(b.add(n_rel, i64(j)), wst)) for j in range(count)]
                with k.loop(0, a.mpad, lanes, name="mp") as mp:
                    panel = b.sdiv(mp, i64(PANEL))
                    apan = k.gep(apanels, b.mul(panel, b.mul(a.k, i64(PANEL))), b.srem(mp, i64(PANEL)))
                    cps = [k.gep(a.ct, b.mul(b.add(b.add(s0, n_rel), i64(j)), a.mpad), mp) for j in range(count)]
                    _micro(k, vt, nv, rows, apan, kc, cps, first, last)

            with k.loop(0, npan, name="p") as p:
                if deq is not None:
                    _prefetch_next_tile(k, src, nr, s0, s1, k0, b.add(s0, b.mul(p, i64(nr))))
                tile(b.mul(p, i64(nr)), nr)
            with k.loop(b.mul(npan, i64(nr)), b.sub(s1, s0), name="t") as t:
                tile(t, 1)
    k.ret()


def _prefetch_next_tile(k: Kernel, src: str, nr: int, s0: ir.Value, s1: ir.Value, k0: ir.Value, n0: ir.Value) -> None:
    """Prefetch the ggml bytes the next micro-tile will dequantize (rows n0+nr.. of this K block, or the claim's
    first rows of the next K block after its last tile): a K block of 8 rows is 8 short runs of blocks from
    DRAM, which the hardware prefetchers do not see coming; a tile's products give the lines time to arrive."""
    b, a = k.b, k.a
    nxt = b.add(n0, i64(nr))
    wrap = b.icmp_signed(">=", nxt, s1)
    row = b.select(wrap, s0, nxt)
    kn = b.select(wrap, b.add(k0, i64(KC)), k0)
    with k.if_(b.icmp_signed("<", kn, a.k)):
        base = k.gep(a.w, b.mul(b.sdiv(kn, i64(QK)), i64(BLOCK_BYTES[src])))
        for j in range(nr):
            rp = k.gep(base, b.mul(b.add(row, i64(j)), a.wstride))
            k.prefetch_bytes(rp, KC // QK * BLOCK_BYTES[src] + 64)  # (+64: the run need not start a line)


def _pack(module: ir.Module) -> None:
    """hmx_pack(a, m, k, out, p0, p1): the panels p in [p0, p1) of `pack_panels`: out[p][kk][r] = a[32p + r, kk]
    for rows 32p + r < m, 0 past m (a: (m, k) C-contiguous float32). 8 x 8 blocks through a register transpose;
    the last k % 8 columns one element at a time. Data movement only: the bits are a's."""
    k = Kernel(module, "hmx_pack", [("a", ptr(F32)), ("m", I64), ("k", I64), ("out", ptr(F32)), ("p0", I64),
                                    ("p1", I64)])
    b, a = k.b, k.a
    v8 = vec(F32, 8)
    k8 = b.mul(b.sdiv(a.k, i64(8)), i64(8))
    last = b.sub(a.m, i64(1))
    with k.loop(a.p0, a.p1, name="p") as p:
        pan = k.gep(a.out, b.mul(p, b.mul(a.k, i64(PANEL))))
        for g in range(PANEL // 8):
            r0 = b.add(b.mul(p, i64(PANEL)), i64(8 * g))
            rows = [b.add(r0, i64(j)) for j in range(8)]
            live = [b.icmp_signed("<", r, a.m) for r in rows]
            src = [k.gep(a.a, b.mul(b.select(lv, r, last), a.k)) for r, lv in zip(rows, live)]  # (read in range)
            with k.loop(0, k8, 8, name=f"k{g}") as k0:
                vs = [b.select(lv, k.load_vec(sp, v8, k0), splat(v8, 0.0)) for sp, lv in zip(src, live)]
                for c, v in enumerate(transpose8(k, vs)):
                    k.store_vec(v, pan, b.mul(b.add(k0, i64(c)), i64(PANEL)), 8 * g)
            with k.loop(k8, a.k, name=f"kt{g}") as kk:
                for j, (sp, lv) in enumerate(zip(src, live)):
                    x = b.select(lv, k.load(sp, kk), ir.Constant(F32, 0.0))
                    k.store(x, pan, b.mul(kk, i64(PANEL)), 8 * g + j)
    k.ret()


LIB = Library(__name__, "kazeia_htp_gemm")
GEMM = LIB.kernels("hmx_gemm", _hmx_gemm, SOURCES, par=True)
PACK = LIB.kernel("hmx_pack", _pack, par=True)


# --- fronts ---------------------------------------------------------------------------------------------------

_PANELS = GrowingScratch(np.float32)
_CT = GrowingScratch(np.float32)


def _aligned(scratch: GrowingScratch, n: int) -> np.ndarray:
    """n float32 of a per-thread scratch starting on a 64-byte boundary: a panel's k row (16 or 32 lanes) is then
    one or two whole cache lines, never a load split across two."""
    buf = scratch.take(n + 16)
    skip = (-buf.ctypes.data % 64) // 4
    return buf[skip: skip + n]


def padded_rows(m: int) -> int:
    """Activation rows the panels hold: m rounded up to whole 32-row panels (HMX's row tiles)."""
    return -(-m // PANEL) * PANEL


def pack_panels(a16: np.ndarray) -> np.ndarray:
    """(M, K) float32 -> the panels [mpad/32][K][32] (rows past M zero), in a per-thread scratch."""
    m, kdim = a16.shape
    mpad = padded_rows(m)
    buf = _aligned(_PANELS, mpad * kdim).reshape(mpad // PANEL, kdim, PANEL)
    if available() and a16.dtype == np.float32 and a16.flags.c_contiguous and m:
        run_rows(PACK, (addr(a16), m, kdim, addr(buf)), mpad // PANEL, 1, m * kdim >= PARALLEL_MIN_PACK)
        return buf
    full = m // PANEL * PANEL
    if full:
        buf[: full // PANEL] = a16[:full].reshape(full // PANEL, PANEL, kdim).transpose(0, 2, 1)
    if full < m:
        buf[full // PANEL] = 0.0
        buf[full // PANEL, :, : m - full] = a16[full:].T
    return buf


def product_scratch(n: int, m: int) -> np.ndarray:
    """A per-thread (N, mpad) float32 scratch for the sums of `hmx_products` (reused by the next matmul)."""
    mpad = padded_rows(m)
    return _aligned(_CT, n * mpad).reshape(n, mpad)


def hmx_products(a16: np.ndarray, n: int, src: str, w: np.ndarray, wstride: int,
                 ct: np.ndarray | None = None) -> np.ndarray:
    """ct (N, mpad) float32: ct[n, m] = the HMX accumulation (module doc) of activation row m (a16, (M, K)
    C-contiguous float32 of fp16 values) with weight row n, given as `src` rows of `w` (wstride bytes apart:
    float32 rows, F16 rows, or ggml blocks); into `ct` (C-contiguous) when given, else a per-thread scratch.
    Columns m >= M hold the zero rows' products."""
    m, kdim = a16.shape
    mpad = padded_rows(m)
    if ct is None:
        ct = product_scratch(n, m)
    if ct.shape != (n, mpad) or not ct.flags.c_contiguous:
        raise ValueError(f"hmx_products: ct must be C-contiguous of shape {(n, mpad)}")
    if available():
        panels = pack_panels(a16)
        parallel = m * n * kdim >= PARALLEL_MIN_MACS
        run_rows(GEMM[src], (addr(panels), mpad, kdim, addr(w), wstride, addr(ct)), n, _sub_rows(), parallel)
        return ct
    if src != "f32":
        raise ValueError("the portable HMX product takes float32 weight rows")  # (callers dequantize first)
    at = np.zeros((kdim, mpad), dtype=np.float32)
    at[:, :m] = a16.T
    rows = np.lib.stride_tricks.as_strided(w.view(np.float32), (n, kdim), (wstride, 4))
    hmx_products_portable(at, rows, ct, CANONICAL_NAN)
    return ct


@jit(parallel=True, cache=True)
def hmx_products_portable(at, w, ct, nan):
    """ct[n, m] = sum_k at[k, m] * w[n, k], k ascending from +0, a multiply then an add (the native kernels' FMA
    gives the same bits on fp16 operands); a NaN stored as `nan`."""
    kdim, mpad = at.shape
    for n in prange(w.shape[0]):
        acc = np.zeros(mpad, dtype=np.float32)
        for k in range(kdim):
            wk = w[n, k]
            for m in range(mpad):
                acc[m] = acc[m] + at[k, m] * wk
        for m in range(mpad):
            ct[n, m] = nan if acc[m] != acc[m] else acc[m]
