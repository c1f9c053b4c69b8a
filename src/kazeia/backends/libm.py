"""Transcendental functions whose bits kazeia owns: the same on every host, SIMD family and libm.

numpy's exp, log, log1p, tanh and power dispatch to a different routine per SIMD family, in float32 and float64
alike: on an AVX-512 host numpy takes SVML's, on an AVX2 host its own, and on an x86-64 baseline host the C
library's, and each gives other last bits (seen on numpy 2.4.6: `NPY_DISABLE_CPU_FEATURES` moves every one of them).
A device model built on them gives each host its own answer. These rules use only IEEE basic operations on float64
(+, -, *, /, rint, frexp, ldexp, comparisons: one rounding each, the same everywhere; numpy never fuses them).

    log(d)      d = m 2^e, m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m - 1) / (m + 1), by its odd series
                to s^23 (|s| <= 0.172: the next term is below 1e-19 of the sum); e ln 2 with fdlibm's split of ln 2.
    log1p(d)    u = 1 + d; d where u == 1, else log(u) * (d / (u - 1)) (Goldberg's correction for u's rounding).
    exp(d)      n = rint(d log2 e); r = (d - n LN2_HI) - n LN2_LO; Taylor to r^13 (|r| <= 0.347); ldexp(p, n).
    expm1(d)    Taylor to d^17 where |d| < 0.5, else exp(d) - 1.
    tanh(d)     sign(d) em1 / (em1 + 2), em1 = expm1(2 |d|); +-1 past |d| = 22.
    power(b, y) exp(y log b), y log b as a sum of two doubles (Dekker's split product: no fused multiply-add).
    sin, cos    n = rint(d 2/pi), d - n pi/2 with fdlibm's three-part pi/2 (a head and a tail), Taylor kernels to
                r^19 / r^20 on [-pi/4, pi/4], the quadrant from n mod 4. Exact reduction for |d| < 2^20 pi/2 (angles
                of positions past a million lose accuracy, never determinism).

The float32 forms round the float64 result once. Accuracy against numpy's float64 (tests/test_libm.py): within
2 ulp of float64; the float32 forms equal the correctly rounded float32 of numpy's float64 result on all but a
vanishing fraction of inputs (a tie within 1e-16 of a rounding boundary).
"""

from __future__ import annotations

import math

import numpy as np

LOG2E = 1.4426950408889634
LN2_HI = 6.93147180369123816490e-01  # fdlibm: the high 32 bits of ln 2 (n * LN2_HI exact for |n| < 2^20)
LN2_LO = 1.90821492927058770002e-10
TWO_OVER_PI = 6.36619772367581382433e-01
PIO2_1, PIO2_1T = 1.57079632673412561417e+00, 6.07710050650619224932e-11  # fdlibm __ieee754_rem_pio2
PIO2_2, PIO2_2T = 6.07710050630396597660e-11, 2.02226624879595063154e-21
PIO2_3, PIO2_3T = 2.02226624871116645580e-21, 8.47842766036889956997e-32
SQRT_HALF = 0.70710678118654752440
SPLIT = 134217729.0  # 2^27 + 1: Veltkamp's split of a double into two 26-bit halves

EXP_COEFFS = tuple(1.0 / math.factorial(i) for i in range(13, -1, -1))      # Horner, degree 13 first
EXPM1_COEFFS = tuple(1.0 / math.factorial(i) for i in range(17, 0, -1))     # expm1(d) / d in d: 1/17! .. 1/1!
ATANH_COEFFS = tuple(1.0 / (2 * k + 1) for k in range(11, 0, -1))           # s^2 series of (atanh(s) - s) / s^3
SIN_COEFFS = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(9, 0, -1))  # (sin r - r) / r^3 in r^2
COS_COEFFS = tuple((-1) ** k / math.factorial(2 * k) for k in range(10, 1, -1))     # (cos r - 1 + r^2/2) / r^4


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _horner(z: np.ndarray, coeffs: tuple[float, ...]) -> np.ndarray:
    p = np.full_like(z, coeffs[0])
    for c in coeffs[1:]:
        p = p * z + c
    return p


