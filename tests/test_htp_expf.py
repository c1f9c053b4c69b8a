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
