"""native/stream.py, the streaming read bench/stream.py measures bandwidth with: it reads every element once (its
wrapping sum is numpy's), whole or split across the kernel threads."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia.native.compile import available
from kazeia.native.stream import ROW, read_gbs, stream_sum
from kazeia.native.threads import set_threads, threads


@pytest.mark.skipif(not available(), reason="native kernels not available on this host")
@pytest.mark.parametrize("n", [16, ROW, 3 * ROW + 48])
def test_the_pass_reads_every_element(n):
    x = np.random.default_rng(n).integers(-(1 << 62), 1 << 62, size=n, dtype=np.int64)
    want = int(x.sum(dtype=np.uint64).astype(np.int64))
    old = threads()
    try:
        for t in (1, 2):
            set_threads(t)
            assert stream_sum(x) == want
    finally:
        set_threads(old)
    assert read_gbs(np.ones(1 << 20, dtype=np.uint8), 2) > 0
