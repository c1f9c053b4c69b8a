"""The host's float32 FMA peak, measured: a register-only loop of 12 independent vector FMA chains (enough to
cover the FMA latency on two pipes), as wide as the host's vectors (16 lanes with AVX-512, else 8), run on every
kernel thread at once through kazeia's pool. Emitted with kazeia's IR kit (bench only: nothing in the device model
uses it)."""

from __future__ import annotations

import time

import numpy as np
from llvmlite import ir

from kazeia.native.buffers import ptr
from kazeia.native.compile import Library, host_has
from kazeia.native.irkit import F32, I64, Kernel, splat, vec
from kazeia.native.irkit import ptr as ptr_t
from kazeia.native.pool import run

CHAINS = 12
ITERS = 20_000_000


def _lanes() -> int:
    return 16 if host_has("avx512f") else 8


def _peak(module: ir.Module) -> None:
    """fma_peak(out, iters, r0, r1): for each of the rows r0..r1 (one per thread), `iters` rounds of CHAINS
    independent FMAs; the sums are stored so the loop is kept."""
    vt = vec(F32, _lanes())
    k = Kernel(module, "fma_peak", [("out", ptr_t(F32)), ("iters", I64), ("r0", I64), ("r1", I64)])
    b = k.b
    with k.loop(k.a.r0, k.a.r1, name="r") as r:
        accs = [k.var(vt, splat(vt, 0.0)) for _ in range(CHAINS)]
        x, y = splat(vt, 1.0000001), splat(vt, 1e-7)
        with k.loop(0, k.a.iters, name="it"):
            for s in accs:
                b.store(k.fma(b.load(s), x, y), s)
        tot = b.load(accs[0])
        for s in accs[1:]:
            tot = b.fadd(tot, b.load(s))
        k.store(b.extract_element(tot, ir.Constant(ir.IntType(32), 0)), k.a.out, r)
    k.ret()


LIB = Library(__name__, "kazeia_bench_peak")
PEAK = LIB.kernel("fma_peak", _peak, par=True)


def fma_peak_gflops(threads: int) -> float:
    """GFLOP/s of `threads` threads each running ITERS rounds (the best of three runs)."""
    out = np.zeros(threads, dtype=np.float32)
    flop = 2.0 * CHAINS * _lanes() * ITERS * threads
    best = float("inf")
    for _ in range(3):
        ctr = np.zeros(1, dtype=np.int64)
        t0 = time.perf_counter()
        run(PEAK.par, (ptr(out), ITERS, ptr(ctr), threads, 1), parallel=threads > 1)
        best = min(best, time.perf_counter() - t0)
    return flop / best / 1e9
