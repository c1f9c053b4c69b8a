"""The portable twins: numba, set up once and imported only when a twin is first called (its import costs ~0.2-0.4 s,
and on hosts with AVX2 the native kernels serve every hot path, so numba is usually never imported).

A kernel family writes its portable twin beside its IR and its front, with this module's decorators instead of
numba's:

    from kazeia.native.portable import intrinsic, jit, prange

    @jit(parallel=True, cache=True)
    def hvx_dot_portable(blocks, ...):
        for c in prange(n): ...

On the first call of any twin of a module, every twin and intrinsic of that module (and those it imports from other
families) becomes the numba object it declares, in the module's namespace, and `prange` becomes numba's: numba
then compiles each on its first call and caches it on disk (`cache=True`: in __pycache__ beside the family).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

_given_threads: int | None = None
_configured = False


class _Prange:
    """Stands for numba.prange until the module's twins are made (calling a twin makes them first)."""

    def __call__(self, *a):  # pragma: no cover - never called: twins run only once made
        raise RuntimeError("prange outside a portable twin")


prange = _Prange()


class _Twin:
    """A numba function not made yet: `jit(**opts)(fn)` or `intrinsic(fn)`."""

    __slots__ = ("py", "opts", "kind", "made")

    def __init__(self, py: Callable, opts: dict, kind: str) -> None:
        self.py, self.opts, self.kind, self.made = py, opts, kind, None

    def __call__(self, *args, **kw):
        return materialize(self.py.__globals__)[self.py.__name__](*args, **kw)

    def make(self):
        """The numba object (made once); the function's own module is made too, so that whatever it calls by a
        global name is a numba object when numba compiles it."""
        if self.made is None:
            _configure()
            if self.kind == "intrinsic":
                from numba.extending import intrinsic as nb_intrinsic

                self.made = nb_intrinsic(self.py)
            else:
                import numba

                self.made = numba.njit(**self.opts)(self.py)
            materialize(self.py.__globals__)
        return self.made


def jit(**opts) -> Callable[[Callable], _Twin]:
    """numba.njit(**opts), made on first use."""
    return lambda fn: _Twin(fn, opts, "jit")


def intrinsic(fn: Callable) -> _Twin:
    """numba.extending.intrinsic, made on first use (its typing function imports numba's types itself)."""
    return _Twin(fn, {}, "intrinsic")


def materialize(namespace: dict) -> dict:
    """Replace every twin (and prange) in a module's namespace by its numba object; returns the namespace."""
    import numba

    for name, value in list(namespace.items()):
        if isinstance(value, _Twin):
            namespace[name] = value.make()
        elif value is prange:
            namespace[name] = numba.prange
    return namespace


def _configure() -> None:
    global _configured
    if _configured:
        return
    import numba

    if "NUMBA_THREADING_LAYER" not in os.environ:
        # the OpenMP layer's threads spin after each kernel and halve the BLAS GEMM that follows (measured: 200
        # vs 58 ms for a tiled Q4_0 prefill matmul of 9728x2560 at M=128); the workqueue layer's threads sleep
        numba.config.THREADING_LAYER = "workqueue"
    if _given_threads is not None:
        _set_numba_threads(_given_threads)
    _configured = True


def _set_numba_threads(n: int) -> None:
    import numba

    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


def set_threads(n: int) -> None:
    """numba's threads (the -t flag, threads.py): now if numba is set up, else when it is."""
    global _given_threads
    _given_threads = int(n)
    if _configured and "numba" in sys.modules:
        _set_numba_threads(n)
