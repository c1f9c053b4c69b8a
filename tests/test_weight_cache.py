"""The dequantized-weight cache keeps a byte budget and a fixed set of weights (a forward pass is a cycle:
LRU would miss on every access past the budget), and `ref` multiplies the weights it does not keep in tiles."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gq

from kazeia.backends import ref as cpu_mod
from kazeia.backends.ref import RefBackend, WeightCache
from kazeia.graph.tensor import Buffer, GGMLType, make_tensor


def test_the_first_weights_that_fit_are_kept_and_a_cycle_hits_them():
    c = WeightCache(budget_bytes=3 * 4000)
    made = []

    def make(i):
        made.append(i)
        return np.full(1000, i, dtype=np.float32)  # 4000 bytes

    for _ in range(3):                       # three passes over five weights, three fit
        for i in range(5):
            assert c.get(i, lambda i=i: make(i))[0] == i
    assert made == [0, 1, 2, 3, 4, 3, 4, 3, 4]
    assert c.hits == 6 and c.bytes == c.peak_bytes == c.budget


def test_an_item_larger_than_the_budget_is_computed_but_not_kept():
    c = WeightCache(budget_bytes=100)
    a = c.get("big", lambda: np.zeros(1000, dtype=np.float32))
    assert a.size == 1000 and c.bytes == 0 and not c.admits(1000 * 4)


def _q4_0_weight(n: int, k: int, rng) -> object:
    w = rng.standard_normal((n, k)).astype(np.float32)
    raw = gq.quantize(w, GGMLQuantizationType.Q4_0)
    t = make_tensor(GGMLType.Q4_0, (k, n), name="blk.0.ffn_down.weight")
    t.buffer, t.offset = Buffer("w", raw.reshape(-1).copy()), 0
    return t, gq.dequantize(raw, GGMLQuantizationType.Q4_0).astype(np.float64)


def test_ref_multiplies_a_weight_it_does_not_keep_in_tiles_with_the_same_product(monkeypatch):
    rng = np.random.default_rng(3)
    t, w64 = _q4_0_weight(200, 256, rng)
    y = rng.standard_normal((7, 256))
    kept = RefBackend(WeightCache(1 << 30)).weight_matmul(t, y)
    monkeypatch.setattr(cpu_mod, "WEIGHT_TILE_BYTES", 256 * 8 * 30)   # 30 rows a tile: 7 tiles, the last short
    cache = WeightCache(0)
    tiled = RefBackend(cache).weight_matmul(t, y)
    assert cache.bytes == 0
    np.testing.assert_allclose(tiled, y @ w64.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kept, tiled, rtol=1e-12, atol=1e-12)
