"""A bounded cache of dequantized weights, used by the float64 `ref` oracle only.

`ref` multiplies exact float64 copies of the weights; keeping all of them would not fit for a 4B model (30 GB),
so the cache keeps the first matrices that fit a byte budget (env KAZEIA_WEIGHT_CACHE_MB, default 768 MiB, so
a run stays within the GGUF size + 1.5 GiB) and admits nothing more once full. A forward pass uses every weight
once in the same order, so evicting the least recently used one would throw away exactly the weight needed
soonest (every access a miss past the budget); keeping a fixed set makes the budget's worth of weights hits on
every pass. Weights not kept are multiplied in tiles of rows (RefBackend), never whole. The `cpu` backend and
the HTP model keep no such copies: they compute from the quantized bytes (qmatmul.py, htp/).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

DEFAULT_BUDGET_MB = 768


def default_budget_bytes() -> int:
    mb = os.environ.get("KAZEIA_WEIGHT_CACHE_MB")
    try:
        return int(float(mb) * 2**20) if mb else DEFAULT_BUDGET_MB * 2**20
    except ValueError:
        return DEFAULT_BUDGET_MB * 2**20


class WeightCache:
    def __init__(self, budget_bytes: int | None = None) -> None:
        self.budget = default_budget_bytes() if budget_bytes is None else int(budget_bytes)
        self._items: dict[object, np.ndarray] = {}
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.peak_bytes = 0

    def get(self, key: object, make: Callable[[], np.ndarray]) -> np.ndarray:
        arr = self._items.get(key)
        if arr is not None:
            self.hits += 1
            return arr
        self.misses += 1
        arr = make()
        if self.admits(arr.nbytes):
            self._items[key] = arr
            self.bytes += arr.nbytes
            self.peak_bytes = max(self.peak_bytes, self.bytes)
        return arr

    def cached(self, key: object) -> np.ndarray | None:
        """The kept array for key, or None (counts a hit when found)."""
        arr = self._items.get(key)
        if arr is not None:
            self.hits += 1
        return arr

    def admits(self, nbytes: int) -> bool:
        """Whether an array of nbytes would be kept now."""
        return self.bytes + nbytes <= self.budget

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
