"""The native kernel threads (native/pool.py): the mailbox protocol of pool_ir.py and pool.run on top of it.

The kernels are real ones (the cpu dequantizers), checked against gguf-py's dequantization; the protocol
is driven by hand (post, serve, finish on one thread) where its outcome is otherwise a race.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from kazeia import native
from kazeia.backends.cpu import qmatmul
from kazeia.backends.cpu.kernels.dequant import DEQUANT
from kazeia.native import pool
from kazeia.native import threads as native_threads

pytestmark = pytest.mark.skipif(not native.available(), reason="no AVX2/FMA/F16C here: no native kernels")


def _q8_rows(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    raw = gq.quantize(w, T.Q8_0)
    return raw, gq.dequantize(raw, T.Q8_0).reshape(n, k)


def _mb():
    from kazeia.native import pool_ir

    return pool_ir, pool_ir.LIB.functions()


def _post(slot: np.ndarray, mb, job: int, fn, args: tuple, linger: int = 0) -> None:
    pool.post(slot, job, pool.address(fn), args, linger)


def _posted_dequant(n: int, k: int, seed: int, job: int, r0: int, r1: int):
    """A mailbox holding job `job`: dequant_q8_0(w, wstride, nb, out, ostride, r0, r1), 7 of the 16 integers the
    worker passes. Returns (mailbox, its address, out, the expected rows)."""
    mb, _ = _mb()
    raw, want = _q8_rows(n, k, seed)
    out = np.zeros((n, k), dtype=np.float32)
    slot = np.zeros(mb.SLOT_WORDS, dtype=np.int64)
    _post(slot, mb, job, DEQUANT["q8_0"].fn,
          (raw.ctypes.data, raw.strides[0], k // 32, out.ctypes.data, k, r0, r1))
    return slot, slot.ctypes.data, out, want


def test_a_served_job_runs_once_with_its_arguments():
    mb, lib = _mb()
    slot, p, out, want = _posted_dequant(24, 64, 0, job=1, r0=3, r1=20)
    assert lib["pool_pending"](p) == 1
    assert lib["pool_serve"](p, 64) == 1  # ran it, then idled 64 pauses
    assert lib["pool_pending"](p) == 0 and slot[mb.DONE] == 1 and slot[mb.STATE] == -1
    np.testing.assert_array_equal(out[3:20], want[3:20])
    assert not out[:3].any() and not out[20:].any()  # r0, r1 reached the kernel: nothing outside written
    assert lib["pool_finish"](p, 1) == 1  # a worker took it: finish reports it done
    out[:] = 0
    assert lib["pool_serve"](p, 64) == 0  # nothing new posted: it does not run again
    assert not out.any()


def test_a_job_cancelled_before_a_worker_takes_it_never_runs():
    mb, lib = _mb()
    slot, p, out, _ = _posted_dequant(8, 32, 1, job=7, r0=0, r1=8)
    assert lib["pool_finish"](p, 7) == 0  # cancelled: the poster did all the work itself
    assert slot[mb.STATE] == 0
    assert lib["pool_serve"](p, 64) == 0  # the worker sees job 7 but loses the compare-and-swap
    assert slot[mb.SEEN] == 7 and slot[mb.DONE] == 0 and not out.any()


def test_exchange_returns_the_old_word():
    mb, lib = _mb()
    slot = np.zeros(mb.SLOT_WORDS, dtype=np.int64)
    assert lib["pool_exchange"](slot.ctypes.data, mb.SLEEPING, 1) == 0
    assert lib["pool_exchange"](slot.ctypes.data, mb.SLEEPING, 0) == 1 and slot[mb.SLEEPING] == 0


def _dequant_all(raw: np.ndarray, n: int, k: int, chunk: int) -> np.ndarray:
    out = np.full((n, k), np.nan, dtype=np.float32)
    ctr = np.zeros(1, dtype=np.int64)
    fn = DEQUANT["q8_0"].par
    pool.run(fn, (raw.ctypes.data, raw.strides[0], k // 32, out.ctypes.data, k, ctr.ctypes.data, n, chunk))
    return out


def test_run_on_two_threads_gives_every_row_once_many_times(monkeypatch):
    monkeypatch.setattr(native_threads, "_n_threads", 2)
    raw, want = _q8_rows(97, 96, 2)
    for rep in range(300):  # back to back (worker spinning) and, every 50, after it went back to sleep
        if rep % 50 == 49:
            threading.Event().wait(0.02)
        np.testing.assert_array_equal(_dequant_all(raw, 97, 96, chunk=1 + rep % 7), want)


def test_concurrent_callers_each_get_their_result(monkeypatch):
    monkeypatch.setattr(native_threads, "_n_threads", 2)
    cases = [_q8_rows(64 + i, 64, 10 + i) for i in range(3)]
    errors: list[BaseException] = []

    def caller(i: int) -> None:
        raw, want = cases[i]
        try:
            for _ in range(100):
                np.testing.assert_array_equal(_dequant_all(raw, want.shape[0], 64, chunk=4), want)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_runs_kernels_without_the_parents_workers(monkeypatch):
    monkeypatch.setattr(native_threads, "_n_threads", 2)
    raw, want = _q8_rows(40, 64, 3)
    np.testing.assert_array_equal(_dequant_all(raw, 40, 64, 2), want)  # the parent's workers exist now
    pid = os.fork()
    if pid == 0:  # the child: a new pool is made on first use, the result is the same
        ok = np.array_equal(_dequant_all(raw, 40, 64, 2), want)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_weight_matmul_is_the_same_on_one_and_two_threads(monkeypatch):
    rng = np.random.default_rng(4)
    raw = gq.quantize(rng.standard_normal((1536, 576)).astype(np.float32), T.Q4_0)  # 0.5 MB: one thread unless forced
    ws = qmatmul.WeightSet([(raw, T.Q4_0, 576)])
    ws.parallel = True  # force the parallel path for this small weight
    x = rng.standard_normal((3, 576)).astype(np.float32)
    monkeypatch.setattr(native_threads, "_n_threads", 1)
    one = ws.matmul(x)
    monkeypatch.setattr(native_threads, "_n_threads", 2)
    for _ in range(20):
        np.testing.assert_array_equal(ws.matmul(x), one)


def test_a_worker_waits_for_a_next_job_only_after_a_lingering_one():
    mb, lib = _mb()
    dq = DEQUANT["q8_0"].fn
    raw, want = _q8_rows(4, 32, 5)
    out = np.zeros((4, 32), dtype=np.float32)
    slot = np.zeros(mb.SLOT_WORDS, dtype=np.int64)
    p = slot.ctypes.data

    def job(n: int, r0: int, linger: int) -> None:
        _post(slot, mb, n, dq, (raw.ctypes.data, raw.strides[0], 1, out.ctypes.data, 32, r0, r0 + 1), linger)

    def serve(result: list) -> None:
        result.append(lib["pool_serve"](p, 1 << 40))

    def wait_done(n: int) -> None:
        for _ in range(10_000):  # until the worker took it (finish would cancel a job nobody took yet)
            if slot[mb.STATE] == -n:
                break
            threading.Event().wait(0.001)
        assert lib["pool_finish"](p, n) == 1  # a taken job cannot be cancelled: finish waits for DONE

    ran: list[int] = []
    t = threading.Thread(target=serve, args=(ran,))
    job(1, 0, linger=1 << 40)  # the worker takes it, then keeps waiting (for hours, if need be)
    t.start()
    wait_done(1)
    job(2, 1, linger=0)  # taken by the same serve call; after it the worker stops waiting
    wait_done(2)
    t.join()
    assert ran == [2]
    job(3, 2, linger=0)  # no serve call is running now: it stays pending
    assert lib["pool_pending"](p) == 1 and slot[mb.STATE] == 3
    np.testing.assert_array_equal(out[:2], want[:2])
    assert not out[2:].any()
