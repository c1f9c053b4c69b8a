"""The float64 sum of squares the device's RMS_NORM and L2_NORM take (backends/sum_squares.py) gives numpy einsum's
bits, which recorded the device's digests (numpy's baseline einsum: two float64 lanes, four steps unrolled); its
native kernel and its numba twin agree; RMS_NORM's one-pass kernel gives numpy's steps' bits, in place too."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia import native
from kazeia.backends import sum_squares as S

LENGTHS = (1, 2, 3, 7, 8, 9, 15, 16, 17, 37, 128, 1000, 2560)


def _rows(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal((24, n)) * rng.uniform(1e-4, 1e4, (24, 1))).astype(np.float32)
    x[0] = 0.0
    x[1, ::3] = -0.0
    x[2, : min(n, 5)] = 3e38  # squares far past float32, exact in float64
    x[3] = rng.standard_normal(n).astype(np.float32) * np.float32(1e-40)  # subnormal float32
    return x


def _einsum(x: np.ndarray) -> np.ndarray:
    return np.einsum("...i,...i->...", x, x, dtype=np.float64)


@pytest.mark.parametrize("n", LENGTHS)
def test_the_order_is_numpy_einsums(n):
    x = _rows(np.random.default_rng(n), n)
    assert S.sum_squares(x).tobytes() == _einsum(x).tobytes()
    twin = np.empty(x.shape[0])
    S.sum_squares_portable(x, twin)
    assert twin.tobytes() == _einsum(x).tobytes()


def test_views_and_leading_axes():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 32, 130)).astype(np.float32)
    for v in (x, x[:, :, ::2], x[..., 1:129], x.transpose(0, 2, 1, 3)):
        got = S.sum_squares(v)
        assert got.shape == v.shape[:-1]
        assert got.tobytes() == _einsum(v).tobytes()


@pytest.mark.skipif(not native.available(), reason="no native kernels on this host")
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_rms_pass_gives_numpy_steps_bits(n, eps):
    x = _rows(np.random.default_rng(100 + n), n)
    x[4, 0] = np.inf
    with np.errstate(all="ignore"):
        inv = (1.0 / np.sqrt(_einsum(x) / n + eps)).astype(np.float32)
        want = x * inv[:, None]
        y = np.full_like(x, np.nan)
        S.RmsRows.of(x, y, eps)()
        assert y.tobytes() == want.tobytes()
        inplace = x.copy()
        S.RmsRows.of(inplace, inplace, eps)()
        assert inplace.tobytes() == want.tobytes()
        strided = np.repeat(x, 2, axis=0)[::2]  # rows two apart
        out = np.empty((x.shape[0] * 2, n), np.float32)[::2]
        S.RmsRows.of(strided, out, eps)()
        assert out.tobytes() == want.tobytes()


def test_rms_pass_declines_what_it_cannot_address():
    x = np.ones((4, 8), np.float32)
    assert S.RmsRows.of(x[:, ::2], np.empty((4, 4), np.float32), 1e-6) is None  # elements not adjacent
    assert S.RmsRows.of(x, np.empty((4, 8), np.float64), 1e-6) is None
