"""Vtcm.write_runs, write_views and write_deferred (the writes of the bound decode programs): the same bytes
and checks as `write`."""

import numpy as np
import pytest

from kazeia.backends.htp.vtcm.arena import Vtcm, VtcmAccessError

SIZE = 4096


def _random_ops(seed: int, n: int = 400):
    rng = np.random.default_rng(seed)
    kinds = ["write", "runs", "views", "lazy", "deferred", "fill", "read", "view", "mem"]
    for _ in range(n):
        kind = rng.choice(kinds, p=[.1, .15, .1, .1, .2, .05, .15, .1, .05])
        off = int(rng.integers(0, SIZE))
        nbytes = int(rng.integers(0, min(900, SIZE - off) + 1))
        data = rng.integers(0, 256, nbytes, dtype=np.uint8)
        yield kind, off, nbytes, data, int(rng.integers(0, 256))


@pytest.mark.parametrize("seed", range(8))
def test_run_writes_read_back_as_eager_writes(seed):
    eager, vt = Vtcm(SIZE, fill=None, seed=seed), Vtcm(SIZE, fill=None, seed=seed)
    for kind, off, nbytes, data, value in _random_ops(seed):
        if kind in ("write", "lazy", "deferred"):
            eager.write(off, data)
            if kind == "write":
                vt.write(off, data)
            elif kind == "lazy":  # runs that cut deferred (HMX) images must keep them from landing there
                vt.write_lazy(off, nbytes, lambda d=data: d)
            else:
                vt.write_deferred(off, data)
        elif kind in ("runs", "views"):  # several small pieces, some overlapping, in order
            pieces = [(off + i * 7, data[i * 11:i * 11 + 13]) for i in range(max(1, nbytes // 11))]
            pieces = [(o, d) for o, d in pieces if o + d.size <= SIZE]
            for o, d in pieces:
                eager.write(o, d)
            if kind == "runs":
                vt.write_runs(pieces)
            else:  # a bound program: destination views made first, written later
                spans = [(o, d.size) for o, d in pieces]
                vt.write_views(spans, list(zip(vt.run_views(spans), (d for _, d in pieces))))
        elif kind == "fill":
            eager.fill(off, nbytes, value)
            vt.fill(off, nbytes, value)
        elif kind == "read":
            assert vt.read(off, nbytes) == eager.read(off, nbytes)
        elif kind == "view":
            v = vt.view_u8(off, nbytes)
            assert v.tobytes() == eager.read(off, nbytes)
            v[:] = data
            eager.write(off, data)
        else:
            assert np.array_equal(vt.mem, eager.mem)
    assert np.array_equal(vt.mem, eager.mem)


def test_run_writes_check_every_range():
    vt = Vtcm(64)
    with pytest.raises(VtcmAccessError):
        vt.write_runs([(0, np.ones(8, np.uint8)), (60, np.ones(8, np.uint8))])
    assert vt.read(0, 8) == b"\x01" * 8  # the runs before the bad one were written, as separate writes would
    with pytest.raises(VtcmAccessError):
        vt.write_runs([(-1, np.ones(2, np.uint8))])


def test_deferred_bytes_land_only_where_read_or_split():
    vt = Vtcm(256)
    vt.write_deferred(50, np.arange(100, dtype=np.uint8))
    assert vt.read(60, 10) == bytes(range(10, 20))  # lands 50..70 only
    assert vt._mem[70:150].tolist() == [0] * 80
    vt.write(100, b"\xff" * 10)  # inside: 70..100 land, 110..150 stay deferred
    assert vt._mem[70:100].tolist() == list(range(20, 50)) and vt._mem[110:150].tolist() == [0] * 40
    vt.write(100, b"\xee" * 60)  # covers the rest: nothing left to land
    assert not vt._ready
    assert list(vt.read(40, 130)) == [0] * 10 + list(range(50)) + [0xee] * 60 + [0] * 10
