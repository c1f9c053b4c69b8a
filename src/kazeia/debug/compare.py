"""Per-op comparison of a backend against the float64 `ref` oracle, in two modes.

- cumulative: the backend under test runs the whole prefill feeding itself, like a normal run; every node's
  output is compared at completion with REF's. Error accumulates along the graph, so an op is only judged by
  its per-op threshold when the inputs it consumed were bit-identical to REF's (or when it turns finite inputs
  into NaN/inf); the other rows show drift. The whole-model output (logits) is judged against 2e-3.
- isolated: test-backend-ops style. The graph is walked node by node on the backend under test; before each
  node the reference values of the sources it reads are written into their storage (through ne/nb, so views,
  in-place ops and KV-cache views get exactly what REF consumed), the node runs alone and is waited for (on
  the HTP: one op per batch), and its output is compared with REF's. The first row out of tolerance is the
  culprit; a device death inside an op is that op failing.

Thresholds are test-backend-ops' NMSE ones (see `op_threshold`). The reference is REF's float64 value rounded
to the output's storage type (the backend cannot store more than that), which makes the exact ops exact. A
weight MUL_MAT also gets the NMSE of ggml's own activation conversion on its inputs (see the allowance section
below; `strict=True` removes it). Isolated mode runs each HTP op in its own batch, so bugs that need the batch
context (the per-batch src1 VTCM shortcut) only show in cumulative mode.

Python use: `report = compare(RunSpec(...), "isolated")`, `report.first_failure`, `plot_errors(report, path)`.
One `Reference` (from `capture_reference`) can serve several compares of the same model and prompt.
"""

from __future__ import annotations

import gc
import math
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from kazeia.backends.base import Backend, Hook, OpInfo
from kazeia.backends.ref import RefBackend
from kazeia.debug.runner import RunSpec, build_context, load_model, prompt_ids, run
from kazeia.debug.stats import max_errors
from kazeia.engine.context import Context
from kazeia.engine.scheduler import Placement, Scheduler
from kazeia.errors import DeviceDeathError, DeviceOpError, KazeiaError
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import SCALAR_DTYPES, BufferUsage, GGMLType, Tensor, TFlag, array, rows

MODES = ("cumulative", "isolated")
WHOLE_MODEL_THRESHOLD = 2e-3
DEFAULT_THRESHOLD = 1e-7
_OP_THRESHOLDS = {"MUL_MAT": 5e-4, "FLASH_ATTN_EXT": 5e-4, "SOFT_MAX": 1e-6}
_DATA_MOVEMENT = frozenset({"CPY", "CONT", "GET_ROWS", "SET_ROWS"})

# row statuses
OK, FAIL, DRIFT, REF_INVALID, DEATH = "OK", "FAIL", "DRIFT", "REF-INVALID", "DEATH"


# ------------------------------------------------------------------------------------------------------------
# thresholds and the element-wise verdict


def op_threshold(node: Tensor) -> float:
    """test-backend-ops' per-op NMSE limit. Data movement between tensors of one type must be exact; a
    conversion (to F16, or a dequantizing GET_ROWS) includes its rounding in the op, so it gets the default."""
    if node.op in _OP_THRESHOLDS:
        return _OP_THRESHOLDS[node.op]
    if node.op in _DATA_MOVEMENT:
        src = node.src[0]
        return 0.0 if src is not None and src.type == node.type else DEFAULT_THRESHOLD
    return DEFAULT_THRESHOLD


@dataclass
class Verdict:
    status: str  # OK | FAIL | REF-INVALID
    reason: str
    nmse: float | None
    max_abs: float | None
    max_rel: float | None
    kind: str = "nmse"  # what decided: nmse | nan | inf | zero | ref-nan


