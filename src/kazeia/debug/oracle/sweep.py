"""Sweeps: a pool of forked workers, each dying or hanging one replaced.

A sweep runs each case in a forked worker process: a device death is a result of that case, a worker that
dies (os._exit, a crash of the interpreter) or hangs past the timeout is replaced and its case reported as
CRASH or TIMEOUT, and the sweep goes on.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait as mp_wait
from typing import Any

from kazeia.debug.oracle.backends import BackendSpec, Caches
from kazeia.debug.oracle.cases import Case
from kazeia.debug.oracle.report import SweepResult
from kazeia.debug.oracle.run import case_flops, case_threshold, run_case
from kazeia.debug.oracle.verdicts import CRASH, TIMEOUT, CaseResult
from kazeia.limits import InputLimitError, TextLimits, read_text

DEFAULT_TIMEOUT = 300.0  # seconds per case; the largest default case takes a few seconds

Progress = Callable[[int, int, CaseResult], None]


def run_sweep(cases: list[Case], backend: BackendSpec | str = "HTP0", seed: int = 0, jobs: int = 2,
              timeout: float = DEFAULT_TIMEOUT, progress: Progress | None = None) -> SweepResult:
    """Run every case; jobs >= 1: in that many forked worker processes (a case that kills or hangs its worker is
    reported and the worker replaced); jobs == 0: in this process (no protection against crashes or hangs)."""
    spec = backend if isinstance(backend, BackendSpec) else BackendSpec(backend)
    spec.validate()
    sweep = SweepResult(spec.name, spec.describe(), seed, [],
                        started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    t0 = time.perf_counter()
    results: dict[int, CaseResult] = {}

    def done(i: int, r: CaseResult) -> None:
        results[i] = r
        if progress:
            progress(len(results), len(cases), r)

    try:
        if jobs <= 0:
            caches = Caches()
            for i, c in enumerate(cases):
                done(i, run_case(c, spec, seed, caches))
        else:
            _Pool(spec, seed, min(jobs, max(1, len(cases))), timeout).run(cases, done)
    except KeyboardInterrupt:
        sweep.interrupted = True
    sweep.results = [results[i] for i in sorted(results)]
    sweep.seconds = time.perf_counter() - t0
    return sweep


@dataclass
class _Worker:
    proc: Any
    conn: Any
    log_path: str
    task: tuple[int, Case] | None = None
    deadline: float = 0.0
    key: tuple | None = None


def _worker_main(conn, spec: BackendSpec, seed: int, blas_threads: int | None, log_path: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends its workers
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)  # whatever a case prints must not break the parent's console
    os.dup2(fd, 2)
    if blas_threads:
        with contextlib.suppress(ImportError):
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=blas_threads)
    caches = Caches()
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        i, case = msg
        conn.send((i, run_case(case, spec, seed, caches)))


class _Pool:
    def __init__(self, spec: BackendSpec, seed: int, jobs: int, timeout: float) -> None:
        self.spec, self.seed, self.jobs, self.timeout = spec, seed, jobs, timeout
        self.ctx = mp.get_context("fork")
        self.tmp = tempfile.TemporaryDirectory(prefix="kazeia-oracle-")
        self.n_started = 0
        # more workers than cores make BLAS threads fight; one thread each then
        self.blas_threads = 1 if jobs > 1 else None

    def _spawn(self) -> _Worker:
        parent, child = self.ctx.Pipe()
        self.n_started += 1
        log_path = os.path.join(self.tmp.name, f"worker{self.n_started}.log")
        p = self.ctx.Process(target=_worker_main, args=(child, self.spec, self.seed, self.blas_threads, log_path),
                             daemon=True, name=f"kazeia-oracle-{self.n_started}")
        p.start()
        child.close()
        return _Worker(p, parent, log_path)

    def run(self, cases: list[Case], done: Callable[[int, CaseResult], None]) -> None:
        pending = _group(cases)
        workers = [self._spawn() for _ in range(self.jobs)]
        try:
            while pending or any(w.task for w in workers):
                for w in workers:
                    if w.task is None and pending:
                        self._assign(w, pending, workers)
                busy = [w for w in workers if w.task]
                wait_for = min(w.deadline for w in busy) - time.monotonic()
                mp_wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=max(0.0, wait_for))
                for idx, w in enumerate(workers):
                    if w.task is not None and not self._collect(w, done):
                        workers[idx] = self._spawn()
        finally:
            self._shutdown(workers)

    def _assign(self, w: _Worker, pending: list[tuple[int, Case]], workers: list[_Worker]) -> None:
        # keep a worker on its weight (its caches hold it); else take a weight no other worker is busy with
        held = {x.key for x in workers if x.task is not None}
        pick = next((j for j, (_, c) in enumerate(pending) if w.key is not None and c.weight_key() == w.key), None)
        if pick is None:
            pick = next((j for j, (_, c) in enumerate(pending) if c.weight_key() not in held), 0)
        task = pending.pop(pick)
        w.task, w.key = task, task[1].weight_key()
        w.deadline = time.monotonic() + self.timeout
        with contextlib.suppress(OSError):  # a worker gone between cases: _collect reports it and replaces it
            w.conn.send(task)

    def _collect(self, w: _Worker, done: Callable[[int, CaseResult], None]) -> bool:
        """Handle a busy worker after a wait; False if it is gone (dead or killed) and must be replaced."""
        i, case = w.task
        try:
            if w.conn.poll():
                j, res = w.conn.recv()
                w.task = None
                done(j, res)
                return True
        except (EOFError, OSError):
            pass
        else:
            if w.proc.is_alive():
                if time.monotonic() < w.deadline:
                    return True
                w.proc.kill()
                w.proc.join()
                done(i, self._lost(case, TIMEOUT, f"no result after {self.timeout:g} s (hang); worker killed"))
                w.task = None
                return False
        w.proc.join()
        done(i, self._lost(case, CRASH, f"worker process died ({_exit_text(w.proc.exitcode)})"
                                        f"{_log_tail(w.log_path)}"))
        w.task = None
        return False

    def _lost(self, case: Case, status: str, reason: str) -> CaseResult:
        """The result of a case whose worker never answered."""
        spent = self.timeout if status == TIMEOUT else 0.0
        return CaseResult(case.name, case.op, case.vars, self.spec.name, status, reason, seed=self.seed,
                          max_nmse=case_threshold(case), flops=case_flops(case), seconds=spent)

    def _shutdown(self, workers: list[_Worker]) -> None:
        for w in workers:
            with contextlib.suppress(OSError, ValueError):
                if w.task is None:
                    w.conn.send(None)
        for w in workers:
            w.proc.join(timeout=5 if w.task is None else 0)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
            w.conn.close()
        self.tmp.cleanup()


def _group(cases: list[Case]) -> list[tuple[int, Case]]:
    """Pending work, cases of one weight together (in order of first appearance)."""
    first: dict[tuple | None, int] = {}
    for i, c in enumerate(cases):
        first.setdefault(c.weight_key(), i)
    return sorted(enumerate(cases), key=lambda ic: (first[ic[1].weight_key()], ic[0]))


def _exit_text(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _log_tail(path: str, n: int = 2) -> str:
    try:
        lines = [x.rstrip() for x in read_text(path, TextLimits("child log", max_line=1 << 20)).splitlines()
                 if x.strip()]
    except InputLimitError:
        return ""
    return (": " + " | ".join(lines[-n:])) if lines else ""


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def now_seed() -> int:
    """A fresh seed for a run that was not given one (printed, so the run can be repeated)."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
