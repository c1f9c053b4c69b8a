"""quantize_q8x4x2's native path (quants stored straight into the image rows) gives the numpy quantizer's bytes."""

import numpy as np
import pytest

from kazeia import native as native_kernels
from kazeia.backends.htp.hvx import quant as Q

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="no native HTP kernels on this host")


@pytest.mark.parametrize("seed", range(4))
def test_native_image_is_the_numpy_image(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(40):
        m, k = int(rng.integers(1, 5)), int(rng.choice([32, 96, 256, 288, 544, 2560, 9728]))
        x = (rng.standard_normal((m, k)) * rng.choice([1e-6, 1e-2, 1.0, 3e4])).astype(np.float32)
        x[0, : int(rng.integers(0, 40))] = 0.0
        x[:, int(rng.integers(0, k))] = -0.0
        prev = rng.integers(0, 256, (m, Q.q8x4x2_row_size(k)), dtype=np.uint8)
        cases.append((x, int(rng.choice([32, 64, 128])), prev))
    native = [Q.quantize_q8x4x2(x, g, prev=p) for x, g, p in cases]
    assert any(Q._native_q8x4x2(x, g, p) is not None for x, g, p in cases)
    with native_kernels.portable_only():  # the numpy quantizer
        for (x, g, p), img in zip(cases, native):
            ref = Q.quantize_q8x4x2(x, g, prev=p)
            assert img.shape == ref.shape and img.tobytes() == ref.tobytes()