def judge(a: np.ndarray, b: np.ndarray, threshold: float) -> Verdict:
    """Compare `a` (backend under test) with `b` (reference), both float64 of one shape.

    Order as test-backend-ops: a NaN in the reference makes it invalid (never blamed on the backend); a NaN
    in `a` fails; an inf on either side must be matched by an inf of the same sign on the other; then the
    NMSE sum((a-b)^2)/sum(a^2) over the remaining positions must not exceed `threshold`."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    n_ref_nan = int(np.isnan(b).sum())
    if n_ref_nan:
        return Verdict(REF_INVALID, f"reference holds {n_ref_nan} NaN of {b.size}: reference invalid, not judged",
                       None, None, None, "ref-nan")
    max_abs, max_rel = max_errors(a, b)
    n_nan = int(np.isnan(a).sum())
    if n_nan:
        first = int(np.flatnonzero(np.isnan(a))[0])
        return Verdict(FAIL, f"NaN: {n_nan} of {a.size} values (first at flat index {first}, reference "
                             f"{b[first]:.6g})", math.inf, max_abs, max_rel, "nan")
    a_inf, b_inf = np.isinf(a), np.isinf(b)
    matched = a_inf & b_inf & (np.signbit(a) == np.signbit(b))
    bad = (a_inf | b_inf) & ~matched
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return Verdict(FAIL, f"inf: {int(bad.sum())} values where test and reference disagree on inf (first at "
                             f"flat index {i}: test {a[i]:.6g}, reference {b[i]:.6g})", math.inf, max_abs, max_rel,
                       "inf")
    if matched.any():
        keep = ~matched
        a, b = a[keep], b[keep]
    num = float(np.sum((a - b) ** 2))
    den = float(np.sum(a * a))
    value = (0.0 if num == 0.0 else math.inf) if den == 0.0 else num / den
    if value <= threshold:
        return Verdict(OK, "", value, max_abs, max_rel)
    if den == 0.0:
        return Verdict(FAIL, "all-zero output where the reference is not (NMSE inf)", value, max_abs, max_rel,
                       "zero")
    return Verdict(FAIL, f"NMSE {value:.3g} > {threshold:g}", value, max_abs, max_rel)


# ------------------------------------------------------------------------------------------------------------
# what an op reads and what it produces


def is_weight(t: Tensor) -> bool:
    root = t.root
    return bool(root.flags & TFlag.WEIGHT) or (root.buffer is not None and root.buffer.usage == BufferUsage.WEIGHTS)


def read_sources(node: Tensor) -> list[int]:
    """Positions of the sources whose contents the op consumes, weights excepted (both sides map the same
    file). SET_ROWS and CPY only write their destination operand, so it is not an input."""
    if node.op == "SET_ROWS":
        cand = [0, 1]
    elif node.op == "CPY":
        cand = [0]
    else:
        cand = list(range(len(node.src)))
    return [i for i in cand if i < len(node.src) and node.src[i] is not None and not is_weight(node.src[i])]


def raw_copy(t: Tensor) -> np.ndarray:
    """The tensor's logical elements in their storage type (read through ne/nb)."""
    return np.array(array(t)) if t.type in SCALAR_DTYPES else np.array(rows(t))


def write_raw(t: Tensor, values: np.ndarray) -> None:
    """Write storage-typed values into the tensor's elements through ne/nb (views included)."""
    dst = array(t) if t.type in SCALAR_DTYPES else rows(t)
    dst[...] = values


def _set_rows_ids(node: Tensor) -> np.ndarray | None:
    if node.op == "SET_ROWS" and node.ne[2] == node.ne[3] == 1:
        return np.asarray(array(node.src[1])).reshape(-1).astype(np.int64)
    return None


def output_raw(node: Tensor) -> np.ndarray:
    """The part of the output the op produces, in storage type. SET_ROWS: only the rows it writes (the rest of
    a KV cache is neither its work nor worth copying)."""
    ids = _set_rows_ids(node)
    out = array(node)
    return np.array(out[0, 0, ids]) if ids is not None else np.array(out)


def ref_output(ref: RefBackend, node: Tensor) -> np.ndarray:
    """REF's float64 value of the output (the float64 shadow where REF keeps one)."""
    if node.type == GGMLType.F32:
        v = ref.value(node)
        ids = _set_rows_ids(node)
        return np.array(v[0, 0, ids] if ids is not None else v, dtype=np.float64)
    return output_raw(node).astype(np.float64)


def as_storable(values: np.ndarray, t: GGMLType) -> np.ndarray:
    """The reference rounded to the output's storage type, back in float64."""
    dt = SCALAR_DTYPES.get(GGMLType(t))
    if dt is None or not np.issubdtype(dt, np.floating) or dt == np.float64:
        return values
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(dt).astype(np.float64)


# ------------------------------------------------------------------------------------------------------------
# the activation-quantization allowance of MUL_MAT
#
# test-backend-ops compares a backend with ggml's CPU backend, which itself converts src1 to the weight type's
# "vec_dot_type" before a quantized matmul (int8 blocks with one scale each). Its 5e-4 therefore never counted
# that conversion's error. Against our exact float64 REF it does count, and on real activations with outlier
# channels it alone can pass 5e-4 (SmolLM2's attn_v at some layers). To keep test-backend-ops' meaning, a
# weight MUL_MAT is allowed, on top of its threshold, the NMSE that ggml's reference conversion of the same
# inputs commits (computed in float64 during the REF run). `strict=True` turns the allowance off.

