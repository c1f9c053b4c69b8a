"""`DumpHook`: the execution hook that writes op dumps, and the --dump command-line flags that install it."""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazeia import __version__
from kazeia.backends.base import Hook, OpInfo
from kazeia.debug.dump.blobs import BlobStore
from kazeia.debug.dump.context import BatchContexts
from kazeia.debug.dump.format import (
    COMPLETE_NOTE,
    ENQUEUE_NOTE,
    FORMAT,
    SYNC_ENQUEUE_NOTE,
    VERSION,
    settings_dict,
    source_role,
    tensor_meta,
    write_json,
    write_manifest,
)
from kazeia.debug.json_safe import json_safe
from kazeia.debug.tensors import logical_values, read_extent
from kazeia.errors import KazeiaError
from kazeia.graph.tensor import SCALAR_DTYPES, BufferUsage, Tensor
from kazeia.limits import read_json_object, safe_regex
from kazeia.outputs import LOCK_NAME, claim_folder, ensure_folder


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
        self.pattern = safe_regex(regex, "--dump")
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
        self._occ: dict[Tensor, int] = {}  # node -> occurrence number while the op is in flight
        self._enqueued: set[Tensor] = set()  # nodes whose enqueue capture is done
        self._pending: dict[Tensor, _Pending] = {}  # node -> complete capture waiting for its output
        self._backends: list[Any] = []  # the HtpBackends bound
        self.contexts = BatchContexts(self.store)  # batch-start snapshots, from the backend's batch-start hook
        self._by_name: dict[str, int] = {}  # node name -> executions dumped so far
        self._nth: dict[Tensor, int] = {}  # node -> which execution of that node name this is

    # --- setup ---
    def _prepare_root(self) -> None:
        ensure_folder(str(self.root), "--dump")
        claim_folder(str(self.root))  # a second run dumping here at the same time is refused, not mixed in
        idx = self.root / "index.json"
        if idx.exists():
            try:
                old = read_json_object(str(idx), "dump index")
                ok = old.get("format") == FORMAT
            except KazeiaError:
                ok = False
            if not ok:
                raise KazeiaError(f"--dump: {self.root} already holds something that is not a kazeia dump")
            if old.get("version") != VERSION:
                raise KazeiaError(f"--dump: {self.root} holds a dump of format version {old.get('version')}; "
                                  f"use a new directory")
            self._index = old
        else:
            if any(p.name != LOCK_NAME for p in self.root.iterdir()):
                raise KazeiaError(f"--dump: {self.root} is not empty and is not a kazeia dump directory")
            self._index = {"format": FORMAT, "version": VERSION, "kazeia": __version__, "entries": []}
            write_json(idx, self._index)

    def bind_backend(self, backend: Any) -> None:
        """Called by the HTP backend at graph start: lets the hook snapshot VTCM and memory at batch start."""
        if any(b is backend for b in self._backends):
            return
        self._backends.append(backend)
        backend.add_batch_start_hook(self._on_batch_start)

    # --- hook protocol ---
    def on_enqueue(self, node: Tensor, info: OpInfo) -> None:
        if not self.pattern.search(node.name) or self.at == "complete":
            return
        occ = self._claim(node)
        if occ is None:
            return
        self._enqueued.add(node)
        self._write_enqueue(node, info, occ, synchronous=False)

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        if not self.pattern.search(node.name):
            return
        occ = self._occ.get(node)
        if occ is None:
            occ = self._claim(node)
            if occ is None:
                return
        if self.at in ("enqueue", "both") and node not in self._enqueued:
            # no enqueue event: a synchronous backend, where enqueue and start are the same moment
            self._write_enqueue(node, info, occ, synchronous=True)
        self._enqueued.discard(node)
        if self.at == "enqueue":
            self._occ.pop(node, None)
            return
        entry_id = f"{occ:04d}-{_safe(node.name)}"
        m = self._base_manifest(node, info, "complete", entry_id)
        m["sources"] = self._sources(node)
        m["output_before"] = self._tensor_record(node, with_span=False)
        m["status"] = "started: output not captured yet (the run ended before the op completed)"
        m["context"] = self._context_for(node, info)
        p = _Pending(entry_id, m, self.root / entry_id)
        p.path.mkdir(exist_ok=True)
        write_manifest(p.path / "manifest.json", m)
        self._pending[node] = p
        self._register(entry_id, m)

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        p = self._pending.pop(node, None)
        self._occ.pop(node, None)
        if p is None:
            return
        m = p.manifest
        m["output"] = self._tensor_record(node, with_span=False)
        m["status"] = "completed"
        m["device"]["path"] = info.path
        m["device"]["extra"] = json_safe(info.extra)
        write_manifest(p.path / "manifest.json", m)

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        p = self._pending.pop(node, None)
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
        write_manifest(p.path / "manifest.json", m)

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
        self._occ[node] = occ
        self._nth[node] = self._by_name[node.name] = self._by_name.get(node.name, 0) + 1
        return occ

    def _register(self, entry_id: str, m: dict) -> None:
        self.entries.append(entry_id)
        self._index["entries"] = [e for e in self._index["entries"] if e["id"] != entry_id]
        self._index["entries"].append({"id": entry_id, "node": m["node"]["name"], "op": m["node"]["desc"],
                                       "capture": m["capture"], "match": m["match"], "pair": m.get("pair"),
                                       "device": m["device"]["backend"]})
        write_json(self.root / "index.json", self._index)

    def _base_manifest(self, node: Tensor, info: OpInfo, capture: str, entry_id: str) -> dict:
        dev: dict[str, Any] = {"backend": info.backend, "path": info.path, "batch": info.batch,
                               "batch_index": info.extra.get("batch_index"), "extra": json_safe(info.extra)}
        be = self._htp_backend_named(info.backend)
        if be is not None:
            dev["htp"] = settings_dict(be.settings)
            dev["htp_profile"] = {"name": be.profile.name, "description": be.profile.description}
        occ = self._occ.get(node, 0)
        pair = f"{occ:04d}-{_safe(node.name)}" + (".enqueue" if capture == "complete" else "")
        return {
            "format": FORMAT, "version": VERSION, "kazeia": __version__, "id": entry_id, "capture": capture,
            "capture_note": COMPLETE_NOTE, "match": occ, "occurrence_of_name": self._nth.get(node, 0),
            "pair": pair if self.at == "both" else None,
            "graph_index": info.index, "node": tensor_meta(node), "device": dev, "fault": None,
        }

    def _htp_backend_named(self, name: str) -> Any:
        for be in self._backends:
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
        write_manifest(path / "manifest.json", m)
        self._register(entry_id, m)

    def _context_for(self, node: Tensor, info: OpInfo) -> dict | None:
        if not self.context or info.batch is None:
            return None
        be = self._htp_backend_named(info.backend)
        if be is None:
            return {"unavailable": "the hook was not bound to the HTP backend (bind_backend), so the batch start "
                                   "state was not seen"}
        return self.contexts.for_op(be, info, node.name)

    def _on_batch_start(self, be: Any, batch: Any) -> None:
        if self not in be.hooks or not self.context or self.at == "enqueue":
            return
        last = -1
        for op in batch.ops:
            if any(self.pattern.search(d.node.name) for d in (op, *op.fused)):  # (a node fused into the op too)
                last = op.index
        if last < 0 or (self.limit is not None and self.matches >= self.limit):
            return
        self.contexts.record(be, batch, last)


def add_dump_args(p: argparse.ArgumentParser, dump_action: type[argparse.Action] | None = None,
                  limit_type=int) -> None:
    """The --dump flags; the CLI passes its validators (`dump_action` checks REGEX and DIR as argparse reads them)."""
    g = p.add_argument_group("op dumps")
    g.add_argument("--dump", nargs=2, metavar=("REGEX", "DIR"), default=None, action=dump_action,
                   help="dump the inputs, output, weights and HTP batch context of every op whose node name "
                        "matches REGEX into DIR (replay with `kazeia replay DIR`)")
    g.add_argument("--dump-at", choices=["complete", "enqueue", "both"], default="complete",
                   help="complete: inputs at op start, output at completion (default); enqueue: as read when "
                        "the host queued the op (NOT what the op consumed on the HTP); both")
    g.add_argument("--dump-limit", type=limit_type, default=32, metavar="N",
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
