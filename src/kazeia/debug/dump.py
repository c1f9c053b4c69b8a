"""Op dumps: the exact inputs and output of chosen ops, written so that one op can be rerun anywhere.

`DumpHook(regex, dir)` is an ordinary execution hook. For every op whose node name matches it writes:
the op's logical inputs as read at `on_start` (what the op consumes) and its output at `on_complete` (after
the op finished on its device, never when it was queued), each read through ne/nb; the op params; each
source's type/ne/nb/name/role/place in memory; the GGUF names and raw block bytes of the weights (so a
replay needs nothing else); the device, and for the HTP its settings, profile and batch context.

The batch context is what separates a value-triggered fault from a context-triggered one on the HTP: the
ops that ran before this one in its batch (names, params, tensors, descriptor indexes), the VTCM contents
and DSP state at the start of the batch, and the memory those ops read (every byte range their tensors
span, weights included) with the original buffer addresses and offsets, so that a replay can rebuild the
same tensors at the same addresses and the host's descriptor de-duplication (data address + ne + nb) maps
them to the same descriptors. It is snapshotted from `Dsp.on_batch_start`, which the hook reaches through
`bind_backend` (called by the HTP backend at graph start).

`at="enqueue"` (or "both") also writes an ENQUEUE-time capture of the same tensors, labelled as such: what
a host-side dump taken when the op was queued sees. On an asynchronous backend that is not what the op
consumed (its producer may not have run yet: zeros or stale bytes); `compare_captures` shows the difference.
On a synchronous backend enqueue and start are the same moment.

On disk (format FORMAT, version VERSION), DIR holds `index.json`, one directory per capture with a
`manifest.json` (JSON only), and `blobs/<sha256>.npy|.npz`: content-addressed arrays (weights are stored once
however many dumps use them). Loading verifies the format, the version and every content hash, and never
executes anything from the files (JSON, and numpy files with allow_pickle=False): a corrupt, truncated or
foreign dump is a `DumpFileError`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kazeia import __version__
from kazeia.backends.base import Hook, OpInfo
from kazeia.debug.stats import Stats, nmse, values_stats
from kazeia.errors import DumpFileError, KazeiaError
from kazeia.graph.tensor import (
    SCALAR_DTYPES,
    BufferUsage,
    GGMLType,
    Tensor,
    TFlag,
    array,
    rows,
    type_name,
    type_size,
)

FORMAT = "kazeia-op-dump"
VERSION = 1
CAPTURES = ("complete", "enqueue")

ENQUEUE_NOTE = ("ENQUEUE-TIME capture: read when the host queued the op, before the device ran it. On an "
                "asynchronous backend (HTP) its inputs may not have been written yet (zeros or stale bytes) and "
                "the output is whatever the buffer held before: this is NOT what the op consumed.")
SYNC_ENQUEUE_NOTE = ("ENQUEUE-TIME capture on a synchronous backend: enqueue and start are the same moment, so it "
                     "holds what the op consumed.")
COMPLETE_NOTE = "inputs read when the op started on its device, output read after it completed"


# ----------------------------------------------------------------------------------------------------------
# reading tensors (always through ne/nb)


def logical_values(t: Tensor) -> np.ndarray:
    """A copy of the tensor's logical elements: scalar types as (ne3, ne2, ne1, ne0) values, block types as
    raw block rows (ne3, ne2, ne1, row_bytes). Read through ne/nb, so gaps of a view are never included."""
    if t.type in SCALAR_DTYPES:
        return np.ascontiguousarray(array(t)).copy()
    return np.ascontiguousarray(rows(t)).copy()


def read_extent(t: Tensor) -> tuple[int, int]:
    """[start, end) bytes of the tensor's buffer that a kernel may read for it: the span from element 0 to the
    last element, widened to the dense size (the quantized HMX kernel reads M*K floats from the data pointer
    whatever the row stride), clipped to the buffer."""
    assert t.buffer is not None
    n = t.nbytes
    if t.type in SCALAR_DTYPES:
        n = max(n, t.nelements * type_size(t.type))
    return t.offset, min(t.buffer.size, t.offset + n)


def _buffer_meta(t: Tensor) -> dict:
    b = t.buffer
    assert b is not None
    return {"name": b.name, "usage": b.usage.name, "size": b.size, "base_addr": b.base_addr}


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return _jsonable(v.item())
    if isinstance(v, float) and not np.isfinite(v):
        return repr(v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, re.Pattern):
        return v.pattern
    return repr(v)


def tensor_meta(t: Tensor) -> dict:
    """Everything about a tensor but its contents."""
    return {
        "name": t.name, "op": t.op, "desc": t.desc() if t.op != "NONE" else "NONE", "type": type_name(t.type),
        "ne": list(t.ne), "nb": list(t.nb), "params": _jsonable(t.params), "flags": int(t.flags),
        "weight_name": t.weight_name, "layer": t.layer, "contiguous": t.is_contiguous(),
        "view_of": t.view_src.name if t.view_src is not None else None, "view_offs": t.view_offs,
        "buffer": _buffer_meta(t), "offset": t.offset, "data_addr": t.data_addr,
    }


_ROLES = {
    "MUL_MAT": ("weights", "activations"), "GET_ROWS": ("table", "ids"), "SET_ROWS": ("values", "ids", "destination"),
    "FLASH_ATTN_EXT": ("q", "k", "v", "mask"), "SOFT_MAX": ("x", "mask"), "ROPE": ("x", "positions"),
    "CPY": ("source", "destination"), "GLU": ("gate", "up"), "ADD": ("a", "b"), "MUL": ("a", "b"),
}


def source_role(node: Tensor, i: int) -> str:
    """src<i> plus what it is for this op (and 'weight' / 'kv-cache' when that is where it lives)."""
    names = _ROLES.get(node.op, ())
    role = f"src{i}" + (f" ({names[i]})" if i < len(names) else "")
    s = node.src[i]
    if s is not None and s.flags & TFlag.WEIGHT:
        role += " weight"
    elif s is not None and s.buffer is not None and s.buffer.name == "kv_cache":
        role += " kv-cache"
    return role


def settings_dict(settings: Any) -> dict:
    """An HtpSettings as JSON (generic over its fields, so new switches are recorded too)."""
    return {f.name: _jsonable(getattr(settings, f.name)) for f in dataclasses.fields(settings)}


# ----------------------------------------------------------------------------------------------------------
# content-addressed blob store


def array_digest(a: np.ndarray) -> str:
    """sha256 over dtype, shape and the C-order bytes: the name of a blob and its integrity check."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256()
    h.update(f"{a.dtype.str}|{','.join(str(x) for x in a.shape)}|".encode())
    h.update(memoryview(a.reshape(-1).view(np.uint8)))
    return h.hexdigest()


