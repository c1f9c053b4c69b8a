"""x4x2 weight repack of the ggml-hexagon host (set_tensor into an "HTPn-REPACK" buffer).

Upstream reference: ggml-hexagon.cpp, repack_row_q4x4x2 / repack_row_q4_1x4x2 / repack_row_q8x4x2 and the
repack_<type>_<x4x2> drivers (snapshot ggml-org/ggml bb4dc86a). IQ4_NL goes through the Q4_0 repacker.

Row layout (k elements, nsub = k/32 ggml blocks, super-block = 8 blocks = 256 elements):
- quants first, then scales; the stored row is exactly the ggml row size (the host copies `row_size` bytes
  of a padded scratch row), so the scale area starts at k/2 (Q4) or k (Q8) and is never padded.
- Q4_0 / IQ4_NL / Q4_1: full super-block i occupies bytes 128*i .. 128*i+127 and byte j holds element j in
  its low nibble and element j+128 in its high nibble (natural element order inside the super-block).
  A partial last super-block (k % 256 != 0) is packed by adjacent pairs instead: byte j = e[2j] | e[2j+1]<<4.
- Q8_0: the int8 quants in natural order.
- scales: the block d's as fp16, in block order, contiguous (8 per super-block = 16 B); Q4_1 stores (d, m)
  pairs (32 B per super-block). With the ggml row size every scale of a partial super-block still fits; the
  pad quants (8, or 0 for Q4_1/Q8_0) and pad scales (0) the host writes fall outside the stored row.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kazeia.backends.htp.fp16 import from_fp16_bits
from kazeia.backends.htp.kernels.hmx import hmx_weight_rows
from kazeia.gguf.quants import QK  # elements per ggml block / per HVX lane ("sub-block")
from kazeia.graph.tensor import Tensor
from kazeia.native.idioms import IQ4_NL_VALUES  # ggml's IQ4_NL code book (kvalues_iq4nl), as int8

GGMLType = GGMLQuantizationType

SUPER = 256        # elements per x4x2 super-block
REPACK_QTYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.IQ4_NL)
WEIGHT_QTYPES = REPACK_QTYPES + (GGMLType.F16,)


_Q4_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.IQ4_NL)
F16_LUT = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)  # fp16 bits -> value


def _check(qtype: GGMLType, k: int) -> None:
    if qtype not in REPACK_QTYPES:
        raise ValueError(f"x4x2 repack not modelled for {GGMLType(qtype).name}")
    if k <= 0 or k % QK:
        raise ValueError(f"row length {k} must be a positive multiple of {QK}")


def x4x2_row_bytes(qtype: GGMLType, k: int) -> int:
    """Bytes of one repacked row: the ggml row size (quants + scales, not padded to super-blocks)."""
    _check(qtype, k)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return k // block_size * type_size


def _rows(a: np.ndarray, row_bytes: int) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.uint8)
    if a.ndim == 1:
        if a.size % row_bytes:
            raise ValueError(f"{a.size} bytes is not a whole number of {row_bytes}-byte rows")
        a = a.reshape(-1, row_bytes)
    if a.ndim != 2 or a.shape[1] != row_bytes:
        raise ValueError(f"expected rows of {row_bytes} bytes, got shape {a.shape}")
    return a


# --- ggml blocks <-> (codes, scale bits) ---------------------------------------------------------------


def _split_ggml(raw: np.ndarray, qtype: GGMLType, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """ggml rows -> (codes (N, k) uint8 in element order, d bits (N, nsub) uint16, m bits or None)."""
    _, ts = GGML_QUANT_SIZES[qtype]
    b = raw.reshape(raw.shape[0], k // QK, ts)
    d = np.ascontiguousarray(b[..., 0:2]).view(np.uint16)[..., 0]
    m = None
    if qtype == GGMLType.Q8_0:
        codes = b[..., 2:]
    else:
        off = 4 if qtype == GGMLType.Q4_1 else 2
        if qtype == GGMLType.Q4_1:
            m = np.ascontiguousarray(b[..., 2:4]).view(np.uint16)[..., 0]
        qs = b[..., off:]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # ggml: low nibbles = elements 0..15
    return np.ascontiguousarray(codes).reshape(raw.shape[0], k), d, m


def _join_ggml(codes: np.ndarray, d: np.ndarray, m: np.ndarray | None, qtype: GGMLType, k: int) -> np.ndarray:
    n = codes.shape[0]
    c = codes.reshape(n, k // QK, QK)
    parts = [np.ascontiguousarray(d)[..., None].view(np.uint8)]
    if qtype == GGMLType.Q4_1:
        parts.append(np.ascontiguousarray(m)[..., None].view(np.uint8))
    if qtype == GGMLType.Q8_0:
        parts.append(c)
    else:
        parts.append(c[..., :16] | (c[..., 16:] << 4))
    return np.concatenate(parts, axis=-1).reshape(n, -1)


# --- x4x2 quant area <-> codes ------------------------------------------------------------------------


def _pack_codes(codes: np.ndarray, qtype: GGMLType, k: int) -> np.ndarray:
    if qtype == GGMLType.Q8_0:
        return codes
    n = codes.shape[0]
    full = k // SUPER * SUPER
    sb = codes[:, :full].reshape(n, -1, 2, 128)
    packed = [(sb[:, :, 0] | (sb[:, :, 1] << 4)).reshape(n, -1)]
    if full < k:  # partial last super-block: adjacent pairs share a byte
        tail = codes[:, full:].reshape(n, -1, 2)
        packed.append(tail[..., 0] | (tail[..., 1] << 4))
    return np.concatenate(packed, axis=1)


def _unpack_codes(qbytes: np.ndarray, qtype: GGMLType, k: int) -> np.ndarray:
    if qtype == GGMLType.Q8_0:
        return qbytes
    n = qbytes.shape[0]
    full = k // SUPER * SUPER
    sb = qbytes[:, : full // 2].reshape(n, -1, 1, 128)
    out = [np.concatenate([sb & 0x0F, sb >> 4], axis=2).reshape(n, full)]
    if full < k:
        tail = qbytes[:, full // 2:]
        out.append(np.stack([tail & 0x0F, tail >> 4], axis=-1).reshape(n, -1))
    return np.concatenate(out, axis=1)


def _qrow_bytes(qtype: GGMLType, k: int) -> int:
    return k if qtype == GGMLType.Q8_0 else k // 2


# --- public repack API ----------------------------------------------------------------------------------


def repack_x4x2(raw: np.ndarray, qtype: GGMLType, k: int) -> np.ndarray:
    """ggml block rows (N, row_bytes) uint8 -> repacked rows (N, row_bytes) exactly as the host stores them."""
    _check(qtype, k)
    raw = _rows(raw, x4x2_row_bytes(qtype, k))
    n, (_, ts) = raw.shape[0], GGML_QUANT_SIZES[qtype]
    nsub, qb = k // QK, _qrow_bytes(qtype, k)
    out = np.empty_like(raw)
    # the d's (Q4_1: (d, m) pairs) in block order, copied as whole 2 (4) B words
    word = np.uint32 if qtype == GGMLType.Q4_1 else np.uint16
    w = np.dtype(word).itemsize
    out[:, qb:].view(word)[:] = raw.view(word).reshape(n, nsub, ts // w)[..., 0]
    if qtype == GGMLType.Q8_0:
        out[:, :qb] = raw.reshape(n, nsub, ts)[..., 2:].reshape(n, k)
    elif k % SUPER == 0:
        qs = raw.view(np.uint16).reshape(n, nsub, ts // 2)[..., w // 2:]  # 8 words of nibbles per block
        _pack_q4_superblocks(qs.reshape(n, k // SUPER, 8, 8), out[:, :qb].reshape(n, -1, 4, 32))
    else:
        out[:, :qb] = _pack_codes(_split_ggml(raw, qtype, k)[0], qtype, k)
    return out


_LOW4 = np.uint64(0x0F0F0F0F0F0F0F0F)  # the low nibble of each of 8 bytes


def _pack_q4_superblocks(qs: np.ndarray, out: np.ndarray) -> None:
    """x4x2 quant bytes of whole super-blocks straight from the ggml nibbles (the same bytes as _pack_codes of
    _split_ggml's codes): qs (N, S, 8 blocks, 8 uint16 = 16 B) -> out (N, S, 4, 32) uint8. Byte 32i+p of a super-block
    holds element 32i+p (block i) low and element 128+32i+p (block i+4) high; ggml keeps element p of a block
    in the low nibble of byte p for p < 16 and in the high nibble of byte p-16 otherwise. Computed 8 bytes at
    a time (uint64 lanes; every mask keeps each byte's bits inside that byte)."""
    q = np.ascontiguousarray(qs).view(np.uint64).reshape(qs.shape[0], qs.shape[1], 2, 4, 2)
    lo, hi = q[:, :, 0], q[:, :, 1]                       # blocks 0..3 and 4..7, 2 lanes of 8 B each
    o = out.view(np.uint64)                                # (N, S, 4, 4): 16 B low half, 16 B high half
    o[..., :2] = (lo & _LOW4) | ((hi & _LOW4) << np.uint64(4))
    o[..., 2:] = ((lo >> np.uint64(4)) & _LOW4) | (hi & ~_LOW4)


def decode_x4x2(rep: np.ndarray, qtype: GGMLType, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Repacked rows -> (codes (N, k) uint8 in element order, d bits (N, nsub) uint16, m bits or None).

    Reads any bytes (it is a pure reinterpretation), so it also decodes arbitrary/garbage rows.
    """
    _check(qtype, k)
    rep = _rows(rep, x4x2_row_bytes(qtype, k))
    codes = _unpack_codes(rep[:, :_qrow_bytes(qtype, k)], qtype, k)
    return (codes, *x4x2_scale_bits(rep, qtype, k))


def x4x2_scale_bits(rep: np.ndarray, qtype: GGMLType, k: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Repacked rows -> (d bits (N, nsub) uint16, m bits (Q4_1) or None), read from the scale area only."""
    rep = _rows(rep, x4x2_row_bytes(qtype, k))
    s = np.ascontiguousarray(rep[:, _qrow_bytes(qtype, k):]).view(np.uint16)
    if qtype == GGMLType.Q4_1:
        return s[:, 0::2], s[:, 1::2]
    return s, None


def unpack_x4x2(rep: np.ndarray, qtype: GGMLType, k: int) -> np.ndarray:
    """Exact inverse of `repack_x4x2`: repacked rows -> ggml block rows."""
    codes, d, m = decode_x4x2(rep, qtype, k)
    return _join_ggml(codes, d, m, qtype, k)


def signed_quants(codes: np.ndarray, qtype: GGMLType) -> np.ndarray:
    """Codes -> the int8 operand the HVX vrmpy sees: q-8 (Q4_0), table value (IQ4_NL), q (Q8_0), 0..15 (Q4_1)."""
    if qtype == GGMLType.Q4_0:
        return (codes.astype(np.int8) - np.int8(8)).astype(np.int8)
    if qtype == GGMLType.IQ4_NL:
        return IQ4_NL_VALUES[codes]
    if qtype == GGMLType.Q8_0:
        return codes.view(np.int8)
    return codes.astype(np.int8)


# --- the weight object the backend keeps ----------------------------------------------------------------


def w16_destination(n: int, k: int, r0: int, r1: int | None, out: np.ndarray | None) -> tuple[int, np.ndarray]:
    """(rows, (rows, k) float32 array) for a weight's w16_rows(r0, r1, out): the head of the caller's C-contiguous
    float32 scratch `out` (one for all the tiles of a matmul), or a new array."""
    r1 = n if r1 is None else min(r1, n)
    rows = max(0, r1 - max(0, r0))
    if out is None:
        out = np.empty(rows * k, dtype=np.float32)
    elif out.dtype != np.float32 or not out.flags.c_contiguous or out.size < rows * k:
        raise ValueError(f"w16_rows needs a C-contiguous float32 scratch of {rows * k} elements")
    return rows, out.reshape(-1)[: rows * k].reshape(rows, k)


class WeightSource(Protocol):
    """The REPACK buffer as the MUL_MAT paths read it (ops/matmul.py WeightStore): a weight's repacked form."""

    def get(self, w: Tensor) -> RepackedWeight: ...


class RepackedWeight:
    """One weight matrix as the DSP sees it: `n` rows of `k` elements in the REPACK buffer layout.

    The repack is a pure byte permutation, so the weight is kept as the ggml rows it was made from (`ggml`,
    usually a view of the memory-mapped GGUF: no copy) and everything is computed from them: the kernels read
    codes and scales per tile (hvx_matmul / hmx_matmul), and the x4x2 bytes themselves, observable only where
    they land in VTCM, are made on demand for the rows asked for (`x4x2_rows`). `RepackedWeight(qtype, k, n,
    data)` builds one from x4x2 rows instead (any bytes: a stale VTCM row); they are unpacked to ggml rows.
    F16 rows are the same in both layouts. `data` (all x4x2 rows), `quants`, `scales`, `w16` ... compute the
    whole matrix each time they are read: for checks and small weights, never used by the kernels.
    """

    def __init__(self, qtype: GGMLType, k: int, n: int, data: np.ndarray | None = None, *,
                 ggml: np.ndarray | None = None) -> None:
        self.qtype = GGMLType(qtype)
        self.k, self.n = int(k), int(n)
        if self.qtype not in WEIGHT_QTYPES:
            raise ValueError(f"HTP matmul weights of type {self.qtype.name} are not modelled")
        if self.qtype == GGMLType.F16:
            if self.k <= 0:
                raise ValueError("k must be positive")
        else:
            _check(self.qtype, self.k)
        if ggml is None:
            if data is None:
                raise ValueError("a RepackedWeight needs its x4x2 rows or its ggml rows")
            rows = _rows(data, self.row_bytes)
            ggml = rows if self.qtype == GGMLType.F16 else unpack_x4x2(rows, self.qtype, self.k)
        self.ggml = _rows(ggml, self.row_bytes)
        if self.ggml.shape[0] != self.n:
            raise ValueError(f"expected {self.n} rows, got {self.ggml.shape[0]}")
        # what the ops leave of this weight in VTCM, by layout: (offset, read-only bytes) runs of a few rows (see
        # matmul.MatmulUnit._leave_hvx_bytes): made once per layout, not on every use
        self.ring_images: dict[tuple, tuple[tuple[int, np.ndarray], ...]] = {}
        self._blocks: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def from_ggml(cls, raw: np.ndarray, qtype: GGMLType, k: int) -> RepackedWeight:
        """The weight the host's `set_tensor` makes of ggml rows; the rows are kept as given (not copied)."""
        qtype = GGMLType(qtype)
        rb = 2 * k if qtype == GGMLType.F16 else x4x2_row_bytes(qtype, k)
        rows = _rows(raw, rb)
        return cls(qtype, k, rows.shape[0], ggml=rows)

    @property
    def row_bytes(self) -> int:
        return 2 * self.k if self.qtype == GGMLType.F16 else x4x2_row_bytes(self.qtype, self.k)

    @property
    def nsub(self) -> int:
        """Number of 32-element sub-blocks per row (ggml blocks)."""
        return -(-self.k // QK)

    def blocks(self, r0: int = 0, r1: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rows r0..r1 of the ggml blocks as (uint8 (R, nsub, type_size), uint16 (R, nsub, type_size/2)) views
        (those of all rows are made once: the kernels keep their addresses by view)."""
        whole = r0 == 0 and r1 is None
        if whole and self._blocks is not None:
            return self._blocks
        _, ts = GGML_QUANT_SIZES[self.qtype]
        raw = self.ggml[r0:r1]
        r = raw.shape[0]
        out = raw.reshape(r, self.nsub, ts), raw.view(np.uint16).reshape(r, self.nsub, ts // 2)
        if whole:
            self._blocks = out
        return out

    def x4x2_rows(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        """Rows r0..r1 as stored in the REPACK buffer (x4x2 for quantized types, fp16 rows for F16)."""
        raw = self.ggml[r0:r1]
        return np.ascontiguousarray(raw) if self.qtype == GGMLType.F16 else repack_x4x2(raw, self.qtype, self.k)

    @property
    def data(self) -> np.ndarray:
        """(n, row_bytes) uint8: every row as the REPACK buffer holds it (computed now)."""
        return self.x4x2_rows()

    def fields(self, r0: int = 0, r1: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Rows r0..r1 -> (codes (R, k) uint8 in element order, d bits (R, nsub) uint16, m bits or None)."""
        if self.qtype == GGMLType.F16:
            raise ValueError("F16 weights have no quants/scales")
        return _split_ggml(np.ascontiguousarray(self.ggml[r0:r1]), self.qtype, self.k)

    @property
    def quants(self) -> np.ndarray:
        """(n, nsub, 32) int8: the integer operand of the HVX dot (see `signed_quants`)."""
        return signed_quants(self.fields()[0], self.qtype).reshape(self.n, self.nsub, QK)

    @property
    def quants_t(self) -> np.ndarray:
        """(nsub, 32, n) int8, C-contiguous: `quants` sub-block major."""
        return np.ascontiguousarray(self.quants.transpose(1, 2, 0))

    @property
    def codes(self) -> np.ndarray:
        """(n, k) uint8: the raw 4/8-bit codes in element order."""
        return self.fields()[0]

    @property
    def scales(self) -> np.ndarray:
        """(n, nsub) float32: the fp16 block scales d."""
        return from_fp16_bits(self.fields()[1])

    @property
    def mins(self) -> np.ndarray:
        """(n, nsub) float32: the fp16 block offsets m (Q4_1 only)."""
        if self.qtype != GGMLType.Q4_1:
            raise ValueError(f"{self.qtype.name} has no block offsets")
        return from_fp16_bits(self.fields()[2])

    def w16_rows(self, r0: int = 0, r1: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """(R, k) float32 of fp16 values: rows r0..r1 of the matrix the HMX path multiplies (what its dequant
        tasks scatter into weight tiles; see hmx/tiles.py), computed from the ggml blocks (kernels/hmx.py).
        `out`: a C-contiguous float32 scratch of at least R*k elements to write them into (its head is
        returned, shaped (R, k)); the caller's matmul reuses one for all its tiles."""
        rows, dst = w16_destination(self.n, self.k, r0, r1, out)
        if self.qtype == GGMLType.F16:
            np.copyto(dst, self.ggml[r0:r1].view(np.float16))  # exact widening, as from_fp16_bits
            return dst
        b8, b16 = self.blocks(r0, r1)
        hmx_weight_rows(b8, b16, self.qtype, dst.reshape(rows, self.nsub, QK), IQ4_NL_VALUES, F16_LUT)
        return dst

    @property
    def w16(self) -> np.ndarray:
        """(n, k) float32 of fp16 values: the whole HMX weight, computed now."""
        return self.w16_rows()

    def dequantized(self) -> np.ndarray:
        """(n, k) float32 of d*q (+m) in float32, ggml's own dequantization; for checks, not used by kernels."""
        if self.qtype == GGMLType.F16:
            return self.w16
        q = self.quants.astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            v = self.scales[..., None] * q
            if self.qtype == GGMLType.Q4_1:
                v = v + self.mins[..., None]
        return v.reshape(self.n, self.k)
