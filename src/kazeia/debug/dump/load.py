"""Loading op dumps: every format version, manifest digest and blob hash verified; nothing in the files is
executed (JSON, and numpy files with allow_pickle=False). A corrupt, truncated or foreign dump is a
`DumpFileError`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kazeia.debug.dump import schema
from kazeia.debug.dump.blobs import BlobStore
from kazeia.debug.dump.format import CAPTURES, FORMAT, VERSION, manifest_digest
from kazeia.errors import DumpFileError, KazeiaError
from kazeia.graph.tensor import SCALAR_DTYPES, GGMLType
from kazeia.limits import InputLimitError, read_bytes

MAX_JSON_BYTES = 16 << 20  # an index or manifest (a 36-layer run's index of every op is ~2 MiB)


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
        raw = read_bytes(path, what, MAX_JSON_BYTES)
    except InputLimitError as e:
        raise DumpFileError(str(e)) from None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise DumpFileError(f"{path}: the {what} is not valid JSON (corrupt, truncated or nested too deep)") from None
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
    schema.validate(schema.index, idx, root / "index.json")
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
    try:
        digest = manifest_digest(m)
    except ValueError:  # NaN or infinity in the JSON
        raise DumpFileError(f"{man_path}: the manifest holds a non-finite number") from None
    if m.get("digest") != digest:
        raise DumpFileError(f"{man_path}: the manifest does not match its digest (corrupt or edited)")
    # every field against the schema (types, ranges, sizes) before anything is allocated from it
    schema.validate(schema.manifest, m, man_path)
    if m.get("output") and not schema.same_tensor(m["node"], m["output"]):
        raise DumpFileError(f"{man_path}: the output record describes another tensor than the node")
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
        for r in refs:  # verified now: a plain replay reads none of them, and must still notice a damaged one
            store.verify(r, f"{where} context")
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
