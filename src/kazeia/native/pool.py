"""The kernel threads: `run(fn, args, parallel)` runs a chunked kernel on this thread and `threads()-1` workers
(ctypes releases the GIL during each call); the threads claim chunks of rows from one atomic counter, so a thread
that the OS deschedules (the machine is shared) delays nobody. Every output row is computed whole by one thread,
so results do not depend on the thread count or on who took which chunk. `run_rows(kernel, ...)` is the same for
a declared kernel (compile.NativeFn) over a row range, with its counter.

The workers wait for jobs in native code (pool_ir.py: a mailbox per worker, spun on for SPIN pauses after a job
posted with `linger`, then a semaphore).
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from kazeia.identity import IdentityCache
from kazeia.native import pool_ir  # the mailbox layout and its kernels (emitted only when the cache misses)
from kazeia.native.buffers import ptr
from kazeia.native.compile import NativeFn
from kazeia.native.pool_ir import EXCHANGE, FINISH, PENDING, SERVE
from kazeia.native.threads import threads


class _Pool:
    """Worker threads that wait for jobs in native code, each running its ctypes kernel without the GIL."""

    STACK = 32 << 20  # the kernels keep their quantized activations on the stack
    SPIN = 40_000     # idle pauses (with a sched_yield every 32) after a lingering job: ~2 ms here
    WOKEN_SPIN = 1_000  # pauses a worker woken by its semaphore looks for the job it was woken for

    def __init__(self, n: int) -> None:
        mb = pool_ir
        mb.LIB.functions()  # compiled or loaded before any worker runs
        self.slots = np.zeros((n, mb.SLOT_WORDS), dtype=np.int64)  # one mailbox per worker
        self.ptrs = [self.slots.ctypes.data + 8 * mb.SLOT_WORDS * i for i in range(n)]
        self.wake = [threading.Semaphore(0) for _ in range(n)]
        self.job = 0
        self.busy = threading.Lock()  # one poster at a time (a second concurrent caller runs alone)
        old = threading.stack_size(self.STACK)
        try:
            for i in range(n):
                threading.Thread(target=self._serve, args=(i,), daemon=True, name=f"kazeia-native-{i}").start()
        finally:
            threading.stack_size(old)

    def _serve(self, i: int) -> None:
        serve, exchange, pending = SERVE.fn, EXCHANGE.fn, PENDING.fn
        p, wake, sleeping = self.ptrs[i], self.wake[i], pool_ir.SLEEPING
        while True:
            serve(p, self.WOKEN_SPIN)  # returns once the wait after its last job passed that job's LINGER
            exchange(p, sleeping, 1)
            if pending(p) and exchange(p, sleeping, 0) == 1:
                continue  # a job came in between: nobody released the semaphore for it
            wake.acquire()

    def run(self, fn, args: tuple, n: int, linger: bool) -> None:
        """fn(*args) on this thread and on n workers (n <= len(workers)); returns when all have finished."""
        if len(args) > pool_ir.MAX_ARGS or not self.busy.acquire(blocking=False):
            fn(*args)
            return
        try:
            self.job += 1
            job, exchange = self.job, EXCHANGE.fn
            addr = address(fn)
            for w in range(n):
                post(self.slots[w], job, addr, args, self.SPIN if linger else 0)
                if exchange(self.ptrs[w], pool_ir.SLEEPING, 0) == 1:
                    self.wake[w].release()
            fn(*args)
            finish = FINISH.fn
            for w in range(n):
                finish(self.ptrs[w], job)  # cancels a job no worker took; else waits for it
        finally:
            self.busy.release()


def post(slot, job: int, addr: int, args: tuple, linger: int) -> None:
    """Write job `job` (the kernel at `addr` with integer `args`, then `linger` idle pauses) into a worker's
    mailbox (pool_ir.py's layout): FN, LINGER and ARGS first, then STATE, then SEQ (x86 keeps stores in order: a
    worker that sees the new SEQ sees the rest)."""
    mb = pool_ir
    slot[mb.ARGS:mb.ARGS + len(args)] = args
    slot[mb.FN] = addr
    slot[mb.LINGER] = linger
    slot[mb.STATE] = job
    slot[mb.SEQ] = job


_ADDRESSES = IdentityCache("native.address", limit=None)


def address(fn) -> int:
    """The machine address of a ctypes function (kept per function object)."""
    return _ADDRESSES.get(fn, lambda: ctypes.cast(fn, ctypes.c_void_p).value)


_pool: _Pool | None = None


def _forget_pool() -> None:
    """In a forked child the workers do not exist: make a new pool on first use."""
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


def run(fn, args: tuple, parallel: bool = True, linger: bool = False) -> None:
    """Run a chunked kernel (one whose threads claim work from counters passed in `args`, zeroed by the
    caller: irkit.chunked) on this thread and, when `parallel`, on `threads()-1` workers too. A worker that
    has not taken the job by the time this thread has claimed every chunk is not waited for (the job is
    cancelled); one that has taken it is waited for. `args` are integers and pointers only. `linger`: the
    workers wait for the next job spinning for ~2 ms (a decode step's GEMVs), else they sleep at once (after
    a prefill kernel a spinning worker would take a core from BLAS's threads)."""
    global _pool
    t = threads() if parallel else 1
    if t <= 1:
        fn(*args)
        return
    if _pool is None or len(_pool.ptrs) < t - 1:
        _pool = _Pool(t - 1)
    _pool.run(fn, args, t - 1, linger)


def run_rows(kernel: NativeFn, args: tuple, n: int, chunk: int, parallel: bool, linger: bool = False) -> None:
    """A row-range kernel on rows [0, n): whole on this thread (`kernel.fn(*args, 0, n)`), or its chunked twin on
    the kernel threads, `chunk` rows a claim (`linger`: they spin for the next job, see `run`)."""
    if parallel and threads() > 1 and n > chunk:
        ctr = np.zeros(1, dtype=np.int64)
        run(kernel.par, (*args, ptr(ctr), n, chunk), linger=linger)
    else:
        kernel.fn(*args, 0, n)