class BlobStore:
    """`root/blobs/<sha256>.npy` (or .npz when compressed). Writes are atomic; an existing blob is reused."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.dir = self.root / "blobs"
        self._digests: dict[tuple, str] = {}  # (buffer address, offset, shape) of immutable weights -> digest

    def put(self, a: np.ndarray, compress: bool = False, cache_key: tuple | None = None) -> dict:
        a = np.ascontiguousarray(a)
        digest = self._digests.get(cache_key) if cache_key is not None else None
        if digest is None:
            digest = array_digest(a)
            if cache_key is not None:
                self._digests[cache_key] = digest
        ext = "npz" if compress else "npy"
        ref = {"blob": digest, "file": f"blobs/{digest}.{ext}", "dtype": a.dtype.str, "shape": list(a.shape)}
        path = self.root / ref["file"]
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    if compress:
                        np.savez_compressed(f, a=a)
                    else:
                        np.save(f, a, allow_pickle=False)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        ref["bytes"] = path.stat().st_size
        return ref

    def get(self, ref: dict, where: str) -> np.ndarray:
        """Load and verify one blob; anything wrong is a DumpFileError naming `where`."""
        try:
            rel = str(ref["file"])
            digest = str(ref["blob"])
            dtype, shape = np.dtype(ref["dtype"]), tuple(int(x) for x in ref["shape"])
        except (KeyError, TypeError, ValueError):
            raise DumpFileError(f"{where}: malformed blob reference in the manifest") from None
        if dtype.hasobject or not re.fullmatch(r"blobs/[0-9a-f]{64}\.(npy|npz)", rel) or not rel[6:70] == digest:
            raise DumpFileError(f"{where}: blob reference {rel!r} is not a kazeia blob")
        path = self.root / rel
        if not path.is_file():
            raise DumpFileError(f"{where}: missing blob {path}")
        try:
            if rel.endswith(".npz"):
                with np.load(path, allow_pickle=False) as z:
                    a = z["a"]
            else:  # memory-mapped: a dump of many weights need not sit in RAM
                a = np.load(path, mmap_mode="r", allow_pickle=False)
        except Exception as e:  # numpy raises ValueError/OSError/EOFError/zipfile errors on bad files
            raise DumpFileError(f"{where}: blob {path.name} is corrupt or truncated ({type(e).__name__})") from None
        if a.dtype != dtype or a.shape != shape:
            raise DumpFileError(f"{where}: blob {path.name} holds {a.dtype}{list(a.shape)}, the manifest says "
                                f"{dtype}{list(shape)}")
        if array_digest(a) != digest:
            raise DumpFileError(f"{where}: blob {path.name} does not match its content hash (corrupt)")
        return a

    def check_present(self, ref: dict, where: str) -> None:
        """Cheap check (existence and size) for blobs loaded later."""
        try:
            path = self.root / str(ref["file"])
            size = int(ref["bytes"])
        except (KeyError, TypeError, ValueError):
            raise DumpFileError(f"{where}: malformed blob reference in the manifest") from None
        if not path.is_file():
            raise DumpFileError(f"{where}: missing blob {path}")
        if path.stat().st_size != size:
            raise DumpFileError(f"{where}: blob {path.name} is {path.stat().st_size} B, expected {size} B "
                                f"(truncated or replaced)")


def manifest_digest(m: dict) -> str:
    """sha256 of the manifest's canonical JSON without its own digest field."""
    body = {k: v for k, v in m.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


def _write_manifest(path: Path, m: dict) -> None:
    m["digest"] = manifest_digest(m)
    _write_json(path, m)


def _write_json(path: Path, obj: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, allow_nan=False)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------
# the hook


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", name)[:80] or "op"


@dataclass
class _Pending:
    entry_id: str
    manifest: dict
    path: Path


class DumpHook(Hook):
    """Dump every op whose node name matches `regex` (re.search) into `directory`.

    at: "complete" (inputs at on_start, output at on_complete: what the op consumed and produced),
        "enqueue" (the same tensors read when the op was queued, labelled ENQUEUE), or "both".
    context: on the HTP, also record the batch context (VTCM, DSP state, memory, preceding ops).
    limit: stop after this many matched op executions (None = no limit).
    """

    def __init__(self, regex: str, directory: str | os.PathLike, at: str = "complete", context: bool = True,
                 limit: int | None = None) -> None:
        try:
            self.pattern = re.compile(regex)
        except re.error as e:
            raise KazeiaError(f"--dump: {regex!r} is not a valid regex: {e}") from None
        if at not in ("complete", "enqueue", "both"):
            raise KazeiaError(f"dump capture must be complete, enqueue or both, not {at!r}")
        self.root = Path(directory)
        self._prepare_root()
        self.store = BlobStore(self.root)
        self.at = at
        self.context = context
        self.limit = limit
        self.entries: list[str] = []  # entry ids written, in order
        self.matches = 0  # matched op executions dumped by this hook
        self.limit_reached = False
        # entry numbers continue after those already in the directory (a second run appends)
        self._first = max((int(e.get("match") or 0) for e in self._index["entries"]), default=0)
        self._occ: dict[int, int] = {}  # id(node) -> occurrence number while the op is in flight
        self._enqueued: set[int] = set()  # id(node) of ops whose enqueue capture is done
        self._pending: dict[int, _Pending] = {}  # id(node) -> complete capture waiting for its output
        self._backends: dict[int, Any] = {}  # id(dsp) -> HtpBackend
        self._batch_ctx: dict[tuple[int, int], dict] = {}  # (id(dsp), batch seq) -> context snapshot
        self._by_name: dict[str, int] = {}  # node name -> executions dumped so far
        self._nth: dict[int, int] = {}  # id(node) -> which execution of that node name this is

    # --- setup ---
    def _prepare_root(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise KazeiaError(f"--dump: cannot create {self.root}: {e.strerror}") from None
        idx = self.root / "index.json"
        if idx.exists():
            try:
                old = json.loads(idx.read_text())
                ok = isinstance(old, dict) and old.get("format") == FORMAT
            except (OSError, ValueError):
                ok = False
            if not ok:
                raise KazeiaError(f"--dump: {self.root} already holds something that is not a kazeia dump")
            if old.get("version") != VERSION:
                raise KazeiaError(f"--dump: {self.root} holds a dump of format version {old.get('version')}; "
                                  f"use a new directory")
            self._index = old
        else:
            if any(self.root.iterdir()):
                raise KazeiaError(f"--dump: {self.root} is not empty and is not a kazeia dump directory")
            self._index = {"format": FORMAT, "version": VERSION, "kazeia": __version__, "entries": []}
            _write_json(idx, self._index)

    def bind_backend(self, backend: Any) -> None:
        """Called by the HTP backend at graph start: lets the hook snapshot VTCM and memory at batch start."""
        dsp = getattr(backend, "dsp", None)
        if dsp is None or id(dsp) in self._backends:
            return
        self._backends[id(dsp)] = backend
        dsp.on_batch_start.append(self._on_batch_start)

    # --- hook protocol ---
    def on_enqueue(self, node: Tensor, info: OpInfo) -> None:
        if not self.pattern.search(node.name) or self.at == "complete":
            return
        occ = self._claim(node)
        if occ is None:
            return
        self._enqueued.add(id(node))
        self._write_enqueue(node, info, occ, synchronous=False)

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        if not self.pattern.search(node.name):
            return
        occ = self._occ.get(id(node))
        if occ is None:
            occ = self._claim(node)
            if occ is None:
                return
        if self.at in ("enqueue", "both") and id(node) not in self._enqueued:
            # no enqueue event: a synchronous backend, where enqueue and start are the same moment
            self._write_enqueue(node, info, occ, synchronous=True)
        self._enqueued.discard(id(node))
        if self.at == "enqueue":
            self._occ.pop(id(node), None)
            return
        entry_id = f"{occ:04d}-{_safe(node.name)}"
        m = self._base_manifest(node, info, "complete", entry_id)
        m["sources"] = self._sources(node)
        m["output_before"] = self._tensor_record(node, with_span=False)
        m["status"] = "started: output not captured yet (the run ended before the op completed)"
        m["context"] = self._context_for(node, info)
        p = _Pending(entry_id, m, self.root / entry_id)
        p.path.mkdir(exist_ok=True)
        _write_manifest(p.path / "manifest.json", m)
        self._pending[id(node)] = p
        self._register(entry_id, m)

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        p = self._pending.pop(id(node), None)
        self._occ.pop(id(node), None)
        if p is None:
            return
        m = p.manifest
        m["output"] = self._tensor_record(node, with_span=False)
        m["status"] = "completed"
        m["device"]["path"] = info.path
        m["device"]["extra"] = _jsonable(info.extra)
        _write_manifest(p.path / "manifest.json", m)

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        p = self._pending.pop(id(node), None)
        # the device is dead: ops queued after this one will never start
        self._occ.clear()
        self._enqueued.clear()
        if p is None:
            return
        m = p.manifest
        m["output"] = None
        m["status"] = "device died inside this op: no output"
        m["device"]["path"] = info.path
        m["fault"] = {"kind": info.extra.get("kind"), "cause": info.extra.get("cause")}
        _write_manifest(p.path / "manifest.json", m)

    # --- internals ---
    def _claim(self, node: Tensor) -> int | None:
        if self.limit is not None and self.matches >= self.limit:
            if not self.limit_reached:
                self.limit_reached = True
                print(f"kazeia: --dump: limit of {self.limit} dumped ops reached; later matches are not dumped",
                      file=sys.stderr)
            return None
        self.matches += 1
        occ = self._first + self.matches
        self._occ[id(node)] = occ
        self._nth[id(node)] = self._by_name[node.name] = self._by_name.get(node.name, 0) + 1
        return occ

    def _register(self, entry_id: str, m: dict) -> None:
        self.entries.append(entry_id)
        self._index["entries"] = [e for e in self._index["entries"] if e["id"] != entry_id]
        self._index["entries"].append({"id": entry_id, "node": m["node"]["name"], "op": m["node"]["desc"],
                                       "capture": m["capture"], "match": m["match"], "pair": m.get("pair"),
                                       "device": m["device"]["backend"]})
        _write_json(self.root / "index.json", self._index)

    def _base_manifest(self, node: Tensor, info: OpInfo, capture: str, entry_id: str) -> dict:
        dev: dict[str, Any] = {"backend": info.backend, "path": info.path, "batch": info.batch,
                               "batch_index": info.extra.get("batch_index"), "extra": _jsonable(info.extra)}
        be = self._htp_backend_named(info.backend)
        if be is not None:
            dev["htp"] = settings_dict(be.settings)
            dev["htp_profile"] = {"name": be.profile.name, "description": be.profile.description}
        occ = self._occ.get(id(node), 0)
        pair = f"{occ:04d}-{_safe(node.name)}" + (".enqueue" if capture == "complete" else "")
        return {
            "format": FORMAT, "version": VERSION, "kazeia": __version__, "id": entry_id, "capture": capture,
            "capture_note": COMPLETE_NOTE, "match": occ, "occurrence_of_name": self._nth.get(id(node), 0),
            "pair": pair if self.at == "both" else None,
            "graph_index": info.index, "node": tensor_meta(node), "device": dev, "fault": None,
        }

    def _htp_backend_named(self, name: str) -> Any:
        for be in self._backends.values():
            if be.name == name:
                return be
        return None

    def _tensor_record(self, t: Tensor, with_span: bool, role: str | None = None) -> dict:
        rec = tensor_meta(t)
        if role is not None:
            rec["role"] = role
        key = None
        if t.buffer is not None and t.buffer.usage == BufferUsage.WEIGHTS:
            key = (t.buffer.base_addr, t.offset, t.ne, t.nb, t.type)  # weights never change: hash them once
        try:
            vals = logical_values(t)
            rec["values"] = self.store.put(vals, cache_key=key)
            rec["values_kind"] = "elements" if t.type in SCALAR_DTYPES else "raw block rows"
        except (TypeError, ValueError) as e:
            rec["values"] = None
            rec["values_kind"] = f"not readable as elements ({e})"
        rec["span"] = None
        if with_span and (not t.is_contiguous() or rec["values"] is None):
            # a view with gaps: the raw bytes it spans too, for kernels that read outside the logical elements
            s, e = read_extent(t)
            rec["span"] = {"start": s, **self.store.put(t.buffer.data[s:e].copy())}
        return rec

    def _sources(self, node: Tensor) -> list[dict | None]:
        return [self._tensor_record(s, True, source_role(node, i)) if s is not None else None
                for i, s in enumerate(node.src)]

    def _write_enqueue(self, node: Tensor, info: OpInfo, occ: int, synchronous: bool) -> None:
        entry_id = f"{occ:04d}-{_safe(node.name)}.enqueue"
        m = self._base_manifest(node, info, "enqueue", entry_id)
        m["pair"] = f"{occ:04d}-{_safe(node.name)}" if self.at == "both" else None
        m["capture_note"] = SYNC_ENQUEUE_NOTE if synchronous else ENQUEUE_NOTE
        m["synchronous"] = synchronous
        m["sources"] = self._sources(node)
        m["output_before"] = None
        m["output"] = self._tensor_record(node, with_span=False)
        m["output_note"] = "the output buffer as read at enqueue time (before the op ran)"
        m["status"] = "enqueue-time capture"
        m["context"] = None
        path = self.root / entry_id
        path.mkdir(exist_ok=True)
        _write_manifest(path / "manifest.json", m)
        self._register(entry_id, m)

    def _context_for(self, node: Tensor, info: OpInfo) -> dict | None:
        if not self.context or info.batch is None:
            return None
        be = self._htp_backend_named(info.backend)
        if be is None:
            return {"unavailable": "the hook was not bound to the HTP backend (bind_backend), so the batch start "
                                   "state was not seen"}
        snap = self._batch_ctx.get((id(be.dsp), info.batch))
        idx = info.extra.get("batch_index")
        if snap is None or idx is None:
            return {"unavailable": "no batch-start snapshot for this batch"}
        ops = snap["ops"][: idx + 1]
        keys = {k for o in ops for k in o["tensors"]}
        tensors = [t for t in snap["tensors"] if t["key"] in keys]
        descs = sorted({d for o in ops for d in [*(x for x in o["src"] if x is not None), o["dst"]]})
        memory = [r for r in snap["memory"] if r["first_op"] <= idx]
        return {"batch_seq": info.batch, "op_index": idx, "ops": ops, "tensors": tensors,
                "descriptors": [snap["descriptors"][d] for d in descs], "n_descriptors": len(snap["descriptors"]),
                "buffers": snap["buffers"], "memory": memory, "vtcm": snap["vtcm"], "dsp_state": snap["dsp_state"],
                "batch_ops_total": snap["batch_ops_total"]}

    def _on_batch_start(self, dsp: Any, batch: Any) -> None:
        be = self._backends.get(id(dsp))
        if be is None or self not in be.hooks or not self.context or self.at == "enqueue":
            return
        last = -1
        for op in batch.ops:
            if self.pattern.search(op.node.name):
                last = op.index
        if last < 0 or (self.limit is not None and self.matches >= self.limit):
            return
        self._batch_ctx = {k: v for k, v in self._batch_ctx.items() if k[0] != id(dsp)}  # one batch at a time
        self._batch_ctx[(id(dsp), batch.seq)] = self._snapshot(dsp, batch, last)

    def _snapshot(self, dsp: Any, batch: Any, last: int) -> dict:
        """Everything needed to rerun ops[0..last] of the batch on the same device state."""
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
                    buf_meta.append(_buffer_meta(t))
                meta = tensor_meta(t)
                meta["key"] = k
                meta["buffer_index"] = buffers[id(t.buffer)]
                tensors.append(meta)
            return k

        ops = []
        extents: list[tuple[Tensor, int]] = []  # (tensor, first op index that touches it)
        for op in batch.ops[: last + 1]:
            n = op.node
            src_keys = [key_of(s) if s is not None else None for s in n.src]
            ops.append({"index": op.index, "name": n.name, "op": n.op, "desc": n.desc(), "params": _jsonable(n.params),
                        "graph_index": op.graph_index, "src": list(op.src), "dst": op.dst,
                        "src_keys": src_keys, "dst_key": key_of(n),
                        "tensors": [k for k in [*src_keys, keys[id(n)]] if k is not None]})
            extents += [(s, op.index) for s in n.src if s is not None] + [(n, op.index)]
        descs = [{"index": d.index, "tensor": d.tensor.name, "addr": d.addr, "size": d.size,
                  "type": type_name(d.type), "ne": list(d.ne), "nb": list(d.nb), "flags": d.flags,
                  "buffer_index": d.buffer_index} for d in batch.tensors]
        return {"ops": ops, "tensors": tensors, "buffers": buf_meta, "descriptors": descs,
                "memory": self._memory_regions(extents, buffers), "vtcm": self.store.put(dsp.vtcm.mem, compress=True),
                "dsp_state": _dsp_state(dsp), "batch_ops_total": len(batch.ops)}

    def _memory_regions(self, extents: list[tuple[Tensor, int]], buffers: dict[int, int]) -> list[dict]:
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
                try:
                    if not t.is_contiguous():
                        raise ValueError("view")
                    blob = self.store.put(logical_values(t), cache_key=(b.base_addr, t.offset, t.ne, t.nb, t.type))
                except (TypeError, ValueError):
                    blob = self.store.put(b.data[s:e].copy(), cache_key=(b.base_addr, s, e))
                out.append({"buffer": buffers[id(b)], "offset": s, "first_op": first, **blob})
            else:
                spans.setdefault(id(b), []).append((s, e, first))
        for bid, iv in spans.items():
            b = next(t.buffer for t, _ in extents if id(t.buffer) == bid)
            iv.sort()
            merged: list[list[int]] = []
            for s, e, first in iv:
                if merged and s <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], e)
                    merged[-1][2] = min(merged[-1][2], first)
                else:
                    merged.append([s, e, first])
            for s, e, first in merged:
                out.append({"buffer": buffers[bid], "offset": s, "first_op": first,
                            **self.store.put(b.data[s:e].copy())})
        return out


