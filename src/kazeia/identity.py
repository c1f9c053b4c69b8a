"""What is worked out once per object and kept while that object lives: the one identity cache every "bind once,
replay every token" layer uses (scheduler plans, context graphs, CPU binds, the HTP batch record, bound ops and
matmuls, the backends' per-node answers), and the few kept addresses of the native fronts.

An entry is keyed by the object itself (or a tuple of objects), holds it (so its id() is not reused while the
entry is there) and is a hit only for that very object. Whether a kept value is still right is asked of one hook,
`valid(value)`, which the layers answer from one placement stamp (graph/alloc.py: where the allocator put the
graph, and the buffers' versions), not by re-testing what they bound. One eviction rule: past `limit` entries
the cache starts empty (the objects of graphs long gone go with it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class IdentityCache(Generic[V]):
    __slots__ = ("name", "limit", "_items")

    def __init__(self, name: str, limit: int | None = 4096) -> None:
        """`name`: what it keeps (for readers and for `stats`); `limit`: entries before it starts empty (None: no
        limit, for caches whose keys are few and live as long as the process)."""
        self.name = name
        self.limit = limit
        self._items: dict = {}

    def get(self, key, make: Callable[[], V], valid: Callable[[V], bool] | None = None) -> V:
        """The value kept for `key` (an object or a tuple of objects), made by `make()` when there is none, it
        was made for another object of the same id, or `valid(value)` says it no longer holds."""
        hit = self._items.get(_ident(key))
        if hit is not None and _same(hit[0], key) and (valid is None or valid(hit[1])):
            return hit[1]
        value = make()
        self.put(key, value)
        return value

    def peek(self, key) -> V | None:
        """The value kept for `key`, or None (nothing is made)."""
        hit = self._items.get(_ident(key))
        return hit[1] if hit is not None and _same(hit[0], key) else None

    def put(self, key, value: V) -> None:
        if self.limit is not None and len(self._items) >= self.limit:
            self._items.clear()
        self._items[_ident(key)] = (key, value)

    def pop(self, key) -> None:
        hit = self._items.get(_ident(key))
        if hit is not None and _same(hit[0], key):
            del self._items[_ident(key)]

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


def _ident(key):
    return tuple(map(id, key)) if type(key) is tuple else id(key)


def _same(kept, key) -> bool:
    if type(key) is tuple:
        return type(kept) is tuple and len(kept) == len(key) and all(a is b for a, b in zip(kept, key))
    return kept is key
