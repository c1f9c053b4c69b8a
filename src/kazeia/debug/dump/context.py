"""The HTP batch context of a dumped op (see the package docstring for what it holds and why): the batch's
state snapshotted at its start (HtpBackend.add_batch_start_hook, HtpBackend.snapshot), then cut down to the
ops up to the dumped one."""

from __future__ import annotations

from typing import Any

from kazeia.backends.base import OpInfo
from kazeia.debug.dump.blobs import BlobStore
from kazeia.debug.dump.format import buffer_meta, tensor_meta
from kazeia.debug.json_safe import json_safe
from kazeia.debug.tensors import logical_values, read_extent
from kazeia.graph.tensor import BufferUsage, Tensor, type_name


class BatchContexts:
    """Batch-start snapshots (one batch at a time per HTP backend), and the part of one that an op's dump
    records."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._snapshots: dict[tuple[Any, int], dict] = {}  # (backend, batch seq) -> snapshot

    def record(self, backend: Any, batch: Any, last: int) -> None:
        """Snapshot what ops[0..last] of the batch need, forgetting this backend's previous batch."""
        self._snapshots = {k: v for k, v in self._snapshots.items() if k[0] is not backend}
        self._snapshots[(backend, batch.seq)] = snapshot(self.store, backend, batch, last)

    def for_op(self, backend: Any, info: OpInfo, name: str | None = None) -> dict:
        """The context of the op `info` describes (node `name`): the ops of its batch up to it, and what they
        touch. A node fused into an op (2026-10) ends the list where it is, after the nodes run before it."""
        snap = self._snapshots.get((backend, info.batch))
        idx = info.extra.get("batch_index")
        if snap is None or idx is None:
            return {"unavailable": "no batch-start snapshot for this batch"}
        ends = [i for i, o in enumerate(snap["ops"]) if o["index"] == idx and (name is None or o["name"] == name)]
        ops = snap["ops"][: ends[-1 if name is None else 0] + 1] if ends else snap["ops"][: idx + 1]
        keys = {k for o in ops for k in o["tensors"]}
        tensors = [t for t in snap["tensors"] if t["key"] in keys]
        descs = sorted({d for o in ops for d in [*(x for x in o["src"] if x is not None), o["dst"]]})
        memory = [r for r in snap["memory"] if r["first_op"] <= idx]
        return {"batch_seq": info.batch, "op_index": idx, "ops": ops, "tensors": tensors,
                "descriptors": [snap["descriptors"][d] for d in descs], "n_descriptors": len(snap["descriptors"]),
                "buffers": snap["buffers"], "memory": memory, "vtcm": snap["vtcm"], "dsp_state": snap["dsp_state"],
                "batch_ops_total": snap["batch_ops_total"]}


def snapshot(store: BlobStore, backend: Any, batch: Any, last: int) -> dict:
    """Everything needed to rerun ops[0..last] of the batch on the same device state."""
    state = backend.snapshot()
    keys: dict[int, int] = {}
    tensors: list[dict] = []
    buffers: dict[int, int] = {}
    buf_meta: list[dict] = []

    def key_of(t: Tensor) -> int:
        k = keys.get(id(t))
        if k is None:
            k = keys[id(t)] = len(tensors)
            if id(t.buffer) not in buffers:
                buffers[id(t.buffer)] = len(buf_meta)
                buf_meta.append(buffer_meta(t))
            meta = tensor_meta(t)
            meta["key"] = k
            meta["buffer_index"] = buffers[id(t.buffer)]
            tensors.append(meta)
        return k

    ops = []
    extents: list[tuple[Tensor, int]] = []  # (tensor, first op index that touches it)
    # one entry per node, in the order the DSP runs them: an op, then the nodes fused into it (2026-10), marked
    for op in batch.ops[: last + 1]:
        for d in (op, *op.fused):
            n = d.node
            src_keys = [key_of(s) if s is not None else None for s in n.src]
            entry = {"index": op.index, "name": n.name, "op": n.op, "desc": n.desc(), "params": json_safe(n.params),
                     "graph_index": d.graph_index, "src": list(d.src), "dst": d.dst,
                     "src_keys": src_keys, "dst_key": key_of(n),
                     "tensors": [k for k in [*src_keys, keys[id(n)]] if k is not None]}
            if d is not op:
                entry["fused"] = op.name
            ops.append(entry)
            extents += [(s, op.index) for s in n.src if s is not None] + [(n, op.index)]
    return {"ops": ops, "tensors": tensors, "buffers": buf_meta, "descriptors": _descriptors(batch),
            "memory": memory_regions(store, extents, buffers), "vtcm": store.put(state.vtcm, compress=True),
            "dsp_state": json_safe(state.registers()), "batch_ops_total": len(batch.ops)}


def _descriptors(batch: Any) -> list[dict]:
    return [{"index": d.index, "tensor": d.tensor.name, "addr": d.addr, "size": d.size, "type": type_name(d.type),
             "ne": list(d.ne), "nb": list(d.nb), "flags": d.flags, "buffer_index": d.buffer_index}
            for d in batch.tensors]


def memory_regions(store: BlobStore, extents: list[tuple[Tensor, int]], buffers: dict[int, int]) -> list[dict]:
    """Byte ranges of every buffer the ops read or write, as they are at batch start. Weights go per tensor
    (the same blobs as the op's own weight source); other buffers as merged intervals."""
    out: list[dict] = []
    spans: dict[int, list[tuple[int, int, int]]] = {}
    seen_w: set[tuple[int, int, int]] = set()
    for t, first in extents:
        s, e = read_extent(t)
        b = t.buffer
        if b.usage == BufferUsage.WEIGHTS:
            k = (id(b), s, e)
            if k in seen_w:
                continue
            seen_w.add(k)
            out.append({"buffer": buffers[id(b)], "offset": s, "first_op": first, **_weight_blob(store, t, s, e)})
        else:
            spans.setdefault(id(b), []).append((s, e, first))
    for bid, iv in spans.items():
        b = next(t.buffer for t, _ in extents if id(t.buffer) == bid)
        for s, e, first in _merge_intervals(iv):
            out.append({"buffer": buffers[bid], "offset": s, "first_op": first, **store.put(b.data[s:e].copy())})
    return out


def _weight_blob(store: BlobStore, t: Tensor, s: int, e: int) -> dict:
    """A weight's bytes as the same blob its op's own weight source uses (its logical values), or raw for a view."""
    b = t.buffer
    try:
        if not t.is_contiguous():
            raise ValueError("view")
        return store.put(logical_values(t), cache_key=(b.base_addr, t.offset, t.ne, t.nb, t.type))
    except (TypeError, ValueError):
        return store.put(b.data[s:e].copy(), cache_key=(b.base_addr, s, e))


def _merge_intervals(iv: list[tuple[int, int, int]]) -> list[list[int]]:
    """(start, end, first op) intervals merged where they touch or overlap, keeping the earliest first op."""
    merged: list[list[int]] = []
    for s, e, first in sorted(iv):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
            merged[-1][2] = min(merged[-1][2], first)
        else:
            merged.append([s, e, first])
    return merged
