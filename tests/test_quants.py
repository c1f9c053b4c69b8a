"""Block formats: kazeia.gguf.quants.dequantize against gguf-py (bitwise, float32) and against a scalar,
exact-rational transcription of ggml's dequantize_row_* (float64).

Blocks are random but valid: random bytes everywhere, with the f16 scale fields drawn from every finite f16
bit pattern (subnormals and negatives included), plus blocks that gguf-py's quantizers produce from data.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq

from kazeia.errors import UnsupportedError
from kazeia.gguf.quants import dequantize
from oracle_utils import F16_FIELDS, random_blocks

T = GGMLQuantizationType

BLOCK_TYPES = list(F16_FIELDS)
ALL_TYPES = BLOCK_TYPES + [T.BF16]


# ---------------------------------------------------------------------------------------------------
# scalar oracle: one block at a time, as ggml-quants.c reads it, in exact rationals


def _f16(b: np.ndarray, off: int) -> Fraction:
    return Fraction(float(np.frombuffer(bytes(b[off:off + 2]), dtype="<f2")[0]))


def _scale_min_k4(j: int, s: np.ndarray) -> tuple[int, int]:
    s = [int(x) for x in s]
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def block_exact(qtype: T, b: np.ndarray) -> list[Fraction]:
    b = np.asarray(b, dtype=np.uint8)
    if qtype == T.Q4_0:
        d, qs = _f16(b, 0), b[2:18]
        return [((int(qs[j]) & 0xF) - 8) * d for j in range(16)] + [((int(qs[j]) >> 4) - 8) * d for j in range(16)]
    if qtype == T.Q4_1:
        d, m, qs = _f16(b, 0), _f16(b, 2), b[4:20]
        return [(int(qs[j]) & 0xF) * d + m for j in range(16)] + [(int(qs[j]) >> 4) * d + m for j in range(16)]
    if qtype == T.Q5_0:
        d = _f16(b, 0)
        qh = int.from_bytes(bytes(b[2:6]), "little")
        qs = b[6:22]
        lo, hi = [], []
        for j in range(16):
            xh0 = ((qh >> j) << 4) & 0x10
            xh1 = (qh >> (j + 12)) & 0x10
            lo.append((((int(qs[j]) & 0x0F) | xh0) - 16) * d)
            hi.append((((int(qs[j]) >> 4) | xh1) - 16) * d)
        return lo + hi
    if qtype == T.Q8_0:
        d = _f16(b, 0)
        return [int(q) * d for q in b[2:34].view(np.int8)]
    if qtype == T.Q4_K:
        d, dmin, scales, q = _f16(b, 0), _f16(b, 2), b[4:16], b[16:144]
        y: list[Fraction] = []
        for c in range(4):
            sc1, m1 = _scale_min_k4(2 * c, scales)
            sc2, m2 = _scale_min_k4(2 * c + 1, scales)
            chunk = q[32 * c: 32 * c + 32]
            y += [d * sc1 * (int(x) & 0xF) - dmin * m1 for x in chunk]
            y += [d * sc2 * (int(x) >> 4) - dmin * m2 for x in chunk]
        return y
    if qtype == T.Q6_K:
        ql, qh, sc, d = b[0:128], b[128:192], b[192:208].view(np.int8), _f16(b, 208)
        y = [Fraction(0)] * 256
        for half in range(2):
            L, H, S, base = ql[64 * half:], qh[32 * half:], sc[8 * half:], 128 * half
            for lo in range(32):
                i = lo // 16
                q1 = ((int(L[lo]) & 0xF) | (((int(H[lo]) >> 0) & 3) << 4)) - 32
                q2 = ((int(L[lo + 32]) & 0xF) | (((int(H[lo]) >> 2) & 3) << 4)) - 32
                q3 = ((int(L[lo]) >> 4) | (((int(H[lo]) >> 4) & 3) << 4)) - 32
                q4 = ((int(L[lo + 32]) >> 4) | (((int(H[lo]) >> 6) & 3) << 4)) - 32
                y[base + lo] = d * int(S[i]) * q1
                y[base + lo + 32] = d * int(S[i + 2]) * q2
                y[base + lo + 64] = d * int(S[i + 4]) * q3
                y[base + lo + 96] = d * int(S[i + 6]) * q4
        return y
    if qtype == T.BF16:
        u = int.from_bytes(bytes(b[:2]), "little") << 16
        return [Fraction(float(np.array([u], dtype=np.uint32).view(np.float32)[0]))]
    raise AssertionError(qtype)


def exact_rows(qtype: T, raw: np.ndarray) -> np.ndarray:
    """Correctly rounded float64 of the exact value of every element."""
    _, ts = GGML_QUANT_SIZES[qtype]
    out = []
    for row in raw.reshape(-1, raw.shape[-1]):
        vals: list[Fraction] = []
        for i in range(0, row.size, ts):
            vals += block_exact(qtype, row[i:i + ts])
        out.append([float(v) for v in vals])  # float(Fraction) rounds correctly
    return np.array(out, dtype=np.float64).reshape(*raw.shape[:-1], -1)


# ---------------------------------------------------------------------------------------------------


def _bits32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("scale_kind", ["any", "realistic"])
def test_float32_bitwise_equal_to_gguf_py(qtype, scale_kind):
    raw = random_blocks(qtype, n_rows=6, n_blocks=8 if GGML_QUANT_SIZES[qtype][0] > 1 else 64, seed=qtype.value,
                        scale_kind=scale_kind)
    ours = dequantize(raw, qtype, np.float32)
    theirs = gq.dequantize(raw, qtype)
    assert ours.dtype == np.float32
    assert ours.shape == theirs.shape
    diff = np.flatnonzero(_bits32(ours) != _bits32(theirs))
    assert diff.size == 0, f"{diff.size} elements differ, first at {diff[0]}: {ours.flat[diff[0]]!r} " \
                           f"vs gguf-py {theirs.flat[diff[0]]!r}"


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_float64_is_exact(qtype):
    raw = random_blocks(qtype, n_rows=3, n_blocks=4 if GGML_QUANT_SIZES[qtype][0] > 1 else 32, seed=100 + qtype.value)
    ours = dequantize(raw, qtype, np.float64)
    want = exact_rows(qtype, raw)
    assert ours.dtype == np.float64
    np.testing.assert_array_equal(ours, want)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.BF16], ids=lambda t: t.name)
def test_quantized_by_gguf_py(qtype):
    """Blocks produced by gguf-py's reference quantizers from normal data (the common case in real files)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 512)).astype(np.float32)
    raw = gq.quantize(x, qtype)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    ours32 = dequantize(raw, qtype, np.float32)
    np.testing.assert_array_equal(_bits32(ours32), _bits32(gq.dequantize(raw, qtype)))
    np.testing.assert_array_equal(dequantize(raw, qtype, np.float64), exact_rows(qtype, raw))


