"""A few helpers for writing SIMD kernels as LLVM IR with llvmlite's IRBuilder (the way tinygrad's LLVM backend
emits its kernels): vector types, constants, counted loops, x86 intrinsics declared by name, and the ABI of a
kernel (`abi`), derived from its argument list: the ctypes prototype it is called through (compile.py) is never
written by hand beside it.

Only the kernel families (backends/*/kernels/) use it, and only when the native cache misses (compile.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from llvmlite import ir

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
VOID = ir.VoidType()


def vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def ptr(t: ir.Type) -> ir.PointerType:
    return ir.PointerType(t)


V32I8, V16I8, V16I16, V8I16, V8I32, V8F32, V8F16 = (vec(I8, 32), vec(I8, 16), vec(I16, 16), vec(I16, 8),
                                                     vec(I32, 8), vec(F32, 8), vec(F16, 8))


def splat(t: ir.VectorType, value) -> ir.Constant:
    """A constant vector with every lane `value`."""
    return ir.Constant(t, [ir.Constant(t.element, value)] * t.count)


def lanes(t: ir.VectorType, values) -> ir.Constant:
    return ir.Constant(t, [ir.Constant(t.element, v) for v in values])


def i64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def i32(v: int) -> ir.Constant:
    return ir.Constant(I32, v)


def f32(v: float) -> ir.Constant:
    return ir.Constant(F32, v)


_ABI = {"i64": "i", "float": "f", "double": "d", "void": "v"}


def abi(fn: ir.Function) -> str:
    """The call signature compile.py makes a ctypes prototype from: "<ret>:<args>", one letter a value: p a
    pointer, i an int64, f a float, d a double, v void (e.g. "v:ppii"). Other types have no ctypes form here."""
    ty = fn.function_type

    def code(t: ir.Type) -> str:
        c = "p" if isinstance(t, ir.PointerType) else _ABI.get(str(t))
        if c is None:
            raise TypeError(f"{fn.name}: a kernel argument or result of type {t} has no ABI code (use i64, a "
                            f"pointer, float or double)")
        return c
    return code(ty.return_type) + ":" + "".join(code(t) for t in ty.args)


class Kernel:
    """One function being built: `Kernel(module, name, [("w", ptr(I8)), ("n", I64), ...])`, arguments by name
    (`k.a.w`), the builder `k.b`, loops (`with k.loop(start, stop) as i:`), intrinsics (`k.call("llvm.x86...",
    ret, *args)`). Pointer arguments are noalias (the callers pass distinct buffers) unless `noalias=False`."""

    def __init__(self, module: ir.Module, name: str, args: list[tuple[str, ir.Type]], ret: ir.Type = VOID,
                 noalias: bool = True):
        self.module = module
        self.fn = ir.Function(module, ir.FunctionType(ret, [t for _, t in args]), name=name)
        for arg, (an, t) in zip(self.fn.args, args):
            arg.name = an
            if noalias and isinstance(t, ir.PointerType):
                arg.add_attribute("noalias")
        self.a = _Args({an: arg for arg, (an, _) in zip(self.fn.args, args)})
        self._entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self._entry)

    @property
    def abi(self) -> str:
        """This kernel's call signature (`abi`), from its argument list."""
        return abi(self.fn)

    # --- control flow ---
    def var(self, t: ir.Type, init=None, name: str = "") -> ir.AllocaInstr:
        """A stack slot in the entry block (promoted to a register by LLVM's mem2reg)."""
        with self.b.goto_block(self._entry):
            if self._entry.instructions:
                self.b.position_before(self._entry.instructions[0])
            slot = self.b.alloca(t, name=name)
        if init is not None:
            self.b.store(init if isinstance(init, ir.Value) else ir.Constant(t, init), slot)
        return slot

    @contextlib.contextmanager
    def loop(self, start, stop, step: int = 1, name: str = "i") -> Iterator[ir.Value]:
        """for (i = start; i < stop; i += step): yields i (I64). `start`/`stop` are I64 values or ints."""
        b = self.b
        start, stop = _as64(start), _as64(stop)
        slot = self.var(I64, start, name=name)
        head = self.fn.append_basic_block(f"{name}.head")
        body = self.fn.append_basic_block(f"{name}.body")
        end = self.fn.append_basic_block(f"{name}.end")
        b.branch(head)
        b.position_at_end(head)
        i = b.load(slot, name=name)
        b.cbranch(b.icmp_signed("<", i, stop), body, end)
        b.position_at_end(body)
        yield i
        b.store(b.add(i, i64(step)), slot)
        b.branch(head)
        b.position_at_end(end)

    @contextlib.contextmanager
    def if_(self, cond: ir.Value) -> Iterator[None]:
        with self.b.if_then(cond):
            yield

    def ret(self, value=None) -> None:
        if value is None:
            self.b.ret_void()
        else:
            self.b.ret(value)

    # --- memory ---
    def gep(self, base: ir.Value, *offsets) -> ir.Value:
        """base + sum(offsets) elements of base's pointee (offsets: I64 values or ints)."""
        off = offsets[0] if len(offsets) == 1 else None
        if off is None:
            off = _as64(offsets[0])
            for o in offsets[1:]:
                off = self.b.add(off, _as64(o))
        return self.b.gep(base, [_as64(off)])

    def load_vec(self, base: ir.Value, t: ir.VectorType, *offsets, align: int = 1) -> ir.Value:
        """A vector of type t loaded from base + offsets (elements of base's pointee, any alignment)."""
        p = self.b.bitcast(self.gep(base, *offsets), ptr(t))
        return self.b.load(p, align=align)

    def store_vec(self, value: ir.Value, base: ir.Value, *offsets, align: int = 1) -> None:
        p = self.b.bitcast(self.gep(base, *offsets), ptr(value.type))
        self.b.store(value, p, align=align)

    def prefetch(self, p: ir.Value, locality: int = 3) -> None:
        """Prefetch the cache line at I8 pointer p for reading: locality 3 into every cache level (prefetcht0), 2
        into L2 and below (prefetcht1). A prefetch never faults, so p may point past the end of a buffer."""
        self.call("llvm.prefetch.p0i8", VOID, p, ir.Constant(I32, 0), ir.Constant(I32, locality), ir.Constant(I32, 1))

    def prefetch_bytes(self, p: ir.Value, nbytes: int, locality: int = 3) -> None:
        """Prefetch every cache line of the `nbytes` (a compile-time count) from I8 pointer p, one prefetch per 64
        bytes (p need not start a line: a run that does not may reach one more)."""
        for j in range(-(-nbytes // 64)):
            self.prefetch(self.gep(p, 64 * j), locality)

    def load(self, base: ir.Value, *offsets) -> ir.Value:
        return self.b.load(self.gep(base, *offsets))

    def store(self, value: ir.Value, base: ir.Value, *offsets) -> None:
        self.b.store(value, self.gep(base, *offsets))

    def load_as(self, base: ir.Value, t: ir.Type, byte_offset) -> ir.Value:
        """A scalar of type t at a byte offset from an I8 pointer (unaligned)."""
        p = self.b.bitcast(self.gep(base, byte_offset), ptr(t))
        return self.b.load(p, align=1)

    # --- values ---
    def call(self, name: str, ret: ir.Type, *args: ir.Value) -> ir.Value:
        """Call an intrinsic (or any external function) by name, declared on first use."""
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, [a.type for a in args]), name=name)
        return self.b.call(fn, list(args))

    def broadcast(self, scalar: ir.Value, n: int) -> ir.Value:
        t = vec(scalar.type, n)
        v = self.b.insert_element(ir.Constant(t, ir.Undefined), scalar, i32(0))
        return self.b.shuffle_vector(v, ir.Constant(t, ir.Undefined), ir.Constant(vec(I32, n), [0] * n))

    def shuffle(self, a: ir.Value, b: ir.Value | None, idx: list[int]) -> ir.Value:
        if b is None:
            b = ir.Constant(a.type, ir.Undefined)
        return self.b.shuffle_vector(a, b, ir.Constant(vec(I32, len(idx)), idx))

    def half_to_f32(self, bits16: ir.Value) -> ir.Value:
        """An I16 holding fp16 bits -> F32 (exact; vcvtph2ps with F16C)."""
        return self.b.fpext(self.b.bitcast(bits16, F16), F32)

    def opaque(self, v: ir.Value) -> ir.Value:
        """v unchanged, hidden from LLVM's instruction combiner by an empty inline asm (keeps, e.g., a widened
        value widened instead of letting LLVM narrow the operations that follow into byte lanes)."""
        asm = ir.InlineAsm(ir.FunctionType(v.type, [v.type]), "", "=x,0")
        return self.b.call(asm, [v])

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        """a * b + c rounded once (vfmadd)."""
        t = a.type
        name = f"llvm.fma.v{t.count}f32" if isinstance(t, ir.VectorType) else "llvm.fma.f32"
        return self.call(name, t, a, b, c)

    def hsum8(self, v: ir.Value) -> ir.Value:
        """<8 x float> -> float: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), a fixed order."""
        b = self.b
        h = b.fadd(self.shuffle(v, None, [0, 1, 2, 3]), self.shuffle(v, None, [4, 5, 6, 7]))
        q = b.fadd(self.shuffle(h, None, [0, 1]), self.shuffle(h, None, [2, 3]))
        return b.fadd(b.extract_element(q, i32(0)), b.extract_element(q, i32(1)))


