"""Programs: runs of the `cpu` backend's bound native calls (cpu_native.py) made by one call of
simd_ops.run_program, so a decode step crosses from Python to native code a few dozen times instead of once per op.

A bound call that a program can make carries `steps` [(kind, function address, int args)] (run_program's steps);
a rope carries its table (filled before the first rope of the list that reads it), a GEMV its serial steps (a GEMV
the thread pool shares stays a Python call), a fused member its group (the product is computed at the group's first
member in the list). The helpers here give the kernels integer arguments only (float parameters as their bits).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from kazeia.backends import native


def lib() -> dict | None:
    """The simd_ops kernels, or None where the native kernels do not run."""
    return native.library("kazeia.backends.simd_ops") if native.available() else None


MEMMOVE = ctypes.cast(ctypes.memmove, ctypes.c_void_p).value
MEMSET = ctypes.cast(ctypes.memset, ctypes.c_void_p).value


def bits64(x: float) -> int:
    return int(np.array(x, dtype=np.float64).view(np.int64))


def bits32(x: float) -> int:
    return int(np.array(x, dtype=np.float32).view(np.int32))


def simple(fn, args: tuple) -> Callable[[], None]:
    def run() -> None:
        fn(*args)
    run.steps = [(0, native.address(fn), args)]
    return run


class _Program:
    """Steps of consecutive bound calls, run by one call of simd_ops.run_program."""

    def __init__(self, steps: list[tuple], errors: dict[int, Callable[[], Exception]]) -> None:
        words = []
        for kind, fa, args in steps:
            words += [kind, fa, len(args), *args]
        self.words = np.array(words, dtype=np.int64)
        self.n, self.errors = len(steps), errors
        self.fn, self.wp = lib()["run_program"], self.words.ctypes.data

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
