"""What is worked out once per object and kept while that object lives: the one cache every "bind once, replay every
token" layer uses (scheduler plans, context graphs, CPU binds and programs, the HTP batch record, bound ops and
matmuls, scratch views, the backends' per-node answers), and the few kept addresses of the native fronts.

An entry is keyed by an object (or a tuple of objects; `by_value=True`: by an ordinary hashable key), holds it, so
its id() is not reused while the entry is there, and is a hit only for that very object. Whether a kept value still
holds is asked of one hook, `valid(value)`, which the bound layers answer from one placement stamp: the
`Placement` token the graph allocator gives a graph each time it places it (graph/alloc.py), plus a buffer's
`version` where a value depends on a buffer's contents. One eviction rule: past `limit` entries the cache starts
empty (the objects of graphs long gone go with it).

One switch: KAZEIA_NO_BIND=1 (kazeia/settings.py). A cache made with `bind=True` then keeps nothing, and every bound
layer asks `binding()` before its bound path and runs its general path instead: the general path is the oracle the
bound one must equal bitwise (tests/test_bind_switch.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from kazeia import settings

V = TypeVar("V")


def binding() -> bool:
    """False under KAZEIA_NO_BIND=1: every bound layer runs its general path."""
    return not settings.get().no_bind


class IdentityCache(Generic[V]):
    __slots__ = ("name", "limit", "bind", "by_value", "_items")

    def __init__(self, name: str, limit: int | None = 4096, bind: bool = False, by_value: bool = False) -> None:
        """`name`: what it keeps (for readers); `limit`: entries before it starts empty (None: no limit, for caches
        whose keys are few and live as long as the process); `bind`: a bound layer's cache, which keeps nothing
        under KAZEIA_NO_BIND=1; `by_value`: keyed by an ordinary hashable key instead of an object's identity."""
        self.name = name
        self.limit = limit
        self.bind = bind
        self.by_value = by_value
        self._items: dict = {}

    def get(self, key, make: Callable[[], V], valid: Callable[[V], bool] | None = None) -> V:
        """The value kept for `key`, made by `make()` when there is none, it was made for another object of the same
        id, or `valid(value)` says it no longer holds."""
        hit = self._items.get(key if self.by_value else _ident(key))
        if hit is not None and (self.by_value or _same(hit[0], key)) and (valid is None or valid(hit[1])):
            return hit[1]
        value = make()
        self.put(key, value)
        return value

    def peek(self, key) -> V | None:
        """The value kept for `key`, or None (nothing is made)."""
        hit = self._items.get(key if self.by_value else _ident(key))
        return hit[1] if hit is not None and (self.by_value or _same(hit[0], key)) else None

    def put(self, key, value: V) -> None:
        if self.bind and not binding():
            return
        if self.limit is not None and len(self._items) >= self.limit:
            self._items.clear()
        self._items[key if self.by_value else _ident(key)] = (key, value)

    def pop(self, key) -> None:
        k = key if self.by_value else _ident(key)
        hit = self._items.get(k)
        if hit is not None and (self.by_value or _same(hit[0], key)):
            del self._items[k]

    def clear(self) -> None:
        self._items.clear()

    def values(self) -> list[V]:
        return [v for _, v in self._items.values()]

    def __len__(self) -> int:
        return len(self._items)


def _ident(key):
    return tuple(map(id, key)) if type(key) is tuple else id(key)


def _same(kept, key) -> bool:
    if type(key) is tuple:
        return type(kept) is tuple and len(kept) == len(key) and all(a is b for a, b in zip(kept, key))
    return kept is key
