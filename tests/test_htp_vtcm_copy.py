"""Vtcm.write_views with its copies made natively (fast.CopyRuns) and the covers of deferred writes made ready write
by ready write (Vtcm._cover_spans): the bytes of eager `write`s of the same pieces, in the same order, with ring
images (write_deferred) and HMX images (write_lazy) pending over and around them."""

import numpy as np
import pytest

from kazeia import native as native_kernels
from kazeia.backends.htp.kernels.vtcm_copy import CopyRuns
from kazeia.backends.htp.vtcm.arena import Vtcm, span_box

SIZE = 8192


def _pieces(rng, off: int, nbytes: int, data: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Small pieces from off on, some overlapping, some apart (a bound scratch program's runs)."""
    step = int(rng.integers(5, 300))
    out = [(off + i * step, data[i * 11:i * 11 + int(rng.integers(1, 200))]) for i in range(max(1, nbytes // 40))]
    return [(o, d) for o, d in out if o + d.size <= SIZE and d.size]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("seed", [0, 1, *(pytest.param(s, marks=pytest.mark.slow) for s in range(2, 6))])
def test_views_with_native_copies_are_eager_writes(seed, native):
    if native and not native_kernels.available():
        pytest.skip("no native HTP kernels on this host")
    rng = np.random.default_rng(seed)
    eager, vt = Vtcm(SIZE, fill=None, seed=seed), Vtcm(SIZE, fill=None, seed=seed)
    for _ in range(500):
        kind = rng.choice(["deferred", "lazy", "views", "write", "read", "mem"], p=[.3, .05, .4, .1, .1, .05])
        off = int(rng.integers(0, SIZE))
        nbytes = int(rng.integers(1, min(3000, SIZE - off) + 1))
        data = rng.integers(0, 256, nbytes, dtype=np.uint8)
        if kind in ("deferred", "lazy", "write"):
            eager.write(off, data)
            if kind == "deferred":
                vt.write_deferred(off, data)
            elif kind == "lazy":
                vt.write_lazy(off, nbytes, lambda d=data: d)
            else:
                vt.write(off, data)
        elif kind == "views":
            pieces = _pieces(rng, off, nbytes, data)
            if not pieces:
                continue
            for o, d in pieces:
                eager.write(o, d)
            spans = [(o, d.size) for o, d in pieces]
            pairs = list(zip(vt.run_views(spans), (d for _, d in pieces)))
            copy = CopyRuns.of(pairs) if native else None
            vt.write_views(spans, pairs, span_box(spans) if rng.random() < .7 else None, copy)
        elif kind == "read":
            assert vt.read(off, nbytes) == eager.read(off, nbytes)
        else:
            assert np.array_equal(vt.mem, eager.mem)
    assert np.array_equal(vt.mem, eager.mem)
