"""The emulated DSP's bookkeeping copies: many (VTCM view, tensor bytes) pairs copied in one native call (an op's
scratch images, a matmul's dst rows; vtcm/arena.py `write_views`). `copy_runs` as IR (compiled by
native/compile.py) and its front `CopyRuns`; without the native kernels the caller copies the pairs with numpy.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import Library, available
from kazeia.native.irkit import I1, I8, I64, Kernel, i64, ptr


def _copy_runs_kernel(module: ir.Module) -> str:
    """copy_runs(tab, r0, r1): for each run i in [r0, r1), memcpy(tab[3i], tab[3i+1], tab[3i+2]): destination
    address, source address, bytes (int64 each). The runs never overlap their sources (VTCM vs DDR)."""
    k = Kernel(module, "copy_runs", [("tab", ptr(I64)), ("r0", I64), ("r1", I64)])
    b, a = k.b, k.a
    memcpy = module.globals.get("llvm.memcpy.p0i8.p0i8.i64")
    if memcpy is None:
        memcpy = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr(I8), ptr(I8), I64, I1]),
                             name="llvm.memcpy.p0i8.p0i8.i64")
    with k.loop(a.r0, a.r1, name="run") as i:
        base = b.mul(i, i64(3))
        dst = b.inttoptr(k.load(a.tab, base), ptr(I8))
        src = b.inttoptr(k.load(a.tab, b.add(base, i64(1))), ptr(I8))
        b.call(memcpy, [dst, src, k.load(a.tab, b.add(base, i64(2))), ir.Constant(I1, 0)])
    k.ret()
    return "copy_runs"

LIB = Library(__name__, "kazeia_htp_copy")
COPY_RUNS = LIB.kernel("copy_runs", _copy_runs_kernel)


class CopyRuns:
    """dst[...] = src for fixed (dst, src) pairs of C-contiguous uint8 views (the same number of bytes each) in
    one native call (copy_runs). The pairs are kept, so the addresses stay theirs."""

    __slots__ = ("fn", "table", "ptab", "n", "keep")

    def __init__(self, pairs: list[tuple[np.ndarray, np.ndarray]]):
        self.fn = COPY_RUNS.fn
        for d, s in pairs:
            if d.nbytes != s.nbytes or not (d.flags.c_contiguous and s.flags.c_contiguous):
                raise ValueError("CopyRuns needs C-contiguous pairs of the same size")
        self.keep = list(pairs)
        self.table = np.array([(addr(d), addr(s), d.nbytes) for d, s in pairs], dtype=np.int64).reshape(-1, 3)
        self.ptab, self.n = addr(self.table), len(pairs)

    @staticmethod
    def of(pairs: list[tuple[np.ndarray, np.ndarray]]) -> CopyRuns | None:
        """A CopyRuns of the pairs, or None where the native kernels are missing (the caller copies them)."""
        return CopyRuns(pairs) if available() and pairs else None

    def __call__(self) -> None:
        self.fn(self.ptab, 0, self.n)