def _exp_parts(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """exp(hi + lo) for finite hi in [-746, 710] and |lo| within an ulp of hi: the Cody-Waite step on hi, lo added to
    the reduced argument."""
    n = np.rint(hi * LOG2E)
    r = ((hi - n * LN2_HI) + lo) - n * LN2_LO
    p = _horner(r, EXP_COEFFS)
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(p, n.astype(np.int64))


def exp(x) -> np.ndarray:
    """exp of float64 values by the rule (module doc); NaN stays NaN, +-inf give inf and 0."""
    d = _f64(x)
    c = np.clip(np.where(np.isnan(d), 0.0, d), -746.0, 710.0)
    return np.where(np.isnan(d), d, _exp_parts(c, np.zeros_like(c)))


def expm1(x) -> np.ndarray:
    """exp(x) - 1 of float64 values by the rule, without exp's cancellation near 0."""
    d = _f64(x)
    small = np.abs(d) < 0.5
    z = np.where(small, d, 0.0)
    series = z * _horner(z, EXPM1_COEFFS)
    return np.where(small, series, exp(d) - 1.0)


def _log_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log of positive finite float64 values as (e LN2_HI, the rest): the first exact, their sum the log."""
    m, e = np.frexp(x)  # x = m 2^e, m in [0.5, 1)
    low = m < SQRT_HALF
    m = np.where(low, m * 2.0, m)
    e = (e - low).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)  # m - 1 exact (Sterbenz)
    z = s * s
    log_m = 2.0 * s + 2.0 * s * (z * _horner(z, ATANH_COEFFS))
    return e * LN2_HI, e * LN2_LO + log_m


def log(x) -> np.ndarray:
    """log of float64 values by the rule; 0 -> -inf, negative -> NaN, inf -> inf, NaN stays."""
    d = _f64(x)
    ok = np.isfinite(d) & (d > 0)
    hi, lo = _log_parts(np.where(ok, d, 1.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        special = np.where(d == 0, -np.inf, np.where(d < 0, np.nan, d))
    return np.where(ok, hi + lo, special)


def log1p(x) -> np.ndarray:
    """log(1 + x) of float64 values by the rule; -1 -> -inf, below -1 -> NaN."""
    d = _f64(x)
    u = 1.0 + d
    ok = np.isfinite(d) & (d > -1.0)
    safe_u = np.where(ok & (u != 1.0), u, 2.0)
    corrected = log(safe_u) * (np.where(ok, d, 1.0) / (safe_u - 1.0))
    res = np.where(u == 1.0, d, corrected)
    with np.errstate(invalid="ignore"):
        special = np.where(d == -1.0, -np.inf, np.where(d < -1.0, np.nan, d))  # inf stays inf, NaN stays
    return np.where(ok, res, special)


def tanh(x) -> np.ndarray:
    """tanh of float64 values by the rule; NaN stays NaN, the sign of zero kept."""
    d = _f64(x)
    a = np.minimum(np.abs(np.where(np.isnan(d), 0.0, d)), 22.0)
    em1 = expm1(2.0 * a)
    t = np.where(a >= 22.0, 1.0, em1 / (em1 + 2.0))
    return np.where(np.isnan(d), d, np.copysign(t, d))


def _two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a * b as hi + lo exactly (Dekker, with Veltkamp's split: no fused multiply-add)."""
    p = a * b

    def split(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = SPLIT * v
        hi = t - (t - v)
        return hi, v - hi

    ah, al = split(a)
    bh, bl = split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def power(base: float, y) -> np.ndarray:
    """base ** y for a positive finite scalar base and finite float64 exponents (rope's frequencies, ALiBi's
    slopes): exp(y log base), the product kept as two doubles."""
    if not (math.isfinite(base) and base > 0):
        raise ValueError(f"power: base {base} must be positive and finite")
    yy = _f64(y)
    hi, lo = _log_parts(np.array([base], dtype=np.float64))
    p_hi, p_lo = _two_prod(yy, np.broadcast_to(hi, yy.shape))
    rest = yy * lo + p_lo
    s = p_hi + rest                        # Knuth's two-sum: s + err == p_hi + rest exactly
    back = s - p_hi
    err = (p_hi - (s - back)) + (rest - back)
    return _exp_parts(np.clip(s, -746.0, 710.0), err)


def cos_sin(x) -> tuple[np.ndarray, np.ndarray]:
    """(cos x, sin x) of finite float64 values by the rule (module doc)."""
    d = _f64(x)
    n = np.rint(d * TWO_OVER_PI)
    r = d - n * PIO2_1                       # exact: n * PIO2_1 has at most 53 bits (|n| < 2^20), then Sterbenz
    w = n * PIO2_1T
    for head, tail in ((PIO2_2, PIO2_2T), (PIO2_3, PIO2_3T)):  # fdlibm's second and third rounds, each exact
        t = r
        w = n * head
        r = t - w
        w = n * tail - ((t - r) - w)
    y = r - w
    y_lo = (r - y) - w                       # the reduced argument as y + y_lo, |y| <= pi/4
    z = y * y
    sin_k = y + (y_lo + y * z * _horner(z, SIN_COEFFS))
    hz = 0.5 * z
    one_minus = 1.0 - hz
    cos_k = one_minus + (((1.0 - one_minus) - hz) + (z * z * _horner(z, COS_COEFFS) - y * y_lo))
    q = n.astype(np.int64) & 3
    cos = np.choose(q, [cos_k, -sin_k, -cos_k, sin_k])
    sin = np.choose(q, [sin_k, cos_k, -sin_k, -cos_k])
    return cos, sin


def f32(fn, x) -> np.ndarray:
    """A float32 form: the float64 rule on float32 values (exact widening), rounded once to float32."""
    with np.errstate(over="ignore"):
        return fn(np.asarray(x, dtype=np.float32).astype(np.float64)).astype(np.float32)


class OwnedMath:
    """The kernels' transcendental functions by these rules (REF, and the emulated DSP's base): float32 arrays get
    the float32 forms, anything else float64."""

    @staticmethod
    def _apply(fn, x) -> np.ndarray:
        x = np.asarray(x)
        return f32(fn, x) if x.dtype == np.float32 else fn(x)

    def exp(self, x) -> np.ndarray:
        return self._apply(exp, x)

    def log1p(self, x) -> np.ndarray:
        return self._apply(log1p, x)

    def tanh(self, x) -> np.ndarray:
        return self._apply(tanh, x)

    def power(self, base: float, y) -> np.ndarray:
        return power(base, y)

    def cos_sin(self, x) -> tuple[np.ndarray, np.ndarray]:
        return cos_sin(x)


class HostMath:
    """numpy's own functions: their last bits follow the host's SIMD family, as a llama.cpp CPU build's follow its
    compiler and ISA (the CPU device's choice)."""

    def exp(self, x) -> np.ndarray:
        return np.exp(x)

    def log1p(self, x) -> np.ndarray:
        return np.log1p(x)

    def tanh(self, x) -> np.ndarray:
        return np.tanh(x)

    def power(self, base: float, y) -> np.ndarray:
        return base ** np.asarray(y, dtype=np.float64)

    def cos_sin(self, x) -> tuple[np.ndarray, np.ndarray]:
        return np.cos(x), np.sin(x)


OWNED = OwnedMath()
HOST = HostMath()