def _dsp_state(dsp: Any) -> dict:
    """DSP state other than VTCM that survives from one batch to the next."""
    state: dict[str, Any] = {}
    for name in ("hmx_scale", "dma_stale_pop"):
        if hasattr(dsp, name):
            state[name] = _jsonable(getattr(dsp, name))
    race = getattr(dsp, "race", None)
    if race is not None and hasattr(race, "bit_generator"):
        state["race_rng"] = _jsonable(race.bit_generator.state)
    return state


# ----------------------------------------------------------------------------------------------------------
# loading


@dataclass
class TensorRecord:
    """A dumped tensor: its description and (for sources and outputs) its logical values."""

    meta: dict
    values: np.ndarray | None = None
    span: np.ndarray | None = None  # raw bytes [span_start, ...) for views with gaps
    span_start: int = 0

    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def type(self) -> GGMLType:
        return GGMLType[self.meta["type"].upper()]

    @property
    def ne(self) -> tuple[int, int, int, int]:
        return tuple(self.meta["ne"])  # type: ignore[return-value]

    @property
    def nb(self) -> tuple[int, int, int, int]:
        return tuple(self.meta["nb"])  # type: ignore[return-value]

    @property
    def role(self) -> str:
        return self.meta.get("role", "")

    @property
    def weight_name(self) -> str | None:
        return self.meta.get("weight_name")

    def floats(self) -> np.ndarray | None:
        """The values as float64 (None for block types)."""
        if self.values is None or self.type not in SCALAR_DTYPES:
            return None
        return self.values.astype(np.float64)

    def label(self) -> str:
        w = f" ({self.weight_name})" if self.weight_name else ""
        return f"{self.name}{w} {self.meta['type']}{self.meta['ne']}"


