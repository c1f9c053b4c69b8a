"""Weight matmuls of the `cpu` backend on the quantized bytes (no float copy of any weight).

`weight_matmul(raw, qtype, k, x)` computes y (M, N) = x (M, K) @ W^T for a 2-D weight given by its raw rows
(N, row_bytes), typically a view of the memory-mapped GGUF:

- small M (decode, M <= GEMV_MAX_M) on Q4_0 / Q4_1 / Q8_0: a GEMV that streams each weight row's bytes once.
  The activations are quantized first, as ggml does with its vec_dot_type, but to int16 per 32-element block
  with one float32 scale d = amax/32767 (ggml: int8, fp16 scale): the conversion error is ~1e-9 NMSE, far
  below test-backend-ops' 5e-4 and the 1e-5 the whole-model tests allow. Per block the dot of the 4/8-bit
  codes with the int16 activations is an exact int32, scaled by d_w * d_x into float32 accumulators. Each
  output is computed by one thread in one fixed order, so results do not depend on the thread count.
- larger M on Q4_0 / Q4_1 / Q8_0 (prefill): the AVX2 GEMM (kernels/gemm/) on the same int16 activations, per
  panel of 16 weight rows unpacked once into int16 pairs and multiplied by pmaddwd (16 multiply-adds per
  instruction where an fp32 FMA does 8): exact int32 block dots, each output's blocks summed in order by one
  thread, so the same at any thread count. Its threads claim panels from an atomic counter, where BLAS's
  threads wait for each other (a descheduled BLAS thread on this shared 2-core machine costs 5-10x).
- otherwise: tiles of weight rows are dequantized (exact: the values gguf-py gives) into a cache-sized
  float32 scratch that numpy's BLAS multiplies. The K reduction is BLAS's, per output element, for a fixed
  tile shape: deterministic at a fixed thread count.
- F32 weights are multiplied in place (BLAS on the mapped rows); F16 / BF16 are converted per tile like the
  block formats, the other block formats per tile by numpy (gguf.quants.dequantize).

Kernels: the families of kernels/ (quantize, gemv, gemm, dequant: AVX2 IR compiled by native/compile.py, the GEMV
and the GEMM in zmm where the host also has AVX-512 F and BW) when the host has AVX2/FMA/F16C and KAZEIA_SIMD is not
0, else their portable numba twins, which give the native kernels' bits (tests/test_isa_variants.py; the GEMM's
twin, an exact emulation of every FMA, runs a prefill several times slower than the BLAS tiles did). The packed
copies of the weights (packs.py) are read by the native kernels only.
"""

from __future__ import annotations

import contextlib

import numpy as np
from gguf import GGMLQuantizationType

from kazeia.backends.cpu.kernels import gemm as G
from kazeia.backends.cpu.kernels.dequant import PARALLEL_MIN_BYTES, dequantize_rows
from kazeia.backends.cpu.kernels.gemv import MATVEC, gemv_portable
from kazeia.backends.cpu.kernels.gemv.pack import packed_nbytes
from kazeia.gguf.quants import QK
from kazeia.native.buffers import GrowingScratch
from kazeia.native.buffers import ptr as addr
from kazeia.native.compile import available
from kazeia.native.pool import run
from kazeia.native.threads import single_blas_thread, threads

T = GGMLQuantizationType
GEMV_MAX_M = 4           # rows of x up to which the GEMV beats the native GEMM (measured, bench/README)
PORTABLE_GEMV_MAX_M = 4  # the numba twin up to the native GEMV's M (its bits: gemv/portable.py)
GEMV_MAX_K = 1 << 16     # the native GEMV quantizes x on the thread's stack: at most 4 x 64K int16 (512 KiB)
TILE_BYTES = 4 << 20     # float32 scratch per dequantized tile (about L3 / 8: BLAS packs it anyway)
SMALL_GEMM_M = 16    # x rows up to which the tiled path's GEMMs run on one BLAS thread
GEMV_TYPES = (T.Q4_0, T.Q4_1, T.Q8_0)
KIND = {T.Q4_0: "q4_0", T.Q4_1: "q4_1", T.Q8_0: "q8_0"}
# weight rows per claimed chunk of the parallel GEMV (a multiple of 8: 8-row groups, so the bits do not depend on it).
# Each chunk starts its rows' streams cold (the kernel prefetches only the next group inside it): 256 rows read the
# 36 layers' weights from DRAM ~10 % faster than 64 (2 threads, AVX-512 EPYC, 4 interleaved pairs: 80 vs 89 ms)
GEMV_CHUNK = 256

_tiles = GrowingScratch(np.float32)  # a reused float32 tile: fresh 4 MiB buffers would be page-faulted in every call


