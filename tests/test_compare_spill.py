"""debug/compare/spill.py: a reference's arrays round-trip through the spill file bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia.debug.compare.spill import ArrayStore, SpilledArrays, SpilledSources


def _arrays():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((6, 10))
    return [
        base,                                              # float64
        base[:, ::3],                                      # not contiguous
        base.astype(np.float16),
        np.array([np.nan, -np.inf, -0.0, 1e-310]),         # special values, a subnormal
        rng.integers(-2**62, 2**62, size=(3, 1, 4)),       # int64
        rng.integers(0, 2, size=5).astype(bool),
        np.zeros((0, 7), dtype=np.float32),                # empty
        np.float32(3.5) * np.ones(()),                     # 0-d
    ]


def test_arrays_come_back_bitwise_with_their_shape_and_dtype():
    store = ArrayStore()
    m = SpilledArrays(store)
    arrays = _arrays()
    for i, a in enumerate(arrays):
        m[(0, i)] = a
    assert len(m) == len(arrays) and (0, 3) in m and (1, 0) not in m
    for i, a in enumerate(arrays):
        got = m[(0, i)]
        assert got.dtype == a.dtype and got.shape == a.shape
        assert got.tobytes() == np.ascontiguousarray(a).tobytes()
    got = m[(0, 0)]
    got[...] = 0  # a read is a copy: writing it leaves the stored array alone
    assert m[(0, 0)].tobytes() == arrays[0].tobytes()
    assert m.nbytes() == sum(a.nbytes for a in arrays) == store.nbytes
    store.close()


def test_sources_keep_their_indices_and_arrays():
    store = ArrayStore()
    s = SpilledSources(store)
    a, b = _arrays()[:2]
    s[(2, 5)] = [(0, a), (3, b)]
    s[(2, 6)] = []
    got = s[(2, 5)]
    assert [i for i, _ in got] == [0, 3]
    assert got[1][1].tobytes() == np.ascontiguousarray(b).tobytes()
    assert s[(2, 6)] == [] and s.get((9, 9)) is None
    assert s.nbytes() == a.nbytes + b.nbytes
    del s[(2, 6)]
    assert list(s) == [(2, 5)]


def test_object_arrays_are_refused_and_a_truncated_file_is_an_error():
    store = ArrayStore()
    with pytest.raises(TypeError):
        store.put(np.array([object()]))
    h = store.put(np.arange(100, dtype=np.float64))
    store._file.truncate(80)
    with pytest.raises(OSError, match="truncated"):
        store.get(h)