@dataclass
class Dump:
    """One capture of one op execution (see the module doc)."""

    path: Path
    root: Path
    manifest: dict
    sources: list[TensorRecord | None]
    output: TensorRecord | None
    output_before: TensorRecord | None
    store: BlobStore = field(repr=False)

    @property
    def id(self) -> str:
        return self.manifest["id"]

    @property
    def name(self) -> str:
        return self.manifest["node"]["name"]

    @property
    def op(self) -> str:
        return self.manifest["node"]["op"]

    @property
    def desc(self) -> str:
        return self.manifest["node"]["desc"]

    @property
    def node(self) -> dict:
        return self.manifest["node"]

    @property
    def capture(self) -> str:
        return self.manifest["capture"]

    @property
    def device(self) -> dict:
        return self.manifest["device"]

    @property
    def backend(self) -> str:
        return self.device["backend"]

    @property
    def htp_settings(self) -> dict | None:
        return self.device.get("htp")

    @property
    def fault(self) -> dict | None:
        return self.manifest.get("fault")

    @property
    def context(self) -> dict | None:
        c = self.manifest.get("context")
        return c if c and "unavailable" not in c else None

    @property
    def context_note(self) -> str | None:
        c = self.manifest.get("context")
        if c is None:
            return "no batch context recorded (CPU op, enqueue capture, or context capture off)"
        return c.get("unavailable")

    @property
    def graph_index(self) -> int:
        return int(self.manifest.get("graph_index", -1))

    def load_blob(self, ref: dict, where: str) -> np.ndarray:
        return self.store.get(ref, f"{self.path}: {where}")

    def summary(self) -> str:
        d = self.device
        where = d["backend"]
        if d.get("htp"):
            where += f"/{d['htp'].get('profile')}"
        if d.get("batch") is not None:
            where += f" batch {d['batch']} op #{d.get('batch_index')}"
        what = self.manifest.get("status", "")
        if self.fault:
            what = f"device died in this op ({self.fault.get('kind')}: {self.fault.get('cause')})"
        n = self.node
        return (f"{self.id}: {n['desc']} {n['name']} {n['type']}{n['ne']} [{self.capture} capture, {where}, "
                f"path {d.get('path')}] {what}")