_INT8_BLOCK = {GGMLType.Q4_0: 32, GGMLType.Q4_1: 32, GGMLType.Q5_0: 32, GGMLType.Q5_1: 32, GGMLType.Q8_0: 32,
               GGMLType.IQ4_NL: 32, GGMLType.Q4_K: 256, GGMLType.Q5_K: 256, GGMLType.Q6_K: 256,
               GGMLType.Q2_K: 256, GGMLType.Q3_K: 256}


def reference_activations(x: np.ndarray, wtype: GGMLType) -> np.ndarray | None:
    """src1 rows (..., K) as ggml's CPU path would feed the dot product for a `wtype` weight (float64): int8
    blocks with scale amax/127 (stored fp16 for the 32-blocks) for quantized weights, fp16 or bf16 values for
    F16 / BF16 weights; None when no conversion happens (F32)."""
    wtype = GGMLType(wtype)
    x = np.asarray(x, dtype=np.float64)
    if wtype == GGMLType.F16:
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float64)
    if wtype == GGMLType.BF16:
        b = x.astype(np.float32).view(np.uint32)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000  # round to nearest even on the upper 16 bits
        return b.view(np.float32).astype(np.float64)
    blk = _INT8_BLOCK.get(wtype)
    if blk is None or x.shape[-1] % blk:
        return None
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // blk, blk)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d = amax / 127.0
    if blk == 32:
        d = d.astype(np.float16).astype(np.float64)
    safe = np.where(d == 0, 1.0, d)
    q = np.clip(np.trunc(xb / safe + np.copysign(0.5, xb)), -127, 127)  # round half away from zero
    return (q * d).reshape(x.shape)


def _floor_for(ref: RefBackend, node: Tensor) -> np.ndarray | None:
    """REF's float64 MUL_MAT output recomputed from ggml-converted activations, or None if not applicable."""
    if node.op != "MUL_MAT":
        return None
    w, x = node.src[0], node.src[1]
    if w is None or x is None or not is_weight(w) or w.ne[2] * w.ne[3] != 1 or w.type == GGMLType.F32:
        return None
    xv = ref.load(x)
    xq = reference_activations(xv, w.type)
    if xq is None:
        return None
    W = ref.weight_matrix(w)
    return (xq.reshape(-1, w.ne[0]) @ W.T).reshape(node.ne[::-1])


# ------------------------------------------------------------------------------------------------------------
# the reference run


def _ref_spec(spec: RunSpec) -> RunSpec:
    return spec.with_(device="REF", htp_profile=None, vtcm=None, faults=[], env={}, cpu_ops=None, cpu_nodes=None,
                      cpu_node_range=None, n_predict=0)


def _ref_key(spec: RunSpec) -> tuple:
    return (os.path.realpath(spec.model_path), tuple(spec.tokens or ()), spec.ubatch, spec.ctx, spec.flash_attn)


@dataclass
class Reference:
    """REF's view of one prefill: per (micro-batch, node index) the float64 output and the raw contents of
    the sources the op read (None when sources were not captured)."""

    spec: RunSpec
    names: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    outputs: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    sources: dict[tuple[int, int], list[tuple[int, np.ndarray]]] | None = None
    floors: dict[tuple[int, int], float] = field(default_factory=dict)  # MUL_MAT activation-conversion NMSE
    logits: np.ndarray | None = None
    n_ubatch: int = 0

    def matches(self, spec: RunSpec) -> bool:
        return _ref_key(self.spec) == _ref_key(spec)

    def nbytes(self) -> int:
        n = sum(v.nbytes for v in self.outputs.values())
        if self.sources:
            n += sum(r.nbytes for srcs in self.sources.values() for _, r in srcs)
        return n


class _RefCapture(Hook):
    def __init__(self, ref: RefBackend, out: Reference, sources: bool) -> None:
        self.ref, self.out, self.want_sources = ref, out, sources
        self.ubatch = 0
        self._converted: np.ndarray | None = None

    def next_ubatch(self, *_args) -> None:
        self.ubatch += 1

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        if self.want_sources:
            self.out.sources[(self.ubatch, info.index)] = [(i, raw_copy(node.src[i])) for i in read_sources(node)]
        self._converted = _floor_for(self.ref, node)

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        key = (self.ubatch, info.index)
        self.out.names[key] = (node.name, node.desc())
        out = self.out.outputs[key] = ref_output(self.ref, node)
        if self._converted is not None:
            v = judge(self._converted, out, math.inf).nmse
            self.out.floors[key] = v if v is not None and math.isfinite(v) else 0.0
        self._converted = None


