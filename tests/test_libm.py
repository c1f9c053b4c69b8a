"""backends/libm.py: kazeia's own transcendental rules. Oracles: numpy's float64 functions for accuracy (within a
few ulp; the float32 forms equal the correctly rounded float32 of numpy's float64 result), and the same rules run
in a child process whose numpy is held to the x86-64 baseline (NPY_DISABLE_CPU_FEATURES), where numpy's own
functions take other routines: the rules' bits must not move."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from kazeia.backends import libm
from kazeia.backends.htp.kernels.expf import DSP_MATH, exp_f32
from kazeia.native.compile import portable_only

RNG = np.random.default_rng(34)
WIDE = np.concatenate([RNG.standard_normal(20000) * 30, RNG.uniform(-700, 700, 20000),
                       RNG.standard_normal(2000) * 1e-9, [0.0, -0.0, 1e-300, -1e-300]])


def ulps(got: np.ndarray, want: np.ndarray) -> float:
    ok = np.isfinite(want) & (want != 0)
    return float(np.max(np.abs(got[ok] - want[ok]) / np.spacing(np.abs(want[ok]))))


@pytest.mark.parametrize("name, x, tol", [
    ("exp", WIDE, 2), ("expm1", WIDE[np.abs(WIDE) < 50], 3), ("log", np.abs(WIDE) + 1e-300, 2),
    ("log1p", np.concatenate([WIDE[WIDE > -1], RNG.uniform(-1, 0, 5000)]), 4), ("tanh", WIDE, 3),
])
def test_each_rule_is_within_a_few_ulp_of_float64(name, x, tol):
    assert ulps(getattr(libm, name)(x), getattr(np, name)(x)) <= tol


def test_cos_sin_and_power_hold_rope_angles():
    theta = np.concatenate([RNG.uniform(0, 2e5, 20000), RNG.standard_normal(2000) * 4, np.arange(0, 131072, 13.0)])
    cos, sin = libm.cos_sin(theta)
    assert ulps(cos, np.cos(theta)) <= 3 and ulps(sin, np.sin(theta)) <= 3
    for base in (10000.0, 500000.0, 1e6, 2.0):
        y = -np.arange(0, 256, 2, dtype=np.float64) / 256
        assert ulps(libm.power(base, y), base ** y) <= 3


@pytest.mark.parametrize("name", ["exp", "log1p", "tanh"])
def test_float32_forms_round_the_float64_value(name):
    x = (RNG.standard_normal(200000) * 6).astype(np.float32)
    if name == "log1p":
        x = np.abs(x)
    got = libm.f32(getattr(libm, name), x)
    want = getattr(np, name)(x.astype(np.float64)).astype(np.float32)
    assert np.count_nonzero(got != want) <= 2  # a tie within 1e-16 of a float32 rounding boundary, at most


def test_special_values():
    with np.errstate(all="ignore"):
        assert np.array_equal(libm.log1p(np.array([np.inf, -1.0, 0.0])), [np.inf, -np.inf, 0.0])
        assert np.isnan(libm.log1p(np.array([-2.0, np.nan]))).all()
        assert np.array_equal(libm.tanh(np.array([np.inf, -np.inf, 40.0, -0.0])), [1.0, -1.0, 1.0, -0.0])
        assert np.signbit(libm.tanh(np.array([-0.0])))[0]
        assert np.array_equal(libm.exp(np.array([np.inf, -np.inf, 800.0, -800.0])), [np.inf, 0.0, np.inf, 0.0])
        assert np.array_equal(libm.log(np.array([0.0, np.inf])), [-np.inf, np.inf])
        assert np.isnan(libm.log(np.array([-1.0, np.nan]))).all() and np.isnan(libm.tanh(np.array([np.nan]))).all()
    with pytest.raises(ValueError):
        libm.power(-2.0, np.ones(2))


def test_the_native_tanh_gives_the_rule_s_bits():
    x = np.concatenate([RNG.standard_normal(300_001) * 3, RNG.standard_normal(5000) * 1e-4, RNG.uniform(-30, 30, 5000),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 22.0, -22.0, 0.25, 1e-30, -1e-40]]).astype(np.float32)
    want = libm.f32(libm.tanh, x).view(np.uint32)
    assert np.array_equal(DSP_MATH.tanh(x).view(np.uint32), want)
    with portable_only():
        assert np.array_equal(DSP_MATH.tanh(x).view(np.uint32), want)


def test_the_dsp_math_keeps_its_float32_exp_rule():
    x = (RNG.standard_normal(4096) * 20).astype(np.float32)
    assert np.array_equal(DSP_MATH.exp(x), exp_f32(x))
    assert DSP_MATH.tanh(x).dtype == np.float32 and DSP_MATH.exp(x.astype(np.float64)).dtype == np.float64


DIGEST = """
import hashlib, numpy as np
from kazeia.backends import libm
rng = np.random.default_rng(7)
x = rng.standard_normal(50000) * 25
h = hashlib.sha256()
for y in (libm.exp(x), libm.log(np.abs(x)), libm.log1p(np.abs(x)), libm.tanh(x), *libm.cos_sin(x * 1000),
          libm.power(1e6, -np.abs(x) / 100), libm.f32(libm.tanh, x), libm.f32(libm.log1p, np.abs(x))):
    h.update(np.ascontiguousarray(y).tobytes())
print(h.hexdigest())
"""


def _digest(env: dict[str, str]) -> list[str]:
    r = subprocess.run([sys.executable, "-c", DIGEST], env={**os.environ, **env}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_the_rules_give_the_same_bits_whatever_simd_numpy_takes():
    native = _digest({})
    baseline = _digest({"NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"})
    assert native == baseline  # (numpy's own functions move between the two on an AVX2 or AVX-512 host)