def _read_json(path: Path, what: str) -> dict:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DumpFileError(f"{path}: cannot read the {what}: {e.strerror}") from None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise DumpFileError(f"{path}: the {what} is not valid JSON (corrupt or truncated)") from None
    if not isinstance(obj, dict):
        raise DumpFileError(f"{path}: the {what} is not a JSON object (foreign file)")
    return obj


def _check_format(obj: dict, path: Path) -> None:
    fmt = obj.get("format")
    if fmt != FORMAT:
        raise DumpFileError(f"{path}: not a kazeia op dump (format {str(fmt)[:40]!r}, expected {FORMAT!r})")
    ver = obj.get("version")
    if not isinstance(ver, int):
        raise DumpFileError(f"{path}: the dump has no valid format version")
    if ver > VERSION:
        raise DumpFileError(f"{path}: dump format version {ver} is newer than this kazeia reads (version "
                            f"{VERSION}); use a newer kazeia")
    if ver < 1:
        raise DumpFileError(f"{path}: unknown dump format version {ver}")


def _entry_dirs(root: Path) -> list[Path]:
    idx = _read_json(root / "index.json", "dump index")
    _check_format(idx, root / "index.json")
    entries = idx.get("entries")
    if not isinstance(entries, list):
        raise DumpFileError(f"{root / 'index.json'}: the dump index has no entry list")
    out = []
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("id"), str) or "/" in e["id"] or e["id"] in (".", ".."):
            raise DumpFileError(f"{root / 'index.json'}: malformed entry in the dump index")
        out.append(root / e["id"])
    return out