def chunked(module: ir.Module, inner: ir.Function, name: str) -> ir.Function:
    """`name(args..., ctr, n, chunk)`: calls `inner(args..., r0, r1)` (whose last two arguments are a row range)
    on chunks [c*chunk, min(n, c*chunk + chunk)) claimed one at a time by an atomic increment of *ctr. Every
    thread that calls it with the same counter takes chunks until none is left, so a descheduled thread's
    share is done by the others; which thread computes a row never changes the row's result."""
    args = list(inner.args[:-2])
    k = Kernel(module, name, [(f"a{i}", a.type) for i, a in enumerate(args)] +
               [("ctr", ptr(I64)), ("n", I64), ("chunk", I64)])
    b = k.b
    head = k.fn.append_basic_block("claim")
    body = k.fn.append_basic_block("run")
    end = k.fn.append_basic_block("done")
    b.branch(head)
    b.position_at_end(head)
    c = b.atomic_rmw("add", k.a.ctr, i64(1), "monotonic")
    r0 = b.mul(c, k.a.chunk)
    b.cbranch(b.icmp_signed("<", r0, k.a.n), body, end)
    b.position_at_end(body)
    r1 = b.add(r0, k.a.chunk)
    r1 = b.select(b.icmp_signed("<", r1, k.a.n), r1, k.a.n)
    b.call(inner, list(k.fn.args[:len(args)]) + [r0, r1])
    b.branch(head)
    b.position_at_end(end)
    k.ret()
    return k.fn


class _Args:
    def __init__(self, d: dict):
        self.__dict__.update(d)


def _as64(v) -> ir.Value:
    if isinstance(v, int):
        return i64(v)
    return v
