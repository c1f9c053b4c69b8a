"""Memory the native kernels are handed: array addresses, and scratch kept per thread between calls.

Kernels take integers and pointers only. `ptr(a)` is an array's address; `kept_ptr(a)` the same for an array
passed again and again (a weight's block view, a lookup table), kept by the array object. Scratch buffers are
per thread (two sessions may run on two threads) and kept between calls: a fresh multi-MB buffer costs its page
faults on every call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from kazeia.identity import IdentityCache


def ptr(a: np.ndarray) -> int:
    """The address of an array's first element (what the native kernels take)."""
    return a.__array_interface__["data"][0]


_PTRS = IdentityCache("native.kept_ptr", limit=8192)


def kept_ptr(a: np.ndarray) -> int:
    """`ptr` of an array that is passed again and again, kept by the array object (which the entry holds, so its
    id is not reused while it is there)."""
    return _PTRS.get(a, lambda: ptr(a))


class ThreadScratch:
    """Per-thread scratch arrays, made by `make()` on a thread's first call for a key and kept (at most `limit`
    keys a thread: past it, the thread's arrays are dropped and made again)."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._local = threading.local()

    def get(self, key, make: Callable[[], object]):
        cache = getattr(self._local, "items", None)
        if cache is None:
            cache = self._local.items = {}
        hit = cache.get(key)
        if hit is None:
            if len(cache) > self.limit:
                cache.clear()
            hit = cache[key] = make()
        return hit


class GrowingScratch:
    """One flat per-thread array that only grows: `take(n)` is a view of at least n elements, its pages touched
    once. `minimum`: elements allocated at least (a caller that asks for tiles of one size)."""

    def __init__(self, dtype=np.float32, minimum: int = 0) -> None:
        self.dtype, self.minimum = np.dtype(dtype), minimum
        self._local = threading.local()

    def take(self, n: int) -> np.ndarray:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.size < n:
            buf = self._local.buf = np.empty(max(n, self.minimum), dtype=self.dtype)
        return buf