def _locate(path: str | os.PathLike) -> tuple[Path, list[Path]]:
    """(root, entry dirs) for a dump root, an entry directory or a manifest file."""
    p = Path(path)
    if p.is_file():
        if p.name == "index.json":
            p = p.parent
        elif p.name == "manifest.json":
            return p.parent.parent, [p.parent]
        else:
            raise DumpFileError(f"{p}: not a kazeia dump (give the dump directory)")
    if not p.is_dir():
        raise DumpFileError(f"{p}: no such dump directory")
    if (p / "manifest.json").is_file():
        return p.parent, [p]
    if (p / "index.json").is_file():
        return p, _entry_dirs(p)
    raise DumpFileError(f"{p}: not a kazeia dump (no index.json or manifest.json)")


def _as_record(store: BlobStore, rec: Any, where: str) -> TensorRecord | None:
    if rec is None:
        return None
    if not isinstance(rec, dict):
        raise DumpFileError(f"{where}: malformed tensor record")
    for k in ("name", "type", "ne", "nb", "buffer", "offset"):
        if k not in rec:
            raise DumpFileError(f"{where}: tensor record lacks {k!r}")
    try:
        GGMLType[str(rec["type"]).upper()]
        ne, nb = [int(x) for x in rec["ne"]], [int(x) for x in rec["nb"]]
    except (KeyError, TypeError, ValueError):
        raise DumpFileError(f"{where}: tensor record has a bad type, ne or nb") from None
    if len(ne) != 4 or len(nb) != 4 or min(ne) < 0 or min(nb) < 0:
        raise DumpFileError(f"{where}: tensor record has a bad ne or nb")
    vals = store.get(rec["values"], f"{where} values") if rec.get("values") else None
    span, start = None, 0
    if rec.get("span"):
        span = store.get(rec["span"], f"{where} span")
        start = int(rec["span"].get("start", 0))
    return TensorRecord(rec, vals, span, start)