def _fix_tokens(spec: RunSpec) -> RunSpec:
    if spec.tokens is not None:
        return spec
    return spec.with_(tokens=prompt_ids(spec, load_model(spec.model_path)))


def capture_reference(spec: RunSpec, sources: bool = True) -> Reference:
    """Run the prefill of `spec` on REF and keep every op's float64 output (and, with `sources`, what each op
    read, for isolated replays). Device settings of `spec` are ignored."""
    rspec = _ref_spec(_fix_tokens(spec))
    ctx = build_context(rspec)
    ref = next(b for b in ctx.scheduler.backends if isinstance(b, RefBackend))
    out = Reference(rspec, sources={} if sources else None)
    cap = _RefCapture(ref, out, sources)
    ctx.on_ubatch = cap.next_ubatch
    res = run(rspec, hooks=[cap], ctx=ctx)
    if not res.ok:
        raise KazeiaError(f"the REF run failed: {res.signature()}")
    out.logits = res.logits
    out.n_ubatch = cap.ubatch
    del ctx, ref, cap
    gc.collect()  # drop REF's per-run state (shadows, graphs) before the backend under test runs
    return out


# ------------------------------------------------------------------------------------------------------------
# rows and the report


@dataclass
class OpRow:
    mode: str
    ubatch: int
    index: int  # node index in the graph
    name: str
    op: str
    backend: str
    path: str
    shape: str
    layer: int | None
    threshold: float
    status: str  # OK | FAIL | DRIFT | REF-INVALID | DEATH
    reason: str = ""
    nmse: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    judged: bool = True  # False: cumulative row whose inputs already differed (threshold shown, not applied)
    input_nmse: float | None = None  # cumulative: largest NMSE of the op's inputs against REF's
    base_threshold: float | None = None  # the per-op threshold before the MUL_MAT allowance
    quant_floor: float | None = None  # MUL_MAT: NMSE of ggml's own activation conversion on these inputs
    extra: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in (FAIL, DEATH)

    @property
    def min_tolerance(self) -> float | None:
        """The smallest NMSE threshold this row would have passed (Polygraphy's 'minimum required tolerance')."""
        return self.nmse if self.failed else None

    @property
    def where(self) -> str:
        return f"{self.backend}/{self.path}"

    def label(self) -> str:
        ub = f"ub{self.ubatch} " if self.ubatch else ""
        return f"{ub}#{self.index} {self.name} ({self.op}, {self.where})"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["min_tolerance"] = self.min_tolerance
        for k in ("nmse", "max_abs", "max_rel", "input_nmse", "min_tolerance", "quant_floor"):
            v = d[k]
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = "inf" if v > 0 else ("-inf" if v < 0 else "nan")
        d["extra"] = {k: v for k, v in d["extra"].items() if isinstance(v, str | int | float | bool | type(None))}
        return d


@dataclass
class CompareReport:
    spec: RunSpec
    modes: tuple[str, ...]
    rows: dict[str, list[OpRow]] = field(default_factory=dict)
    deaths: dict[str, dict | None] = field(default_factory=dict)
    not_run: dict[str, int] = field(default_factory=dict)  # nodes left unrun after a death
    logits_nmse: dict[str, float | None] = field(default_factory=dict)
    n_tokens: int = 0
    strict: bool = False  # True: no MUL_MAT activation-conversion allowance

    def failures(self, mode: str) -> list[OpRow]:
        return [r for r in self.rows.get(mode, []) if r.failed]

    def first_failure_in(self, mode: str) -> OpRow | None:
        f = self.failures(mode)
        return f[0] if f else None

    @property
    def first_failure(self) -> OpRow | None:
        """The culprit: the first op out of tolerance in isolated mode if it ran, else in cumulative mode."""
        for mode in ("isolated", "cumulative"):
            if mode in self.modes:
                f = self.first_failure_in(mode)
                if f is not None:
                    return f
        return None

    def ref_invalid(self, mode: str) -> list[OpRow]:
        return [r for r in self.rows.get(mode, []) if r.status == REF_INVALID]

    @property
    def ok(self) -> bool:
        return all(not self.failures(m) for m in self.modes)

    @property
    def exit_status(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict:
        """A JSON-ready dict (non-finite numbers as the strings "inf", "-inf", "nan")."""
        ff = self.first_failure
        return _json_safe({
            "spec": asdict(self.spec),
            "command": compare_command(self.spec, self.modes, self.strict),
            "modes": list(self.modes),
            "n_tokens": self.n_tokens,
            "ok": self.ok,
            "first_failure": ff.to_dict() if ff else None,
            "first_failure_by_mode": {m: (f.to_dict() if (f := self.first_failure_in(m)) else None)
                                      for m in self.modes},
            "logits_nmse": {m: v for m, v in self.logits_nmse.items()},
            "whole_model_threshold": WHOLE_MODEL_THRESHOLD,
            "strict": self.strict,
            "deaths": self.deaths,
            "not_run": self.not_run,
            "rows": {m: [r.to_dict() for r in rs] for m, rs in self.rows.items()},
        })


def _json_safe(o):
    if isinstance(o, float) and not math.isfinite(o):
        return "nan" if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_json_safe(v) for v in o]
    if isinstance(o, np.generic):
        return _json_safe(o.item())
    return o


