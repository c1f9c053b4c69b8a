"""The `cpu` backend's GEMV family: the decode matmul on the quantized bytes, and the activation quantization it
reads: IR for ymm (AVX2) with a zmm group kernel where the host has AVX-512 F and BW (ir.py, compiled by
native/compile.py), the packed layout the zmm kernel also reads (pack.py), its front (here), and its portable
numba twin (portable.py).

GEMV (x rows quantized by quantize.py's `quantize_x` to int16 per 32-element block, one float32 scale d_x = amax/32767):
per block and weight row, the 32 codes are widened to int16 and multiplied with the activations by pmaddwd
(exact int32 pair sums in 8 lanes). Weight rows in whole groups of 8 (from the weight's row 0: claimed chunks are
multiples of 8) sum those lanes to one exact int32 a block and accumulate it with d_w*d_x by one FMA a block, in
block order, each row in its own lane of one vector (_emit_rows8; with zmm, 16 rows at a time by the same
operations, _emit_rows16, or _emit_rows16_packed from a packed copy of the rows, pack.py); the last N % 8 rows
keep the 8 lanes, each
accumulated by its own FMA chain, summed at the end in a fixed tree (irkit.Kernel.hsum8). Q4_0 and Q4_1 add a
second chain (the -8 bias, or m_w, times d_x * sum(x_q)). Every output is computed by one call in one fixed
order: bitwise the same at any thread count, and whatever the host's vector width.

The portable twin (numba, `gemv_exact_portable`) runs those operations in that order, the FMAs emulated exactly
(`fma32`): its outputs are the native kernel's bits (tests/test_isa_variants.py). The activations are int16 (scale
amax/32767), which keeps the GEMV within ~1e-9 NMSE of the float product. Blocks: native/idioms.py.
"""

from __future__ import annotations

import numpy as np

from kazeia.backends.cpu.kernels.gemv.ir import BLOCK_BYTES, GEMV_M, KINDS, T, emit_matvec, zmm
from kazeia.backends.cpu.kernels.gemv.portable import KIND_Q4_0, KIND_Q4_1, KIND_Q8_0, gemv_exact_portable
from kazeia.backends.cpu.kernels.quantize import quantize_activations
from kazeia.gguf.quants import QK
from kazeia.native.compile import Library

__all__ = ["F16_LUT", "GEMV_M", "KINDS", "MATVEC", "blocks", "gemv_portable", "quantize_activations", "run_portable",
           "zmm"]

LIB = Library(__name__, "kazeia_simd_cpu")
MATVEC = {(kind, m): LIB.kernel(f"matvec_{kind}_m{m}", emit_matvec, kind, m) for kind in KINDS for m in GEMV_M}


# --- front -----------------------------------------------------------------------------------------------------

F16_LUT = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)  # fp16 bits -> value


def blocks(raw: np.ndarray, qtype: T, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, row_bytes) uint8 rows -> (uint8 (N, nb, type_size), uint16 (N, nb, type_size/2)) views, no copy."""
    ts = BLOCK_BYTES[T(qtype).name.lower()]
    n = raw.shape[0]
    return raw.reshape(n, k // QK, ts), raw.view(np.uint16).reshape(n, k // QK, ts // 2)


def run_portable(twin, raw: np.ndarray, qtype: T, k: int, x: np.ndarray, out: np.ndarray) -> None:
    """out (M, N) = x @ W^T by a numba twin (`twin(blocks, their uint16 view, xq, xd, xs, y, F16_LUT, kind)`: the
    GEMV's or the GEMM's) on Q4_0 / Q4_1 / Q8_0 rows `raw`, from x quantized as the native kernels quantize it."""
    xq, xd, xs = quantize_activations(x)
    b8, b16 = blocks(raw, qtype, k)
    y = out if out.flags.c_contiguous else np.empty(out.shape, dtype=np.float32)
    kind = {T.Q4_0: KIND_Q4_0, T.Q4_1: KIND_Q4_1, T.Q8_0: KIND_Q8_0}[T(qtype)]
    twin(b8, b16, xq, xd, xs, y, F16_LUT, kind)
    if y is not out:
        out[...] = y


def gemv_portable(raw: np.ndarray, qtype: T, k: int, x: np.ndarray, out: np.ndarray) -> None:
    """out (M, N) = x @ W^T by the GEMV's numba twin: the native GEMV's bits."""
    run_portable(gemv_exact_portable, raw, qtype, k, x, out)
