"""The GEMV's packed layout: a weight's whole 16-row groups rearranged so that the GEMV
(`ir._emit_rows16_packed`) reads one sequential stream, loads each block's 16 scales at once, and finds the 16
rows' codes of two neighbouring elements side by side (one pmaddwd lane a row: no reduction across lanes).

    packed[g, j] (16 * block_bytes bytes) = d_w of rows 16g..16g+15 at block j   (16 x fp16)
                                          | m_w of those rows (Q4_1 only)        (16 x fp16)
                                          | word p of the 16 rows' codes, p = 0, 1, ... (16 x 2 bytes each)

where word p is code bytes 2p and 2p+1 of a row: Q4_0 / Q4_1 (8 words) elements 2p, 2p+1 in the low nibbles and
16+2p, 17+2p in the high ones; Q8_0 (16 words) elements 2p, 2p+1.

The bytes are the file's, moved: the kernels compute every output from the same values, their block dots the same
exact integers and the float operations the same, in the same order, as from the mapped rows (the same bits).
Rows past the last whole group are not packed (the kernels read them from the file). gguf-py's block layouts:
Q4_0 = d (fp16) + 16 bytes of nibbles, Q4_1 = d + m + 16 bytes, Q8_0 = d + 32 int8."""

from __future__ import annotations

import numpy as np

from kazeia.backends.cpu.kernels.gemv.ir import BLOCK_BYTES, PACK_ROWS, packed_header


def packed_nbytes(kind: str, n: int, nb: int) -> int:
    """Bytes of the packed copy of n rows of nb blocks."""
    return n // PACK_ROWS * nb * PACK_ROWS * BLOCK_BYTES[kind]


def pack_rows(raw: np.ndarray, kind: str, out: np.ndarray | None = None) -> np.ndarray:
    """The packed copy (uint8, `packed_nbytes` long) of the whole 16-row groups of `raw` ((N, row_bytes) uint8
    rows of `kind` blocks), written into `out` when given (e.g. a mapped file)."""
    bb = BLOCK_BYTES[kind]
    n, row_bytes = raw.shape
    nb = row_bytes // bb
    groups = n // PACK_ROWS
    hdr = packed_header(kind)
    # (group, block, row-in-group, block byte)
    blocks = raw[:groups * PACK_ROWS].reshape(groups, PACK_ROWS, nb, bb).transpose(0, 2, 1, 3)
    dst = np.empty(packed_nbytes(kind, n, nb), dtype=np.uint8) if out is None else out
    view = dst.reshape(groups, nb, PACK_ROWS * bb)
    scale_bytes = hdr // PACK_ROWS  # 2 (d) or 4 (d, m) at the start of each block
    for s in range(0, scale_bytes, 2):  # d_w of the 16 rows, then m_w
        view[:, :, PACK_ROWS * s:PACK_ROWS * (s + 2)].reshape(groups, nb, PACK_ROWS, 2)[...] = blocks[..., s:s + 2]
    codes = blocks[..., scale_bytes:]  # (groups, nb, 16, cb)
    words = (bb - scale_bytes) // 2
    # (row, word, byte) -> (word, row, byte)
    view[:, :, hdr:].reshape(groups, nb, words, PACK_ROWS, 2)[...] = \
        codes.reshape(groups, nb, PACK_ROWS, words, 2).transpose(0, 1, 3, 2, 4)
    return dst