def _row(mode: str, ub: int, node: Tensor, info: OpInfo | None, backend: Backend | None, threshold: float,
         status: str, **kw) -> OpRow:
    index = kw.pop("index", -1)
    if info is not None and info.index >= 0:
        index = info.index
    be = info.backend if info else (backend.name if backend else "?")
    path = info.path if info else "?"
    extra = dict(info.extra) if info else {}
    if info and info.batch is not None:
        extra["batch"] = info.batch
    return OpRow(mode, ub, index, node.name, node.desc(), be, path, node.shape_str(), node.layer, threshold, status,
                 extra=extra, **kw)


def _compare_output(node: Tensor, ref: np.ndarray, threshold: float) -> tuple[Verdict, bool]:
    """The verdict on the node's output, and whether that output holds NaN or inf."""
    a = output_raw(node).astype(np.float64)
    return judge(a, as_storable(ref, node.type), threshold), not bool(np.isfinite(a).all())


def _check_names(reference: Reference, key: tuple[int, int], node: Tensor) -> np.ndarray:
    if key not in reference.outputs:
        raise KazeiaError(f"the REF run has no node #{key[1]} in micro-batch {key[0]} ({node.name}): "
                          "graphs differ")
    name, op = reference.names[key]
    if name != node.name or op != node.desc():
        raise KazeiaError(f"graph mismatch at node #{key[1]}: REF ran {name} ({op}), the backend {node.name} "
                          f"({node.desc()})")
    return reference.outputs[key]


def _threshold(reference: Reference, key: tuple[int, int], node: Tensor, strict: bool) -> tuple[float, dict]:
    """(threshold applied, row fields): the per-op threshold plus, unless strict, the MUL_MAT allowance."""
    base = op_threshold(node)
    floor = None if strict else reference.floors.get(key)
    return base + (floor or 0.0), {"base_threshold": base, "quant_floor": floor}


def _death_dict(e: DeviceDeathError) -> dict:
    return {"message": str(e), "code": e.code, "last_enqueued": e.last_enqueued, "faulting": e.faulting,
            "cause": e.cause, "kind": getattr(e, "kind", None), "batch": getattr(e, "batch_seq", None)}


# ------------------------------------------------------------------------------------------------------------
# cumulative mode


