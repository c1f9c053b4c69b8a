"""Native helpers of the emulated DSP's bookkeeping (emitted into simd_htp.py's module through simd_hvx.kernels):
`copy_runs`, the byte copies a bound op leaves in VTCM (its scratch rows, a matmul's dst areas) in one call."""

from __future__ import annotations

from llvmlite import ir

from kazeia.backends.irkit import I1, I8, I64, Kernel, i64, ptr


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


def kernels(module: ir.Module) -> list[tuple[str, str]]:
    """Emit the helpers into `module`: [(name, signature)]."""
    return [(_copy_runs_kernel(module), "v:pii")]
