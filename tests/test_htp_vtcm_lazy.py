"""Vtcm.write_lazy: deferred writes are observably the same as eager ones, and are skipped when overwritten."""

import numpy as np
import pytest

from kazeia.backends.htp.vtcm.arena import Vtcm, VtcmAccessError

SIZE = 4096


def _random_ops(seed: int, n: int = 300):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        kind = rng.choice(["write", "lazy", "fill", "read", "view", "mem"], p=[.2, .35, .1, .15, .1, .1])
        off = int(rng.integers(0, SIZE))
        nbytes = int(rng.integers(0, min(700, SIZE - off) + 1))
        data = rng.integers(0, 256, nbytes, dtype=np.uint8)
        yield kind, off, nbytes, data, int(rng.integers(0, 256))


@pytest.mark.parametrize("seed", range(6))
def test_lazy_writes_read_back_as_eager_writes(seed):
    eager, lazy = Vtcm(SIZE, fill=None, seed=seed), Vtcm(SIZE, fill=None, seed=seed)
    for kind, off, nbytes, data, value in _random_ops(seed):
        if kind == "write":
            eager.write(off, data)
            lazy.write(off, data)
        elif kind == "lazy":
            eager.write(off, data)
            lazy.write_lazy(off, nbytes, lambda d=data: d)
        elif kind == "fill":
            eager.fill(off, nbytes, value)
            lazy.fill(off, nbytes, value)
        elif kind == "read":
            assert lazy.read(off, nbytes) == eager.read(off, nbytes)
        elif kind == "view":  # a view is writable: what is written through it stays
            v = lazy.view_u8(off, nbytes)
            assert v.tobytes() == eager.read(off, nbytes)
            v[:] = data
            eager.write(off, data)
        else:
            assert np.array_equal(lazy.mem, eager.mem)
    assert np.array_equal(lazy.mem, eager.mem)


def test_overwritten_lazy_write_is_never_made():
    v = Vtcm(1024)
    made = []
    v.write_lazy(100, 200, lambda: made.append(1) or np.full(200, 7, np.uint8))
    v.write(0, np.ones(150, np.uint8))     # covers the head
    v.fill(150, 200, 3)                    # and the rest
    assert v.read(0, 1024)[:350] == b"\x01" * 150 + b"\x03" * 200
    assert not made


def test_partly_overwritten_lazy_write_keeps_only_its_live_bytes():
    v = Vtcm(64)
    v.write_lazy(8, 16, lambda: np.arange(16, dtype=np.uint8))
    v.write(12, b"\xff\xff")
    assert list(v.read(8, 16)) == [0, 1, 2, 3, 255, 255, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]


def test_lazy_write_checks_its_range_now_and_its_size_when_made():
    v = Vtcm(64)
    with pytest.raises(VtcmAccessError):
        v.write_lazy(60, 8, lambda: np.zeros(8, np.uint8))
    v.write_lazy(0, 8, lambda: np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match="made 4 B, announced 8"):
        v.read(0, 1)


def test_lazy_write_cut_into_again_and_again_is_landed_with_the_same_bytes():
    """An image that later writes keep cutting into (a prefill's HMX tiles under a decode's scratch) is made and
    landed after LAND_AFTER_HITS covers, once; what reads see is what eager writes give, before and after."""
    from kazeia.backends.htp.vtcm.arena import LAND_AFTER_HITS

    eager, lazy = Vtcm(SIZE, fill=None, seed=1), Vtcm(SIZE, fill=None, seed=1)
    image = np.random.default_rng(2).integers(0, 256, 2048, dtype=np.uint8)
    made = []
    eager.write(512, image)
    lazy.write_lazy(512, 2048, lambda: made.append(1) or image)
    for i in range(LAND_AFTER_HITS + 8):
        off = 512 + 7 * (i % 50)
        data = np.full(5, i, np.uint8)
        eager.write(off, data)
        lazy.write(off, data)
        if i == LAND_AFTER_HITS - 2:
            assert not made  # still deferred
    assert made == [1] and not lazy._pending
    assert np.array_equal(lazy.mem, eager.mem)


def test_write_views_beside_a_lazy_image_leaves_it_deferred():
    from kazeia.backends.htp.vtcm.arena import span_box

    v = Vtcm(SIZE)
    made = []
    v.write_lazy(2048, 1024, lambda: made.append(1) or np.full(1024, 9, np.uint8))
    v.write_deferred(0, np.full(512, 4, np.uint8))
    spans = [(100, 8), (300, 16)]
    for _ in range(3 * 64):
        v.write_views(spans, list(zip(v.run_views(spans), (np.full(8, 1, np.uint8), np.full(16, 2, np.uint8)))),
                      span_box(spans))
    assert not made
    assert v.read(96, 240)[4:12] == b"\x01" * 8 and v.read(2048, 4) == b"\x09" * 4 and made == [1]
    assert v.read(0, 100) == b"\x04" * 100