class _CumulativeHook(Hook):
    def __init__(self, reference: Reference, rows: list[OpRow], strict: bool) -> None:
        self.reference = reference
        self.rows = rows
        self.strict = strict
        self.ubatch = 0
        self._inputs: dict[int, tuple[bool, bool, float | None]] = {}  # id(node) -> (identical, finite, nmse)

    def next_ubatch(self, *_args) -> None:
        self.ubatch += 1

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        refs = dict((self.reference.sources or {}).get((self.ubatch, info.index), []))
        identical, finite, worst = True, True, 0.0
        for i in read_sources(node):
            got = raw_copy(node.src[i])
            if np.issubdtype(got.dtype, np.floating) and not np.isfinite(got).all():
                finite = False
            want = refs.get(i)
            if want is None or want.shape != got.shape:
                identical, worst = False, None
                continue
            if not np.array_equal(got, want, equal_nan=np.issubdtype(got.dtype, np.floating)):
                identical = False
                if worst is not None:
                    v = judge(got.astype(np.float64), want.astype(np.float64), math.inf).nmse
                    worst = max(worst, v if v is not None else math.inf)
        self._inputs[id(node)] = (identical, finite, worst)

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        key = (self.ubatch, info.index)
        ref = _check_names(self.reference, key, node)
        identical, finite, in_nmse = self._inputs.pop(id(node), (False, True, None))
        is_output = bool(node.flags & TFlag.OUTPUT)
        threshold, tinfo = _threshold(self.reference, key, node, self.strict)
        if is_output:
            threshold, tinfo = WHOLE_MODEL_THRESHOLD, {"base_threshold": WHOLE_MODEL_THRESHOLD, "quant_floor": None}
        v, nonfinite_out = _compare_output(node, ref, threshold)
        status, reason, judged = v.status, v.reason, True
        if status == FAIL and not (is_output or identical):
            nonfinite_new = finite and nonfinite_out and v.kind in ("nan", "inf")
            if not nonfinite_new:
                status, judged = DRIFT, False
                reason = f"{v.reason} (inputs already differed: input NMSE {in_nmse:.3g})" if in_nmse is not None \
                    else f"{v.reason} (inputs already differed)"
            else:
                reason = f"{v.reason}; its inputs were finite"
        elif status == OK and not (is_output or identical):
            judged = False
        if is_output:
            reason = reason or "whole-model output"
        self.rows.append(_row("cumulative", self.ubatch, node, info, None, threshold, status, reason=reason,
                              nmse=v.nmse, max_abs=v.max_abs, max_rel=v.max_rel, judged=judged,
                              input_nmse=0.0 if identical else in_nmse, **tinfo))

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        cause = f"device died inside this op: {info.extra.get('kind')}: {info.extra.get('cause')}"
        self.rows.append(_row("cumulative", self.ubatch, node, info, None, op_threshold(node), DEATH, reason=cause,
                              nmse=math.inf))


def _run_cumulative(spec: RunSpec, reference: Reference, report: CompareReport, hooks, strict: bool) -> None:
    rows: list[OpRow] = []
    ctx = build_context(spec)
    hook = _CumulativeHook(reference, rows, strict)
    ctx.on_ubatch = hook.next_ubatch
    res = run(spec, hooks=[*hooks, hook], ctx=ctx)  # user hooks first: they may alter the output
    _close(ctx)
    # an async backend may finish an op after a later CPU op: list rows in graph order
    report.rows["cumulative"] = sorted(rows, key=lambda r: (r.ubatch, r.index))
    report.deaths["cumulative"] = res.death
    if res.error and not res.death:
        report.deaths["cumulative"] = {"message": res.error, "kind": "op-error"}
    report.logits_nmse["cumulative"] = _logits_nmse(res.logits, reference.logits)
    if res.death:
        report.not_run["cumulative"] = max(0, _n_computed(reference) - len(rows))


def _logits_nmse(got: np.ndarray | None, want: np.ndarray | None) -> float | None:
    if got is None or want is None or got.shape != want.shape:
        return None
    return judge(got, as_storable(want, GGMLType.F32), math.inf).nmse


def _n_computed(reference: Reference) -> int:
    return len(reference.outputs)


def _close(ctx: Context) -> None:
    for b in ctx.scheduler.backends:
        b.close()


# ------------------------------------------------------------------------------------------------------------
# isolated mode


class _InfoHook(Hook):
    """Remembers how the last op ran (the backend only says so through its hooks)."""

    def __init__(self) -> None:
        self.info: OpInfo | None = None
        self.fault: OpInfo | None = None

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        self.info = info

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        self.fault = info


