"""The op-dump schema: every field of an index and a manifest checked (type, range, consistency) when a dump is
loaded, before anything is allocated from it. A manifest whose digest was recomputed after an edit is still
just input: `ne=[2560, 1e12]`, `vtcm_bytes=1e15`, a string where a number belongs or `node: null` become one
DumpFileError naming the file, the field and the limit.

Limits are the CLI's where it has them (VTCM 64 KiB .. 1 GiB, GGML_MAX_SRC sources, the GGUF reader's
largest dimension), and otherwise what one op of a model this machine can run could need (a tensor or a buffer
of at most MAX_TENSOR_BYTES); a tensor's bytes must lie inside its buffer, and recorded values must have the
tensor's own shape and storage type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kazeia.backends.devices import DEVICES  # the registry: a dump names its backend so
from kazeia.errors import DumpFileError, KazeiaError
from kazeia.graph.tensor import SCALAR_DTYPES, BufferUsage, GGMLType, block_size, row_size, type_size
from kazeia.limits import safe_regex

MIN_VTCM, MAX_VTCM = 64 * 1024, 1 << 30  # kazeia's VTCM range (HtpSettings.from_env, --vtcm)
MAX_DIM = 1 << 40  # the GGUF reader's largest tensor dimension
MAX_TENSOR_BYTES = 1 << 32  # 4 GiB: one tensor or buffer of a replayed op (Qwen3-8B's F32 embedding is 2.5 GB)
MAX_SRC = 10  # GGML_MAX_SRC
MAX_LIST = 1 << 20  # entries of any list in a manifest (ops of a batch, memory regions, descriptors)
MAX_STR = 1 << 16
HEX64 = re.compile(r"[0-9a-f]{64}")
BLOB_FILE = re.compile(r"blobs/[0-9a-f]{64}\.(npy|npz)")
ENTRY_ID = re.compile(r"[A-Za-z0-9_.+-]{1,200}")
TYPE_NAMES = {t.name.lower(): t for t in GGMLType}


class Invalid(Exception):
    """A field that does not fit the schema: where (a dotted path) and why."""

    def __init__(self, where: str, value: Any, problem: str) -> None:
        shown = repr(value)
        super().__init__(f"field {where} = {shown if len(shown) <= 40 else shown[:37] + '...'}: {problem}")


Check = Callable[[Any, str], None]


def integer(lo: int | None = None, hi: int | None = None, why: str = "") -> Check:
    def check(v: Any, where: str) -> None:
        if not isinstance(v, int) or isinstance(v, bool):
            raise Invalid(where, v, "not an integer")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f"{lo if lo is not None else '-inf'} .. {hi if hi is not None else 'inf'}"
            raise Invalid(where, v, f"out of range {rng}{f' ({why})' if why else ''}")
    return check


def number(v: Any, where: str) -> None:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise Invalid(where, v, "not a finite number")


def boolean(v: Any, where: str) -> None:
    if not isinstance(v, bool):
        raise Invalid(where, v, "not a boolean")


def string(pattern: re.Pattern | None = None, limit: int = MAX_STR) -> Check:
    def check(v: Any, where: str) -> None:
        if not isinstance(v, str):
            raise Invalid(where, v, "not a string")
        if len(v) > limit:
            raise Invalid(where, v, f"longer than {limit} characters")
        if pattern is not None and not pattern.fullmatch(v):
            raise Invalid(where, v, f"does not match {pattern.pattern}")
    return check


text = string()


def one_of(*values: Any) -> Check:
    def check(v: Any, where: str) -> None:
        if not isinstance(v, (str, int)) or isinstance(v, bool) or v not in values:
            raise Invalid(where, v, f"not one of {', '.join(map(str, values))}")
    return check


def optional(inner: Check) -> Check:
    def check(v: Any, where: str) -> None:
        if v is not None:
            inner(v, where)
    return check


def list_of(inner: Check, length: int | None = None, limit: int = MAX_LIST) -> Check:
    def check(v: Any, where: str) -> None:
        if not isinstance(v, list):
            raise Invalid(where, v, "not a list")
        if length is not None and len(v) != length:
            raise Invalid(where, v, f"has {len(v)} entries, not {length}")
        if len(v) > limit:
            raise Invalid(where, v, f"has more than {limit} entries")
        for i, x in enumerate(v):
            inner(x, f"{where}[{i}]")
    return check


def json_value(depth: int = 8) -> Check:
    """Any JSON value (op params, backend extras), nested at most `depth` deep."""
    def check(v: Any, where: str, d: int = 0) -> None:
        if d > depth:
            raise Invalid(where, v, f"nested deeper than {depth}")
        if isinstance(v, dict):
            for k, x in v.items():
                check(x, f"{where}.{k}", d + 1)
        elif isinstance(v, list):
            if len(v) > MAX_LIST:
                raise Invalid(where, v, f"has more than {MAX_LIST} entries")
            for i, x in enumerate(v):
                check(x, f"{where}[{i}]", d + 1)
        elif isinstance(v, float) and not math.isfinite(v):
            raise Invalid(where, v, "not a finite number")
        elif not isinstance(v, (str, int, float, bool)) and v is not None:
            raise Invalid(where, v, "not a JSON value")
    return check


def obj(required: dict[str, Check], optional_fields: dict[str, Check] | None = None) -> Check:
    """A JSON object with these fields (unknown extra fields are allowed: a newer writer of the same version)."""
    opt = optional_fields or {}

    def check(v: Any, where: str) -> None:
        if not isinstance(v, dict):
            raise Invalid(where, v, "not an object")
        for k, c in required.items():
            if k not in v:
                raise Invalid(f"{where}.{k}" if where else k, None, "missing")
            c(v[k], f"{where}.{k}" if where else k)
        for k, c in opt.items():
            if k in v:
                c(v[k], f"{where}.{k}" if where else k)
    return check


# --- the parts ---------------------------------------------------------------------------------------------


def blob_ref(v: Any, where: str) -> None:
    obj({"blob": string(HEX64), "file": string(BLOB_FILE), "dtype": string(limit=16),
         "shape": list_of(integer(0, MAX_DIM), limit=8)}, {"bytes": integer(0, MAX_TENSOR_BYTES + (1 << 20))})(v, where)
    if v["file"][6:70] != v["blob"]:
        raise Invalid(f"{where}.file", v["file"], "does not name the blob's digest")
    try:
        dt = np.dtype(v["dtype"])
    except TypeError:
        raise Invalid(f"{where}.dtype", v["dtype"], "not a numpy dtype") from None
    if dt.hasobject or dt.kind not in "biuf":
        raise Invalid(f"{where}.dtype", v["dtype"], "not a numeric dtype")
    nbytes = dt.itemsize * math.prod(v["shape"])
    if nbytes > MAX_TENSOR_BYTES:
        raise Invalid(f"{where}.shape", v["shape"], f"{nbytes} bytes, over the limit of {MAX_TENSOR_BYTES}")


buffer_meta = obj({"name": text, "usage": one_of(*(u.name for u in BufferUsage)),
                   "size": integer(0, MAX_TENSOR_BYTES, "bytes"), "base_addr": integer(0, 1 << 62)})


def _dims(v: Any, where: str) -> None:
    list_of(integer(1, MAX_DIM, "the GGUF reader's largest dimension"), length=4)(v, where)


def _strides(v: Any, where: str) -> None:
    list_of(integer(0, MAX_TENSOR_BYTES), length=4)(v, where)


_TENSOR_FIELDS: dict[str, Check] = {
    "name": text, "type": one_of(*TYPE_NAMES), "ne": _dims, "nb": _strides, "buffer": buffer_meta,
    "offset": integer(0, MAX_TENSOR_BYTES),
}
_TENSOR_OPTIONAL: dict[str, Check] = {
    "op": text, "desc": text, "params": optional(obj({})), "flags": integer(0, 1 << 31),
    "weight_name": optional(text), "layer": optional(integer(-1, 1 << 20)), "contiguous": boolean,
    "view_of": optional(text), "view_offs": integer(0, MAX_TENSOR_BYTES), "data_addr": integer(0, 1 << 62),
    "role": text, "values_kind": text, "key": integer(0, MAX_LIST), "buffer_index": integer(0, MAX_LIST),
}


def tensor_meta(v: Any, where: str) -> None:
    """A tensor's description, then what it implies: its bytes inside its buffer, and its values' shape."""
    obj(_TENSOR_FIELDS, _TENSOR_OPTIONAL)(v, where)
    json_value()(v.get("params"), f"{where}.params")
    t = TYPE_NAMES[v["type"]]
    ne, nb = v["ne"], v["nb"]
    if ne[0] % block_size(t):
        raise Invalid(f"{where}.ne", ne, f"ne0 is not a multiple of the {v['type']} block size {block_size(t)}")
    if t not in SCALAR_DTYPES and nb[0] != type_size(t):
        raise Invalid(f"{where}.nb", nb, f"the rows of a {v['type']} tensor must be contiguous (nb0 "
                                         f"{type_size(t)})")
    # the bytes its elements span (ggml_nbytes), and the dense size a kernel may read (debug.tensors.read_bytes)
    first = (ne[0] - 1) * nb[0] + type_size(t) if t in SCALAR_DTYPES else row_size(t, ne[0])
    span = first + sum((n - 1) * s for n, s in zip(ne[1:], nb[1:]))
    dense = row_size(t, ne[0]) * ne[1] * ne[2] * ne[3]
    if max(span, dense) > MAX_TENSOR_BYTES:
        raise Invalid(f"{where}.ne", ne, f"{max(span, dense)} bytes, over the limit of {MAX_TENSOR_BYTES}")
    if v["offset"] + span > v["buffer"]["size"]:
        raise Invalid(f"{where}.offset", v["offset"], f"the tensor's {span} bytes from there run past its "
                                                      f"buffer of {v['buffer']['size']} bytes")


def tensor_record(v: Any, where: str) -> None:
    """A dumped tensor: its description, and the blobs of its values (and raw span) that must fit it."""
    tensor_meta(v, where)
    obj({}, {"values": optional(blob_ref), "span": optional(obj({"start": integer(0, MAX_TENSOR_BYTES)}))})(v, where)
    if v.get("span"):
        blob_ref(v["span"], f"{where}.span")
    vals = v.get("values")
    if vals:
        t = TYPE_NAMES[v["type"]]
        ne = v["ne"]
        want = ([ne[3], ne[2], ne[1], ne[0]], np.dtype(SCALAR_DTYPES[t]).str) if t in SCALAR_DTYPES else \
            ([ne[3], ne[2], ne[1], row_size(t, ne[0])], np.dtype(np.uint8).str)
        if vals["shape"] != want[0] or np.dtype(vals["dtype"]) != np.dtype(want[1]):
            raise Invalid(f"{where}.values", f"{vals['dtype']}{vals['shape']}",
                          f"the values of a {v['type']}{ne} tensor are {want[1]}{want[0]}")


def _settings(v: Any, where: str) -> None:
    from kazeia.backends.htp import FAULTS, MAX_HVX_THREADS, PROFILES

    obj({}, {"opbatch": integer(1, 1 << 30), "opqueue": integer(1, 1 << 30), "opfilter": optional(_regex),
             "verbose": integer(0, 16), "nhvx": integer(0, MAX_HVX_THREADS), "use_hmx": boolean,
             "arch": integer(0, 1 << 16), "vtcm_bytes": integer(MIN_VTCM, MAX_VTCM, "the CLI's VTCM limit"),
             "profile": one_of(*PROFILES), "faults": list_of(one_of(*FAULTS), limit=64),
             "farf": boolean, "fp32_quantize_group": integer(1, 1 << 16),
             "race_seed": optional(integer(0, (1 << 64) - 1)), "oplog": integer(0, 16), "dump": optional(_regex),
             "dump_dir": text, "dump_limit": integer(0, 1 << 30),
             # 2026-10's switches (backends/htp/settings.py)
             "nhmx": integer(0, 16), "mm_select": integer(0, 2), "fa_select": integer(0, 2),
             "gdn_select": integer(0, 2), "opfusion": integer(0, 127), "devices": integer(1, 16),
             "vtcm_grant": optional(integer(4096, MAX_VTCM)),
             "vmem_mib": optional(integer(1, 65536)), "mbuf_mib": integer(1, 65536),
             "ignored": list_of(one_of("GGML_HEXAGON_USE_HMX", "GGML_HEXAGON_OPSTAGE"), limit=2)})(v, where)


def _regex(v: Any, where: str) -> None:
    text(v, where)
    try:
        safe_regex(v, "regex")
    except KazeiaError as e:
        raise Invalid(where, v, f"not a usable regex ({e})") from None


device = obj({"backend": one_of(*DEVICES)},
             {"path": optional(text), "batch": optional(integer(0)), "batch_index": optional(integer(0, MAX_LIST)),
              "extra": optional(obj({})), "htp": optional(_settings),
              "htp_profile": optional(obj({"name": text}, {"description": text}))})

_op = obj({"index": integer(0, MAX_LIST), "name": text, "op": text, "graph_index": integer(-1, MAX_LIST),
           "src": list_of(optional(integer(0, MAX_LIST)), limit=MAX_SRC), "dst": integer(0, MAX_LIST),
           "src_keys": list_of(optional(integer(0, MAX_LIST)), limit=MAX_SRC), "dst_key": integer(0, MAX_LIST)},
          {"desc": text, "params": optional(obj({})), "tensors": list_of(integer(0, MAX_LIST)), "fused": text})

_memory = obj({"buffer": integer(0, MAX_LIST), "offset": integer(0, MAX_TENSOR_BYTES), "first_op": integer(0)})


_U128 = integer(0, (1 << 128) - 1)
# numpy's PCG64 bit generator state (the DSP's race generator), as bit_generator.state gives it
_pcg64_state = obj({"bit_generator": one_of("PCG64"), "state": obj({"state": _U128, "inc": _U128}),
                    "has_uint32": integer(0, 1), "uinteger": integer(0, (1 << 32) - 1)})


def context(v: Any, where: str) -> None:
    """The HTP batch context: its ops, tensors, buffers, memory regions and VTCM, all referring to each other."""
    if isinstance(v, dict) and "unavailable" in v:
        obj({"unavailable": text})(v, where)
        return
    obj({"batch_seq": integer(0), "op_index": integer(0, MAX_LIST), "ops": list_of(_op),
         "tensors": list_of(tensor_meta), "buffers": list_of(buffer_meta), "memory": list_of(_memory),
         "vtcm": blob_ref},
        {"descriptors": list_of(obj({})), "n_descriptors": integer(0, MAX_LIST), "dsp_state": optional(obj(
            {}, {"hmx_scale": number, "dma_stale_pop": boolean, "race_rng": optional(_pcg64_state)})),
         "batch_ops_total": integer(0, MAX_LIST)})(v, where)
    keys = set()
    for i, t in enumerate(v["tensors"]):
        for k in ("key", "buffer_index"):
            if k not in t:
                raise Invalid(f"{where}.tensors[{i}].{k}", None, "missing")
        if t["buffer_index"] >= len(v["buffers"]):
            raise Invalid(f"{where}.tensors[{i}].buffer_index", t["buffer_index"], "names no buffer")
        keys.add(t["key"])
    for i, o in enumerate(v["ops"]):
        for k in [o["dst_key"], *(x for x in o["src_keys"] if x is not None)]:
            if k not in keys:
                raise Invalid(f"{where}.ops[{i}]", k, "refers to a tensor key the context does not hold")
    if not v["ops"] or v["op_index"] >= len(v["ops"]):
        raise Invalid(f"{where}.op_index", v["op_index"], f"the context holds {len(v['ops'])} ops")
    for i, r in enumerate(v["memory"]):
        blob_ref(r, f"{where}.memory[{i}]")
        if r["buffer"] >= len(v["buffers"]):
            raise Invalid(f"{where}.memory[{i}].buffer", r["buffer"], "names no buffer")
        size = np.dtype(r["dtype"]).itemsize * math.prod(r["shape"])
        if r["offset"] + size > v["buffers"][r["buffer"]]["size"]:
            raise Invalid(f"{where}.memory[{i}].offset", r["offset"], "the region runs past its buffer")
    vt = v["vtcm"]
    if np.dtype(vt["dtype"]).itemsize * math.prod(vt["shape"]) > MAX_VTCM:
        raise Invalid(f"{where}.vtcm.shape", vt["shape"], f"more than the CLI's VTCM limit of {MAX_VTCM} bytes")


def _capture_fields(v: Any, where: str) -> None:
    obj({"kind": optional(text), "cause": optional(text)})(v, where)


def _sources(v: Any, where: str) -> None:
    list_of(optional(tensor_record), limit=MAX_SRC)(v, where)
    if not v or v[0] is None:
        raise Invalid(f"{where}[0]" if v else where, v[0] if v else v, "every computed ggml op has a src0")


manifest = obj(
    {"format": text, "version": integer(1), "id": string(ENTRY_ID), "capture": one_of("complete", "enqueue"),
     "node": tensor_meta, "device": device, "sources": _sources,
     "digest": string(HEX64)},
    {"kazeia": text, "capture_note": text, "match": integer(0), "occurrence_of_name": integer(0),
     "pair": optional(string(ENTRY_ID)), "graph_index": integer(-1, MAX_LIST), "fault": optional(_capture_fields),
     "output": optional(tensor_record), "output_before": optional(tensor_record), "status": text,
     "context": optional(context), "synchronous": boolean, "output_note": text})

index = obj({"format": text, "version": integer(1), "entries": list_of(obj(
    {"id": string(ENTRY_ID)},
    {"node": optional(text), "op": optional(text), "capture": optional(one_of("complete", "enqueue")),
     "match": optional(integer(0)), "pair": optional(string(ENTRY_ID)), "device": optional(text)}))},
    {"kazeia": text})


def validate(check: Check, value: Any, path: Path) -> None:
    """Run a schema check; a mismatch is a DumpFileError naming the file and the field."""
    try:
        check(value, "")
    except Invalid as e:
        raise DumpFileError(f"{path}: {e}") from None


def same_tensor(a: dict, b: dict) -> bool:
    """The output record describes the node itself (a forged one could describe another tensor)."""
    return all(a.get(k) == b.get(k) for k in ("type", "ne", "nb", "offset")) and \
        a["buffer"]["base_addr"] == b["buffer"]["base_addr"]
