"""HVX dynamic quantization of src1 (matmul-ops.c: quantize_f32_q8x4x2, quantize_f32_q8_1x4x2): the byte
images the HVX matmul writes to VTCM at vtcm_base and reads back, and the fixed-point helpers of the HVX
quantizer (hvx-inverse.h reciprocal, hvx-base.h rounding int16 conversion). See hvx/dot.py for the model.
"""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType

from kazeia.backends.htp.fp16 import (
    f32_to_f16_plain,
    fp16_bits,
    fp16_from_bytes,
    fp16_to_bytes,
    from_fp16_bits,
    round_fp16,
    round_fp16_hw,
    round_fp16_hw_bits,
)
from kazeia.backends.htp.host.repack import QK, SUPER
from kazeia.backends.htp.kernels import quant as kernel

GGMLType = GGMLQuantizationType

INV127_F16 = 0x2008            # fp16 constant the quantizer uses for 1/127 (= 0.0078735...)
_INV127 = float(from_fp16_bits(np.array([INV127_F16], dtype=np.uint16))[0])
GROUP_SIZES = (32, 64, 128)    # GGML_HEXAGON_FP32_QUANTIZE_GROUP_SIZE (CMake option, default 128)


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def q8x4x2_row_size(k: int) -> int:
    """VTCM row stride of a q8x4x2 activation row: k quant bytes + 16 B of scales per super-block, to 128 B."""
    return round_up(k + 16 * -(-k // SUPER), 128)


def q8_1x4x2_row_size(k: int) -> int:
    """VTCM row stride of a q8_1x4x2 row (Q4_1 weights): k quants + 32 B of (d, s) per super-block, to 128 B."""
    return round_up(k + 32 * -(-k // SUPER), 128)


def f16_row_size(k: int) -> int:
    """VTCM row stride of an fp16 src1 row in the HVX F16 matmul."""
    return round_up(2 * k, 128)


def activation_row_size(k: int, qtype: GGMLType) -> int:
    """Stride of the quantized src1 rows the HVX matmul of a `qtype` weight keeps at vtcm_base."""
    if qtype == GGMLType.F16:
        return f16_row_size(k)
    return q8_1x4x2_row_size(k) if qtype == GGMLType.Q4_1 else q8x4x2_row_size(k)


# --- fixed-point helpers of the HVX quantizer ------------------------------------------------------------

# Piecewise cubic for 1/(1+x), x in [0,1) as u16, 4 segments picked by the top two bits of x; 14 fractional
# bits out. Coefficients of hvx_vec_recip_xp1_O3_unsigned (hvx-inverse.h), one row per segment:
# (c3 looked up by vlut4, then Horner steps p = sat16((p*x +- c << 15) >> 16) with +c2, -c1, +c0).
_RECIP_C3 = np.array([-10589, -4493, -2348, -1306], dtype=np.int64)
_RECIP_C2 = np.array([31252, 22793, 16481, 11849], dtype=np.int64)
_RECIP_C1 = np.array([32706, 30635, 27505, 24054], dtype=np.int64)
_RECIP_C0 = np.array([32769, 32590, 32066, 31205], dtype=np.int64)


def _sat16(v: np.ndarray) -> np.ndarray:
    return np.clip(v, -32768, 32767)


def _wrap16(v: np.ndarray) -> np.ndarray:
    return ((v + 32768) & 0xFFFF) - 32768


def _clz16(u: np.ndarray) -> np.ndarray:
    """Leading zeros of 16-bit unsigned values (16 for 0)."""
    _, e = np.frexp(u.astype(np.float64))
    return 16 - e.astype(np.int64)


def _recip_poly(x: np.ndarray) -> np.ndarray:
    idx = x >> 14
    p = _RECIP_C3[idx]
    p = _sat16((p * x + (_RECIP_C2[idx] << 15)) >> 16)   # vmpa(...):sat
    p = _sat16((p * x - (_RECIP_C1[idx] << 15)) >> 16)   # vmps(...):sat
    p = _sat16((p * x + (_RECIP_C0[idx] << 15)) >> 16)   # vmpa(...):sat
    return p


def hvx_inverse_f16(bits: np.ndarray) -> np.ndarray:
    """Bit-level model of hvx_vec_inverse_f16: uint16 fp16 bits -> uint16 bits of the approximate 1/x.

    Integer pipeline: widen |x| to fp32 exactly, take its mantissa as a u16 fraction, evaluate the fitted
    cubic (relative error ~1e-4), renormalise with a leading-zero count and rebuild an fp16 with exponent
    (254 - e_f32) - (clz - 1) - 112 (saturating 16-bit add, then a wrapping << 10). |x| <= 0x100 (tiny,
    including 0) gives 0x7bff (65504); the sign is copied. Inputs whose reciprocal is not a normal fp16
    (|x| >= 32768, inf, NaN) give whatever the integer pipeline yields (e.g. inf -> 1.0); no exception.
    """
    bits = np.asarray(bits, dtype=np.uint16).astype(np.int64)
    a = bits & 0x7FFF
    neg = (bits & 0x8000) != 0
    small = a < 0x101
    f = from_fp16_bits(a.astype(np.uint16)).view(np.uint32).astype(np.int64)  # fp16 -> fp32 is exact
    mant = ((f << 9) & 0xFFFFFFFF) >> 16          # fp32 mantissa bits 22..7 as a u16 fraction
    expo = (f >> 23) & 0x1FF                      # biased fp32 exponent
    rm = _recip_poly(mant)
    clz = _clz16(rm & 0xFFFF)
    mant_r = (_wrap16((rm << clz) & 0xFFFF) >> 5) & 0x3FF
    exp_r = _wrap16((254 - expo) - (clz - 1))
    exp_r = _sat16(_wrap16(exp_r - 127) + 15)
    out = ((exp_r << 10) & 0xFFFF) | mant_r
    out = np.where(small, 0x7BFF, out)
    out = np.where(neg, out | 0x8000, out)
    return out.astype(np.uint16)


def hf_to_int8(v: np.ndarray) -> np.ndarray:
    """fp16 values (float32 array) -> int8 as hvx_vec_i16_from_hf_rnd_sat + vpack(:sat) compute it.

    The value plus 196608 is converted to fp32 (mantissa LSB = 1/64, so v is first rounded to 1/64, RNE);
    bits 21..0 of that fp32, a signed 22-bit field, are v*64 (|v| < 32768; wraps modulo 65536 beyond);
    then vround: floor(w/64 + 0.5) (ties away from -inf, i.e. 2.5 -> 3, -2.5 -> -2), saturated to int16,
    then saturated to int8. inf and NaN come out as 0 (their mantissa bits 21..0 are zero).
    """
    v = np.asarray(v, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        s = (v.astype(np.float64) + 196608.0).astype(np.float32)
    w = (s.view(np.uint32).astype(np.int64) << 10) & 0xFFFFFFFF
    w = np.where(w >= 1 << 31, w - (1 << 32), w)  # reinterpret as int32
    h = _sat16((w + 0x8000) >> 16)
    return np.clip(h, -128, 127).astype(np.int8)


# --- dynamic quantization of src1 -------------------------------------------------------------------------


def _padded_fp16(x: np.ndarray) -> tuple[np.ndarray, int]:
    """src1 rows -> fp16 values (hw conversion), zero-padded to whole super-blocks like the temp row."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected (M, K) activations, got shape {x.shape}")
    m, k = x.shape
    if k % QK:
        raise ValueError(f"K={k} must be a multiple of {QK}")
    kp = round_up(k, SUPER)
    xh = np.zeros((m, kp), dtype=np.float32)
    xh[:, :k] = round_fp16_hw(x)
    return xh, k


_TABLES: dict[str, np.ndarray] = {}


def fp16_table(name: str) -> np.ndarray:
    """`hvx_inverse_f16` (uint16 bits out) or `hf_to_int8` (int8 out) evaluated once at every one of the 65536
    fp16 bit patterns: both are functions of the fp16 value alone, so indexing the table by an input's bits
    gives exactly what calling the function gives (NaN payloads included)."""
    t = _TABLES.get(name)
    if t is None:
        bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        with np.errstate(all="ignore"):
            t = hvx_inverse_f16(bits) if name == "inverse" else hf_to_int8(from_fp16_bits(bits))
        t = _TABLES[name] = t
    return t


def _quantize_groups(xh: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """fp16 rows (M, Kp) -> (int8 quants (M, Kp), fp16 scale per group (M, Kp/group) as float32)."""
    m, kp = xh.shape
    g = xh.reshape(m, kp // group, group)
    # max |x| over the group; comparing the fp16 bit patterns of |x| is the fp16 max (NaN patterns win)
    amax = from_fp16_bits((fp16_bits(g) & 0x7FFF).max(axis=-1))
    with np.errstate(over="ignore", invalid="ignore"):
        d = round_fp16_hw(amax * np.float32(_INV127))                 # qf16 multiply by fp16(1/127)
        inv = from_fp16_bits(fp16_table("inverse")[fp16_bits(d)])    # hvx_inverse_f16
        scaled = round_fp16_hw_bits(g * inv[..., None])                    # exact fp32 product, one fp16 rounding
    return fp16_table("int8")[scaled].reshape(m, kp), d              # hf_to_int8


def _quantize_rows(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray, int]:
    """`_quantize_groups` of the padded fp16 rows of x, and K: by the native kernel (kernels/quant.py, the same bits)
    when it takes these values, else by numpy."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 2 and x.shape[1] % QK == 0:  # else _padded_fp16 says what is wrong
        k = x.shape[1]
        r = kernel.q8_groups(x, k, round_up(k, SUPER), group, fp16_table("inverse"), fp16_table("int8"))
        if r is not None:
            return r[0], r[1], k
    xh, k = _padded_fp16(x)
    q, d = _quantize_groups(xh, group)
    return q, d, k


def _image(m: int, stride: int, prev: np.ndarray | None) -> np.ndarray:
    if prev is None:
        return np.zeros((m, stride), dtype=np.uint8)
    p = np.asarray(prev, dtype=np.uint8)
    if p.size != m * stride:
        raise ValueError(f"prev must hold {m}x{stride} bytes, got {p.size}")
    return p.reshape(m, stride).copy()


def _write_rows(img: np.ndarray, q: np.ndarray, sbytes: np.ndarray, k: int) -> np.ndarray:
    """Quants of whole super-blocks first (the tail may run past k), then the scale area over them.

    A row whose padded quants run past its stride spills into the next row, which the next row's own
    writes cover again; only the last row's spill leaves the image (see `q8_spill_bytes`).
    """
    stride = img.shape[1]
    w = min(q.shape[1], stride)
    img[:, :w] = q[:, :w].view(np.uint8)
    img[:, k:k + sbytes.shape[1]] = sbytes
    return img


def quantize_q8x4x2(x: np.ndarray, group: int = 128, prev: np.ndarray | None = None) -> np.ndarray:
    """src1 rows (M, K) float32 -> the q8x4x2 byte image (M, q8x4x2_row_size(K)) the DSP writes at vtcm_base.

    Per group of `group` elements (32/64/128): x is converted to fp16 first (|x| > 65504 -> inf), amax =
    max|x_fp16|, d = fp16(amax * fp16(1/127)), q = int8_sat(int16_sat(round(fp16(x_fp16 * inv(d))))) with
    the HVX fixed-point reciprocal `hvx_inverse_f16` and the rounding of `hf_to_int8`. Row: k int8 quants,
    then 8 fp16 scales per super-block (sub-block s of super-block i uses the d of its group). Bytes the
    DSP does not write (between the end of the scales/quants and the stride) come from `prev` (default 0).

    Not modelled: for K == 32 with group 128 upstream's temp row also holds two scale halves of the
    previous row in its padding (they can change amax); quantization runs on several threads, and rows
    whose quant spill crosses a thread boundary race.
    """
    if group not in GROUP_SIZES:
        raise ValueError(f"group must be one of {GROUP_SIZES}")
    img = _native_q8x4x2(x, group, prev)
    if img is not None:
        return img
    q, d, k = _quantize_rows(x, group)
    m, kp = q.shape
    sbytes = fp16_to_bytes(d[:, _sub_groups(kp, group)])
    return _write_rows(_image(m, q8x4x2_row_size(k), prev), q, sbytes, k)


@functools.lru_cache(maxsize=64)
def _sub_groups(kp: int, group: int) -> np.ndarray:
    """The group of every sub-block of a padded row of kp elements (incl. padding)."""
    return (np.arange(kp // QK) * QK) // group


def _native_q8x4x2(x: np.ndarray, group: int, prev: np.ndarray | None) -> np.ndarray | None:
    """quantize_q8x4x2 by the native kernel writing its quants into the image rows directly (the scale bits are
    then placed over the padding as `_write_rows` places them), when the rows fit their stride; else None."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK or x.shape[1] == 0:
        return None
    img = _image(x.shape[0], q8x4x2_row_size(x.shape[1]), prev)
    return img if quantize_q8x4x2_into(x, group, img) else None


def quantize_q8x4x2_into(x: np.ndarray, group: int, img: np.ndarray) -> bool:
    """`quantize_q8x4x2(x, group, prev=img)` made over `img` itself (uint8 (M, stride), C-contiguous: the src1
    area of VTCM) by the native kernel; False, with img untouched, where that kernel does not take the rows
    (no native kernels, |x| > 65504 or NaN, K not a multiple of 32, quants that would spill past the image)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK or x.shape[1] == 0:
        return False
    m, k = x.shape
    kp, stride = round_up(k, SUPER), q8x4x2_row_size(k)
    if kp > stride or img.shape != (m, stride):  # the last row's quants would spill past the image
        return False
    # one native call: the range check, the quants and the scale bits of every sub-block (its group's) at k
    dbits = np.empty((m, kp // group), dtype=np.uint16)
    return kernel.q8x4x2_image(x, kp, group, fp16_table("inverse"), fp16_table("int8"), img, dbits)


def quantize_q8_1x4x2(x: np.ndarray, prev: np.ndarray | None = None) -> np.ndarray:
    """src1 rows (M, K) -> the q8_1x4x2 image used with Q4_1 weights (quantize_block_f32_q8_1x1).

    Quants as `quantize_q8x4x2` with 32-element groups, except that amax is taken on the fp32 values and
    then converted. The stored pair per sub-block is computed on the scalar core in IEEE arithmetic and is
    NOT the scale the quants were made with: d = fp16(amax_f32 / 127.0f), s = fp16(float(sum(q)) * d_f32)
    where d_f32 is the unrounded float quotient.
    """
    x = np.asarray(x, dtype=np.float32)
    xh, k = _padded_fp16(x)
    m, kp = xh.shape
    xf = np.zeros((m, kp), dtype=np.float32)
    xf[:, :k] = x
    amax32 = np.abs(xf.reshape(m, kp // QK, QK)).max(axis=-1)
    q, _ = _quantize_groups(xh, QK)  # fp32 max then fp16 == fp16 max (monotone rounding)
    sums = q.reshape(m, kp // QK, QK).astype(np.int32).sum(axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        d32 = amax32 / np.float32(127.0)
        d16 = round_fp16(d32)
        s16 = round_fp16(sums.astype(np.float32) * d32)
    sbytes = fp16_to_bytes(np.stack([d16, s16], axis=-1).reshape(m, 2 * d16.shape[1]))
    return _write_rows(_image(m, q8_1x4x2_row_size(k), prev), q, sbytes, k)


def q8_spill_bytes(k: int, qtype: GGMLType = GGMLType.Q4_0) -> int:
    """Bytes the quantizer writes past the end of the LAST row: max(0, round_up(k, 256) - stride). They are
    the quants of the row's zero padding, always 0x00 (0 * any finite or non-finite inverse quantizes to 0);
    `quantize_*` does not return them."""
    return max(0, round_up(k, SUPER) - activation_row_size(k, qtype))


def quantize_activations(x: np.ndarray, qtype: GGMLType, group: int = 128, arch: int | None = None,
                         prev: np.ndarray | None = None) -> np.ndarray:
    """The src1 image the HVX matmul of a `qtype` weight builds: q8x4x2, q8_1x4x2 (Q4_1) or fp16 (F16)."""
    if qtype == GGMLType.F16:
        return quantize_f16(x, arch=arch, prev=prev)
    if qtype == GGMLType.Q4_1:
        return quantize_q8_1x4x2(x, prev=prev)
    return quantize_q8x4x2(x, group=group, prev=prev)


def _image_rows(image: np.ndarray, m: int | None, stride: int) -> np.ndarray:
    img = np.asarray(image, dtype=np.uint8)
    if m is None:
        m = img.shape[0] if img.ndim == 2 else img.size // stride
    flat = np.ascontiguousarray(img).reshape(-1)
    if flat.size < m * stride:
        raise ValueError(f"image has {flat.size} bytes, {m} rows of {stride} need {m * stride}")
    return flat[: m * stride].reshape(m, stride)


def parse_q8x4x2(rows: np.ndarray, K: int, M: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read back M rows of a q8x4x2 image -> (int8 quants (M, nsub, 32), fp16 scales (M, nsub) as float32).

    `rows` is (M, stride) or flat bytes (M defaults to all whole rows). Only the bytes the vec_dot uses are
    read: [0, K) quants and [K, K + 2*nsub) scales of each row. Any bytes are accepted (NaN/inf scales are
    returned as such).
    """
    k, m = K, M
    rows = _image_rows(rows, m, q8x4x2_row_size(k))
    m = rows.shape[0]
    nsub = k // QK
    q = rows[:, :k].view(np.int8).reshape(m, nsub, QK)
    return q, fp16_from_bytes(rows[:, k:k + 2 * nsub])


def parse_q8_1x4x2(rows: np.ndarray, K: int, M: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read back a q8_1x4x2 image -> (quants (M, nsub, 32) int8, d (M, nsub), s (M, nsub)) as float32."""
    k, m = K, M
    rows = _image_rows(rows, m, q8_1x4x2_row_size(k))
    m = rows.shape[0]
    nsub = k // QK
    q = rows[:, :k].view(np.int8).reshape(m, nsub, QK)
    ds = fp16_from_bytes(rows[:, k:k + 4 * nsub]).reshape(m, nsub, 2)
    return q, ds[..., 0], ds[..., 1]


def quantize_f16(x: np.ndarray, arch: int | None = None, prev: np.ndarray | None = None,
                 src1_f16: bool = False) -> np.ndarray:
    """src1 rows -> the fp16 image (M, f16_row_size(K)) of the HVX F16 matmul (quantize_f32_f16).

    f32 src1 goes through the non-shuffled converter (`f32_to_f16_plain`, with the <v79 NaN->-inf rewrite
    when `arch` is given); an F16 src1 (`src1_f16=True`, values already fp16) is copied. Only 2*K bytes per
    row are written; the rest of the stride comes from `prev` (default 0) and is never used by the dot.
    """
    x = np.asarray(x, dtype=np.float32)
    m, k = x.shape
    h = x if src1_f16 else f32_to_f16_plain(x, arch)
    img = _image(m, f16_row_size(k), prev)
    img[:, :2 * k] = fp16_to_bytes(h)
    return img


def parse_f16(rows: np.ndarray, K: int, M: int | None = None) -> np.ndarray:
    """Read back M rows of an fp16 src1 image -> (M, K) float32 of fp16 values (any bytes accepted)."""
    k = K
    rows = _image_rows(rows, M, f16_row_size(k))
    return fp16_from_bytes(rows[:, :2 * k])
