"""The mailbox protocol of the kernel threads (pool.py), emitted as LLVM IR (irkit) and compiled by compile.py.

A worker thread waits for jobs in native code (no GIL, no Python), spinning on its mailbox for a bounded
number of `pause`s before it goes back to Python to sleep on a semaphore. A decode step calls a parallel
kernel every 0.1-1 ms: a worker sleeping on a semaphore started its share ~0.1 ms late at the median and
~0.5 ms at the 90th percentile (measured), a spinning one in about a microsecond. The spinning worker calls
sched_yield every YIELD_EVERY pauses: on a 2-core machine another thread (BLAS's second thread, another
process) that wants the core gets it.

Mailbox (int64 slots): SEQ (the last job posted), STATE (the job number while it is open, -job once a worker
took it, 0 once the poster cancelled it), DONE (the last job a worker finished), SLEEPING (1 while the worker
is, or is about to be, asleep on its semaphore), SEEN (the last job number the worker looked at), FN (the
kernel's address), LINGER (how many pauses the worker waits for a next job after this one: a decode step's
GEMVs come every 0.1-1 ms, while after other kernels a spinning thread would only take a core from BLAS),
ARGS (up to MAX_ARGS integer or pointer arguments). The poster writes FN, LINGER and ARGS, then STATE, then
SEQ; a worker runs a job only after its compare-and-swap of STATE from the job number to its negative
succeeded, and the poster's cancel is the compare-and-swap from the job number to 0, so a job runs on a
worker at most once and only with the arguments posted for it. Kernels are called with MAX_ARGS int64
arguments whatever their arity: under the System V x86-64 convention the callee reads its own leading
integer arguments and ignores the rest (every kernel compiled by compile.py takes integers and pointers only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kazeia.native.compile import Library

if TYPE_CHECKING:  # pool.py reads the layout below on every start; llvmlite.ir is imported only to build
    from llvmlite import ir

    from kazeia.native.irkit import Kernel

SEQ, STATE, DONE, SLEEPING, SEEN, FN, LINGER, ARGS = 0, 1, 2, 3, 4, 5, 6, 8
MAX_ARGS = 16
YIELD_EVERY = 32  # idle pauses between two sched_yield calls (a power of two)
SLOT_WORDS = ARGS + MAX_ARGS


def _pause(k: Kernel) -> None:
    from kazeia.native.irkit import VOID

    k.call("llvm.x86.sse2.pause", VOID)


def _cas(k: Kernel, p: ir.Value, old: ir.Value, new: ir.Value) -> ir.Value:
    """Compare-and-swap *p from old to new (sequentially consistent): I1, true when it swapped."""
    pair = k.b.cmpxchg(p, old, new, "seq_cst", "seq_cst")
    return k.b.extract_value(pair, 1)


def _load(k: Kernel, slot: ir.Value, word: int) -> ir.Value:
    return k.b.load_atomic(k.gep(slot, word), "acquire", 8)


def _serve(module: ir.Module) -> None:
    """pool_serve(slot, spin) -> jobs run: run the jobs posted to `slot` until a wait for the next one passes
    its budget of pauses: `spin` before the first job, then the LINGER of the job last run."""
    from llvmlite import ir

    from kazeia.native.irkit import I64, VOID, Kernel, i64, ptr

    k = Kernel(module, "pool_serve", [("slot", ptr(I64)), ("spin", I64)], ret=I64, noalias=False)
    b, slot = k.b, k.a.slot
    idle = k.var(I64, 0, "idle")
    ran = k.var(I64, 0, "ran")
    budget = k.var(I64, k.a.spin, "budget")
    head, body, got, take, wait, end = (k.fn.append_basic_block(n) for n in
                                        ("head", "body", "got", "take", "wait", "end"))
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(b.icmp_signed("<", b.load(idle), b.load(budget)), body, end)
    b.position_at_end(body)
    s = _load(k, slot, SEQ)
    b.cbranch(b.icmp_signed("!=", s, b.load_atomic(k.gep(slot, SEEN), "monotonic", 8)), got, wait)
    b.position_at_end(got)
    b.store_atomic(s, k.gep(slot, SEEN), "monotonic", 8)
    b.store(i64(0), idle)
    b.cbranch(_cas(k, k.gep(slot, STATE), s, b.neg(s)), take, head)  # lost: the poster cancelled it
    b.position_at_end(take)
    fnty = ir.FunctionType(VOID, [I64] * MAX_ARGS)
    fn = b.inttoptr(_load(k, slot, FN), ptr(fnty))
    b.store(b.load(k.gep(slot, LINGER)), budget)
    b.call(fn, [b.load(k.gep(slot, ARGS + j)) for j in range(MAX_ARGS)])
    b.store_atomic(s, k.gep(slot, DONE), "release", 8)
    b.store(b.add(b.load(ran), i64(1)), ran)
    b.branch(head)
    b.position_at_end(wait)
    _pause(k)
    n = b.add(b.load(idle), i64(1))
    b.store(n, idle)
    with b.if_then(b.icmp_signed("==", b.and_(n, i64(YIELD_EVERY - 1)), i64(0))):
        k.call("sched_yield", ir.IntType(32))  # let a thread that wants this core have it (BLAS's, say)
    b.branch(head)
    b.position_at_end(end)
    k.ret(b.load(ran))


def _finish(module: ir.Module) -> None:
    """pool_finish(slot, job) -> 1 if a worker ran `job` (returns once it is done), 0 if it was cancelled."""
    from kazeia.native.irkit import I64, Kernel, i64, ptr

    k = Kernel(module, "pool_finish", [("slot", ptr(I64)), ("job", I64)], ret=I64, noalias=False)
    b, slot = k.b, k.a.slot
    cancelled, spin, end = (k.fn.append_basic_block(n) for n in ("cancelled", "spin", "end"))
    b.cbranch(_cas(k, k.gep(slot, STATE), k.a.job, i64(0)), cancelled, spin)
    b.position_at_end(cancelled)
    b.ret(i64(0))
    b.position_at_end(spin)
    done = b.icmp_signed("==", _load(k, slot, DONE), k.a.job)
    pause = k.fn.append_basic_block("pause")
    b.cbranch(done, end, pause)
    b.position_at_end(pause)
    _pause(k)
    b.branch(spin)
    b.position_at_end(end)
    b.ret(i64(1))


def _exchange(module: ir.Module) -> None:
    """pool_exchange(slot, word, value) -> the word's old value (atomic, sequentially consistent)."""
    from kazeia.native.irkit import I64, Kernel, ptr

    k = Kernel(module, "pool_exchange", [("slot", ptr(I64)), ("word", I64), ("value", I64)], ret=I64,
               noalias=False)
    k.ret(k.b.atomic_rmw("xchg", k.gep(k.a.slot, k.a.word), k.a.value, "seq_cst"))


def _pending(module: ir.Module) -> None:
    """pool_pending(slot) -> 1 when a job was posted that the worker has not looked at yet."""
    from kazeia.native.irkit import I64, Kernel, ptr

    k = Kernel(module, "pool_pending", [("slot", ptr(I64))], ret=I64, noalias=False)
    differ = k.b.icmp_signed("!=", _load(k, k.a.slot, SEQ), _load(k, k.a.slot, SEEN))
    k.ret(k.b.zext(differ, I64))


LIB = Library(__name__, "kazeia_simd_pool")
SERVE = LIB.kernel("pool_serve", _serve)
FINISH = LIB.kernel("pool_finish", _finish)
EXCHANGE = LIB.kernel("pool_exchange", _exchange)
PENDING = LIB.kernel("pool_pending", _pending)