def _load_entry(root: Path, entry: Path) -> Dump:
    man_path = entry / "manifest.json"
    if not man_path.is_file():
        raise DumpFileError(f"{entry}: missing manifest.json")
    m = _read_json(man_path, "dump manifest")
    _check_format(m, man_path)
    if m.get("digest") != manifest_digest(m):
        raise DumpFileError(f"{man_path}: the manifest does not match its digest (corrupt or edited)")
    for k in ("id", "capture", "node", "device", "sources"):
        if k not in m:
            raise DumpFileError(f"{man_path}: the manifest lacks {k!r}")
    if m["capture"] not in CAPTURES or not isinstance(m["sources"], list) or not isinstance(m["device"], dict):
        raise DumpFileError(f"{man_path}: malformed manifest")
    store = BlobStore(root)
    where = str(entry.name)
    srcs = [_as_record(store, s, f"{where} src{i}") for i, s in enumerate(m["sources"])]
    out = _as_record(store, m.get("output"), f"{where} output")
    before = _as_record(store, m.get("output_before"), f"{where} output_before")
    _as_record(store, dict(m["node"], values=None), f"{where} node")
    ctx = m.get("context")
    if ctx and "unavailable" not in ctx:
        try:
            refs = [ctx["vtcm"], *ctx["memory"]]
        except (KeyError, TypeError):
            raise DumpFileError(f"{man_path}: malformed batch context") from None
        for r in refs:
            store.check_present(r, f"{where} context")
    return Dump(entry, root, m, srcs, out, before, store)


def load_dumps(path: str | os.PathLike) -> list[Dump]:
    """Every capture under a dump directory (or the one entry a path names), verified."""
    root, entries = _locate(path)
    return [_load_entry(root, e) for e in entries]


def load_dump(path: str | os.PathLike, op: str | None = None, capture: str | None = None) -> Dump:
    """One capture: `path` is an entry directory, or a dump root with `op` = an entry id or a node name (the
    completion-time capture is preferred when both exist; `capture` forces one)."""
    root, entries = _locate(path)
    if len(entries) == 1 and op is None:
        return _load_entry(root, entries[0])
    if not entries:
        raise DumpFileError(f"{root}: the dump directory holds no dumps")
    if op is None:
        raise KazeiaError(f"{root} holds {len(entries)} dumps ({', '.join(e.name for e in entries[:6])}"
                          f"{', ...' if len(entries) > 6 else ''}): choose one")
    dumps = [_load_entry(root, e) for e in entries if e.name == op] or \
        [d for d in (_load_entry(root, e) for e in entries) if d.name == op]
    if capture is not None:
        dumps = [d for d in dumps if d.capture == capture]
    elif any(d.capture == "complete" for d in dumps):
        dumps = [d for d in dumps if d.capture == "complete"]
    if not dumps:
        raise KazeiaError(f"{root}: no dump of {op!r}")
    if len(dumps) > 1:
        raise KazeiaError(f"{root}: {len(dumps)} dumps of {op!r} ({', '.join(d.id for d in dumps[:6])}): "
                          f"choose one by id")
    return dumps[0]


def find_pair(dumps: list[Dump], d: Dump) -> Dump | None:
    """The other capture (enqueue <-> complete) of the same op execution, if it was dumped."""
    pid = d.manifest.get("pair")
    return next((x for x in dumps if x.id == pid), None) if pid else None


