"""A reference's arrays kept in an unlinked temporary file instead of memory.

A reference of one prefill holds REF's float64 output of every op and what each op read: ~1.1 GB for a
40-token prefill of a 36-layer 4B model, resident beside the mapped model, REF's weight cache and the run
under test (5 GB peak measured). Written to a file they live in the page cache, which the kernel can drop,
and an op's arrays are read back when that op is judged.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator, MutableMapping

import numpy as np

Handle = tuple[int, str, tuple[int, ...]]  # (offset in the file, dtype string, shape)


class ArrayStore:
    """Append-only arrays in a temporary file (deleted when closed or when the process ends)."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="kazeia-reference-")
        self._end = 0

    def put(self, a: np.ndarray) -> Handle:
        a = np.asarray(a)
        if a.dtype.hasobject:
            raise TypeError("only plain numeric arrays can be spilled")
        h = (self._end, a.dtype.str, tuple(a.shape))
        a = np.ascontiguousarray(a)  # (0-d arrays come back 1-d: the handle keeps the shape)
        self._file.seek(self._end)
        self._file.write(memoryview(a.reshape(-1)).cast("B"))
        self._end += a.nbytes
        return h

    def get(self, h: Handle) -> np.ndarray:
        off, dt, shape = h
        dtype = np.dtype(dt)
        n = math.prod(shape) * dtype.itemsize
        out = np.empty(shape, dtype=dtype)
        self._file.seek(off)
        if n and self._file.readinto(memoryview(out.reshape(-1)).cast("B")) != n:
            raise OSError("the reference's spill file was truncated")
        return out

    @property
    def nbytes(self) -> int:
        return self._end

    def close(self) -> None:
        self._file.close()


class _Spilled(MutableMapping):
    """key -> value whose arrays live in an ArrayStore (read back, a fresh copy, on every access)."""

    def __init__(self, store: ArrayStore) -> None:
        self.store = store
        self._handles: dict = {}

    def _put(self, value):
        raise NotImplementedError

    def _get(self, handles):
        raise NotImplementedError

    def _handle_list(self, handles) -> list[Handle]:
        raise NotImplementedError

    def __setitem__(self, key, value) -> None:
        self._handles[key] = self._put(value)

    def __getitem__(self, key):
        return self._get(self._handles[key])

    def __delitem__(self, key) -> None:
        del self._handles[key]  # the bytes stay in the file until it is closed

    def __iter__(self) -> Iterator:
        return iter(self._handles)

    def __len__(self) -> int:
        return len(self._handles)

    def __contains__(self, key) -> bool:
        return key in self._handles

    def nbytes(self) -> int:
        return sum(math.prod(s) * np.dtype(d).itemsize for hs in self._handles.values()
                   for _, d, s in self._handle_list(hs))


class SpilledArrays(_Spilled):
    """key -> array."""

    def _put(self, value: np.ndarray) -> Handle:
        return self.store.put(value)

    def _get(self, handle: Handle) -> np.ndarray:
        return self.store.get(handle)

    def _handle_list(self, handle: Handle) -> list[Handle]:
        return [handle]


class SpilledSources(_Spilled):
    """key -> [(source index, array), ...]: what an op read."""

    def _put(self, value: list[tuple[int, np.ndarray]]) -> list[tuple[int, Handle]]:
        return [(i, self.store.put(a)) for i, a in value]

    def _get(self, handles: list[tuple[int, Handle]]) -> list[tuple[int, np.ndarray]]:
        return [(i, self.store.get(h)) for i, h in handles]

    def _handle_list(self, handles: list[tuple[int, Handle]]) -> list[Handle]:
        return [h for _, h in handles]
