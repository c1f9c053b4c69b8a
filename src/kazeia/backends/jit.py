"""numba, configured once and imported only when a kernel module is first needed (its import costs ~0.4 s).

Kernel modules (`qkernels`, `htp.kernels`) are compiled on first use and cached on disk by numba (`cache=True`,
in __pycache__ beside them), so later processes load them in milliseconds.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

_loaded: dict[str, ModuleType] = {}


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


def set_threads(n: int) -> None:
    """Threads of the numba kernels (at most numba's pool size, the CPU count by default)."""
    import numba

    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))
