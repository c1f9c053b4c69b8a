"""numba, configured once and imported only when a kernel module is first needed (its import costs ~0.4 s).

Kernel modules (`qkernels`, `htp.kernels`) are compiled on first use and cached on disk by numba (`cache=True`,
in __pycache__ beside them), so later processes load them in milliseconds. On hosts with AVX2 the native
kernels (native.py) serve the hot paths and numba is not imported at all for them.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from kazeia.backends import native

_loaded: dict[str, ModuleType] = {}
_threads: int | None = None


def kernels(module: str) -> ModuleType:
    """The kernel module `module` (e.g. "kazeia.backends.qkernels"), numba set up before its first import."""
    mod = _loaded.get(module)
    if mod is None:
        _configure()
        mod = _loaded[module] = importlib.import_module(module)
    return mod


def _configure() -> None:
    import numba

    if "NUMBA_THREADING_LAYER" not in os.environ:
        # the OpenMP layer's threads spin after each kernel and halve the BLAS GEMM that follows (measured: 200
        # vs 58 ms for a tiled Q4_0 prefill matmul of 9728x2560 at M=128); the workqueue layer's threads sleep
        numba.config.THREADING_LAYER = "workqueue"
    if _threads is not None:
        _set_numba_threads(_threads)


def _set_numba_threads(n: int) -> None:
    import numba

    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


def set_threads(n: int) -> None:
    """Threads of the kernels: the native pool's, and numba's (now if numba is loaded, else when it is)."""
    global _threads
    _threads = int(n)
    native.set_threads(n)
    if "numba" in sys.modules and _loaded:
        _set_numba_threads(n)
