"""Rebuilding dumped tensors: at their original buffer offsets, in buffers with the original addresses (so in-place
aliasing and the HTP's descriptor de-duplication are what they were), each buffer only as large as the bytes
used."""

from __future__ import annotations

import numpy as np

from kazeia.debug.dump import Dump, TensorRecord
from kazeia.debug.tensors import elements, read_bytes
from kazeia.errors import DumpFileError
from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, Tensor


def tensor_from_meta(meta: dict, buf: Buffer) -> Tensor:
    return Tensor(type=GGMLType[meta["type"].upper()], ne=tuple(meta["ne"]), nb=tuple(meta["nb"]),
                  name=meta["name"], op=meta.get("op", "NONE"), params=dict(meta.get("params") or {}),
                  flags=int(meta.get("flags", 0)), weight_name=meta.get("weight_name"), layer=meta.get("layer"),
                  buffer=buf, offset=int(meta["offset"]))


def extent_end(meta: dict) -> int:
    """The end of the bytes a kernel may read for the described tensor (kazeia.debug.tensors.read_bytes)."""
    t = Tensor(type=GGMLType[meta["type"].upper()], ne=tuple(meta["ne"]), nb=tuple(meta["nb"]))
    return int(meta["offset"]) + read_bytes(t)


def make_buffer(meta: dict, size: int) -> Buffer:
    b = Buffer(meta["name"], np.zeros(max(size, 1), dtype=np.uint8), BufferUsage[meta["usage"]])
    b.base_addr = int(meta["base_addr"])  # the original address: descriptor de-duplication keys on it
    return b


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
    sizes: dict[int, int] = {}
    bmeta: dict[int, dict] = {}
    for m in metas:
        addr = int(m["buffer"]["base_addr"])
        bmeta[addr] = m["buffer"]
        sizes[addr] = max(sizes.get(addr, 0), extent_end(m))
    for r in records:
        if r.span is not None:
            addr = int(r.meta["buffer"]["base_addr"])
            sizes[addr] = max(sizes[addr], r.span_start + r.span.size)
    bufs = {addr: make_buffer(bmeta[addr], size) for addr, size in sizes.items()}

    def tensor(m: dict) -> Tensor:
        return tensor_from_meta(m, bufs[int(m["buffer"]["base_addr"])])

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
            t.buffer.data[rec.span_start:rec.span_start + rec.span.size] = rec.span.reshape(-1).view(np.uint8)
        if rec.values is not None:
            _write_values(t, rec.values)
        srcs.append(t)
    node.src = tuple(srcs)
    return node


def context_tensors(dump: Dump, ctx: dict) -> tuple[dict[int, Tensor], list[Buffer]]:
    """The batch context's tensors (by key) in its buffers, which hold the memory the batch read at its start."""
    bufs_meta = ctx["buffers"]
    sizes = [0] * len(bufs_meta)
    for t in ctx["tensors"]:
        bi = int(t["buffer_index"])
        sizes[bi] = max(sizes[bi], extent_end(t))
    blobs = []
    for r in ctx["memory"]:
        a = dump.load_blob(r, f"context memory @{r.get('offset')}")
        raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        bi = int(r["buffer"])
        sizes[bi] = max(sizes[bi], int(r["offset"]) + raw.size)
        blobs.append((bi, int(r["offset"]), raw))
    bufs = [make_buffer(m, s) for m, s in zip(bufs_meta, sizes)]
    for bi, off, raw in blobs:
        bufs[bi].data[off:off + raw.size] = raw
    tensors = {int(t["key"]): tensor_from_meta(t, bufs[int(t["buffer_index"])]) for t in ctx["tensors"]}
    return tensors, bufs
