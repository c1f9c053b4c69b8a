"""Programs: runs of the `cpu` backend's bound native calls (cpu/bind.py) made by one call of `run_program` (its IR
is here too), so a decode step crosses from Python to native code a few dozen times instead of once per op.

A bound call that a program can make carries `steps` [(kind, function address, int args)] (run_program's steps);
a rope carries its table (filled before the first rope of the list that reads it), a GEMV its serial steps (a GEMV
the thread pool shares stays a Python call), a fused member its group (the product is computed at the group's first
member in the list). The helpers here give the kernels integer arguments only (float parameters as their bits).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from kazeia.native.compile import Library
from kazeia.native.irkit import I64, VOID, Kernel, i64, ptr
from kazeia.native.pool import address

PROGRAM_MAX_ARGS = 12


def _program(module: ir.Module) -> None:
    """run_program(prog, n) -> 0, or 1 + the index of the first step whose status was not 0 (the later ones do not
    run): n steps, each [kind, function address, nargs, args...] in int64 words; kind 0 calls fn(args) and ignores
    what it returns, kind 1 takes its int64 return as a status. Every function takes integer arguments only."""
    k = Kernel(module, "run_program", [("prog", ptr(I64)), ("n", I64)], ret=I64)
    b, a = k.b, k.a
    pos = k.var(I64, i64(0))
    with k.loop(0, a.n, name="step") as step:
        o = b.load(pos)
        kind, fa, na = (k.load(a.prog, b.add(o, i64(j))) for j in range(3))
        args = k.gep(a.prog, b.add(o, i64(3)))
        status = k.var(I64, i64(0))
        after = k.fn.append_basic_block("called")
        sw = b.switch(na, after)
        for n in range(PROGRAM_MAX_ARGS + 1):
            blk = k.fn.append_basic_block(f"args{n}")
            sw.add_case(ir.Constant(I64, n), blk)
            b.position_at_end(blk)
            vals = [k.load(args, j) for j in range(n)]
            ty = ir.FunctionType(I64, [I64] * n)
            with b.if_else(b.icmp_signed("==", kind, i64(1))) as (then, other):
                with then:
                    b.store(b.call(b.inttoptr(fa, ptr(ty)), vals), status)
                with other:
                    b.call(b.inttoptr(fa, ptr(ir.FunctionType(VOID, [I64] * n))), vals)
            b.branch(after)
        b.position_at_end(after)
        with k.if_(b.icmp_signed("!=", b.load(status), i64(0))):
            k.ret(b.add(step, i64(1)))
        b.store(b.add(o, b.add(na, i64(3))), pos)
    k.ret(i64(0))


LIB = Library(__name__, "kazeia_simd_program")
RUN_PROGRAM = LIB.kernel("run_program", _program)


MEMMOVE = ctypes.cast(ctypes.memmove, ctypes.c_void_p).value
MEMSET = ctypes.cast(ctypes.memset, ctypes.c_void_p).value


def bits64(x: float) -> int:
    return int(np.array(x, dtype=np.float64).view(np.int64))


def bits32(x: float) -> int:
    return int(np.array(x, dtype=np.float32).view(np.int32))


def simple(fn, args: tuple) -> Callable[[], None]:
    def run() -> None:
        fn(*args)
    run.steps = [(0, address(fn), args)]
    return run


class _Program:
    """Steps of consecutive bound calls, run by one call of run_program."""

    def __init__(self, steps: list[tuple], errors: dict[int, Callable[[], Exception]]) -> None:
        words = []
        for kind, fa, args in steps:
            words += [kind, fa, len(args), *args]
        self.words = np.array(words, dtype=np.int64)
        self.n, self.errors = len(steps), errors
        self.fn, self.wp = RUN_PROGRAM.fn, self.words.ctypes.data

    def __call__(self) -> None:
        r = self.fn(self.wp, self.n)
        if r:
            raise self.errors[r - 1]()


def program(calls: list[Callable[[], None]]) -> list[Callable[[], None]]:
    """The calls of a node list (CpuBackend.run_nodes), runs of program-able ones merged into _Program calls. Made
    for the current thread count (a pooled GEMV stays a Python call)."""
    out: list[Callable[[], None]] = []
    steps: list[tuple] = []
    errors: dict[int, Callable[[], Exception]] = {}
    seen: set[int] = set()  # groups and rope tables already computed at an earlier call of the list

    def flush() -> None:
        if steps:
            out.append(_Program(list(steps), dict(errors)))
            steps.clear()
            errors.clear()

    for call in calls:
        own, pre = getattr(call, "steps", None), []
        gemv, group, tab = (getattr(call, a, None) for a in ("gemv", "group", "table"))
        if gemv is not None and (group is None or id(group) not in seen):
            if group is not None:
                seen.add(id(group))
            if gemv.parallel():
                own = None  # its Python call computes the product (and marks the group computed for this run)
            else:
                pre, own = list(gemv.serial_steps), own or []
        if tab is not None and id(tab) not in seen:
            seen.add(id(tab))
            pre += tab.steps if own is not None else []  # (a Python rope fills its table itself)
        if own is None:
            flush()
            out.append(call)
            continue
        steps.extend(pre)
        if getattr(call, "error", None) is not None:
            errors[len(steps)] = call.error  # the index of its status step
        steps.extend(own)
    flush()
    return out
