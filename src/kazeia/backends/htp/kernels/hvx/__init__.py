"""The HVX vec_dot family: the HVX MUL_MAT of ggml weight rows with q8 activation images (hvx/dot.py is its numpy
model), as AVX2 IR (ir.py: `hvx_dot_<kind>`, `hvx_pairs`, compiled by native/compile.py), its fronts (`hvx_dot`,
`BoundDot`) and its portable numba twin (portable.py). Each gives the bits of the others
(tests/test_htp_simd.py, tests/test_htp_hvx_pairs.py).

Lane L of the 32 fp32 accumulators owns sub-block L of every 1024-element chunk, exactly as on the DSP: the 32
exact int32 sub-block dots of a chunk are computed as vectors (Q4_0 / Q4_1: two blocks' nibbles per ymm against int8
quants laid out in pair order, pmaddubsw; Q8_0 / IQ4_NL: codes widened to int16, pmaddwd; then a phaddd
transposition tree puts sub-block b in lane b % 8: integer sums are exact in any order), multiplied by the fp32
d_w*d_x of their sub-block, added lane-wise in fp32 (Q4_1: plus the rounded m_w*s_x first, no FMA anywhere), then
reduced by the far or the adjacent tree. The twin does the same arithmetic in the same order, explicit IEEE
float32, no fastmath.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from kazeia.backends.htp.kernels.hvx.ir import KINDS, emit_dot, emit_dot_seq, emit_pairs
from kazeia.backends.htp.kernels.hvx.portable import hvx_dot_portable, hvx_dot_seq_portable
from kazeia.native.buffers import ThreadScratch, kept_ptr
from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import Library, available
from kazeia.native.idioms import KIND_CODE
from kazeia.native.pool import run, run_rows
from kazeia.native.threads import threads

GGMLType = GGMLQuantizationType
NAMES = {GGMLType.Q4_0: "q4_0", GGMLType.Q4_1: "q4_1", GGMLType.Q8_0: "q8_0", GGMLType.IQ4_NL: "iq4_nl"}
NIBBLE_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1)  # NIBBLES: their dot reads the image's int8 quants
PARALLEL_MIN_ELEMS = 1 << 18     # weight row ranges below this run on one thread
HVX_CHUNK = 128                  # weight rows per claimed chunk of the HVX dot (see hvx_dot)
DECODE_ROWS = 8                  # HVX dots of up to this many activation rows keep the kernel threads spinning


LIB = Library(__name__, "kazeia_htp_hvx")
PAIRS = LIB.kernel("hvx_pairs", emit_pairs)
DOT = LIB.kernels("hvx_dot", emit_dot, KINDS, par=True)
DOT_SEQ = LIB.kernels("hvx_dot_seq", emit_dot_seq, KINDS, par=True)  # October 2026's summation order


# --- fronts ----------------------------------------------------------------------------------------------------

_SCRATCH = ThreadScratch(limit=64)


def _dot_scratch(m: int, n16: int, npad: int, k: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """This thread's (x16 (m, n16) int16, xs (m, npad) int32) scratch of the HVX dot for K = k and their
    pointers: x16 is zero past what the callers of one (m, n16, npad, k) write."""
    def make():
        x16 = np.zeros((m, n16), dtype=np.int16)
        xs = np.zeros((m, npad), dtype=np.int32)
        return x16, xs, addr(x16), addr(xs)
    return _SCRATCH.get((m, n16, npad, k), make)


def hvx_dot(b8: np.ndarray, b16: np.ndarray, qtype: GGMLType, image: np.ndarray, m: int, k: int,
            parse, iq4: np.ndarray, lut: np.ndarray, sequential: bool = False) -> np.ndarray:
    """y (M, N) float32 = the HVX MUL_MAT of the ggml rows b8 (N, nb, type_size) with the M rows of the
    activation image (q8_1x4x2 for Q4_1, q8x4x2 else; `parse(image, k, m)` reads it for the portable
    kernel). `sequential`: October 2026's order (one accumulator per output, blocks in K order) instead of May's
    32 lanes and tree."""
    n, nb = b8.shape[0], b8.shape[1]
    y = np.empty((m, n), dtype=np.float32)
    img = np.asarray(image, dtype=np.uint8)
    if not available() or b8.strides[2] != 1 or img.ndim != 2 or img.strides[1] != 1 or m == 0:
        parsed = parse(image, k, m)
        aq, ad = parsed[0], parsed[1]
        asum = parsed[2] if len(parsed) > 2 else ad
        twin = hvx_dot_seq_portable if sequential else hvx_dot_portable
        twin(b8, b16, KIND_CODE[NAMES[qtype]], iq4, lut, np.ascontiguousarray(aq),
             np.ascontiguousarray(ad, dtype=np.float32), np.ascontiguousarray(asum, dtype=np.float32), y)
        return y
    npad, pimg = -(-nb // 8) * 8, addr(img)
    if qtype in NIBBLE_TYPES:  # the int8 quants in the kernel's pair order, and their sums per sub-block
        x16, xs, p16, ps = _dot_scratch(m, npad * 16, npad, k)
        PAIRS.fn(pimg, img.strides[0], nb, npad, p16, ps, 0, m)
    else:
        x16, xs, p16, ps = _dot_scratch(m, npad * 32, npad, k)  # the int8 quants widened once (zero past K)
        x16[:, :k] = img[:m, :k].view(np.int8)
    args = (kept_ptr(b8), b8.strides[0], nb, p16, ps, pimg, img.strides[0], k, m, addr(y), n, n)
    # a decode's HVX dots come one after another, a few hundred us of Python apart: the worker waits spinning
    # (as for the CPU decode GEMVs); after a batch of many rows it sleeps at once. Chunks of HVX_CHUNK rows: a
    # thread streams 128 consecutive rows (~180 KB of Q4_0 at K=2560) before it claims again; with 16-row claims
    # the two threads' streams interleaved every 23 KB and May's dots of a 36-layer decode took 1.4x as long
    # (102 vs 72 ms for its 252 weights at M=1, 2 threads). Which thread computes a row never changes its bits.
    kernel = (DOT_SEQ if sequential else DOT)[NAMES[qtype]]
    run_rows(kernel, args, n, HVX_CHUNK, n * nb * 32 * m >= PARALLEL_MIN_ELEMS, linger=m <= DECODE_ROWS)
    return y


class BoundDot:
    """`hvx_dot` of one weight's ggml rows b8 (N, nb, type_size) with M activation rows, its arguments worked out
    once: a decode runs the same matmul every token. `run(pimg, imgstride, py)` multiplies the image at address
    pimg (rows imgstride bytes apart) into y at address py (rows N floats apart), as `hvx_dot` does; the int16 /
    pair-order scratch is the caller's (`scratch`: (x16, xs) of `dot_scratch_shape`), since two sessions may
    run on two threads."""

    __slots__ = ("fn", "qtype", "m", "k", "n", "nb", "npad", "pw", "wstride", "p16", "ps", "x16",
                 "parallel", "linger", "ctr", "pctr")

    def __init__(self, b8: np.ndarray, qtype: GGMLType, m: int, k: int, scratch: tuple[np.ndarray, np.ndarray],
                 sequential: bool = False):
        self.qtype, self.m, self.k = qtype, m, k
        self.n, self.nb = b8.shape[0], b8.shape[1]
        self.npad = -(-self.nb // 8) * 8
        self.pw, self.wstride = kept_ptr(b8), b8.strides[0]
        self.x16 = scratch[0]
        self.p16, self.ps = addr(scratch[0]), addr(scratch[1])
        kernel = (DOT_SEQ if sequential else DOT)[NAMES[qtype]]  # sequential: October 2026's order
        self.fn = kernel.fn, kernel.par
        self.parallel = self.n > HVX_CHUNK and self.n * self.nb * 32 * m >= PARALLEL_MIN_ELEMS
        self.linger = m <= DECODE_ROWS
        self.ctr = np.zeros(1, dtype=np.int64)
        self.pctr = addr(self.ctr)

    @staticmethod
    def usable(b8: np.ndarray, qtype: GGMLType, m: int) -> bool:
        """Whether `hvx_dot` would run these through the native kernel (else the caller keeps the general path)."""
        return available() and b8.strides[2] == 1 and m > 0 and qtype in NAMES

    @staticmethod
    def scratch_shape(qtype: GGMLType, nb: int, m: int) -> tuple[int, int, int]:
        """(m, int16 columns, npad) of the scratch `hvx_dot` uses for these (`_dot_scratch`)."""
        npad = -(-nb // 8) * 8
        return m, npad * (16 if qtype in NIBBLE_TYPES else 32), npad

    def run(self, img: np.ndarray, pimg: int, imgstride: int, py: int) -> None:
        m, nb, npad = self.m, self.nb, self.npad
        if self.qtype in NIBBLE_TYPES:
            PAIRS.fn(pimg, imgstride, nb, npad, self.p16, self.ps, 0, m)
        else:
            self.x16[:, :self.k] = img[:m, :self.k].view(np.int8)
        args = (self.pw, self.wstride, nb, self.p16, self.ps, pimg, imgstride, self.k, m, py, self.n, self.n)
        if self.parallel and threads() > 1:  # as run_rows: the threads claim chunks of rows from the counter
            self.ctr[0] = 0
            run(self.fn[1], (*args, self.pctr, self.n, HVX_CHUNK), linger=self.linger)
        else:
            self.fn[0](*args, 0, self.n)

