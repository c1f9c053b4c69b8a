"""Replaying a dumped op: alone on any backend, or with its HTP batch context, judged against float64.

`replay(dump, device=..., htp_profile=..., with_context=...)` rebuilds the op's tensors at their original
buffer offsets and addresses (so in-place aliasing and the HTP's descriptor de-duplication are what they
were), runs it, and compares its output with `ref` (float64, run on the same inputs) using the per-op
thresholds of test-backend-ops, and with the output the dump recorded.

Alone, the op runs in a fresh device: fresh VTCM, a batch of one op. That answers "do these inputs (values
and shapes) make this op fail?". With context (HTP dumps taken at completion), the VTCM contents and DSP
state at the start of the op's batch are restored, the memory the batch read is put back at the original
addresses, and the ops that preceded it in its batch are rerun first, in the same order and with the same
descriptor indexes. That answers "does this op fail because of what ran before it in the batch?". The two
answers side by side separate a value-triggered fault from a context-triggered one.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kazeia.backends.base import Backend, Hook, OpInfo
from kazeia.backends.cpu import CpuBackend
from kazeia.backends.ref import RefBackend
from kazeia.debug.dump import Dump, TensorRecord, load_dump, logical_values, read_extent
from kazeia.debug.stats import max_errors, nmse
from kazeia.errors import DeviceDeathError, DeviceOpError, DumpFileError, KazeiaError
from kazeia.graph.tensor import SCALAR_DTYPES, Buffer, BufferUsage, GGMLType, Tensor, TFlag, array, rows, type_size

# ----------------------------------------------------------------------------------------------------------
# thresholds and comparison (test-backend-ops)

SAME_TYPE_EXACT_OPS = frozenset({"CPY", "CONT", "GET_ROWS", "SET_ROWS"})


def op_threshold(op: str, src_type: str | None, dst_type: str) -> float:
    """Max NMSE for an op (the same rule as kazeia.debug.compare.op_threshold): MUL_MAT and FLASH_ATTN_EXT
    5e-4, SOFT_MAX 1e-6, copies/gathers/scatters within one type exact, conversions (to F16, dequantizing
    GET_ROWS) 1e-7 since their rounding is part of the op, everything else 1e-7."""
    if op in ("MUL_MAT", "FLASH_ATTN_EXT"):
        return 5e-4
    if op == "SOFT_MAX":
        return 1e-6
    if op in SAME_TYPE_EXACT_OPS and src_type == dst_type:
        return 0.0
    return 1e-7


def dump_threshold(dump: Dump) -> float:
    src0 = dump.sources[0] if dump.sources else None
    return op_threshold(dump.op, src0.meta["type"] if src0 is not None else None, dump.node["type"])


@dataclass
class Comparison:
    """a (under test) against b (reference or recorded output)."""

    against: str  # "ref" or "recorded output"
    threshold: float
    ok: bool
    reason: str
    identical: bool = False
    nmse: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    nan_a: int = 0
    nan_b: int = 0
    inf_mismatch: int = 0
    reference_invalid: bool = False

    def short(self) -> str:
        if self.identical:
            return "identical"
        s = self.reason
        if self.nmse is not None and "NMSE" not in s:
            s += f", NMSE {self.nmse:.3g}"
        if self.max_abs is not None:
            s += f", max abs err {self.max_abs:.3g}"
        return s

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                for k, v in dataclasses.asdict(self).items()}


def compare(a: np.ndarray, b: np.ndarray, threshold: float, against: str = "ref") -> Comparison:
    """NaN check first (a NaN in the reference makes it invalid, never the backend's fault), then the inf sign
    check, then NMSE over the finite positions against the threshold."""
    if a.shape != b.shape:
        return Comparison(against, threshold, False, f"shape {list(a.shape)} differs from {list(b.shape)}")
    if a.dtype.kind != "f" or b.dtype.kind != "f":  # raw bytes: exact or not
        same = bool(np.array_equal(a, b))
        return Comparison(against, threshold, same, "identical bytes" if same else "bytes differ", identical=same)
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    identical = bool(np.array_equal(a, b, equal_nan=True))
    nan_a, nan_b = int(np.isnan(a).sum()), int(np.isnan(b).sum())
    c = Comparison(against, threshold, False, "", identical=identical, nan_a=nan_a, nan_b=nan_b)
    fin = np.isfinite(a) & np.isfinite(b)
    if fin.any():
        d = (a[fin] - b[fin]) ** 2
        den = float(np.sum(a[fin] ** 2))
        num = float(np.sum(d))
        c.nmse = 0.0 if num == 0.0 else (num / den if den else float("inf"))
        c.max_abs, c.max_rel = max_errors(a[fin], b[fin])
    if nan_b and against == "ref":
        c.reference_invalid = True
        c.reason = f"reference invalid ({nan_b} NaN in the float64 reference)"
        return c
    if nan_a or nan_b:
        c.reason = f"{nan_a} NaN in the output" + (f", {nan_b} in the {against}" if nan_b else "")
        c.ok = identical
        return c
    ia, ib = np.isinf(a), np.isinf(b)
    bad_inf = (ia | ib) & ~(ia & ib & (np.sign(a) == np.sign(b)))
    c.inf_mismatch = int(bad_inf.sum())
    if c.inf_mismatch:
        c.reason = f"{c.inf_mismatch} inf values differ from the {against}"
        return c
    e = c.nmse or 0.0
    c.ok = e <= threshold
    c.reason = f"NMSE {e:.3g} {'<=' if c.ok else '>'} {threshold:.3g}"
    return c


# ----------------------------------------------------------------------------------------------------------
# rebuilding tensors from a dump


def _tensor_from_meta(meta: dict, buf: Buffer) -> Tensor:
    return Tensor(type=GGMLType[meta["type"].upper()], ne=tuple(meta["ne"]), nb=tuple(meta["nb"]),
                  name=meta["name"], op=meta.get("op", "NONE"), params=dict(meta.get("params") or {}),
                  flags=int(meta.get("flags", 0)), weight_name=meta.get("weight_name"), layer=meta.get("layer"),
                  buffer=buf, offset=int(meta["offset"]))


def _extent_end(meta: dict) -> int:
    t = Tensor(type=GGMLType[meta["type"].upper()], ne=tuple(meta["ne"]), nb=tuple(meta["nb"]))
    n = t.nbytes
    if t.type in SCALAR_DTYPES:
        n = max(n, t.nelements * type_size(t.type))
    return int(meta["offset"]) + n


def _make_buffer(meta: dict, size: int) -> Buffer:
    b = Buffer(meta["name"], np.zeros(max(size, 1), dtype=np.uint8), BufferUsage[meta["usage"]])
    b.base_addr = int(meta["base_addr"])  # the original address: descriptor de-duplication keys on it
    return b


def _write_values(t: Tensor, values: np.ndarray) -> None:
    dst = array(t) if t.type in SCALAR_DTYPES else rows(t)
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
        sizes[addr] = max(sizes.get(addr, 0), _extent_end(m))
    for r in records:
        if r.span is not None:
            addr = int(r.meta["buffer"]["base_addr"])
            sizes[addr] = max(sizes[addr], r.span_start + r.span.size)
    bufs = {addr: _make_buffer(bmeta[addr], size) for addr, size in sizes.items()}

    def tensor(m: dict) -> Tensor:
        return _tensor_from_meta(m, bufs[int(m["buffer"]["base_addr"])])

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


# ----------------------------------------------------------------------------------------------------------
# executions


@dataclass
class Execution:
    """One run of the op (alone or with context) on one device, judged."""

    mode: str  # "alone" | "with context"
    device: str
    profile: str | None = None
    path: str | None = None  # cpu / ref / hvx / hmx
    status: str | None = None  # the DSP's op status if not OK
    died: dict | None = None  # kind, cause, message, faulting op
    error: str | None = None
    vs_ref: Comparison | None = None
    vs_recorded: Comparison | None = None
    same_death_as_recorded: bool | None = None
    inputs_reproduced: bool | None = None  # with context: did the preceding ops recreate the dumped inputs?
    input_mismatch: list[str] = field(default_factory=list)
    descriptors_reproduced: bool | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    output: np.ndarray | None = field(default=None, repr=False)
    inputs_seen: list | None = field(default=None, repr=False)  # the op's inputs as it started (replay side)

    @property
    def ok(self) -> bool:
        return (self.died is None and self.error is None and self.status is None and self.vs_ref is not None
                and self.vs_ref.ok)

    @property
    def reference_invalid(self) -> bool:
        return self.vs_ref is not None and self.vs_ref.reference_invalid

    def verdict(self) -> str:
        if self.died is not None:
            s = f"died ({self.died.get('kind')}: {self.died.get('cause')})"
            if self.died.get("faulting") and self.died.get("faulting") != self.died.get("target"):
                s += f" in {self.died['faulting']}, before reaching the op"
            if self.same_death_as_recorded:
                s += ", the same death as the recorded run"
            return s
        if self.error is not None:
            return f"error: {self.error}"
        if self.status is not None:
            return f"FAIL: the op returned {self.status}"
        if self.vs_ref is None:
            return "not compared"
        if self.vs_ref.reference_invalid:
            s = f"UNKNOWN: {self.vs_ref.reason}"
        elif self.vs_ref.ok:
            err = f", max abs err {self.vs_ref.max_abs:.3g}" if self.vs_ref.max_abs else ""
            s = f"OK ({self.vs_ref.reason}{err})"
        else:
            s = f"FAIL: wrong numbers ({self.vs_ref.short()})"
        r = self.vs_recorded
        if r is not None:
            if r.identical:
                s += "; reproduces the recorded output exactly"
            elif r.ok:
                s += f"; matches the recorded output within the threshold (NMSE {r.nmse:.3g})"
            else:
                s += "; differs from the recorded output"
        return s

    def to_dict(self) -> dict:
        return {"mode": self.mode, "device": self.device, "profile": self.profile, "path": self.path,
                "ok": self.ok, "verdict": self.verdict(), "status": self.status, "died": self.died,
                "error": self.error, "vs_ref": self.vs_ref.to_dict() if self.vs_ref else None,
                "vs_recorded": self.vs_recorded.to_dict() if self.vs_recorded else None,
                "same_death_as_recorded": self.same_death_as_recorded,
                "inputs_reproduced": self.inputs_reproduced, "input_mismatch": self.input_mismatch,
                "descriptors_reproduced": self.descriptors_reproduced, "notes": self.notes,
                "extra": {k: v for k, v in self.extra.items() if isinstance(v, (bool, int, float, str, type(None)))}}


@dataclass
class ReplayResult:
    dump_id: str
    name: str
    op: str
    capture: str
    threshold: float
    device: str
    profile: str | None
    alone: Execution
    context: Execution | None = None
    recorded_vs_ref: Comparison | None = None
    recorded_fault: dict | None = None
    reference_error: str | None = None
    notes: list[str] = field(default_factory=list)
    base_threshold: float | None = None  # the op's threshold before the MUL_MAT allowance
    quant_allowance: float | None = None  # NMSE of ggml's activation conversion on these inputs (MUL_MAT)

    @property
    def ok(self) -> bool:
        return self.alone.ok and (self.context is None or self.context.ok)

    def diagnosis(self) -> str | None:
        if self.context is None:
            return None
        a, c = self.alone.ok, self.context.ok
        if self.alone.reference_invalid or self.context.reference_invalid:
            return "undecided: the float64 reference itself is invalid on these inputs"
        if a and not c:
            return ("context-triggered: the op is correct on its own inputs; what ran before it in its batch "
                    "(VTCM contents, the src1 shortcut, DSP state) makes it fail")
        if not a and not c:
            return "value/shape-triggered: the op fails on its own inputs, with or without its batch context"
        if not a and c:
            return "fails alone only: the batch context hides the failure"
        if self.recorded_fault:
            return "not reproduced: the recorded run died in this op, but the replay passes alone and with context"
        if self.recorded_vs_ref is not None and not self.recorded_vs_ref.ok:
            return ("not reproduced: the recorded output was wrong, but the op passes alone and with its batch "
                    "context")
        return "healthy: the op passes alone and with its batch context"

    def verdict(self) -> str:
        s = f"alone: {self.alone.verdict()}"
        if self.context is not None:
            s += f"; with context: {self.context.verdict()}"
        return s

    def to_dict(self) -> dict:
        return {"dump": self.dump_id, "name": self.name, "op": self.op, "capture": self.capture,
                "threshold": self.threshold, "base_threshold": self.base_threshold,
                "quant_allowance": self.quant_allowance, "device": self.device, "profile": self.profile, "ok": self.ok,
                "verdict": self.verdict(), "diagnosis": self.diagnosis(),
                "recorded_fault": self.recorded_fault, "reference_error": self.reference_error,
                "recorded_vs_ref": self.recorded_vs_ref.to_dict() if self.recorded_vs_ref else None,
                "alone": self.alone.to_dict(), "context": self.context.to_dict() if self.context else None,
                "notes": self.notes}


class _Watch(Hook):
    """Captures the target op's inputs at start and how it completed."""

    def __init__(self, target: Tensor) -> None:
        self.target = target
        self.inputs: list[np.ndarray | None] | None = None
        self.info: OpInfo | None = None

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        if node is self.target:
            self.inputs = [_read(s) if s is not None else None for s in node.src]

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        if node is self.target:
            self.info = info


def _read(t: Tensor) -> np.ndarray | None:
    try:
        return logical_values(t)
    except (TypeError, ValueError):
        return None


def _output_of(backend: Backend, node: Tensor) -> np.ndarray:
    if isinstance(backend, RefBackend) and node.type in SCALAR_DTYPES:
        return np.asarray(backend.value(node), dtype=np.float64)  # the float64 shadow, not the f32 buffer
    v = logical_values(node)
    return v.astype(np.float64) if v.dtype.kind == "f" else v


def _make_backend(device: str, settings: Any) -> Backend:
    dev = device.upper()
    if dev == "CPU":
        return CpuBackend()
    if dev == "REF":
        return RefBackend()
    if dev in ("HTP0", "HTP"):
        from kazeia.backends.htp.backend import HtpBackend

        return HtpBackend(settings)
    raise KazeiaError(f"unknown device '{device}' (replay runs on CPU, HTP0 or REF)")


def _death(e: DeviceDeathError, target: str) -> dict:
    return {"message": str(e), "code": e.code, "kind": getattr(e, "kind", None), "cause": e.cause,
            "faulting": e.faulting, "last_enqueued": e.last_enqueued, "target": target}


def _run(backend: Backend, target: Tensor, ex: Execution, run) -> np.ndarray | None:
    """Run `run()` on the backend, filling `ex` with what happened; returns the target's output."""
    watch = _Watch(target)
    backend.hooks.append(watch)
    try:
        run()
    except DeviceDeathError as e:
        ex.died = _death(e, target.name)
    except DeviceOpError as e:
        ex.error = str(e)
    except KazeiaError as e:
        ex.error = str(e)
    except (ArithmeticError, IndexError, ValueError, TypeError) as e:  # a kernel refusing its inputs
        ex.error = f"{type(e).__name__}: {e}"
    finally:
        backend.hooks.remove(watch)
        backend.close()
    if watch.info is not None:
        ex.path = watch.info.path
        ex.extra = dict(watch.info.extra)
        st = watch.info.extra.get("status")
        if st is not None:
            from kazeia.backends.htp.host import STATUS_NAMES, STATUS_OK

            if st != STATUS_OK:  # 2026-05 drops it on the host; the op still did not do its work
                ex.status = STATUS_NAMES.get(st, str(st))
    ex.inputs_seen = watch.inputs
    if ex.died is not None or ex.error is not None or watch.info is None:
        if ex.died is None and ex.error is None:
            ex.error = "the op did not complete"
        return None
    return _output_of(backend, target)


def _alone(dump: Dump, device: str, settings: Any, mode: str = "alone") -> Execution:
    node = materialize(dump)
    backend = _make_backend(device, settings)
    ex = Execution(mode, backend.name, getattr(settings, "profile", None) if backend.name == "HTP0" else None)
    backend.node_index = {id(node): dump.graph_index}
    if not backend.supports(node):
        ex.error = f"{backend.name} does not support this op ({dump.desc} {dump.node['type']}{dump.node['ne']})"
        backend.close()
        return ex

    def run() -> None:
        backend.compute(node)
        backend.synchronize()

    ex.output = _run(backend, node, ex, run)
    return ex


def _reference(dump: Dump) -> tuple[Execution, float | None]:
    """The float64 run on the dumped inputs, and for a weight MUL_MAT the NMSE of ggml's activation
    conversion (REF recomputed from activations converted as ggml's CPU does) against it."""
    from kazeia.debug.compare import reference_activations

    node = materialize(dump)
    be = RefBackend()
    ex = Execution("reference", "REF")
    be.node_index = {id(node): dump.graph_index}
    if not be.supports(node):
        ex.error = f"REF does not support this op ({dump.desc})"
        return ex, None

    def run() -> None:
        be.compute(node)

    ex.output = _run(be, node, ex, run)
    w, x = (node.src + (None, None))[:2]
    if (ex.output is None or node.op != "MUL_MAT" or w is None or x is None or not w.flags & TFlag.WEIGHT
            or w.ne[2] * w.ne[3] != 1 or w.type == GGMLType.F32):
        return ex, None
    xq = reference_activations(be.load(x), w.type)
    if xq is None:
        return ex, None
    floor = (xq.reshape(-1, w.ne[0]) @ be.weight_matrix(w).T).reshape(node.ne[::-1])
    with np.errstate(all="ignore"):
        a = float(nmse(floor, ex.output))
    return ex, a if np.isfinite(a) else None


# --- with context ---


def _context_tensors(dump: Dump, ctx: dict) -> tuple[dict[int, Tensor], list[Buffer]]:
    bufs_meta = ctx["buffers"]
    sizes = [0] * len(bufs_meta)
    for t in ctx["tensors"]:
        bi = int(t["buffer_index"])
        sizes[bi] = max(sizes[bi], _extent_end(t))
    blobs = []
    for r in ctx["memory"]:
        a = dump.load_blob(r, f"context memory @{r.get('offset')}")
        raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        bi = int(r["buffer"])
        sizes[bi] = max(sizes[bi], int(r["offset"]) + raw.size)
        blobs.append((bi, int(r["offset"]), raw))
    bufs = [_make_buffer(m, s) for m, s in zip(bufs_meta, sizes)]
    for bi, off, raw in blobs:
        bufs[bi].data[off:off + raw.size] = raw
    tensors = {int(t["key"]): _tensor_from_meta(t, bufs[int(t["buffer_index"])]) for t in ctx["tensors"]}
    return tensors, bufs


def _restore_dsp(dump: Dump, ctx: dict, dsp: Any, ex: Execution) -> None:
    vt = dump.load_blob(ctx["vtcm"], "context VTCM")
    n = min(vt.size, dsp.vtcm.size)
    if vt.size != dsp.vtcm.size:
        ex.notes.append(f"VTCM is {dsp.vtcm.size} B here, {vt.size} B in the recorded run: restored the first {n} B")
    dsp.vtcm.mem[:n] = vt[:n]
    state = ctx.get("dsp_state") or {}
    for name in ("hmx_scale", "dma_stale_pop"):
        if name in state and hasattr(dsp, name):
            setattr(dsp, name, type(getattr(dsp, name))(state[name]))
    if "race_rng" in state and getattr(dsp, "race", None) is not None:
        try:
            dsp.race.bit_generator.state = state["race_rng"]
        except (TypeError, ValueError, KeyError):
            ex.notes.append("could not restore the DSP race generator state")


def _with_context(dump: Dump, settings: Any) -> Execution:
    from kazeia.backends.htp.backend import HtpBackend
    from kazeia.backends.htp.host import OpBatch

    ctx = dump.context
    if ctx is None:
        raise KazeiaError(f"{dump.id}: no batch context to replay ({dump.context_note})")
    try:
        tensors, _ = _context_tensors(dump, ctx)
        ops = ctx["ops"]
        nodes = []
        for o in ops:
            n = tensors[int(o["dst_key"])]
            n.op, n.params = o["op"], dict(o.get("params") or {})
            n.src = tuple(tensors[int(k)] if k is not None else None for k in o["src_keys"])
            nodes.append(n)
    except (KeyError, TypeError, ValueError) as e:
        raise DumpFileError(f"{dump.path}: malformed batch context ({type(e).__name__}: {e})") from None
    backend = HtpBackend(settings)
    ex = Execution("with context", backend.name, settings.profile)
    _restore_dsp(dump, ctx, backend.dsp, ex)
    batch = OpBatch(seq=int(ctx["batch_seq"]))
    same = True
    for o, n in zip(ops, nodes):
        d = batch.add_op(n, int(o["graph_index"]))
        same &= d.src == list(o["src"]) and d.dst == int(o["dst"])
    ex.descriptors_reproduced = same
    if not same:
        ex.notes.append("the rebuilt batch did not reproduce the recorded descriptor indexes")
    backend.node_index = {id(n): int(o["graph_index"]) for o, n in zip(ops, nodes)}
    target = nodes[-1]
    host = backend.host
    host.batch, host.last_enqueued, host._seq = batch, batch.ops[-1], batch.seq

    def run() -> None:
        backend.synchronize()

    ex.output = _run(backend, target, ex, run)
    got = ex.inputs_seen
    if got is not None:
        mism = []
        for i, (rec, v) in enumerate(zip(dump.sources, got)):
            if rec is None or rec.values is None or v is None:
                continue
            if v.shape != rec.values.shape or not np.array_equal(v.view(np.uint8), rec.values.view(np.uint8)):
                mism.append(f"src{i} {rec.name}")
        ex.inputs_reproduced = not mism
        ex.input_mismatch = mism
    return ex


# ----------------------------------------------------------------------------------------------------------
# settings and the entry point


def htp_settings_for(dump: Dump, profile: str | None = None, vtcm: int | None = None,
                     faults: list[str] | None = None, env: dict[str, str] | None = None) -> Any:
    """The HTP settings of the recorded run (or of this environment for a CPU dump), with overrides."""
    from kazeia.backends.htp.profiles import check_faults, get_profile
    from kazeia.backends.htp.settings import HtpSettings

    rec = dump.htp_settings
    if rec is None:
        base = HtpSettings.from_env(profile=profile, vtcm_bytes=vtcm, faults=faults, overrides=env)
    else:
        known = {f.name for f in dataclasses.fields(HtpSettings)}
        kw = {k: v for k, v in rec.items() if k in known}
        if kw.get("opfilter"):
            kw["opfilter"] = re.compile(kw["opfilter"], re.IGNORECASE)
        kw["faults"] = tuple(kw.get("faults") or ())
        kw["farf"] = False
        kw["verbose"] = 0
        try:
            base = HtpSettings(**kw)
        except TypeError as e:
            raise DumpFileError(f"{dump.path}: recorded HTP settings do not fit this kazeia ({e})") from None
        if env:
            envd = HtpSettings.from_env(env=env)
            base = dataclasses.replace(base, **{k: getattr(envd, k) for k in ("opbatch", "opqueue", "nhvx",
                                                                                "use_hmx", "arch")
                                                if any(n.endswith(k.upper()) for n in env)})
        if profile is not None:
            base = dataclasses.replace(base, profile=profile)
        if vtcm is not None:
            if vtcm < 64 * 1024 or vtcm > 1 << 30:
                raise KazeiaError(f"VTCM size {vtcm} B is out of range (64 KiB .. 1 GiB)")
            base = dataclasses.replace(base, vtcm_bytes=vtcm)
        if faults is not None:
            base = dataclasses.replace(base, faults=tuple(dict.fromkeys(faults)))
    get_profile(base.profile)
    check_faults(base.faults)
    return base


def replay(dump: Dump | str | os.PathLike, device: str | None = None, htp_profile: str | None = None,
           vtcm: int | None = None, faults: list[str] | None = None, env: dict[str, str] | None = None,
           with_context: bool = False, spec: Any = None, strict: bool = False) -> ReplayResult:
    """Rerun a dumped op on `device` (default: the device of the recorded run; CPU, HTP0 or REF), alone and
    optionally with its batch context, and judge it against float64 and against the recorded output.
    `spec` (a runner.RunSpec) may supply device, htp_profile, vtcm, faults and env instead.
    `faults=[]` clears the recorded fault injections; None keeps them. A weight MUL_MAT is allowed, on top of
    its threshold, the NMSE that ggml's own activation conversion commits on these inputs (as `kazeia compare`
    does: test-backend-ops compares with ggml's CPU, which converts them too); `strict=True` turns that off."""
    if not isinstance(dump, Dump):
        dump = load_dump(dump)
    if spec is not None:
        device = device or spec.device
        htp_profile = htp_profile or spec.htp_profile
        vtcm = vtcm or spec.vtcm
        faults = faults if faults is not None else (list(spec.faults) if spec.faults else None)
        env = env or (dict(spec.env) if spec.env else None)
    dev = (device or dump.backend).upper()
    if dev == "HTP":
        dev = "HTP0"
    settings = htp_settings_for(dump, htp_profile, vtcm, faults, env) if dev == "HTP0" else None
    if with_context and dev != "HTP0":
        raise KazeiaError("--with-context reruns the op's HTP batch: it needs -dev HTP0")
    thr = dump_threshold(dump)
    res = ReplayResult(dump.id, dump.name, dump.desc, dump.capture, thr, dev,
                       settings.profile if settings is not None else None,
                       alone=Execution("alone", dev), recorded_fault=dump.fault)
    if dump.capture == "enqueue" and not dump.manifest.get("synchronous"):
        res.notes.append("these inputs are an ENQUEUE-time capture: not what the op consumed on its device")

    ref, allowance = _reference(dump)
    res.base_threshold = thr
    if allowance is not None:
        res.quant_allowance = allowance
        if not strict:
            thr = res.threshold = thr + allowance
    if ref.output is None:
        res.reference_error = ref.error or (ref.died or {}).get("message")
        res.notes.append(f"the float64 reference could not run: {res.reference_error}")
    recorded = dump.output.values if dump.output is not None and dump.capture == "complete" else None
    if recorded is not None and recorded.dtype.kind == "f":
        recorded = recorded.astype(np.float64)
    if recorded is not None and ref.output is not None:
        res.recorded_vs_ref = compare(recorded, ref.output, thr, "ref")

    def judge(ex: Execution) -> Execution:
        if ex.output is not None and ref.output is not None:
            ex.vs_ref = compare(ex.output, ref.output, thr, "ref")
        if ex.output is not None and recorded is not None:
            ex.vs_recorded = compare(ex.output, recorded, thr, "recorded output")
        if ex.died is not None and dump.fault:
            ex.same_death_as_recorded = (ex.died.get("kind") == dump.fault.get("kind")
                                         and ex.died.get("cause") == dump.fault.get("cause"))
        return ex

    res.alone = judge(_alone(dump, dev, settings))
    if with_context:
        if dump.capture != "complete":
            raise KazeiaError(f"{dump.id}: an enqueue-time capture has no batch context")
        res.context = judge(_with_context(dump, settings))
    return res


def format_result(r: ReplayResult, dump: Dump | None = None) -> list[str]:
    """Human-readable lines for one replay."""
    lines = []
    if dump is not None:
        lines.append(dump.summary())
    where = r.device + (f" (profile {r.profile})" if r.profile else "")
    thr = f"threshold NMSE {r.threshold:.3g}"
    if r.quant_allowance is not None and r.threshold != r.base_threshold:
        thr += f" ({r.base_threshold:g} + {r.quant_allowance:.2g} for ggml's own activation conversion)"
    lines.append(f"  replay of {r.name} ({r.op}) on {where}; {thr} vs float64 ref")
    for n in r.notes:
        lines.append(f"  note: {n}")
    if r.recorded_fault:
        lines.append(f"  recorded run: device died in this op ({r.recorded_fault.get('kind')}: "
                     f"{r.recorded_fault.get('cause')})")
    elif r.recorded_vs_ref is not None:
        c = r.recorded_vs_ref
        state = "UNKNOWN" if c.reference_invalid else "OK" if c.ok else "WRONG"
        lines.append(f"  recorded output vs ref: {state} ({c.short()})")
    for ex in (r.alone, r.context):
        if ex is None:
            continue
        lines.append(f"  {ex.mode}: {ex.verdict()}" + (f" [path {ex.path}]" if ex.path else ""))
        if ex.descriptors_reproduced is not None:
            lines.append(f"    context rebuilt: descriptor indexes "
                         f"{'as recorded' if ex.descriptors_reproduced else 'DIFFERENT from the recording'}; "
                         f"the op's inputs {'as dumped' if ex.inputs_reproduced else 'NOT as dumped'}")
        if ex.inputs_reproduced is False:
            lines.append(f"    warning: the context replay did not recreate the dumped inputs "
                         f"({', '.join(ex.input_mismatch)})")
        for n in ex.notes:
            lines.append(f"    note: {n}")
    lines.append(f"  verdict: {r.verdict()}")
    diag = r.diagnosis()
    if diag:
        lines.append(f"  => {diag}")
    return lines


__all__ = ["Comparison", "Execution", "ReplayResult", "compare", "dump_threshold", "format_result",
           "htp_settings_for", "materialize", "op_threshold", "read_extent", "replay"]