def tile_rows(k: int) -> int:
    """Weight rows per dequantized tile: TILE_BYTES of float32, a multiple of 16 rows."""
    return max(16, TILE_BYTES // (4 * k) // 16 * 16)


class WeightSet:
    """Weights multiplied by the same x (Q/K/V, gate/up, or one weight), each product written into its own
    columns of one (M, sum N) output: `WeightSet([(raw, qtype, k), ...]).matmul(x)`. Built once per group (the
    GEMV descriptors: addresses of the mapped rows and of their packed copies, strides, row counts, first columns)
    and kept by the backend, so a decode step costs one native call per group. The rows (`raw`) are referenced,
    not copied."""

    def __init__(self, weights: list[tuple[np.ndarray, T, int]]) -> None:
        self.weights = [(raw, T(qt), int(k)) for raw, qt, k in weights]
        self.packed: list[np.ndarray | None] = [None] * len(self.weights)
        self.k = self.weights[0][2]
        self.cols = np.cumsum([0] + [raw.shape[0] for raw, _, _ in self.weights])
        self.n = int(self.cols[-1])
        qts = {qt for _, qt, _ in self.weights}
        self.kind = None  # one native GEMV for all (same block type, same K)
        if len(qts) == 1 and (qt := qts.pop()) in GEMV_TYPES and self.k <= GEMV_MAX_K and all(
                k == self.k and raw.strides[1] == 1 for raw, _, k in self.weights):
            self.kind = KIND[qt]
            self._describe()
            self.nbytes = sum(raw.nbytes for raw, _, _ in self.weights)
            self.parallel = self.nbytes >= PARALLEL_MIN_BYTES

    def _describe(self) -> None:
        self.desc = np.array([(addr(raw), raw.strides[0], raw.shape[0], c0, 0 if pk is None else addr(pk))
                              for (raw, _, _), c0, pk in zip(self.weights, self.cols, self.packed)], dtype=np.int64)

    def use_packed(self, packed: list[np.ndarray | None]) -> None:
        """Let the GEMV read these packed copies of the weights' rows (kernels/gemv/pack.py's layout; None: the
        mapped rows): the same bits, one sequential stream. Kept referenced here."""
        if self.kind is None or len(packed) != len(self.weights):
            return
        for (raw, _, k), pk in zip(self.weights, packed):
            want = packed_nbytes(self.kind, raw.shape[0], k // QK)
            if pk is not None and (pk.nbytes != want or pk.dtype != np.uint8):
                raise ValueError(f"a packed copy of {pk.nbytes} bytes for rows that pack into {want}")
        self.packed = list(packed)
        self._describe()

    def matmul(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        m = x.shape[0]
        if out is None:
            out = np.empty((m, self.n), dtype=np.float32)
        if self.kind is not None and m > GEMV_MAX_M and available():
            G.gemm(self.kind, self.desc, self.k, x, out, threads() > 1 and m * self.nbytes >= 4 * PARALLEL_MIN_BYTES)
            return out
        if self.kind is None or not available():
            for (raw, qt, k), c0, c1 in zip(self.weights, self.cols[:-1], self.cols[1:]):
                weight_matmul(raw, qt, k, x, out[:, c0:c1])
            return out
        if x.strides[1] != 4:
            x = np.ascontiguousarray(x)
        y = out if out.strides[1] == 4 else np.empty(out.shape, dtype=np.float32)
        xp, yp, xs, ys = addr(x), addr(y), x.strides[0] // 4, y.strides[0] // 4
        nw, parallel = len(self.weights), self.parallel and threads() > 1
        for m0 in range(0, m, 4):
            ctr = np.zeros(nw, dtype=np.int64)
            args = (addr(self.desc), nw, self.k // QK, xp + 4 * xs * m0, xs, yp + 4 * ys * m0, ys, addr(ctr),
                    GEMV_CHUNK if parallel else 1 << 40)
            run(MATVEC[self.kind, min(4, m - m0)].fn, args, parallel, linger=True)
        if y is not out:
            out[...] = y
        return out


def weight_matmul(raw: np.ndarray, qtype: T, k: int, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """y (M, N) = x (M, K) @ W^T for the weight rows `raw` (N, row_bytes) of type `qtype`; `out` may be a
    (M, N) view (e.g. columns of a fused product)."""
    qtype = T(qtype)
    n = raw.shape[0]
    x = np.asarray(x, dtype=np.float32)
    m = x.shape[0]
    if out is None:
        out = np.empty((m, n), dtype=np.float32)
    if qtype == T.F32:
        w = raw.view(np.float32)  # (N, K), mapped
        np.matmul(x, w.T, out=out)
        return out
    native = available()
    if qtype in GEMV_TYPES and native and (ws := WeightSet([(raw, qtype, k)])).kind is not None:
        ws.matmul(x, out)
        return out
    if qtype in GEMV_TYPES and not native and m <= PORTABLE_GEMV_MAX_M:
        gemv_portable(raw, qtype, k, x, out)
        return out
    if qtype in GEMV_TYPES and not native and k <= GEMV_MAX_K and raw.strides[1] == 1:
        G.gemm_portable(raw, qtype, k, x, out)  # the native GEMM's bits (gemm/portable.py)
        return out
    _tiled(raw, qtype, k, x, out)
    return out


def _tile_scratch(rows: int, k: int) -> np.ndarray:
    """This thread's float32 (rows, k) tile."""
    return _tiles.take(rows * k)[:rows * k].reshape(rows, k)


def _tiled(raw: np.ndarray, qtype: T, k: int, x: np.ndarray, out: np.ndarray) -> None:
    n = raw.shape[0]
    tr = min(n, tile_rows(k))
    scratch = _tile_scratch(tr, k)
    x = np.ascontiguousarray(x)
    # a few rows of x make tiny GEMMs: two BLAS threads gain nothing there and, when another process holds the
    # second core, every call waits for a descheduled worker (measured: 110 ms instead of 1 ms at M=5)
    with single_blas_thread() if x.shape[0] <= SMALL_GEMM_M else contextlib.nullcontext():
        for r0 in range(0, n, tr):
            r1 = min(n, r0 + tr)
            w = dequantize_rows(raw[r0:r1], qtype, k, scratch)
            np.matmul(x, w.T, out=out[:, r0:r1])
