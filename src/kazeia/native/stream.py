"""A streaming read, for measuring this machine's memory bandwidth (bench/stream.py, issue 38): every byte of a
buffer read once by the kernel threads, summed as <4 x i64> lanes so that no load can be dropped."""

from __future__ import annotations

import time

import numpy as np
from llvmlite import ir

from kazeia.native.buffers import ptr
from kazeia.native.compile import Library
from kazeia.native.irkit import I64, Kernel, i64, splat, vec
from kazeia.native.irkit import ptr as ptr_t
from kazeia.native.pool import run_rows

ROW = 1 << 16          # int64 elements a claim (512 KiB)
V4I64 = vec(I64, 4)


def _read_kernel(module: ir.Module) -> None:
    """stream_read(x, out, n, r0, r1): out[r0] = the sum of x[ROW*r0 .. min(ROW*r1, n)) as int64 lanes (wrapping)."""
    k = Kernel(module, "stream_read", [("x", ptr_t(I64)), ("out", ptr_t(I64)), ("n", I64), ("r0", I64),
                                       ("r1", I64)])
    b, a = k.b, k.a
    lo = b.mul(a.r0, i64(ROW))
    hi = b.mul(a.r1, i64(ROW))
    hi = b.select(b.icmp_signed("<", hi, a.n), hi, a.n)
    acc = [k.var(V4I64, splat(V4I64, 0), name=f"acc{j}") for j in range(4)]
    with k.loop(lo, hi, 16, name="i") as i:  # 4 independent vectors a step (n is a multiple of 16)
        for j in range(4):
            v = k.load_vec(a.x, V4I64, b.add(i, i64(4 * j)))
            b.store(b.add(b.load(acc[j]), v), acc[j])
    total = b.add(b.add(b.load(acc[0]), b.load(acc[1])), b.add(b.load(acc[2]), b.load(acc[3])))
    s = b.extract_element(total, ir.Constant(ir.IntType(32), 0))
    for j in range(1, 4):
        s = b.add(s, b.extract_element(total, ir.Constant(ir.IntType(32), j)))
    k.store(s, a.out, a.r0)
    k.ret()


LIB = Library(__name__, "kazeia_bench_stream")
READ = LIB.kernel("stream_read", _read_kernel, par=True)


def stream_sum(x: np.ndarray) -> int:
    """One streaming pass over the int64 array x (its size a multiple of 16) on the kernel threads: the wrapping
    sum of its elements (what the pass read)."""
    rows = -(-x.size // ROW)
    out = np.zeros(rows, dtype=np.int64)
    run_rows(READ, (ptr(x), ptr(out), x.size), rows, 1, True)
    return int(out.sum(dtype=np.uint64).astype(np.int64)) if rows else 0


def read_gbs(buf: np.ndarray, reps: int) -> float:
    """Best read rate (GB/s) over `reps` streaming passes of buf's bytes."""
    x = buf.view(np.int64)
    x = x[: x.size - x.size % 16]
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        stream_sum(x)
        best = min(best, time.perf_counter() - t)
    return x.nbytes / best / 1e9
