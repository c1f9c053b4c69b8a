"""The dequantized-weight cache keeps a byte budget (so a 4B model fits in 16 GB) and evicts LRU."""

from __future__ import annotations

import numpy as np

from kazeia.backends.weights import WeightCache


def test_lru_eviction_keeps_the_budget():
    c = WeightCache(budget_bytes=3 * 4000)
    made = []

    def make(i):
        made.append(i)
        return np.full(1000, i, dtype=np.float32)  # 4000 bytes

    for i in range(3):
        c.get(i, lambda i=i: make(i))
    c.get(0, lambda: make(0))  # hit: 0 becomes most recent
    c.get(3, lambda: make(3))  # evicts 1, the least recently used
    assert c.bytes <= c.budget and made == [0, 1, 2, 3]
    c.get(1, lambda: make(1))  # 1 was evicted: recomputed
    assert made[-1] == 1 and c.hits == 1
    assert c.peak_bytes <= c.budget


def test_an_item_larger_than_the_budget_is_computed_but_not_kept():
    c = WeightCache(budget_bytes=100)
    a = c.get("big", lambda: np.zeros(1000, dtype=np.float32))
    assert a.size == 1000 and c.bytes == 0