# ----------------------------------------------------------------------------------------------------------
# comparing two captures of the same op (enqueue vs completion)


@dataclass
class TensorDiff:
    what: str  # "src1 (activations)" or "output"
    name: str
    identical: bool
    n: int
    n_diff: int
    nmse: float | None  # a vs b, b = the completion-time capture
    stats_a: Stats | None
    stats_b: Stats | None

    def line(self, label_a: str, label_b: str) -> str:
        if self.identical:
            return f"{self.what} {self.name}: identical in both captures"
        s = (f"{self.what} {self.name}: DIFFERS in {self.n_diff}/{self.n} elements "
             f"({100.0 * self.n_diff / max(self.n, 1):.1f}%)")
        if self.nmse is not None:
            s += f", NMSE {self.nmse:.3g}"
        if self.stats_a is not None and self.stats_b is not None:
            s += f"; {label_a}: {self.stats_a.short()}; {label_b}: {self.stats_b.short()}"
        return s


@dataclass
class CaptureDiff:
    a: str  # entry ids
    b: str
    label_a: str
    label_b: str
    tensors: list[TensorDiff]

    @property
    def identical(self) -> bool:
        return all(t.identical for t in self.tensors)

    @property
    def inputs_identical(self) -> bool:
        return all(t.identical for t in self.tensors if t.what != "output")

    def describe(self) -> list[str]:
        head = (f"{self.label_a} capture ({self.a}) vs {self.label_b} capture ({self.b}): "
                + ("identical" if self.identical else
                   "inputs identical, output differs" if self.inputs_identical else
                   "the inputs DIFFER: the earlier capture is not what the op consumed"))
        return [head] + ["  " + t.line(self.label_a, self.label_b) for t in self.tensors]


def _diff(what: str, a: TensorRecord | None, b: TensorRecord | None) -> TensorDiff | None:
    if a is None or b is None or a.values is None or b.values is None:
        return None
    va, vb = a.values, b.values
    if va.shape != vb.shape or va.dtype != vb.dtype:
        return TensorDiff(what, b.name, False, int(vb.size), int(vb.size), None, None, None)
    if va.dtype.kind == "f":
        differs = ~((va == vb) | (np.isnan(va) & np.isnan(vb)))
        with np.errstate(all="ignore"):
            e = nmse(va, vb)
        n_diff = int(differs.sum())
        return TensorDiff(what, b.name, n_diff == 0, int(va.size), n_diff, e, values_stats(va), values_stats(vb))
    if b.type in SCALAR_DTYPES:  # integer elements
        n_diff = int((va != vb).sum())
        return TensorDiff(what, b.name, n_diff == 0, int(va.size), n_diff, None, None, None)
    # raw block rows: count rows that differ
    n_diff = int((va != vb).any(axis=-1).sum())
    return TensorDiff(what, b.name, n_diff == 0, int(np.prod(va.shape[:-1])), n_diff, None, None, None)


def compare_captures(a: Dump, b: Dump) -> CaptureDiff:
    """Tensor by tensor: is capture `a` (e.g. enqueue-time) the same as `b` (e.g. completion-time)?"""
    if a.name != b.name or a.node["ne"] != b.node["ne"]:
        raise KazeiaError(f"{a.id} and {b.id} are not captures of the same op")
    diffs = []
    for i, (sa, sb) in enumerate(zip(a.sources, b.sources)):
        d = _diff(sb.role if sb is not None else f"src{i}", sa, sb)
        if d is not None:
            diffs.append(d)
    d = _diff("output", a.output, b.output)
    if d is not None:
        diffs.append(d)
    return CaptureDiff(a.id, b.id, a.capture, b.capture, diffs)


# ----------------------------------------------------------------------------------------------------------
# command-line glue (kazeia.cli.common calls these)


def add_dump_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("op dumps")
    g.add_argument("--dump", nargs=2, metavar=("REGEX", "DIR"), default=None,
                   help="dump the inputs, output, weights and HTP batch context of every op whose node name "
                        "matches REGEX into DIR (replay with `kazeia replay DIR`)")
    g.add_argument("--dump-at", choices=["complete", "enqueue", "both"], default="complete",
                   help="complete: inputs at op start, output at completion (default); enqueue: as read when "
                        "the host queued the op (NOT what the op consumed on the HTP); both")
    g.add_argument("--dump-limit", type=int, default=32, metavar="N",
                   help="dump at most N op executions (default 32; 0 = no limit)")
    g.add_argument("--dump-no-context", action="store_true",
                   help="do not record the HTP batch context (VTCM, preceding ops, memory)")


def install_dump(args: argparse.Namespace, scheduler: Any) -> DumpHook | None:
    """The DumpHook the --dump flags ask for, added to the scheduler (None without --dump)."""
    spec = getattr(args, "dump", None)
    if not spec:
        return None
    regex, directory = spec
    limit = getattr(args, "dump_limit", 32)
    hook = DumpHook(regex, directory, at=getattr(args, "dump_at", "complete"),
                    context=not getattr(args, "dump_no_context", False), limit=limit if limit and limit > 0 else None)
    scheduler.add_hook(hook)
    return hook