class _IsolatedScheduler(Scheduler):
    """Runs each node alone on the backend the normal placement picks, after writing REF's values into the
    storage of every source it reads, and compares its output with REF's."""

    def __init__(self, base: Scheduler, reference: Reference, rows: list[OpRow], report: CompareReport,
                 strict: bool) -> None:
        super().__init__(base.backends, base.router)
        self.reference, self.rows, self.report, self.strict = reference, rows, report, strict
        self.ubatch = 0
        self.info_hook = _InfoHook()
        self.add_hook(self.info_hook)

    def compute(self, graph: Graph) -> None:
        self.placements = []
        self.graph = graph
        for b in self.backends:
            b.begin_graph(graph)
        for i, node in enumerate(graph.nodes):
            if node.is_computed:
                self._one(i, node)
        for b in self.backends:
            b.end_graph()
        self.ubatch += 1

    def _feed(self, key: tuple[int, int], node: Tensor) -> None:
        srcs = (self.reference.sources or {}).get(key)
        if srcs is None:
            raise KazeiaError(f"the reference has no captured inputs for node #{key[1]} ({node.name})")
        for i, raw in srcs:
            s = node.src[i]
            write_raw(s, raw)
            for b in self.backends:  # a host write: no backend may keep a cached copy of the old contents
                b.foreign_write(s.root)

    def _one(self, i: int, node: Tensor) -> None:
        key = (self.ubatch, i)
        ref = _check_names(self.reference, key, node)
        backend, reason = self.place(node, i)
        self.placements.append(Placement(node.name, node.desc(), backend.name, reason, i))
        threshold, tinfo = _threshold(self.reference, key, node, self.strict)
        self._feed(key, node)
        self.info_hook.info = self.info_hook.fault = None
        try:
            backend.compute(node)
            backend.synchronize()  # one op per batch on the HTP: it has finished (or died) when this returns
        except DeviceDeathError as e:
            info = self.info_hook.fault or OpInfo(backend.name, "fault", index=i)
            why = f"device died inside this op: {e.cause or e}" if e.faulting in (None, node.name) else \
                f"device died ({e}) while this op ran alone; DSP says faulting op: {e.faulting}"
            self.rows.append(_row("isolated", self.ubatch, node, info, backend, threshold, DEATH, index=i,
                                  reason=why, nmse=math.inf, **tinfo))
            self.report.deaths["isolated"] = _death_dict(e)
            self.report.not_run["isolated"] = self._not_run_after(i)
            raise
        except DeviceOpError as e:
            info = self.info_hook.info or OpInfo(backend.name, "?", index=i)
            self.rows.append(_row("isolated", self.ubatch, node, info, backend, threshold, FAIL, index=i,
                                  reason=f"op error: {e}", nmse=math.inf, **tinfo))
            return
        info = self.info_hook.info or OpInfo(backend.name, getattr(backend, "path_name", "?"), index=i)
        v, _ = _compare_output(node, ref, threshold)
        self.rows.append(_row("isolated", self.ubatch, node, info, backend, threshold, v.status, index=i,
                              reason=v.reason, nmse=v.nmse, max_abs=v.max_abs, max_rel=v.max_rel, **tinfo))

    def _not_run_after(self, i: int) -> int:
        """Computed nodes after node i in this micro-batch, plus those of the micro-batches not reached."""
        here = sum(1 for n in self.graph.nodes[i + 1:] if n.is_computed)
        return here + sum(1 for (ub, _idx) in self.reference.outputs if ub > self.ubatch)


def _run_isolated(spec: RunSpec, reference: Reference, report: CompareReport, hooks, strict: bool) -> None:
    if reference.sources is None:
        raise KazeiaError("isolated mode needs a reference captured with sources=True")
    rows: list[OpRow] = []
    ctx = build_context(spec)
    ctx.scheduler = _IsolatedScheduler(ctx.scheduler, reference, rows, report, strict)
    report.deaths["isolated"] = None
    res = run(spec, hooks=list(hooks), ctx=ctx)
    _close(ctx)
    report.rows["isolated"] = rows
    if res.error and not res.death:
        report.deaths["isolated"] = {"message": res.error, "kind": "op-error"}
    report.logits_nmse["isolated"] = _logits_nmse(res.logits, reference.logits)


# ------------------------------------------------------------------------------------------------------------
# entry point


def compare(spec: RunSpec, mode: str = "both", reference: Reference | None = None, hooks=(),
            strict: bool = False) -> CompareReport:
    """Compare `spec`'s device against REF per op. mode: cumulative, isolated or both. `reference`: a
    `capture_reference` of the same model, prompt tokens, micro-batch and context (made here if None).
    `hooks`: extra hooks on the backend under test (their on_complete runs before the output is read).
    `strict`: judge MUL_MAT by its bare threshold, without the activation-conversion allowance."""
    modes = MODES if mode == "both" else (mode,)
    for m in modes:
        if m not in MODES:
            raise KazeiaError(f"unknown compare mode '{mode}' (cumulative, isolated or both)")
    shown = spec.with_(n_predict=0)  # as the user gave it (prompt or --n-prompt), for reproduction commands
    spec = _fix_tokens(shown)
    if reference is None:
        reference = capture_reference(spec, sources=True)
    elif not reference.matches(spec):
        raise KazeiaError("the reference was captured for another model, prompt, micro-batch or context")
    report = CompareReport(shown, modes, n_tokens=len(spec.tokens or []), strict=strict)
    if "cumulative" in modes:
        _run_cumulative(spec, reference, report, hooks, strict)
    if "isolated" in modes:
        _run_isolated(spec, reference, report, hooks, strict)
    return report


# ------------------------------------------------------------------------------------------------------------
# text output


def _fmt(v: float | None, width: int = 9) -> str:
    if v is None:
        return "-".rjust(width)
    if isinstance(v, float) and math.isinf(v):
        return "inf".rjust(width)
    if v == 0:
        return "0".rjust(width)
    return f"{v:.3e}".rjust(width)


