"""Products of two float32 operands in one order that kazeia owns, whatever the host: `ordered_matmul`.

For every output (m, n) of C = A @ B:

    c[m, n] = fl(... fl(fl(+0 + fl(a[m, 0] * b[0, n])) + fl(a[m, 1] * b[1, n])) ... )

float32, k ascending, one accumulator per output, each product rounded to float32 and then added (a multiply, then
an add: no FMA, since float32 operands' products are not exact). What varies with the host is only which outputs a
vector lane, a register tile or a thread computes: lanes run over n, tiles over rows of A, threads over whole
matrices. So the bits are the same at any thread count, vector width and BLAS build (docs/hmx-numerics.md).

Who multiplies this way:
- the device model (htp/): flash attention's S = Q K^T and P V, the gated delta net's state products;
- the CPU device's MUL_MAT of two activations (KQ and KQV without flash attention: llama.cpp's CPU backend runs
  its own vec_dot there, not BLAS). In a graph split between HTP0 and the CPU (`-fa off`: KQV reads the V cache
  through a transposed view, which the HTP does not take), the CPU's half then does not move HTP0's bits with the
  host's BLAS.

The kernel is LLVM IR (`ordered_gemm_fp32`, and `ordered_gemm_exact` for fp16 operands; native/compile.py) with
a numba twin (`ordered_matmul_portable`); all give the bits of tests/oracle_utils.ordered_products.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from kazeia.native.compile import Library, available, f32_lanes
from kazeia.native.irkit import F32, I64, Kernel, i64, ptr, splat, vec
from kazeia.native.pool import run_rows
from kazeia.native.portable import jit, prange

MR = 4                       # rows of A a register tile
PARALLEL_MIN_MACS = 1 << 19  # products below this run on one thread (a decode's S = Q K^T at n_kv = 256: 1 << 20)


def _ordered_gemm(module: ir.Module, kind: str) -> None:
    """ordered_gemm_<kind>(a, lda, ahs, bm, ldb, bhs, c, ldc, chs, m, k, n, h0, h1): for each matrix h in [h0, h1)
    C_h (m x n) = A_h (m x k) @ B_h (k x n), row-major with the given row and matrix strides (elements): every
    output a multiply then an add per k, k ascending, from +0 (module doc). Lanes run over n: two vectors, then
    one, then single columns; MR rows of A, then single rows. kind "fp32": a multiply, then an add; "exact": one
    fused multiply-add, for operands whose products are exact in float32 (fp16 values: 11 + 11 significant bits),
    where it rounds once as the multiply-then-add does (the multiply does not round): the same bits, half the
    instructions."""
    vl = f32_lanes()
    names = ("a", "lda", "ahs", "bm", "ldb", "bhs", "c", "ldc", "chs", "m", "k", "n", "h0", "h1")
    k = Kernel(module, f"ordered_gemm_{kind}", [(nm, ptr(F32) if nm in ("a", "bm", "c") else I64) for nm in names])
    b, a = k.b, k.a

    def tile(ah, bh, ch, m0: ir.Value, mr: int, n0: ir.Value, t: ir.Type) -> None:
        width = t.count if isinstance(t, ir.VectorType) else 1
        nvec = 2 if width > 1 and t.count == 2 * vl else 1
        vt_ = vec(F32, vl) if width > 1 else F32
        zero = splat(vt_, 0.0) if width > 1 else ir.Constant(F32, 0.0)
        accs = [[k.var(vt_, zero) for _ in range(nvec)] for _ in range(mr)]
        with k.loop(0, a.k, name="kk") as kk:
            brow = k.gep(bh, b.mul(kk, a.ldb), n0)
            bv = [k.load_vec(brow, vt_, v * vl) if width > 1 else k.load(brow, v) for v in range(nvec)]
            for i in range(mr):
                x = k.load(ah, b.mul(b.add(m0, i64(i)), a.lda), kk)
                xv = k.broadcast(x, vl) if width > 1 else x
                for v in range(nvec):
                    s = accs[i][v]
                    if kind == "exact":
                        b.store(k.fma(xv, bv[v], b.load(s)), s)
                    else:
                        b.store(b.fadd(b.load(s), b.fmul(xv, bv[v])), s)
        for i in range(mr):
            crow = k.gep(ch, b.mul(b.add(m0, i64(i)), a.ldc), n0)
            for v in range(nvec):
                if width > 1:
                    k.store_vec(b.load(accs[i][v]), crow, v * vl)
                else:
                    k.store(b.load(accs[i][v]), crow, v)

    def rows(ah, bh, ch, n0: ir.Value, t: ir.Type) -> None:
        mfull = b.mul(b.sdiv(a.m, i64(MR)), i64(MR))
        with k.loop(0, mfull, MR, name="mi") as m0:
            tile(ah, bh, ch, m0, MR, n0, t)
        with k.loop(mfull, a.m, name="mt") as m0:
            tile(ah, bh, ch, m0, 1, n0, t)

    with k.loop(a.h0, a.h1, name="h") as h:
        ah, bh, ch = k.gep(a.a, b.mul(h, a.ahs)), k.gep(a.bm, b.mul(h, a.bhs)), k.gep(a.c, b.mul(h, a.chs))
        n2 = b.mul(b.sdiv(a.n, i64(2 * vl)), i64(2 * vl))
        with k.loop(0, n2, 2 * vl, name="n2") as n0:
            rows(ah, bh, ch, n0, vec(F32, 2 * vl))
        n1 = b.mul(b.sdiv(a.n, i64(vl)), i64(vl))
        with k.loop(n2, n1, vl, name="n1") as n0:
            rows(ah, bh, ch, n0, vec(F32, vl))
        with k.loop(n1, a.n, name="ns") as n0:
            rows(ah, bh, ch, n0, F32)
    k.ret()


LIB = Library(__name__, "kazeia_ordered")
GEMM = LIB.kernels("ordered_gemm", _ordered_gemm, ("fp32", "exact"), par=True)


def ordered_matmul(a: np.ndarray, bm: np.ndarray, exact: bool = False, linger: bool = False) -> np.ndarray:
    """(G, M, K) @ (G, K, N) -> (G, M, N) float32, every output in the one order (module doc). a and bm: float32
    (copied when their last stride is not one element); matrices of a or bm may repeat (stride 0). `exact`: the
    caller knows every product is exact in float32 (both operands fp16 values: HMX's tiles), so the kernel may
    fuse the multiply into the add (the same bits; the portable twin multiplies, then adds). `linger`: a decode
    step's products (the kernel threads keep spinning for the next op, native.pool.run)."""
    g, m, kdim = a.shape
    n = bm.shape[2]
    c = np.empty((g, m, n), dtype=np.float32)
    if a.dtype != np.float32 or a.strides[2] != 4:
        a = np.ascontiguousarray(a, dtype=np.float32)
    if bm.dtype != np.float32 or bm.strides[2] != 4:
        bm = np.ascontiguousarray(bm, dtype=np.float32)
    if available() and g and m and n:
        args = (a.ctypes.data, a.strides[1] // 4, a.strides[0] // 4, bm.ctypes.data, bm.strides[1] // 4,
                bm.strides[0] // 4, c.ctypes.data, n, m * n, m, kdim, n)
        run_rows(GEMM["exact" if exact else "fp32"], args, g, 1, g * m * n * kdim >= PARALLEL_MIN_MACS, linger=linger)
        return c
    ordered_matmul_portable(a, bm, c)
    return c


def ordered_batched(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.matmul(a, b) for float32 stacks a (..., M, K) and b (..., K, N) whose leading dims broadcast, in the one
    order: the broadcast matrices are repeated by stride 0, not copied."""
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a3 = np.broadcast_to(a, (*lead, *a.shape[-2:])).reshape(-1, *a.shape[-2:]) if lead else a[None]
    b3 = np.broadcast_to(b, (*lead, *b.shape[-2:])).reshape(-1, *b.shape[-2:]) if lead else b[None]
    return ordered_matmul(a3, b3).reshape(*lead, a.shape[-2], b.shape[-1])


@jit(parallel=True, cache=True)
def ordered_matmul_portable(a, bm, c):
    """c[h] = a[h] @ bm[h], every output a multiply then an add per k, k ascending, from +0."""
    g, m, kdim = a.shape
    n = bm.shape[2]
    for h in prange(g):
        for i in range(m):
            acc = np.zeros(n, dtype=np.float32)
            for k in range(kdim):
                x = a[h, i, k]
                for j in range(n):
                    acc[j] = acc[j] + x * bm[h, k, j]
            c[h, i] = acc
