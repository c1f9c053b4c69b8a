"""The one thread setting (`-t`): BLAS's threads, the numba kernels' threads and the native kernel pool's, set from
one place, for this process and for the child processes the forensic tools start (kernels are bitwise
reproducible at a fixed thread count, so a child must not pick its own).

BLAS threading is switched cheaply: OpenBLAS's threads spin while they wait. For tiny products (the HVX kernel's
thousands of K=32 GEMMs) two threads are slower than one, and on a machine where another process holds a core they
are 10-50x slower. Decode matvecs do gain from two threads on an idle machine (memory bandwidth: ~40 vs ~27 GB/s
measured here), so only the tiny-GEMM kernels switch (`single_blas_thread`). A single ThreadpoolController switches
the limit in microseconds (threadpoolctl's threadpool_limits re-inspects the process each time: ~0.5 ms).
"""

from __future__ import annotations

import contextlib
import os

_n_threads = 2 if (os.cpu_count() or 1) >= 2 else 1  # the native pool's (and numba's, once -t is given)
_given: int | None = None  # this process's -t: every child process a forensic tool starts gets the same
_controller = None


def threads() -> int:
    """Threads the native kernels run on (this one and the pool's workers)."""
    return _n_threads


def given() -> int | None:
    """The -t this process was given, or None."""
    return _given


def set_threads(n: int | None) -> None:
    """The -t flag: BLAS threads and the kernels' (set_kernel_threads); None or n <= 0: unchanged."""
    global _given
    if n is None or n <= 0:
        return
    _given = int(n)
    set_blas_threads(_given)
    set_kernel_threads(_given)


def set_kernel_threads(n: int) -> None:
    """The native pool's threads and numba's (now if numba is loaded, else when it is), BLAS's left as they are."""
    global _n_threads
    _n_threads = max(1, min(int(n), os.cpu_count() or 1))
    from kazeia.native import portable

    portable.set_threads(int(n))


def child_threads(share: int = 1) -> int | None:
    """The -t a child process gets (None: this process was given none); `share`: children running at once."""
    return None if _given is None else max(1, _given // max(1, share))


def apply_threads(job: dict) -> None:
    """In a child: the thread count its parent put in the job."""
    if job.get("threads"):
        set_threads(int(job["threads"]))


def _get():
    global _controller
    if _controller is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            return None
        _controller = ThreadpoolController()
    return _controller


def single_blas_thread() -> contextlib.AbstractContextManager:
    c = _get()
    return c.limit(limits=1, user_api="blas") if c is not None else contextlib.nullcontext()


def set_blas_threads(n: int) -> None:
    """Process-wide BLAS thread count (the -t flag)."""
    c = _get()
    if c is not None and n > 0:
        c.limit(limits=n, user_api="blas")  # the returned limiter is not restored: it stays in force
