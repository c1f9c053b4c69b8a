"""The device model's exp (kernels/expf.py): native, portable twin and the rule stated with numpy's float64
element-wise operations give the same bits, on random bit patterns and the edges of float32's range."""

from __future__ import annotations

import numpy as np

from kazeia.backends.htp.kernels import expf
from kazeia.native.compile import portable_only


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    edges = np.array([0, -0.0, np.inf, -np.inf, np.nan, 88.72283, 88.72284, 88.7229, -87.3, -103.9, -103.98,
                      -104, -110, -200, 100, 1e-30, -1e-30, 1e-45], dtype=np.float32)
    return np.concatenate([(rng.standard_normal(100_003) * 30).astype(np.float32),
                           rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                           edges])


def test_native_twin_and_rule_agree():
    x = _inputs()
    want = expf.exp_rule_numpy(x).view(np.uint32)
    assert np.array_equal(expf.exp_f32(x).view(np.uint32), want)
    with portable_only():
        assert np.array_equal(expf.exp_f32(x).view(np.uint32), want)


def test_close_to_exp():
    """Within one float32 ulp of the float64 exp rounded (correctly rounded on every value tried here)."""
    x = _inputs()
    x = x[np.isfinite(x)]
    with np.errstate(all="ignore"):
        ref = np.exp(x.astype(np.float64)).astype(np.float32)
    d = np.abs(expf.exp_f32(x).view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64))
    assert d.max() <= 1


def test_in_place_and_shapes():
    x = np.linspace(-20, 5, 3 * 1031, dtype=np.float32).reshape(3, 1031)
    want = expf.exp_rule_numpy(x)
    y = x.copy()
    expf.exp_f32(y, out=y)
    assert np.array_equal(y, want) and np.array_equal(expf.exp_f32(x[:, ::2]), want[:, ::2])
    assert expf.exp_f32(np.zeros(0, np.float32)).shape == (0,)


def _swiglu_ufuncs(a: np.ndarray, g: np.ndarray) -> np.ndarray:
    """bound_ops._swiglu's numpy form: negate, exp by the rule, 1 +, divide, multiply (float32 each)."""
    with np.errstate(all="ignore"):
        e = expf.exp_f32(np.negative(a))
        return np.divide(a, np.add(np.float32(1), e)) * g


def test_native_swiglu_is_the_ufuncs_or_declines():
    rng = np.random.default_rng(3)
    for n in (8, 64, 1024 + 8, 9728, 3 * 1024, 1 << 18):  # row edges, a decode's FFN width, the parallel size
        a = (rng.standard_normal(n) * rng.choice([1e-20, 1.0, 30.0, 200.0])).astype(np.float32)
        g = rng.standard_normal(n).astype(np.float32)
        a[: min(n, 4)] = np.array([0.0, -0.0, 88.8, -104.0], np.float32)[: min(n, 4)]
        out = np.empty_like(a)
        assert expf.swiglu_f32(a, g, out)
        assert out.tobytes() == _swiglu_ufuncs(a, g).tobytes(), n
    for bad in (np.nan, np.inf, -np.inf):
        a = np.ones(64, np.float32)
        g = np.ones(64, np.float32)
        a[17] = bad
        assert not expf.swiglu_f32(a, g, np.empty_like(a))
        g, a = a, g
        assert not expf.swiglu_f32(a, g, np.empty_like(a))
    assert not expf.swiglu_f32(np.ones(12, np.float32), np.ones(12, np.float32), np.empty(12, np.float32))
