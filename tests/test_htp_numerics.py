"""HTP matmul numerics (kazeia.backends.htp.{fp16,repack,hvx_matmul,hmx_matmul}) against independent
transcriptions of the design notes (docs/htp-backend.md 2.1-2.4, 6.7) and of upstream ggml-hexagon.

The references here never call the kernels' internals: they parse ggml blocks and the VTCM byte images
themselves, loop per super-block / group / lane, and apply the stated roundings explicitly (float64 for
exact products, then a single rounding). HVX and HMX outputs are compared bitwise.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq

from kazeia.backends.htp.fp16 import f32_to_f16_plain, f32_to_f16_shuffled, round_fp16, round_fp16_hw
from kazeia.backends.htp.hmx import tiles as hmx
from kazeia.backends.htp.host.repack import RepackedWeight, repack_x4x2, unpack_x4x2
from kazeia.backends.htp.hvx import dot as hvx
from kazeia.backends.htp.hvx import quant as hq
from oracle_utils import ordered_products

T = GGMLQuantizationType
QTYPES = [T.Q4_0, T.Q4_1, T.Q8_0, T.IQ4_NL]
IQ4NL = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
M_VALUES = [1, 31, 32, 33, 38, 64, 65, 200]


# ---------------------------------------------------------------------------------------------------
# test-side helpers (independent of the modules under test)


def f16(x) -> np.ndarray:
    """Hardware fp16 rounding per the notes: RNE, and any |x| > 65504 becomes +-inf. float64 in, float32 out."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.astype(np.float16).astype(np.float32)
        big = np.abs(x) > 65504.0
    y[big] = np.where(x[big] > 0, np.inf, -np.inf)
    return y