def format_table(report: CompareReport, mode: str, only_problems: bool = False) -> str:
    rows = report.rows.get(mode, [])
    multi = any(r.ubatch for r in rows)
    head = (f"{'ub ' if multi else ''}{'#':>5}  {'node':<24} {'op':<15} {'backend/path':<13} {'NMSE':>9} "
            f"{'max abs':>9} {'max rel':>9} {'thresh':>9}  {'status':<11} {'min tol':>9}  note")
    lines = [f"== {mode} ({len(rows)} ops) ==", head]
    for r in rows:
        if only_problems and r.status == OK:
            continue
        tol = _fmt(r.min_tolerance) if r.failed else " " * 9
        note = r.reason
        if mode == "cumulative" and not r.judged and r.status == OK:
            note = "inputs differ from REF: not judged"
        if r.status == OK and r.judged and r.base_threshold is not None and r.nmse is not None \
                and r.nmse > r.base_threshold:
            note = (f"over {r.base_threshold:g}, within the allowance for ggml's own activation conversion "
                    f"(NMSE {r.quant_floor:.3g})")
        lines.append(f"{f'{r.ubatch:>2} ' if multi else ''}{r.index:>5}  {r.name[:24]:<24} {r.op[:15]:<15} "
                     f"{r.where[:13]:<13} {_fmt(r.nmse)} {_fmt(r.max_abs)} {_fmt(r.max_rel)} {_fmt(r.threshold)}  "
                     f"{r.status:<11} {tol}  {note}")
    return "\n".join(lines)


def compare_command(spec: RunSpec, modes: tuple[str, ...] = MODES, strict: bool = False) -> str:
    """The `kazeia compare` command line that repeats a comparison."""
    import shlex

    argv = spec.with_(n_predict=0).argv()[:-4]  # without "-n 0 --temp 0": compare only prefills
    i = argv.index("run")
    argv[i] = "compare"
    if tuple(modes) != MODES:
        argv += ["--mode", modes[0]]
    if strict:
        argv.append("--strict")
    return " ".join(shlex.quote(x) for x in argv)


def summary_lines(report: CompareReport) -> list[str]:
    out = [f"compared {report.spec.device} against REF on {report.n_tokens} prompt tokens: "
           f"{compare_command(report.spec, report.modes, report.strict)}"]
    for m in report.modes:
        rows = report.rows.get(m, [])
        f = report.first_failure_in(m)
        n_fail = len(report.failures(m))
        if m == "cumulative":
            lg = report.logits_nmse.get(m)
            verdict = "-" if lg is None else ("OK" if lg <= WHOLE_MODEL_THRESHOLD else "FAIL")
            out.append(f"cumulative: logits NMSE {_fmt(lg).strip()} (whole-model threshold "
                       f"{WHOLE_MODEL_THRESHOLD:g}): {verdict}; {sum(r.status == DRIFT for r in rows)} ops drift past "
                       f"their per-op threshold after their inputs had drifted")
        if f is None:
            out.append(f"{m}: no op out of tolerance ({len(rows)} ops compared)")
        else:
            out.append(f"{m}: {n_fail} op(s) out of tolerance; first: {f.label()}: {f.reason}"
                       + (f" [minimum required tolerance {_fmt(f.min_tolerance).strip()}]" if f.nmse is not None
                          and math.isfinite(f.nmse) else ""))
        bad_ref = report.ref_invalid(m)
        if bad_ref:
            out.append(f"{m}: WARNING: the reference is invalid (NaN) from {bad_ref[0].label()} on "
                       f"({len(bad_ref)} ops): those are not judged")
        d = report.deaths.get(m)
        if d:
            out.append(f"{m}: device died: {d.get('message')}"
                       + (f" (faulting op {d.get('faulting')}: {d.get('cause')})" if d.get("faulting") else "")
                       + (f"; {report.not_run.get(m, 0)} ops not run" if report.not_run.get(m) else ""))
    return out


__all__ = ["CompareReport", "OpRow", "Reference", "Verdict", "capture_reference", "compare", "compare_command",
           "format_table", "judge", "op_threshold", "plot_errors", "reference_activations", "summary_lines"]


def plot_errors(report: CompareReport, path: str, title: str | None = None) -> str:
    """Write the error plot of `report` to `path` (PNG); see kazeia.debug.plots."""
    from kazeia.debug.plots import plot_errors as _plot

    return _plot(report, path, title)
