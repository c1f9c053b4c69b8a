"""The op-dump format: its name and version, the capture notes, and how a tensor and the HTP settings are
described in a manifest (everything but the contents, which go to the blob store). Manifests carry a digest of
their canonical JSON and are written atomically."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from kazeia.debug.json_safe import json_safe
from kazeia.graph.tensor import Tensor, TFlag, type_name
from kazeia.outputs import write_text

FORMAT = "kazeia-op-dump"
VERSION = 1
CAPTURES = ("complete", "enqueue")

ENQUEUE_NOTE = ("ENQUEUE-TIME capture: read when the host queued the op, before the device ran it. On an "
                "asynchronous backend (HTP) its inputs may not have been written yet (zeros or stale bytes) and "
                "the output is whatever the buffer held before: this is NOT what the op consumed.")
SYNC_ENQUEUE_NOTE = ("ENQUEUE-TIME capture on a synchronous backend: enqueue and start are the same moment, so it "
                     "holds what the op consumed.")
COMPLETE_NOTE = "inputs read when the op started on its device, output read after it completed"


def buffer_meta(t: Tensor) -> dict:
    b = t.buffer
    assert b is not None
    return {"name": b.name, "usage": b.usage.name, "size": b.size, "base_addr": b.base_addr}


def tensor_meta(t: Tensor) -> dict:
    """Everything about a tensor but its contents."""
    return {
        "name": t.name, "op": t.op, "desc": t.desc() if t.op != "NONE" else "NONE", "type": type_name(t.type),
        "ne": list(t.ne), "nb": list(t.nb), "params": json_safe(t.params), "flags": int(t.flags),
        "weight_name": t.weight_name, "layer": t.layer, "contiguous": t.is_contiguous(),
        "view_of": t.view_src.name if t.view_src is not None else None, "view_offs": t.view_offs,
        "buffer": buffer_meta(t), "offset": t.offset, "data_addr": t.data_addr,
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
    return {f.name: json_safe(getattr(settings, f.name)) for f in dataclasses.fields(settings)}


def manifest_digest(m: dict) -> str:
    """sha256 of the manifest's canonical JSON without its own digest field."""
    body = {k: v for k, v in m.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


def write_manifest(path: Path, m: dict) -> None:
    m["digest"] = manifest_digest(m)
    write_json(path, m)


def write_json(path: Path, obj: dict) -> None:
    write_text(str(path), json.dumps(obj, indent=1, allow_nan=False))