def h2f(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def f2h(v: float) -> int:
    return int(np.array([v], dtype=np.float16).view(np.uint16)[0])


def f32bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def widen_bits(h: int) -> int:
    """fp16 bits -> fp32 bits, exact, NaN payload kept (bit manipulation, no float round trip)."""
    sign, e, man = (h & 0x8000) << 16, (h >> 10) & 0x1F, h & 0x3FF
    if e == 0x1F:
        return sign | 0x7F800000 | (man << 13)
    if e == 0:
        return sign | f32bits(man * 2.0**-24)
    return sign | ((e + 112) << 23) | (man << 13)


def ggml_blocks(qtype: T, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Real quantized rows (gguf-py's quantizer) or, for IQ4_NL, random codes with random finite scales."""
    if qtype == T.F16:
        return rng.standard_normal((n, k)).astype(np.float16).view(np.uint8).reshape(n, 2 * k)
    if qtype == T.IQ4_NL:
        _, ts = GGML_QUANT_SIZES[qtype]
        b = rng.integers(0, 256, (n, k // 32, ts), dtype=np.uint8)
        d = (rng.random((n, k // 32)) * 0.02 + 1e-3).astype(np.float16)
        b[..., 0:2] = d.view(np.uint8).reshape(n, k // 32, 2)
        return b.reshape(n, -1)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.2, 3.0, (n, 1))).astype(np.float32)
    return gq.quantize(w, qtype)


def ggml_fields(raw: np.ndarray, qtype: T, k: int):
    """ggml rows -> (operand values (N, nsub, 32) int64 as the HVX dot sees them, d, m) in float64."""
    n = raw.shape[0]
    _, ts = GGML_QUANT_SIZES[qtype]
    b = raw.reshape(n, k // 32, ts)
    d = b[..., 0:2].copy().view("<f2")[..., 0].astype(np.float64)
    m = None
    if qtype == T.Q8_0:
        return b[..., 2:].view(np.int8).astype(np.int64), d, m
    off = 4 if qtype == T.Q4_1 else 2
    qs = b[..., off:off + 16].astype(np.int64)
    code = np.concatenate([qs & 15, qs >> 4], axis=-1)
    if qtype == T.Q4_0:
        return code - 8, d, m
    if qtype == T.IQ4_NL:
        return np.array(IQ4NL, dtype=np.int64)[code], d, m
    m = b[..., 2:4].copy().view("<f2")[..., 0].astype(np.float64)
    return code, d, m


def codes_of(raw: np.ndarray, qtype: T, k: int) -> np.ndarray:
    """Raw 4/8-bit codes in element order (the bytes the repack moves)."""
    v, _, _ = ggml_fields(raw, qtype, k)
    if qtype == T.Q4_0:
        v = v + 8
    elif qtype == T.IQ4_NL:
        code = np.empty_like(v)
        for i, kv in enumerate(IQ4NL):
            code[v == kv] = i
        v = code
    return (v.reshape(raw.shape[0], k) & 0xFF).astype(np.uint8)


# ---------------------------------------------------------------------------------------------------
# 2.1 x4x2 repack


def repack_scalar(raw: np.ndarray, qtype: T, k: int) -> np.ndarray:
    """Byte-by-byte transcription of the host repack of one row at a time (padded scratch, then truncation)."""
    n = raw.shape[0]
    nb = -(-k // 256)
    codes = codes_of(raw, qtype, k)
    _, d, m = ggml_fields(raw, qtype, k)
    q8 = qtype == T.Q8_0
    qrow = k if q8 else k // 2
    pad_code = 8 if qtype in (T.Q4_0, T.IQ4_NL) else 0
    sblk = 32 if qtype == T.Q4_1 else 16
    row_bytes = raw.shape[1]
    out = np.zeros((n, row_bytes), dtype=np.uint8)
    for r in range(n):
        buf = bytearray(nb * (256 if q8 else 128) + nb * sblk + 512)
        for i in range(nb):
            u = [pad_code] * 256
            for j in range(256):
                if 256 * i + j < k:
                    u[j] = int(codes[r, 256 * i + j])
            partial = (k % 256) != 0 and i == nb - 1
            if q8:
                for j in range(256):
                    buf[256 * i + j] = u[j]
            else:
                for j in range(128):
                    lo, hi = (u[2 * j], u[2 * j + 1]) if partial else (u[j], u[j + 128])
                    buf[128 * i + j] = lo | (hi << 4)
        for i in range(nb):  # scales after all quants: they overwrite the truncated tail
            for s in range(8):
                b = 8 * i + s
                dv = f2h(d[r, b]) if b < k // 32 else 0
                if qtype == T.Q4_1:
                    mv = f2h(m[r, b]) if b < k // 32 else 0
                    struct.pack_into("<HH", buf, qrow + 32 * i + 4 * s, dv, mv)
                else:
                    struct.pack_into("<H", buf, qrow + 16 * i + 2 * s, dv)
        out[r] = np.frombuffer(bytes(buf[:row_bytes]), dtype=np.uint8)
    return out


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("k", [256, 288, 544, 800, 1024])
def test_repack_bytes_and_roundtrip(qtype, k):
    rng = np.random.default_rng(k + int(qtype))
    raw = ggml_blocks(qtype, 3, k, rng)
    rep = repack_x4x2(raw, qtype, k)
    assert rep.shape == raw.shape                          # stored row = ggml row size
    assert np.array_equal(rep, repack_scalar(raw, qtype, k))
    assert np.array_equal(unpack_x4x2(rep, qtype, k), raw)


@pytest.mark.parametrize("qtype", QTYPES)
def test_repack_decodes_like_gguf(qtype):
    """Values decoded from the repacked bytes equal gguf-py's dequantization of the original blocks."""
    rng = np.random.default_rng(7)
    for k in (544, 2048):
        raw = ggml_blocks(qtype, 16, k, rng)
        w = RepackedWeight.from_ggml(raw, qtype, k)
        assert np.array_equal(w.dequantized(), gq.dequantize(raw, qtype).astype(np.float32))


# ---------------------------------------------------------------------------------------------------
# fp16 reciprocal and int8 conversion of the HVX quantizer (scalar transcriptions)


def _halves(word: int) -> list[int]:
    return [(word >> (16 * i)) & 0xFFFF for i in range(4)]


def _s16(v: int) -> int:
    return ((v + 32768) & 0xFFFF) - 32768


# the four 64-bit coefficient words of hvx_vec_recip_xp1_O3_unsigned, as written upstream
_C3 = [_s16(h) for h in _halves(0xFAE6F6D4EE73D6A3)]
_C2 = _halves(0x2E49406159097A14)
_C1 = _halves(0x5DF66B7177AB7FC2)
_C0 = _halves(0x79E57D427F4E8001)


def inverse_scalar(h: int) -> int:
    sat = lambda v: max(-32768, min(32767, v))  # noqa: E731
    a = h & 0x7FFF
    if a <= 0x100:
        r = 0x7BFF
    else:
        f = widen_bits(a)
        x = ((f << 9) & 0xFFFFFFFF) >> 16
        e = (f >> 23) & 0x1FF
        seg = x >> 14
        p = _C3[seg]
        p = sat((p * x + (_C2[seg] << 15)) >> 16)
        p = sat((p * x - (_C1[seg] << 15)) >> 16)
        p = sat((p * x + (_C0[seg] << 15)) >> 16)
        lz = 16 - (p & 0xFFFF).bit_length()
        mant = (_s16((p << lz) & 0xFFFF) >> 5) & 0x3FF
        ex = sat(_s16(_s16((254 - e) - (lz - 1)) - 127) + 15)
        r = ((ex << 10) & 0xFFFF) | mant
    return r | (h & 0x8000)


def int8_scalar(v: float) -> int:
    s = float(np.float32(np.float64(v) + 196608.0))
    w = (f32bits(s) << 10) & 0xFFFFFFFF
    if w >= 1 << 31:
        w -= 1 << 32
    return max(-128, min(127, max(-32768, min(32767, (w + 0x8000) >> 16))))


def test_inverse_f16_bitwise_and_accuracy():
    bits = np.arange(0, 1 << 16, 7, dtype=np.uint16)
    got = hq.hvx_inverse_f16(bits)
    with np.errstate(all="ignore"):
        want = np.array([inverse_scalar(int(b)) for b in bits], dtype=np.uint16)
    assert np.array_equal(got, want)
    # documented accuracy: within 1 fp16 ulp of 1/x wherever 1/x is a normal fp16 (0x101 <= x < 16384)
    b = np.arange(0x0101, 0x7400, dtype=np.uint16)
    x = b.view(np.float16).astype(np.float64)
    r = hq.hvx_inverse_f16(b).view(np.float16)
    ulp = np.abs(r.view(np.int16).astype(int) - (1 / x).astype(np.float16).view(np.int16).astype(int))
    assert ulp.max() <= 1
    assert inverse_scalar(0) == 0x7BFF                      # d == 0 (all-zero group) -> 65504


def test_int8_conversion():
    allh = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    got = hq.hf_to_int8(allh)
    with np.errstate(all="ignore"):
        want = np.array([int8_scalar(float(v)) for v in allh], dtype=np.int8)
    assert np.array_equal(got, want)
    # semantics in the useful range: round to 1/64 (RNE), then floor(v + 1/2), saturate to int8
    fin = np.isfinite(allh) & (np.abs(allh) < 32000)
    v = allh[fin].astype(np.float64)
    assert np.array_equal(got[fin], np.clip(np.floor(np.rint(v * 64) / 64 + 0.5), -128, 127).astype(np.int8))
    assert list(hq.hf_to_int8(np.array([2.5, -2.5, 0.4921875, np.inf, np.nan], np.float32))) == [3, -2, 1, 0, 0]


# ---------------------------------------------------------------------------------------------------
# 2.2 dynamic quantization of src1


INV127 = h2f(0x2008)


def quantize_row_scalar(x: np.ndarray, k: int, group: int) -> bytes:
    nb = -(-k // 256)
    kp = nb * 256
    xh = np.zeros(kp, dtype=np.float32)
    xh[:k] = f16(x)
    q = [0] * kp
    dgrp = []
    for g0 in range(0, kp, group):
        amax = max(abs(float(v)) for v in xh[g0:g0 + group])
        d = float(f16(amax * INV127))
        inv = h2f(inverse_scalar(f2h(d)))
        dgrp.append(d)
        for j in range(g0, g0 + group):
            q[j] = int8_scalar(float(f16(float(xh[j]) * inv)))
    stride = -(-(k + 16 * nb) // 128) * 128
    row = bytearray(stride)
    for j in range(min(kp, stride)):
        row[j] = q[j] & 0xFF
    for s in range(8 * nb):
        struct.pack_into("<H", row, k + 2 * s, f2h(dgrp[(32 * s) // group]))
    return bytes(row)


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("k", [256, 800, 1056])
def test_quantize_q8x4x2_image(group, k):
    rng = np.random.default_rng(group + k)
    x = (rng.standard_normal((3, k)) * np.array([[0.01], [1.0], [40.0]])).astype(np.float32)
    x[1, 5] = 0.0
    x[2, :group] = 0.0                                    # an all-zero group: d = 0, inv = 65504, q = 0
    img = hq.quantize_q8x4x2(x, group=group)
    stride = hq.q8x4x2_row_size(k)
    assert img.shape == (3, stride)
    for r in range(3):
        assert img[r].tobytes() == quantize_row_scalar(x[r], k, group), f"row {r}"
    q, d = hq.parse_q8x4x2(img, k, 3)
    # the reciprocal is approximate, but the quants stay within one step of x/d
    xq = q.reshape(3, k).astype(np.float64) * np.repeat(d, 32, axis=1)
    assert np.all(np.abs(xq - f16(x)) <= 1.01 * np.repeat(d, 32, axis=1) + 1e-12)


def test_quantize_untouched_bytes_keep_prev():
    # K = 1024: quants [0, 1024), scales [1024, 1088), stride 1152 -> 64 bytes per row the DSP never writes
    k = 1024
    x = np.random.default_rng(1).standard_normal((2, k)).astype(np.float32)
    prev = np.full((2, hq.q8x4x2_row_size(k)), 0xAA, dtype=np.uint8)
    img = hq.quantize_q8x4x2(x, prev=prev)
    assert img.shape == (2, 1152)
    assert np.all(img[:, 1088:] == 0xAA) and np.all(hq.quantize_q8x4x2(x)[:, 1088:] == 0)
    assert np.array_equal(img[:, :1088], hq.quantize_q8x4x2(x)[:, :1088])
    # K = 1056: padded quants (1280 B) run past the stride (1152 B), so every byte of the row is written
    k = 1056
    x = np.random.default_rng(2).standard_normal((2, k)).astype(np.float32)
    img = hq.quantize_q8x4x2(x, prev=np.full((2, 1152), 0xAA, dtype=np.uint8))
    assert np.array_equal(img, hq.quantize_q8x4x2(x))
    assert hq.q8_spill_bytes(k) == 128


def test_quantize_q8_1x4x2_image():
    k = 800
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, k)) * 3).astype(np.float32)
    img = hq.quantize_q8_1x4x2(x)
    nb = 4
    assert img.shape == (2, -(-(k + 32 * nb) // 128) * 128)
    for r in range(2):
        xp = np.zeros(nb * 256, dtype=np.float32)
        xp[:k] = x[r]
        row = img[r]
        for s in range(8 * nb):
            grp = xp[32 * s:32 * s + 32]
            amax32 = np.float32(np.max(np.abs(grp)))
            dq = float(f16(float(f16(float(amax32))) * INV127))
            inv = h2f(inverse_scalar(f2h(dq)))
            qs = [int8_scalar(float(f16(float(f16(float(v))) * inv))) for v in grp]
            if 32 * s < k:
                assert list(row[32 * s:32 * s + 32].view(np.int8)) == qs
            d32 = np.float32(amax32 / np.float32(127.0))
            d_st, s_st = struct.unpack_from("<HH", row.tobytes(), k + 4 * s)
            assert d_st == f2h(float(d32))                                     # IEEE scalar, not the quant scale
            assert s_st == f2h(float(np.float32(np.float32(sum(qs)) * d32)))


# ---------------------------------------------------------------------------------------------------
# 2.2 HVX matmul


def reduce_far(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    for dist in (16, 8, 4, 2, 1):
        a[..., :dist] = a[..., :dist] + a[..., dist:2 * dist]
    return a[..., 0]


def reduce_adjacent(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    for dist in (1, 2, 4, 8, 16):
        for i in range(0, 32, 2 * dist):
            a[..., i] = a[..., i] + a[..., i + dist]
    return a[..., 0]


def hvx_reference(raw, qtype, k, img, m):
    """Lane-by-lane transcription: exact int dots, fp32 scale product, fp32 lane accumulation, trees."""
    v, d, mn = ggml_fields(raw, qtype, k)
    n, nsub = d.shape
    stride = img.shape[1]
    q4_1 = qtype == T.Q4_1
    aq = img[:m, :k].view(np.int8).reshape(m, nsub, 32).astype(np.int64)
    sc = img[:m, k:k + (4 if q4_1 else 2) * nsub].copy().view("<f2").astype(np.float32)
    ad, asum = (sc[:, 0::2], sc[:, 1::2]) if q4_1 else (sc, None)
    assert stride % 128 == 0
    ia = np.einsum("mbk,nbk->mnb", aq, v)
    acc = np.zeros((m, n, 32), dtype=np.float32)
    with np.errstate(all="ignore"):
        for c in range(-(-nsub // 32)):
            for lane in range(32):
                b = 32 * c + lane
                if b >= nsub:
                    break                                     # masked lane
                dd = ad[:, b, None] * d[None, :, b].astype(np.float32)
                t = ia[:, :, b].astype(np.float32) * dd
                if q4_1:
                    t = t + asum[:, b, None] * mn[None, :, b].astype(np.float32)
                acc[:, :, lane] = acc[:, :, lane] + t
        y = reduce_far(acc)
        if n % 2:
            y[:, -1] = reduce_adjacent(acc[:, -1])
    return y


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("k", [800, 1312, 2048])
def test_hvx_matmul_bitwise(qtype, k):
    rng = np.random.default_rng(k * 7 + int(qtype))
    n = 7                                                     # odd: the last row takes the 1x1 kernel
    raw = ggml_blocks(qtype, n, k, rng)
    w = RepackedWeight.from_ggml(raw, qtype, k)
    x = (rng.standard_normal((max(M_VALUES), k)) * 2).astype(np.float32)
    for m in M_VALUES:
        img = hq.quantize_activations(x[:m], qtype)
        assert img.shape == (m, hq.activation_row_size(k, qtype))
        y = hvx.hvx_matmul(w, img, m)
        assert y.dtype == np.float32 and y.shape == (m, n)
        assert np.array_equal(y, hvx_reference(raw, qtype, k, img, m)), f"M={m}"
    # sanity against the exact product of the dequantized operands
    ref = x[:m].astype(np.float64) @ gq.dequantize(raw, qtype).astype(np.float64).T
    assert np.abs(y - ref).max() <= 0.05 * np.abs(ref).max()


def f16_reference(x16, w16, k, ddr=False):
    m, n = x16.shape[0], w16.shape[0]
    lanes = 32 if ddr else 64
    acc = np.zeros((m, n, lanes), dtype=np.float32)
    with np.errstate(all="ignore"):
        for i in range(-(-k // 64)):
            if ddr:
                for j in range(32):
                    e = 64 * i + 2 * j
                    if e >= k:
                        break
                    t = x16[:, None, e] * w16[None, :, e] + x16[:, None, e + 1] * w16[None, :, e + 1]
                    acc[:, :, j] = acc[:, :, j] + t
            else:
                for p in range(64):
                    e = 64 * i + p
                    if e >= k:
                        break
                    lane = p // 2 + (32 if p % 2 else 0)
                    acc[:, :, lane] = acc[:, :, lane] + x16[:, None, e] * w16[None, :, e]
        if ddr:
            return reduce_adjacent(acc)
        r = acc[..., :32] + acc[..., 32:]
        y = reduce_far(r)
        if n % 2:
            y[:, -1] = reduce_adjacent(r[:, -1])
        return y


@pytest.mark.parametrize("k", [96, 544])
def test_hvx_f16_bitwise(k):
    rng = np.random.default_rng(k)
    n = 5
    raw = ggml_blocks(T.F16, n, k, rng)
    w = RepackedWeight.from_ggml(raw, T.F16, k)
    w16 = raw.view(np.float16).astype(np.float32)
    for m in (1, 3, 33):
        x = (rng.standard_normal((m, k)) * 4).astype(np.float32)
        img = hq.quantize_activations(x, T.F16)
        assert img.shape == (m, -(-2 * k // 128) * 128)
        x16 = f16(x)
        assert np.array_equal(hvx.hvx_matmul(w, img, m), f16_reference(x16, w16, k))
        assert np.array_equal(hvx.hvx_matmul_f16_ddr(w, x), f16_reference(x16, w16, k, ddr=True))


# ---------------------------------------------------------------------------------------------------
# 2.3 HMX


def hmx_weight_reference(raw, qtype, k):
    if qtype == T.F16:
        return raw.view(np.float16).astype(np.float32)
    v, d, m = ggml_fields(raw, qtype, k)
    prod = v.astype(np.float64) * d[..., None]            # exact
    if qtype == T.Q4_1:
        w = f16(f16(prod).astype(np.float64) + m[..., None])
    else:
        w = f16(prod)
    return w.reshape(raw.shape[0], k)


@pytest.mark.parametrize("qtype", QTYPES + [T.F16])
def test_hmx_matmul_bitwise(qtype):
    k, n = 512, 64
    rng = np.random.default_rng(11 + int(qtype))
    raw = ggml_blocks(qtype, n, k, rng)
    w = RepackedWeight.from_ggml(raw, qtype, k)
    w16 = hmx_weight_reference(raw, qtype, k)
    assert np.array_equal(w.w16, w16)
    x = (rng.standard_normal((max(M_VALUES), k)) * 3).astype(np.float32)
    for m in M_VALUES:
        a16 = f16(x[:m])
        want = f16(ordered_products(a16, w16))
        y = hmx.hmx_mul_mat(w, x[:m])
        assert np.array_equal(y, want), f"M={m}"
        assert np.array_equal(y.astype(np.float16).astype(np.float32), y)   # every output is an fp16 value


def test_hmx_overflow_and_special_values():
    k, n = 64, 32
    w16 = np.ones((n, k), dtype=np.float32)
    x = np.zeros((3, k), dtype=np.float32)
    x[0, 0] = 65504.0                 # largest fp16: stays finite
    x[1, 0] = 65505.0                 # |x| > 65504 -> inf in the staging converter
    x[2, :] = 2048.0                  # finite inputs whose fp32 sum 131072 overflows fp16 in the read-out
    a16 = f32_to_f16_shuffled(x)
    assert a16[0, 0] == 65504.0 and np.isposinf(a16[1, 0])
    y = hmx.hmx_matmul(a16, w16)
    assert y[0, 0] == 65504.0 and np.isposinf(y[1, 0]) and np.isposinf(y[2, 0])
    img = hmx.stage_activations(x)
    assert np.isposinf(hmx.activation_from_tiles(img, 3, k)[1, 0])
    # the HVX quantizer: a group containing an inf gets d = inf
    xq = np.ones((1, 256), dtype=np.float32)
    xq[0, 3] = 1e6
    _, d = hq.parse_q8x4x2(hq.quantize_q8x4x2(xq), 256, 1)
    assert np.all(np.isposinf(d[0, :4])) and np.all(np.isfinite(d[0, 4:]))


def test_arch_quirks():
    x = np.array([[-np.inf, np.inf, np.nan, 1.0]], dtype=np.float32)
    assert np.isneginf(f32_to_f16_shuffled(x)[0, 0])                  # default: IEEE
    assert np.isnan(f32_to_f16_shuffled(x, arch=73)[0, 0])            # v73/v75: -inf stages as NaN
    assert np.isnan(f32_to_f16_shuffled(x, arch=75)[0, 0])
    assert np.isneginf(f32_to_f16_shuffled(x, arch=79)[0, 0])
    assert np.isposinf(f32_to_f16_shuffled(x, arch=73)[0, 1])
    plain = f32_to_f16_plain(x, arch=75)                              # non-shuffled: NaN -> -inf below v79
    assert np.isneginf(plain[0, 0]) and np.isneginf(plain[0, 2])
    assert np.isnan(f32_to_f16_plain(x, arch=81)[0, 2])
    with pytest.raises(ValueError):
        f32_to_f16_shuffled(x, arch=70)


# ---------------------------------------------------------------------------------------------------
# tile layout


def test_tile_index_hand_example():
    mat = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)       # value = 32*r + c
    t = hmx.pack_tiles(mat).reshape(-1)
    # fp16 index -> (r, c): 0 -> (0,0), 1 -> (1,0), 2 -> (0,1), 3 -> (1,1), 64 -> (2,0), 75 -> (3,5)
    assert [t[i] for i in (0, 1, 2, 3, 64, 75, 1023)] == [0, 32, 1, 33, 64, 3 * 32 + 5, 31 * 32 + 31]
    assert hmx.tile_index(3, 5) == 75 and hmx.tile_index(31, 31) == 1023
    # weight tile = the K x N block: element (r = k, c = n)
    n, k = 64, 96
    w = np.arange(n * k, dtype=np.float32).reshape(n, k) % 2048        # fp16-exact values
    b = hmx.weight_to_tiles(w)
    tiles = b.view(np.float16).astype(np.float32).reshape(n // 32, k // 32, 1024)
    nt, kt, kk, nn = 1, 2, 7, 3
    assert tiles[nt, kt, 64 * (kk // 2) + 2 * nn + kk % 2] == w[32 * nt + nn, 32 * kt + kk]


@pytest.mark.parametrize("m", [1, 32, 38, 65])
def test_tile_roundtrips(m):
    rng = np.random.default_rng(m)
    k, n = 96, 64
    a = round_fp16(rng.standard_normal((m, k)))
    ab = hmx.activation_to_tiles(a)
    mp = -(-m // 32) * 32
    assert ab.size == mp * k * 2
    back = hmx.activation_from_tiles(ab, m, k)
    assert np.array_equal(back[:m], a) and np.all(back[m:] == 0)
    w = round_fp16(rng.standard_normal((n, k)))
    assert np.array_equal(hmx.weight_from_tiles(hmx.weight_to_tiles(w), n, k), w)
    y = round_fp16(rng.standard_normal((m, n)))
    assert np.array_equal(hmx.output_from_tiles(hmx.output_to_tiles(y), m, n), y)
    # tile (i, j) of the activation image holds rows 32i.., cols 32j.. with the pair interleave
    t = ab.view(np.float16).astype(np.float32).reshape(mp // 32, k // 32, 1024)
    r, c = m - 1, k - 1
    assert t[r // 32, c // 32, 64 * (r % 32 // 2) + 2 * (c % 32) + r % 2] == a[r, c]


def test_stage_activations_zero_or_stale_pad_rows():
    k, m = 64, 38
    x = np.random.default_rng(5).standard_normal((m, k)).astype(np.float32)
    zero = hmx.stage_activations(x)
    prev = np.full(zero.size, 0x11, dtype=np.uint8)                  # fp16 0x1111 everywhere
    stale = hmx.stage_activations(x, prev=prev)
    a0 = hmx.activation_from_tiles(zero, m, k)
    a1 = hmx.activation_from_tiles(stale, m, k)
    assert np.array_equal(a0[:m], a1[:m]) and np.array_equal(a0[:m], round_fp16_hw(x))
    assert np.all(a0[m:] == 0)
    assert np.all(a1[m:] == np.array([0x1111], dtype=np.uint16).view(np.float16)[0])
    # full tiles never read prev
    assert np.array_equal(hmx.stage_activations(x[:32], prev=prev[: 32 * k * 2]), hmx.stage_activations(x[:32]))


# ---------------------------------------------------------------------------------------------------
# garbage in VTCM (stale src1 reuse): never an exception, deterministic output


@pytest.mark.parametrize("qtype", QTYPES + [T.F16])
def test_garbage_images_never_raise(qtype):
    rng = np.random.default_rng(99)
    k, n, m = 800, 6, 5
    w = RepackedWeight.from_ggml(ggml_blocks(qtype, n, k, rng), qtype, k)
    stride = hq.activation_row_size(k, qtype)
    img = rng.integers(0, 256, (m, stride), dtype=np.uint8)
    sc = img[:, k:k + 16].view(np.uint16)
    sc[:, 0], sc[:, 1], sc[:, 2] = 0x7C00, 0xFC00, 0x7E01                # inf, -inf, NaN scales
    with np.errstate(all="raise"):                                        # no warnings escape either
        y1 = hvx.hvx_matmul(w, img, m)
        y2 = hvx.hvx_matmul(w, img.reshape(-1), m)
    assert y1.shape == (m, n) and y1.dtype == np.float32
    assert np.array_equal(y1, y2, equal_nan=True)
    if qtype != T.F16:
        assert np.isnan(y1).any() or np.isinf(y1).any()
