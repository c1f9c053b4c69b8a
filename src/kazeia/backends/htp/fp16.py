"""fp16 helpers shared by the HTP numerics kernels.

Every value the DSP keeps in half precision is represented here as a float32 array holding an fp16 value
(widening fp16 -> fp32 is exact), so the kernels can do their arithmetic in float32/float64 and only round
at the points where the hardware rounds.

Two roundings exist:
- `round_fp16`: IEEE round-to-nearest-even as numpy does it (values in [65504, 65520) round down to 65504).
  This is what the scalar C code on the DSP does with `(__fp16) f` and what the host does.
- `round_fp16_hw`: the same, except that every |x| > 65504 becomes +-inf. This models the HVX/HMX converters
  (qf32/qf16 -> hf in hvx-base.h, the HMX read-out), whose saturation turns |x| > 65504 into inf.
"""

from __future__ import annotations

import numpy as np

FP16_MAX = 65504.0

# Below v79 "-inf + 0.0" in the qf32 path yields NaN (hvx-base.h: the qf32 add before the hf conversion);
# None = no quirks.
KNOWN_ARCHS = (None, 68, 69, 73, 75, 79, 81)


def round_fp16(x: np.ndarray) -> np.ndarray:
    """IEEE RNE rounding to fp16, returned widened to float32. float64 input is rounded once (not via f32)."""
    x = np.asarray(x)
    if x.dtype != np.float64:
        x = x.astype(np.float32, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).astype(np.float32)


def round_fp16_hw_bits(x: np.ndarray) -> np.ndarray:
    """The uint16 fp16 bit patterns of `round_fp16_hw(x)`: RNE, every |x| > 65504 -> +-inf, NaN kept."""
    x = np.asarray(x)
    if x.dtype != np.float64:
        x = x.astype(np.float32, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        bits = x.astype(np.float16).view(np.uint16)
        big = np.abs(x) > FP16_MAX  # False for NaN, so NaN stays NaN
    if big.any():
        bits[big] = np.where(np.signbit(x[big]), 0xFC00, 0x7C00).astype(np.uint16)
    return bits


def round_fp16_hw(x: np.ndarray) -> np.ndarray:
    """RNE rounding to fp16 where every finite |x| > 65504 overflows to +-inf (HVX/HMX converter model)."""
    return round_fp16_hw_bits(x).view(np.float16).astype(np.float32)


def fp16_bits(x: np.ndarray) -> np.ndarray:
    """float32 array of fp16 values -> uint16 bit patterns (the values must already be fp16-representable)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def from_fp16_bits(bits: np.ndarray) -> np.ndarray:
    """uint16 bit patterns -> float32 values (exact; NaN payloads are kept by numpy's widening)."""
    return np.ascontiguousarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


def fp16_to_bytes(x: np.ndarray) -> np.ndarray:
    """fp16 values (float32 array) -> little-endian bytes, shape (..., 2*n)."""
    b = fp16_bits(x)
    return np.ascontiguousarray(b).view(np.uint8).reshape(*b.shape[:-1], b.shape[-1] * 2)


def fp16_from_bytes(b: np.ndarray) -> np.ndarray:
    """Little-endian bytes (..., 2*n) -> fp16 values widened to float32 (..., n). Any bytes are accepted."""
    b = np.ascontiguousarray(b, dtype=np.uint8)
    return from_fp16_bits(b.view(np.uint16))


def check_arch(arch: int | None) -> None:
    if arch not in KNOWN_ARCHS:
        raise ValueError(f"unknown HTP arch {arch!r}; expected one of {KNOWN_ARCHS}")


def f32_to_f16_shuffled(x: np.ndarray, arch: int | None = None, rounding=None) -> np.ndarray:
    """The "shuffled" f32->f16 converter (HMX activation staging): x + 0.0 in qf32, then to hf.

    Below v79 (HMX exists on v73/v75) a -inf input comes out as NaN, because only the non-shuffled helper
    carries the NaN->-inf repair. Default (None) is plain IEEE conversion with the hw overflow rule.
    """
    check_arch(arch)
    x = np.asarray(x, dtype=np.float32)
    y = (rounding or round_fp16_hw)(x)  # rounding: an equal-valued round_fp16_hw (htp/fast.py's native one)
    if arch is not None and arch < 79:
        y[np.isneginf(x)] = np.nan
    return y


def f32_to_f16_plain(x: np.ndarray, arch: int | None = None) -> np.ndarray:
    """The non-shuffled f32->f16 converter (hvx_copy_f16_f32, used by the HVX F16 matmul for f32 src1).

    Below v79 it rewrites every NaN result to -inf (meant to repair "-inf + 0.0 = NaN", it also turns genuine
    NaN inputs into -inf). Default (None) is plain IEEE conversion with the hw overflow rule.
    """
    check_arch(arch)
    y = round_fp16_hw(np.asarray(x, dtype=np.float32))
    if arch is not None and arch < 79:
        y[np.isnan(y)] = -np.inf
    return y
