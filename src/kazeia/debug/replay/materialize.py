"""Rebuilding dumped tensors: at their original data addresses (so in-place aliasing and the HTP's descriptor
de-duplication are what they were), each buffer holding only the bytes used: a buffer starts at the lowest byte
its tensors touch (its address moved up by as much, every offset down), so a tensor far into a large buffer (a
late layer's KV cache view, or a forged offset) costs only its own bytes."""

from __future__ import annotations

import numpy as np

from kazeia.debug.dump import Dump, TensorRecord
from kazeia.debug.tensors import elements, read_bytes
from kazeia.errors import DumpFileError
from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, Tensor
from kazeia.memory import check_fits


def tensor_from_meta(meta: dict, buf: Buffer, start: int = 0) -> Tensor:
    """The described tensor in `buf`, a buffer holding the recorded one's bytes from `start` on."""
    return Tensor(type=GGMLType[meta["type"].upper()], ne=tuple(meta["ne"]), nb=tuple(meta["nb"]),
                  name=meta["name"], op=meta.get("op", "NONE"), params=dict(meta.get("params") or {}),
                  flags=int(meta.get("flags", 0)), weight_name=meta.get("weight_name"), layer=meta.get("layer"),
                  buffer=buf, offset=int(meta["offset"]) - start)


def extent_end(meta: dict) -> int:
    """The end of the bytes a kernel may read for the described tensor (kazeia.debug.tensors.read_bytes)."""
    t = Tensor(type=GGMLType[meta["type"].upper()], ne=tuple(meta["ne"]), nb=tuple(meta["nb"]))
    return int(meta["offset"]) + read_bytes(t)


def make_buffer(meta: dict, size: int, start: int = 0) -> Buffer:
    """The recorded buffer's bytes [start, start + size)."""
    check_fits(f"replaying the dumped buffer {str(meta['name'])[:60]!r}", size, " (the manifest describes a buffer "
               "larger than this machine can hold)")
    b = Buffer(meta["name"], np.zeros(max(size, 1), dtype=np.uint8), BufferUsage[meta["usage"]])
    b.base_addr = int(meta["base_addr"]) + start  # data addresses as recorded: descriptor de-duplication keys on them
    return b


class _Extents:
    """The bytes [lo, hi) used in each buffer."""

    def __init__(self) -> None:
        self.lo: dict = {}
        self.hi: dict = {}

    def add(self, key, start: int, end: int) -> None:
        self.lo[key] = min(self.lo.get(key, start), start)
        self.hi[key] = max(self.hi.get(key, end), end)


def _write_values(t: Tensor, values: np.ndarray) -> None:
    dst = elements(t)
    if dst.shape != values.shape:
        raise DumpFileError(f"{t.name}: dumped values {list(values.shape)} do not fit the tensor {list(dst.shape)}")
    dst[...] = values


def materialize(dump: Dump, use_output_before: bool = True) -> Tensor:
    """The dumped op as a fresh node whose sources hold the dumped inputs, at the original offsets of buffers
    with the original addresses (each buffer only as large as the bytes used)."""
    records: list[TensorRecord] = [s for s in dump.sources if s is not None]
    metas = [dump.node] + [r.meta for r in records]
    used = _Extents()
    bmeta: dict[int, dict] = {}
    for m in metas:
        addr = int(m["buffer"]["base_addr"])
        bmeta[addr] = m["buffer"]
        used.add(addr, int(m["offset"]), extent_end(m))
    for r in records:
        if r.span is not None:
            used.add(int(r.meta["buffer"]["base_addr"]), r.span_start, r.span_start + r.span.nbytes)
    bufs = {addr: make_buffer(bmeta[addr], used.hi[addr] - lo, lo) for addr, lo in used.lo.items()}

    def tensor(m: dict) -> Tensor:
        addr = int(m["buffer"]["base_addr"])
        return tensor_from_meta(m, bufs[addr], used.lo[addr])

    node = tensor(dump.node)
    before = dump.output_before
    if use_output_before and before is not None and before.values is not None:
        _write_values(node, before.values)
    srcs: list[Tensor | None] = []
    for rec in dump.sources:
        if rec is None:
            srcs.append(None)
            continue
        t = tensor(rec.meta)
        if rec.span is not None:  # gap bytes first, then the logical values (the same bytes, read via ne/nb)
            s = rec.span_start - used.lo[int(rec.meta["buffer"]["base_addr"])]
            raw = np.ascontiguousarray(rec.span).reshape(-1).view(np.uint8)
            t.buffer.data[s:s + raw.size] = raw
        if rec.values is not None:
            _write_values(t, rec.values)
        srcs.append(t)
    node.src = tuple(srcs)
    return node


def context_tensors(dump: Dump, ctx: dict) -> tuple[dict[int, Tensor], list[Buffer]]:
    """The batch context's tensors (by key) in its buffers, which hold the memory the batch read at its start."""
    bufs_meta = ctx["buffers"]
    used = _Extents()
    for t in ctx["tensors"]:
        used.add(int(t["buffer_index"]), int(t["offset"]), extent_end(t))
    blobs = []
    for r in ctx["memory"]:
        a = dump.load_blob(r, f"context memory @{r.get('offset')}")
        raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        bi = int(r["buffer"])
        used.add(bi, int(r["offset"]), int(r["offset"]) + raw.size)
        blobs.append((bi, int(r["offset"]), raw))
    bufs = [make_buffer(m, used.hi.get(bi, 0) - used.lo.get(bi, 0), used.lo.get(bi, 0))
            for bi, m in enumerate(bufs_meta)]
    for bi, off, raw in blobs:
        s = off - used.lo[bi]
        bufs[bi].data[s:s + raw.size] = raw
    tensors = {int(t["key"]): tensor_from_meta(t, bufs[int(t["buffer_index"])], used.lo[int(t["buffer_index"])])
               for t in ctx["tensors"]}
    return tensors, bufs