def test_leading_dimensions_are_kept():
    raw = random_blocks(T.Q4_K, n_rows=6, n_blocks=2, seed=1, scale_kind="realistic").reshape(2, 3, -1)
    out = dequantize(raw, T.Q4_K, np.float32)
    assert out.shape == (2, 3, 512)
    np.testing.assert_array_equal(out.reshape(6, 512), dequantize(raw.reshape(6, -1), T.Q4_K, np.float32))


@pytest.mark.parametrize("qtype,dt", [(T.F32, np.float32), (T.F16, np.float16)])
def test_plain_float_types(qtype, dt):
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(dt)
    np.testing.assert_array_equal(dequantize(x.view(np.uint8), qtype, np.float64), x.astype(np.float64))
    np.testing.assert_array_equal(dequantize(x, qtype, np.float32), x.astype(np.float32))


def test_unsupported_type_is_a_clear_error():
    bs, ts = GGML_QUANT_SIZES[T.IQ2_XXS]
    with pytest.raises(UnsupportedError, match="IQ2_XXS"):
        dequantize(np.zeros((1, ts), dtype=np.uint8), T.IQ2_XXS)


@pytest.mark.parametrize("wtype", ["q4_0", "q8_0"])
def test_the_float64_dequantization_is_gguf_pys_values(wtype, tmp_path):
    """REF's weights (ref.py EXACT_IN_F32): the native float64 dequantization, whole and by rows, equals gguf-py's
    float64 values bit for bit (an fp16 scale times a small code: exact in float32 and float64 alike)."""
    from kazeia.backends.cpu.kernels.dequant import dequantize_rows_f64
    from kazeia.backends.ref import RefBackend
    from kazeia.engine.context import Model
    from kazeia.gguf.quants import dequantize
    from kazeia.gguf.writer import preset, write_model
    from kazeia.graph.tensor import rows

    path = str(tmp_path / "m.gguf")
    write_model(preset("tiny", wtype=wtype), path)
    t = Model.load(path).weights["blk.0.ffn_down.weight"]
    want = dequantize(rows(t), t.type, np.float64).reshape(t.ne[::-1])
    raw = rows(t)[0, 0]
    assert np.array_equal(dequantize_rows_f64(raw, t.type, t.ne[0]), want[0, 0])
    sel = np.array([3, 0, 77])
    ref = RefBackend()
    assert np.array_equal(ref.load(t), want) and np.array_equal(ref.load_rows(t, sel), want[0, 0][sel])
