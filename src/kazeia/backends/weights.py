"""A bounded cache of dequantized weights (LRU by bytes), used by the float64 `ref` oracle only.

`ref` multiplies exact float64 copies of the weights; keeping all of them would not fit for a 4B model, so
the cache keeps the most recently used matrices up to a byte budget (env KAZEIA_WEIGHT_CACHE_MB, default
6144 MiB); past it the least recently used ones are dropped and recomputed when needed again. The `cpu`
backend and the HTP model keep no such copies: they compute from the quantized bytes (qmatmul.py, htp/).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

DEFAULT_BUDGET_MB = 6144


def default_budget_bytes() -> int:
    mb = os.environ.get("KAZEIA_WEIGHT_CACHE_MB")
    try:
        return int(float(mb) * 2**20) if mb else DEFAULT_BUDGET_MB * 2**20
    except ValueError:
        return DEFAULT_BUDGET_MB * 2**20


class WeightCache:
    def __init__(self, budget_bytes: int | None = None) -> None:
        self.budget = default_budget_bytes() if budget_bytes is None else int(budget_bytes)
        self._items: OrderedDict[object, np.ndarray] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.peak_bytes = 0

    def get(self, key: object, make: Callable[[], np.ndarray]) -> np.ndarray:
        arr = self._items.get(key)
        if arr is not None:
            self._items.move_to_end(key)
            self.hits += 1
            return arr
        self.misses += 1
        arr = make()
        if arr.nbytes <= self.budget:
            self._items[key] = arr
            self.bytes += arr.nbytes
            while self.bytes > self.budget and self._items:
                _, old = self._items.popitem(last=False)
                self.bytes -= old.nbytes
            self.peak_bytes = max(self.peak_bytes, self.bytes)
        return arr

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
