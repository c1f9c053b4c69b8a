"""The original team's host-side instrumentation of ggml-hexagon.cpp: OPLOG and DUMP, printed in `enqueue_op`.

Their patch (work log, "OPLOG CPU-side (committé)") logged every op with fprintf(stderr) when the host queued
it, gated by GGML_HEXAGON_OPLOG, and dumped an op's activation to a file, gated by a regex. Both read the host's
view of memory at that moment, `ggml_nbytes(src1)` bytes from src1's data pointer, exactly as theirs did:
- the producer may not have run yet on the DSP (the batch is queued, not done): the bytes are whatever the
  buffer held, stale results or another tensor that shares the address (ggml-alloc reuses memory);
- for a non-contiguous view, ggml_nbytes spans bytes that are not the view's elements.

GGML_HEXAGON_OPLOG=1 is their first format, `KZOP MUL_MAT dst=[2560,38,1,1] src0=q4_0[4096,2560]
src1=f32[4096,38] s1_amax=9.8`, whose amax skipped NaN (`v > amax` is false for NaN) and so counted an infinity
but never a NaN; GGML_HEXAGON_OPLOG=2 is the format after their fix, the same line with ` nan=N inf=M`
appended. s1_amax is printed when src1 is F32. A line is written once the op is in the open batch, after any
flush its enqueue caused.
GGML_HEXAGON_DUMP=REGEX writes the activation (src1, or src0 for an op without src1) of every op whose one-line
description (the line in the .txt) the regex finds (re.search): the raw bytes to `kz_act.bin` (the first match),
`kz_act.1.bin`, ... and that description beside it in `kz_act.txt`, `kz_act.1.txt`, ... in KAZEIA_HTP_DUMP_DIR
(default: the current directory), at most KAZEIA_HTP_DUMP_LIMIT files (default 16).

kazeia's own trace (`--oplog`, `kazeia trace`) is a different tool: it reports each op when it has COMPLETED on
its device, with what it consumed and produced (debug/trace.py).
"""

from __future__ import annotations

import os

import numpy as np

from kazeia.errors import KazeiaError
from kazeia.graph.builder import ggml_name
from kazeia.graph.tensor import GGMLType, Tensor, type_name
from kazeia.outputs import write_bytes, write_text


def host_bytes(t: Tensor) -> np.ndarray:
    """ggml_nbytes(t) bytes from t's data pointer, as the host sees them now (a copy)."""
    return np.array(t.buffer.data[t.offset:t.offset + t.nbytes], dtype=np.uint8)


def _dims(t: Tensor, n: int) -> str:
    return "[" + ",".join(str(x) for x in t.ne[:n]) + "]"


def s1_stats(raw: np.ndarray, post_fix: bool) -> str:
    """` s1_amax=...` (NaN-blind, as their loop: an infinity counts, a NaN does not), then ` nan= inf=` after the
    fix."""
    v = raw[: raw.size // 4 * 4].view(np.float32)
    a = np.abs(v)
    with np.errstate(invalid="ignore"):
        finite_or_inf = a[~np.isnan(a)]
    amax = float(finite_or_inf.max()) if finite_or_inf.size else 0.0
    out = f" s1_amax={amax:.1f}"
    if post_fix:
        out += f" nan={int(np.isnan(v).sum())} inf={int(np.isinf(v).sum())}"
    return out


def kzop_line(node: Tensor, post_fix: bool) -> str:
    """The team's OPLOG line for `node`, statistics from the host's view of src1 now."""
    parts = [f"KZOP {node.desc()} dst={_dims(node, 4)}"]
    for i, s in enumerate(node.src[:2]):
        if s is not None and not (i == 1 and s is node):
            parts.append(f"src{i}={type_name(s.type)}{_dims(s, 2)}")
    line = " ".join(parts)
    s1 = node.src[1] if len(node.src) > 1 else None
    if s1 is not None and s1 is not node and s1.type == GGMLType.F32 and s1.buffer is not None:
        line += s1_stats(host_bytes(s1), post_fix)
    return line


def activation(node: Tensor) -> Tensor:
    s1 = node.src[1] if len(node.src) > 1 else None
    return s1 if s1 is not None and s1 is not node else node.src[0]


def describe(node: Tensor, batch_seq: int) -> str:
    """The one-line description a dump carries (and the DUMP regex is matched against)."""
    a = activation(node)
    w = node.src[0]
    srcs = " ".join(f"src{i}={ggml_name(s)} {type_name(s.type)}{_dims(s, 4)}"
                    for i, s in enumerate(node.src[:2]) if s is not None and s is not node)
    return (f"{node.desc()} {ggml_name(node)} {srcs} | dumped: {ggml_name(a)} {type_name(a.type)}{_dims(a, 4)} "
            f"nb=[{','.join(str(x) for x in a.nb)}] nbytes={a.nbytes} (ggml_nbytes from the data pointer, read by the "
            f"host at enqueue, batch {batch_seq}){' weight=' + w.weight_name if w.weight_name else ''}")


class OpDump:
    """GGML_HEXAGON_DUMP: raw activation bytes and their description, one pair of files per matching op."""

    def __init__(self, pattern, directory: str, limit: int) -> None:
        self.pattern = pattern
        self.directory = directory
        self.limit = limit
        self.count = 0
        self.files: list[str] = []
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise KazeiaError(f"KAZEIA_HTP_DUMP_DIR={directory!r}: {e.strerror}") from None

    def maybe_dump(self, node: Tensor, batch_seq: int) -> int:
        """Dump node's activation if it matches; returns the bytes written (0 if not)."""
        if self.count >= self.limit:
            return 0
        line = describe(node, batch_seq)
        if not self.pattern.search(line):
            return 0
        stem = "kz_act" if self.count == 0 else f"kz_act.{self.count}"
        self.count += 1
        raw = host_bytes(activation(node))
        path = os.path.join(self.directory, stem + ".bin")
        write_bytes(path, raw.tobytes())
        write_text(os.path.join(self.directory, stem + ".txt"), line + "\n")
        self.files.append(path)
        return raw.size
