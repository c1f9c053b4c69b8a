"""Single-op differential oracle in the style of llama.cpp's test-backend-ops (`kazeia oracle`).

Each case is one op with named parameters (`MUL_MAT(type_a=q4_0,type_b=f32,m=2560,n=38,k=9728,bs=[1,1],
nr=[1,1],view=contig)`; m = output features = weight rows, n = tokens, k = inner dimension, as in
test-backend-ops). Running a case builds a one-op graph over seeded random inputs, runs it on the backend under
test and on REF (float64), and judges the two outputs the way test-backend-ops does: NaN first (a NaN in the
reference is "reference invalid", never the backend's fault), then infinities (same sign on both sides), then
NMSE = sum((a-b)^2)/sum(a^2) against the op's threshold.

Inputs are initialized like test-backend-ops (U(-1, 1) by default; MUL U(0.9, 1.1), RMS_NORM U(-10, 10), GLU,
SILU and CPY U(-150, 150); quantized weights are gguf-py quantizations of random data), but seeded: every
leaf's data comes from (seed, case name, leaf name), so one case re-run alone sees the same numbers. Weights
are seeded by (seed, type, shape) instead, so cases that differ only in the token count share them (and the
per-process weight caches).

A sweep runs each case in a forked worker process: a device death is a result of that case, a worker that
dies (os._exit, a crash of the interpreter) or hangs past the timeout is replaced and its case reported as
CRASH or TIMEOUT, and the sweep goes on.

API: `make_cases` (the case grids), `Case` / `parse_case`, `run_case` (one case in this process),
`run_sweep` (isolated workers) -> `SweepResult` (summary, CSV and JSON in test-backend-ops' fields).
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import functools
import math
import multiprocessing as mp
import os
import re
import signal
import subprocess
import tempfile
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait as mp_wait
from typing import Any

import numpy as np
from gguf import quants as gq

from kazeia.backends.base import Backend, Hook, OpInfo
from kazeia.backends.cpu import CpuBackend
from kazeia.backends.ref import RefBackend
from kazeia.backends.weights import WeightCache
from kazeia.engine.scheduler import Scheduler
from kazeia.errors import DeviceDeathError, DeviceOpError, KazeiaError
from kazeia.graph import builder as gb
from kazeia.graph.alloc import GraphAllocator
from kazeia.graph.tensor import (
    SCALAR_DTYPES,
    Buffer,
    BufferUsage,
    GGMLType,
    Tensor,
    TFlag,
    array,
    block_size,
    is_quantized,
    make_tensor,
    rows,
    type_name,
    type_size,
)

# ----------------------------------------------------------------------------------------------------------
# thresholds and statuses (test-backend-ops' max_nmse_err)

NMSE_DEFAULT = 1e-7
NMSE_THRESHOLDS = {"MUL_MAT": 5e-4, "FLASH_ATTN_EXT": 5e-4, "SOFT_MAX": 1e-6,
                   "CPY": 0.0, "CONT": 0.0, "GET_ROWS": 0.0, "SET_ROWS": 0.0}
FLT_MAX = float(np.finfo(np.float32).max)

OK = "OK"
FAIL = "FAIL"
DEATH = "DEVICE DEATH"
CRASH = "CRASH"  # the worker process died (not a device death: the interpreter itself)
TIMEOUT = "TIMEOUT"
NOT_SUPPORTED = "not supported"
REF_INVALID = "reference invalid"
FAILED_STATUSES = (FAIL, DEATH, CRASH, TIMEOUT, REF_INVALID)

DEFAULT_TIMEOUT = 300.0  # seconds per case; the largest default case takes a few seconds
BACKENDS = ("HTP0", "CPU", "REF")


def threshold(op: str) -> float:
    return NMSE_THRESHOLDS.get(op, NMSE_DEFAULT)


# ----------------------------------------------------------------------------------------------------------
# cases

Value = int | float | str | tuple


def _fmt(v: Value) -> str:
    if isinstance(v, tuple):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)  # exact round trip through parse_case
    return str(v)


def _parse_value(s: str) -> Value:
    if s.startswith("[") and s.endswith("]"):
        inner = s[1:-1].strip()
        return tuple(_parse_value(x) for x in inner.split(",")) if inner else ()
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    try:
        return float(s)
    except ValueError:
        return s


@dataclass(frozen=True)
class Case:
    """One op with its parameters, in order; `name` is the test-backend-ops style identity of the case."""

    op: str
    params: tuple[tuple[str, Value], ...]

    @classmethod
    def make(cls, op: str, **params: Value) -> Case:
        return cls(op, tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))

    def get(self, key: str, default: Value | None = None) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        return default

    def __getitem__(self, key: str) -> Any:
        v = self.get(key)
        if v is None:
            raise KeyError(f"{self.op} case has no parameter {key!r}")
        return v

    @property
    def vars(self) -> str:
        return ",".join(f"{k}={_fmt(v)}" for k, v in self.params)

    @property
    def name(self) -> str:
        return f"{self.op}({self.vars})"

    def __str__(self) -> str:
        return self.name

    def weight_key(self) -> tuple | None:
        """Cases with the same key use the same weight tensor (scheduling groups them on one worker)."""
        if self.op == "MUL_MAT" and self.get("view") != "permuted":
            return ("MUL_MAT", self["type_a"], self["m"], self["k"], self.get("bs"), self.get("init"))
        if self.op == "GET_ROWS":
            return ("GET_ROWS", self["type"], self["ne"])
        return None


def parse_case(name: str) -> Case:
    """'OP(k=v,k=[a,b],...)' -> Case (the inverse of Case.name)."""
    m = re.fullmatch(r"\s*([A-Z_0-9]+)\((.*)\)\s*", name)
    if not m:
        raise KazeiaError(f"not a case name: {name!r} (expected OP(key=value,...))")
    op, body = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    params = []
    for p in parts:
        if "=" not in p:
            raise KazeiaError(f"bad parameter {p!r} in case {name!r}")
        k, v = p.split("=", 1)
        params.append((k.strip(), _parse_value(v.strip())))
    case = Case(op, tuple(params))
    try:
        _build(case)  # the graph structure only (no data): unknown ops, missing or bad parameters
    except KazeiaError:
        raise
    except Exception as e:
        raise KazeiaError(f"case {name!r} cannot be built: {type(e).__name__}: {e}") from None
    return case


# ----------------------------------------------------------------------------------------------------------
# building a one-op graph: leaves with an init rule, data written after allocation


@dataclass
class _Leaf:
    tensor: Tensor
    # ("uniform", lo, hi) | ("ids", hi, distinct) | ("mask", n_q) | ("zeros",) | ("weight", lo, hi) | ("extreme",)
    init: tuple
    own_buffer: bool = False  # persistent storage (KV cache, copy destination) rather than the compute buffer


class Leaves:
    """Creates the input tensors of a case's graph and remembers how to fill them."""

    def __init__(self) -> None:
        self.items: list[_Leaf] = []

    def input(self, t: GGMLType | str, ne: tuple[int, ...], name: str, lo: float = -1.0, hi: float = 1.0,
              init: tuple | None = None, own_buffer: bool = False) -> Tensor:
        x = make_tensor(_gtype(t), tuple(ne), name=name, flags=TFlag.INPUT)
        self.items.append(_Leaf(x, init or ("uniform", lo, hi), own_buffer))
        return x

    def weight(self, t: GGMLType | str, ne: tuple[int, ...], name: str, extreme: bool = False) -> Tensor:
        """A model weight (flags WEIGHT: the HTP keeps it in its REPACK buffer, CPU/REF cache it dequantized).
        extreme: random valid blocks whose scales are any finite fp16 (+-65504, subnormals) instead of U(-1, 1)
        data quantized."""
        t = _gtype(t)
        x = make_tensor(t, tuple(ne), name=name, flags=TFlag.WEIGHT,
                        weight_name=f"oracle.{type_name(t)}.{'x'.join(str(d) for d in ne)}")
        self.items.append(_Leaf(x, ("extreme",) if extreme else ("weight", -1.0, 1.0), True))
        return x

    def permuted(self, t: GGMLType | str, ne: tuple[int, int, int, int], per: tuple[int, ...], name: str,
                 lo: float = -1.0, hi: float = 1.0) -> Tensor:
        """test-backend-ops' `per`: a base tensor whose dim per[i] holds logical dim i, permuted back to ne."""
        base_ne = [0] * 4
        for i in range(4):
            base_ne[per[i]] = ne[i]
        base = self.input(t, tuple(base_ne), name, lo, hi)
        inv = [0] * 4
        for i in range(4):
            inv[per[i]] = i
        return gb.permute(base, *inv)


def _gtype(t: GGMLType | str) -> GGMLType:
    if isinstance(t, str):
        try:
            return GGMLType[t.upper()]
        except KeyError:
            raise KazeiaError(f"unknown tensor type '{t}'") from None
    return GGMLType(t)


def _encode(t: GGMLType, values: np.ndarray) -> np.ndarray:
    """Float values (numpy order) -> what the tensor stores (F16 rounding, real quantized blocks)."""
    if t == GGMLType.F32:
        return values.astype(np.float32)
    if t == GGMLType.F16:
        return values.astype(np.float16)
    if t in (GGMLType.I32, GGMLType.I64):
        return values.astype(SCALAR_DTYPES[t])
    if is_quantized(t):
        return np.ascontiguousarray(gq.quantize(values.astype(np.float32), t)).view(np.uint8)
    raise KazeiaError(f"cannot initialize a {type_name(t)} tensor")


def _seed32(*parts: object) -> int:
    return zlib.crc32("|".join(str(p) for p in parts).encode())


def _mask_values(rng: np.random.Generator, n_kv: int, n_q: int, shape: tuple[int, ...]) -> np.ndarray:
    """A KQ mask: U(-1, 1), causal (query t of the last n_q positions sees cells <= n_kv - n_q + t) and ~20% extra
    holes, column 0 always visible so no row is entirely masked."""
    m = rng.uniform(-1, 1, shape).astype(np.float32)
    rows_ = shape[-2]
    for t in range(rows_):
        m[..., t, n_kv - n_q + t + 1:] = -np.inf
    holes = rng.uniform(size=shape) < 0.2
    m[holes] = -np.inf
    m[..., 0] = 0.0
    return m


# byte offsets of the fp16 fields (d, and m for Q4_1) inside one block
_F16_FIELDS = {GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q8_0: (0,), GGMLType.IQ4_NL: (0,)}


def _extreme_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite fp16 bit patterns: a quarter +-65504, a quarter subnormal, the rest any finite value."""
    bits = rng.integers(0, 1 << 16, size=n).astype(np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # exponent all ones would be inf/NaN
    kind = rng.integers(0, 4, size=n)
    sign = bits & 0x8000
    bits = np.where(kind == 0, sign | 0x7BFF, bits)
    sub = rng.integers(1, 0x400, size=n).astype(np.uint16)
    return np.where(kind == 1, sign | sub, bits).astype(np.uint16)


def _extreme_values(t: GGMLType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    n = int(np.prod(shape))
    if t == GGMLType.F16:
        return _extreme_f16_bits(rng, n).view(np.float16).reshape(shape)
    if t == GGMLType.F32:
        bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
        bits[(bits & 0x7F800000) == 0x7F800000] &= 0xBFFFFFFF
        return bits.view(np.float32).reshape(shape)
    if t not in _F16_FIELDS:
        raise KazeiaError(f"no extreme-scale blocks for {type_name(t)}")
    bs, ts = block_size(t), type_size(t)
    nb = n // bs
    blocks = rng.integers(0, 256, size=(nb, ts)).astype(np.uint8)
    for off in _F16_FIELDS[t]:
        blocks[:, off:off + 2] = _extreme_f16_bits(rng, nb).view(np.uint8).reshape(nb, 2)
    return blocks.reshape(shape[:-1] + (shape[-1] // bs * ts,))


def _leaf_values(leaf: _Leaf, rng: np.random.Generator) -> np.ndarray:
    t = leaf.tensor
    shape = t.ne[::-1]
    kind = leaf.init[0]
    if kind in ("uniform", "weight"):
        return _encode(t.type, rng.uniform(leaf.init[1], leaf.init[2], size=shape))
    if kind == "extreme":
        return _extreme_values(t.type, shape, rng)
    if kind == "zeros":
        return _encode(t.type, np.zeros(shape))
    if kind == "ids":
        hi, distinct = leaf.init[1], leaf.init[2]
        n = int(np.prod(shape))
        ids = rng.permutation(hi)[:n] if distinct else rng.integers(0, hi, size=n)
        return _encode(t.type, ids.reshape(shape))
    if kind == "mask":
        return _encode(t.type, _mask_values(rng, t.ne[0], leaf.init[1], shape))
    raise ValueError(f"unknown init {leaf.init}")


def _write(t: Tensor, data: np.ndarray) -> None:
    if t.type in SCALAR_DTYPES:
        array(t)[...] = data.reshape(array(t).shape)
    else:
        rows(t)[...] = np.ascontiguousarray(data).view(np.uint8).reshape(rows(t).shape)


# ----------------------------------------------------------------------------------------------------------
# per-process caches: weight tensors' bytes and the backends' derived weight forms


class Caches:
    """What a worker keeps between cases: weight buffers (LRU by bytes) and the dequantized/repacked forms the
    backends derive from them. Buffers have unique addresses, so derived caches never confuse two weights."""

    # cases of one weight run back to back on a worker, so a few weights' worth is enough (Qwen3-4B ffn_down:
    # 25M values, 200 MB dequantized in float64); two workers stay well under 5 GB
    def __init__(self, weight_bytes: int = 384 << 20, derived_bytes: int = 768 << 20) -> None:
        self.weight_budget = weight_bytes
        self.weights: OrderedDict[tuple, Buffer] = OrderedDict()
        self.ref = WeightCache(derived_bytes)
        self.cpu = WeightCache(derived_bytes // 2)
        self.htp = None  # kazeia.backends.htp.matmul.WeightStore, made on first HTP use
        self.derived_bytes = derived_bytes

    def weight_buffer(self, key: tuple, make: Callable[[], np.ndarray]) -> Buffer:
        buf = self.weights.get(key)
        if buf is not None:
            self.weights.move_to_end(key)
            return buf
        data = np.ascontiguousarray(make()).view(np.uint8).reshape(-1)
        buf = Buffer(f"weights:{key}", data.copy(), BufferUsage.WEIGHTS)
        self.weights[key] = buf
        while len(self.weights) > 1 and sum(b.size for b in self.weights.values()) > self.weight_budget:
            self.weights.popitem(last=False)
        return buf

    def htp_store(self):
        if self.htp is None:
            from kazeia.backends.htp.matmul import WeightStore

            self.htp = WeightStore(self.derived_bytes)
        return self.htp


# ----------------------------------------------------------------------------------------------------------
# backends


@dataclass(frozen=True)
class BackendSpec:
    """The backend under test: HTP0 (with its profile, VTCM size, faults, GGML_HEXAGON_* overrides), CPU or REF."""

    name: str = "HTP0"
    profile: str | None = None
    vtcm: int | None = None
    faults: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        name = self.name.upper()
        if name == "HTP":
            name = "HTP0"
        if name not in BACKENDS:
            raise KazeiaError(f"unknown backend '{self.name}' (available: {', '.join(BACKENDS)})")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "faults", tuple(self.faults))

    def htp_settings(self):
        from kazeia.backends.htp.settings import HtpSettings

        return HtpSettings.from_env(profile=self.profile, vtcm_bytes=self.vtcm, faults=list(self.faults),
                                    overrides=dict(self.env))

    def make(self, caches: Caches, log: Callable[[str], None] | None = None) -> Backend:
        if self.name == "CPU":
            return CpuBackend(caches.cpu)
        if self.name == "REF":
            return RefBackend(caches.ref)
        from kazeia.backends.htp.backend import HtpBackend

        be = HtpBackend(self.htp_settings(), log=log or (lambda s: None))
        unit = getattr(getattr(be, "executor", None), "matmul", None)
        if unit is not None and hasattr(unit, "weights"):
            unit.weights = caches.htp_store()  # the REPACK buffer outlives one case, as on a device
        return be

    def describe(self) -> str:
        if self.name != "HTP0":
            return {"CPU": "numpy float32", "REF": "numpy float64 (oracle)"}[self.name]
        s = self.htp_settings()
        d = f"emulated Hexagon NPU, profile {s.profile}, VTCM {s.vtcm_bytes} B, arch v{s.arch}"
        if s.faults:
            d += f", faults {','.join(s.faults)}"
        if not s.use_hmx:
            d += ", HMX off"
        return d

    def validate(self) -> None:
        """Raise KazeiaError now (in the parent) for a bad profile, fault or env switch."""
        if self.name == "HTP0":
            from kazeia.backends.htp.profiles import check_faults, get_profile

            s = self.htp_settings()
            get_profile(s.profile)
            check_faults(s.faults)


# ----------------------------------------------------------------------------------------------------------
# op definitions: grids and graph builders

N_SMALL = (1, 2, 3, 4, 5, 7, 8, 9, 16)
N_TILES = tuple(sorted({n for t in range(32, 1025, 32) for n in (t - 1, t, t + 1) if n <= 1024}))
N_FOCUS = (1, 7, 16, 31, 32, 33, 38, 48, 63, 64, 65, 96, 97, 128, 129, 256, 257, 512, 513, 1024)
N_COARSE = (1, 31, 32, 33, 64, 65, 128)
N_MODEL_SMALL = (31, 32, 33, 38, 63, 64, 65, 127, 128, 129, 512, 1024)
N_ROWS_OPS = (1, 7, 32, 33, 38, 64, 65, 512)

# (m, k) = (weight rows / output features, inner dimension), with the layer they come from
QWEN3_4B = ((4096, 2560, "attn_q"), (1024, 2560, "attn_k/v"), (2560, 4096, "attn_output"),
            (9728, 2560, "ffn_gate/up"), (2560, 9728, "ffn_down"))
SMOLLM2_135M = ((576, 576, "attn_q/output"), (192, 576, "attn_k/v"), (1536, 576, "ffn_gate/up"),
                (576, 1536, "ffn_down"))
MM_TYPES = ("q4_0", "q4_1", "q8_0", "f16", "f32")


@dataclass(frozen=True)
class GridOptions:
    quick: bool = False
    types: tuple[str, ...] | None = None  # MUL_MAT type_a / GET_ROWS table types to keep
    vtcm: int | None = None  # VTCM size for the plan-change points of the MUL_MAT grid (default 8 MiB)

    def want(self, t: str) -> bool:
        return self.types is None or t in self.types


def mul_mat_case(type_a: str, m: int, n: int, k: int, type_b: str = "f32", bs: tuple[int, int] = (1, 1),
                 nr: tuple[int, int] = (1, 1), view: str = "contig", k_v: int | None = None,
                 per: tuple[int, ...] | None = None, init: str = "uniform") -> Case:
    """A MUL_MAT case: a [k, m] (weight) x b [k, n] -> [m, n]. view: contig, rows (b rows of k inside rows of
    k_v), transposed (b stored [n, k]) or permuted (both built with permuted dims `per`, batched by bs/nr).
    init=extreme: weight blocks with extreme but finite scales (not in the default grids)."""
    params: dict[str, Value] = dict(type_a=type_a, type_b=type_b, m=m, n=n, k=k, bs=tuple(bs), nr=tuple(nr),
                                    view=view)
    if view == "rows":
        params["k_v"] = int(k_v if k_v is not None else k + 64)
    elif view == "permuted":
        params["per"] = tuple(per or (0, 2, 1, 3))
    elif view not in ("contig", "transposed"):
        raise KazeiaError(f"unknown MUL_MAT view '{view}' (contig, rows, transposed, permuted)")
    if init != "uniform":
        params["init"] = init
    return Case.make("MUL_MAT", **params)


def case_for_node(node: Tensor) -> Case | None:
    """The oracle case replaying a graph node's MUL_MAT shape (2-D weight, F32/F16 activations), or None."""
    if node.op != "MUL_MAT":
        return None
    a, b = node.src[0], node.src[1]
    if a.ne[2] * a.ne[3] != 1 or b.ne[2] * b.ne[3] != 1:
        return None
    ta, tb = type_name(a.type), type_name(b.type)
    m, n, k = a.ne[1], b.ne[1], a.ne[0]
    if b.nb[0] > b.nb[1]:
        return mul_mat_case(ta, m, n, k, tb, view="transposed")
    row = b.nb[1] // b.nb[0]
    if b.ne[1] > 1 and row > k:
        return mul_mat_case(ta, m, n, k, tb, view="rows", k_v=row)
    return mul_mat_case(ta, m, n, k, tb)


@functools.lru_cache(maxsize=256)
def plan_points(m: int, k: int, qtype: str, vtcm: int | None = None) -> frozenset[int]:
    """Token counts n where the HTP MUL_MAT plan (path, chunking, status, fallback) changes, with the count just
    before, under both profiles; plus every n whose plan fails (2026-05 overflow) and its neighbours."""
    from kazeia.backends.htp import vtcm as V

    if qtype not in V.QTYPES:
        return frozenset()
    size = vtcm or V.DEFAULT_VTCM_SIZE
    pts: set[int] = set()
    for prof in V.PROFILES:
        prev = None
        for n in range(1, 1025):
            p = V.plan_matmul(n, k, m, qtype, vtcm_size=size, profile=prof)
            key = (p.path, p.mc, p.nc, p.status, p.hmx_attempt is not None)
            if prev is not None and key != prev:
                pts.update((n - 1, n))
            if p.status != "ok":
                pts.update((n - 1, n, n + 1))
            prev = key
    return frozenset(n for n in pts if 1 <= n <= 1024)


def _irregular(m: int, k: int, t: str, vtcm: int | None) -> set[int]:
    """Plan changes that are not at a 32-token tile edge (a new chunking chosen for cost reasons), and failures."""
    from kazeia.backends.htp import vtcm as V

    size = vtcm or V.DEFAULT_VTCM_SIZE
    failing = {n for n in plan_points(m, k, t, vtcm)
               if V.plan_matmul(n, k, m, t, vtcm_size=size, profile="2026-05").status != "ok"}
    edges = {n for n in plan_points(m, k, t, vtcm) if n % 32 not in (0, 1, 31)}
    return edges | {x for n in failing for x in (n - 1, n, n + 1) if 1 <= x <= 1024}


def _mm_quick(types: list[str], o: GridOptions) -> list[Case]:
    cases = []
    for t in types:
        for n in (1, 5):
            cases.append(mul_mat_case(t, 16, n, 256))
        for n in (1, 31, 32, 33, 64, 65):
            cases.append(mul_mat_case(t, 576, n, 1536))
    if o.want("q4_0"):
        cases += [mul_mat_case("q4_0", 2560, n, 9728) for n in (32, 33, 64, 65)]
        for n in (7, 38):
            cases += [mul_mat_case("q4_0", 576, n, 1536, view=v) for v in ("rows", "transposed")]
        cases += [mul_mat_case("q4_0", 576, n, 1536, type_b="f16") for n in (7, 33)]
    for t in [x for x in ("q4_0", "f16") if x in types]:
        cases += [mul_mat_case(t, 64, n, 320) for n in (1, 33)]
    if o.want("f16"):
        cases.append(mul_mat_case("f16", 64, 32, 128, bs=(4, 1), nr=(2, 1)))
        cases.append(mul_mat_case("f16", 16, 8, 256, bs=(2, 3), view="permuted", per=(0, 2, 1, 3)))
    return cases


def _mm_grid(o: GridOptions) -> list[Case]:
    types = [t for t in MM_TYPES if o.want(t)]
    if o.quick:
        return _mm_quick(types, o)
    cases: list[Case] = []
    add = cases.append
    # test-backend-ops' first block: every type, m=16, k=256, n=1..9, large k, and F16 activations
    for t in types:
        cases += [mul_mat_case(t, 16, n, 256) for n in range(1, 10)]
        cases += [mul_mat_case(t, 16, n, 1024) for n in (1, 8, 16)]
        cases += [mul_mat_case(t, 16, n, 256, type_b="f16") for n in (1, 16)]
    # SmolLM2-135M: every 32-tile neighbourhood on its HMX-eligible ffn_down (K=1536) in Q4_0; K=576 is not a
    # multiple of 256 (quantized: HVX only)
    for t in types:
        for m, k, _ in SMOLLM2_135M:
            full = t == "q4_0" and k % 256 == 0
            ns = set(N_SMALL) | set(N_TILES) if full else set(N_SMALL) | set(N_MODEL_SMALL)
            ns |= _irregular(m, k, t, o.vtcm) if t != "f32" else set()
            cases += [mul_mat_case(t, m, n, k) for n in sorted(ns)]
    # Qwen3-4B (the model of the original crash): Q4_0 at tile edges, plan changes and the ffn_down window
    # token by token; the other types at fewer sizes
    for t in types:
        for m, k, _ in QWEN3_4B:
            ns = set(N_FOCUS) if t == "q4_0" else set(N_COARSE)
            ns |= _irregular(m, k, t, o.vtcm) if t != "f32" else set()
            if t == "q4_0" and (m, k) == (2560, 9728):  # the layer of the original crash: every plan change, tile
                ns |= set(plan_points(m, k, t, o.vtcm))  # edges up to 320 tokens, its 2026-05 overflow window
                ns |= {n for n in N_TILES if n <= 320} | set(range(30, 71))  # token by token
            cases += [mul_mat_case(t, m, n, k) for n in sorted(ns)]
    # activations not contiguous: rows inside wider rows (k_v), stored transposed; F16 activations
    for t in types:
        for n in (1, 7, 31, 32, 33, 38, 64, 65, 100):
            add(mul_mat_case(t, 576, n, 1536, view="rows", k_v=1600))
            add(mul_mat_case(t, 576, n, 1536, view="transposed"))
        cases += [mul_mat_case(t, 576, n, 1536, type_b="f16") for n in (7, 33, 64)]
    if o.want("q4_0"):
        for m, k in ((2560, 9728), (2560, 4096)):
            for n in (7, 33, 38, 65):
                add(mul_mat_case("q4_0", m, n, k, view="rows", k_v=k + 64))
                add(mul_mat_case("q4_0", m, n, k, view="transposed"))
    # K not a multiple of 256 (quantized HMX needs it), nor of 64
    for t in types:
        for m, k in ((64, 320), (96, 800), (128, 4160)):
            cases += [mul_mat_case(t, m, n, k) for n in (1, 7, 31, 32, 33, 64, 65, 128)]
    # batched and permuted (test-backend-ops blocks 4 and 7; the attention kq product)
    for t in types:
        for per in ((0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 2, 1)):
            cases += [mul_mat_case(t, 16, n, 256, bs=(2, 3), view="permuted", per=per) for n in (1, 8, 16)]
    for t in [x for x in ("f16", "f32") if x in types]:
        for m, n, k, bs, nr in ((64, 2, 128, (8, 1), (1, 1)), (83, 2, 128, (8, 1), (4, 1)),
                                (64, 45, 128, (8, 1), (4, 1)), (128, 45, 64, (8, 1), (4, 1))):
            add(mul_mat_case(t, m, n, k, bs=bs, nr=nr))
        for n in (1, 38, 64):  # Qwen3 kq: K cache [128, 256, 8 heads] x q [128, n, 32 heads]
            add(mul_mat_case(t, 256, n, 128, bs=(8, 1), nr=(4, 1), view="permuted", per=(0, 2, 1, 3)))
    return _dedup(cases)


def _dedup(cases: list[Case]) -> list[Case]:
    return list(dict.fromkeys(cases))


def _build_mul_mat(c: Case, lv: Leaves) -> Tensor:
    ta, tb = _gtype(c["type_a"]), _gtype(c["type_b"])
    m, n, k = c["m"], c["n"], c["k"]
    bs, nr = c.get("bs", (1, 1)), c.get("nr", (1, 1))
    view = c.get("view", "contig")
    ne_a = (k, m, bs[0], bs[1])
    ne_b = (k, n, bs[0] * nr[0], bs[1] * nr[1])
    if view == "permuted":
        per = c.get("per", (0, 2, 1, 3))
        # like test-backend-ops: a block-quantized a keeps its rows (only per[0] == 0 permutations touch it)
        a = lv.permuted(ta, ne_a, per, "a") if block_size(ta) == 1 or per[0] == 0 else lv.input(ta, ne_a, "a")
        return gb.mul_mat(a, lv.permuted(tb, ne_b, per, "b"))
    extreme = c.get("init", "uniform") == "extreme"
    a = lv.weight(ta, ne_a, "a", extreme) if bs == (1, 1) else lv.input(ta, ne_a, "a")
    if view == "contig":
        b = lv.input(tb, ne_b, "b")
    elif view == "rows":
        base = lv.input(tb, (c["k_v"],) + ne_b[1:], "b")
        b = gb.view(base, ne_b, base.nb)
    elif view == "transposed":
        if ne_b[2] * ne_b[3] != 1:
            raise KazeiaError(f"{c.name}: view=transposed is 2-D only")
        b = gb.transpose(lv.input(tb, (n, k), "b"))
    else:
        raise KazeiaError(f"{c.name}: unknown view '{view}'")
    return gb.mul_mat(a, b)


# ---- the other ops the engine uses: smaller grids over the models' shapes


def _ns(o: GridOptions) -> tuple[int, ...]:
    return (1, 33) if o.quick else N_ROWS_OPS


def _rows_grid(op: str, o: GridOptions, widths: Iterable[int], **extra: Value) -> list[Case]:
    cases = []
    for w in widths:
        for n in _ns(o):
            cases.append(Case.make(op, type="f32", ne=(w, n, 1, 1), **extra, view="contig"))
        cases.append(Case.make(op, type="f32", ne=(w, 38, 1, 1), **extra, view="rows"))
    return cases


def _view_rows(lv: Leaves, c: Case, name: str, lo: float, hi: float, t: str = "f32") -> Tensor:
    """The case's operand: contiguous, or (view=rows) the first ne0 values of rows 64 elements wider."""
    ne = tuple(c["ne"])
    if c.get("view", "contig") == "rows":
        base = lv.input(t, (ne[0] + 64,) + ne[1:], name, lo, hi)
        return gb.view(base, ne, base.nb)
    return lv.input(t, ne, name, lo, hi)


def _rms_norm_grid(o: GridOptions) -> list[Case]:
    cases = _rows_grid("RMS_NORM", o, (2560, 576) if not o.quick else (2560,), eps=1e-6)
    for n in (1, 38):  # q/k norm over each 128-wide head
        cases.append(Case.make("RMS_NORM", type="f32", ne=(128, 32, n, 1), eps=1e-6, view="contig"))
    return cases


def _build_rms_norm(c: Case, lv: Leaves) -> Tensor:
    return gb.rms_norm(_view_rows(lv, c, "a", -10.0, 10.0), c["eps"])


def _binary_grid(op: str, o: GridOptions) -> list[Case]:
    cases = []
    for n in _ns(o):
        cases.append(Case.make(op, type="f32", ne_a=(2560, n, 1, 1), ne_b=(2560, 1, 1, 1), view="contig"))
        cases.append(Case.make(op, type="f32", ne_a=(2560, n, 1, 1), ne_b=(2560, n, 1, 1), view="contig"))
    cases.append(Case.make(op, type="f32", ne_a=(128, 32, 38, 1), ne_b=(128, 1, 1, 1), view="contig"))
    cases.append(Case.make(op, type="f32", ne_a=(16, 5, 3, 2), ne_b=(16, 1, 3, 2), view="contig"))
    cases.append(Case.make(op, type="f32", ne_a=(576, 38, 1, 1), ne_b=(576, 38, 1, 1), view="permuted"))
    return cases


def _build_binary(c: Case, lv: Leaves) -> Tensor:
    lo, hi = (0.9, 1.1) if c.op == "MUL" else (-1.0, 1.0)  # test-backend-ops: MUL/DIV away from zero
    ne_a, ne_b = tuple(c["ne_a"]), tuple(c["ne_b"])
    if c.get("view") == "permuted":
        a = lv.permuted("f32", ne_a, (1, 0, 2, 3), "a", lo, hi)
        b = lv.permuted("f32", ne_b, (1, 0, 2, 3), "b", lo, hi)
    else:
        a, b = lv.input("f32", ne_a, "a", lo, hi), lv.input("f32", ne_b, "b", lo, hi)
    return (gb.mul if c.op == "MUL" else gb.add)(a, b)


def _scale_grid(o: GridOptions) -> list[Case]:
    return [Case.make("SCALE", type="f32", ne=(2560, n, 1, 1), s=0.125, b=0.0, view="contig") for n in _ns(o)] + [
        Case.make("SCALE", type="f32", ne=(256, 38, 8, 1), s=0.37, b=-0.25, view="contig")]


def _build_scale(c: Case, lv: Leaves) -> Tensor:
    return gb.scale(lv.input("f32", tuple(c["ne"]), "a"), c["s"], c["b"])


def _unary_grid(op: str, o: GridOptions, widths: Iterable[int]) -> list[Case]:
    return [Case.make(op, type="f32", ne=(w, n, 1, 1), view="contig") for w in widths for n in _ns(o)]


def _build_swiglu(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    return gb.swiglu_split(lv.input("f32", ne, "gate", -150.0, 150.0), lv.input("f32", ne, "up", -150.0, 150.0))


def _build_silu(c: Case, lv: Leaves) -> Tensor:
    return gb.silu(lv.input("f32", tuple(c["ne"]), "a", -150.0, 150.0))


def _rope_grid(o: GridOptions) -> list[Case]:
    cases = []
    heads = ((128, 32, 2, 1e6), (128, 8, 2, 1e6), (64, 9, 0, 1e4))  # Qwen3-4B q, k (NEOX); SmolLM2 q (NORM)
    for d, h, mode, base in heads[:1] if o.quick else heads:
        for n in _ns(o):
            cases.append(Case.make("ROPE", type="f32", ne=(d, h, n, 1), n_dims=d, mode=mode, base=base,
                                   view="contig"))
    if not o.quick:
        cases.append(Case.make("ROPE", type="f32", ne=(128, 8, 38, 1), n_dims=128, mode=2, base=1e6, view="rows"))
    return cases


def _build_rope(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    if c.get("view") == "rows":  # heads of a wider fused projection
        base = lv.input("f32", (ne[0], ne[1] + 2, ne[2], ne[3]), "a")
        a = gb.view(base, ne, base.nb)
    else:
        a = lv.input("f32", ne, "a")
    pos = lv.input("i32", (ne[2],), "pos", init=("ids", 512, False))  # test-backend-ops: rand() % n_ctx
    return gb.rope_ext(a, pos, c["n_dims"], c["mode"], c["base"])


def _soft_max_grid(o: GridOptions) -> list[Case]:
    cases = []
    shapes = ((256, 38, 32), (256, 1, 32)) if o.quick else ((256, 38, 32), (256, 1, 32), (512, 64, 8),
                                                            (256, 65, 9), (32, 7, 4))
    masks = ("f16",) if o.quick else ("f16", "f32", "none")
    for n_kv, n, h in shapes:
        for mask in masks:
            cases.append(Case.make("SOFT_MAX", type="f32", ne=(n_kv, n, h, 1), mask=mask, scale=0.125,
                                   max_bias=0.0))
    if not o.quick:
        cases.append(Case.make("SOFT_MAX", type="f32", ne=(256, 38, 8, 1), mask="f16", scale=0.125, max_bias=8.0))
    return cases


def _build_soft_max(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    a = lv.input("f32", ne, "a")
    mask = None
    if c["mask"] != "none":
        mask = lv.input(c["mask"], (ne[0], ne[1]), "mask", init=("mask", ne[1]))
    return gb.soft_max_ext(a, mask, c["scale"], c["max_bias"])


def _fa_grid(o: GridOptions) -> list[Case]:
    cases = []
    heads = ((128, 8, 4),) if o.quick else ((128, 8, 4), (64, 3, 3))  # Qwen3-4B (32 q / 8 kv), SmolLM2 (9 / 3)
    for hs, nh, nr in heads:
        for kv in ((256,) if o.quick else (256, 512)):
            for n in ((1, 38) if o.quick else (1, 7, 32, 33, 38, 64, 65)):
                cases.append(Case.make("FLASH_ATTN_EXT", hs=hs, nh=nh, nr=nr, kv=kv, nb=n, mask=1,
                                       type_KV="f16"))
    if not o.quick:
        cases.append(Case.make("FLASH_ATTN_EXT", hs=128, nh=8, nr=4, kv=256, nb=38, mask=0, type_KV="f16"))
    return cases


def _build_fa(c: Case, lv: Leaves) -> Tensor:
    """The engine's layout: q a permuted [D, T, H] view, K/V permuted views of F16 caches, an F16 mask."""
    d, hkv, nr, n_kv, n = c["hs"], c["nh"], c["nr"], c["kv"], c["nb"]
    h = hkv * nr
    q = gb.permute(lv.input("f32", (d, h, n), "q"), 0, 2, 1, 3)
    caches = []
    for name in ("k", "v"):
        t = lv.input(c["type_KV"], (d * hkv, n_kv), f"cache_{name}", own_buffer=True)
        caches.append(gb.permute(gb.view_3d(t, d, hkv, n_kv, t.nb[0] * d, t.nb[1]), 0, 2, 1, 3))
    mask = lv.input("f16", (n_kv, n), "mask", init=("mask", n)) if c["mask"] else None
    return gb.flash_attn_ext(q, caches[0], caches[1], mask, 1.0 / math.sqrt(d))


def _get_rows_grid(o: GridOptions) -> list[Case]:
    types = [t for t in ("f32", "f16", "q4_0", "q8_0") if o.want(t)]
    return [Case.make("GET_ROWS", type=t, ne=(2560, 512, 1, 1), n_ids=n)
            for t in types for n in ((1, 33) if o.quick else (1, 7, 38, 64, 512))]


def _build_get_rows(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    table = lv.weight(c["type"], ne, "table")
    ids = lv.input("i32", (c["n_ids"],), "ids", init=("ids", ne[1], False))
    return gb.get_rows(table, ids)


def _set_rows_grid(o: GridOptions) -> list[Case]:
    cases = [Case.make("SET_ROWS", type="f16", ne=(1024, n, 1, 1), rows=512, view="contig") for n in _ns(o)]
    if not o.quick:
        cases += [Case.make("SET_ROWS", type="f32", ne=(1024, 38, 1, 1), rows=512, view="contig"),
                  Case.make("SET_ROWS", type="f16", ne=(1024, 38, 1, 1), rows=512, view="rows")]
    return cases


def _build_set_rows(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    dst = lv.input(c["type"], (ne[0], c["rows"]), "cache", own_buffer=True)
    src = _view_rows(lv, c, "src", -1.0, 1.0)
    ids = lv.input("i64", (ne[1],), "ids", init=("ids", c["rows"], True))
    return gb.set_rows(dst, src, ids)


def _cpy_grid(o: GridOptions) -> list[Case]:
    pairs = (("f32", "f16"),) if o.quick else (("f32", "f16"), ("f32", "f32"), ("f16", "f32"), ("f16", "f16"))
    cases = [Case.make("CPY", type_src=s, type_dst=d, ne=(1024, n, 1, 1), view="contig")
             for s, d in pairs for n in _ns(o)]
    if not o.quick:
        cases += [Case.make("CPY", type_src=s, type_dst=d, ne=(128, 38, 8, 1), view="permuted")
                  for s, d in pairs]
    return cases


def _build_cpy(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    if c.get("view") == "permuted":
        src = lv.permuted(c["type_src"], ne, (0, 2, 1, 3), "src", -150.0, 150.0)
    else:
        src = lv.input(c["type_src"], ne, "src", -150.0, 150.0)
    dst = lv.input(c["type_dst"], ne, "dst", init=("zeros",), own_buffer=True)
    return gb.cpy(src, dst)


def _cont_grid(o: GridOptions) -> list[Case]:
    ts = ("f32",) if o.quick else ("f32", "f16")
    return [Case.make("CONT", type=t, ne=(128, n, 32, 1), per=(0, 2, 1, 3)) for t in ts for n in _ns(o)[:4]]


def _build_cont(c: Case, lv: Leaves) -> Tensor:
    return gb.cont(lv.permuted(c["type"], tuple(c["ne"]), tuple(c["per"]), "a"))


@dataclass(frozen=True)
class OpDef:
    name: str
    grid: Callable[[GridOptions], list[Case]]
    build: Callable[[Case, Leaves], Tensor]
    aliases: tuple[str, ...] = ()

    @property
    def threshold(self) -> float:
        return threshold(self.name)


OPS: dict[str, OpDef] = {d.name: d for d in [
    OpDef("MUL_MAT", _mm_grid, _build_mul_mat),
    OpDef("RMS_NORM", _rms_norm_grid, _build_rms_norm),
    OpDef("MUL", lambda o: _binary_grid("MUL", o), _build_binary),
    OpDef("ADD", lambda o: _binary_grid("ADD", o), _build_binary),
    OpDef("SCALE", _scale_grid, _build_scale),
    OpDef("ROPE", _rope_grid, _build_rope),
    OpDef("SOFT_MAX", _soft_max_grid, _build_soft_max),
    OpDef("FLASH_ATTN_EXT", _fa_grid, _build_fa),
    OpDef("SWIGLU", lambda o: _unary_grid("SWIGLU", o, (9728, 1536) if not o.quick else (1536,)), _build_swiglu,
          aliases=("GLU",)),
    OpDef("SILU", lambda o: _unary_grid("SILU", o, (9728,) if not o.quick else (1536,)), _build_silu,
          aliases=("UNARY",)),
    OpDef("GET_ROWS", _get_rows_grid, _build_get_rows),
    OpDef("SET_ROWS", _set_rows_grid, _build_set_rows),
    OpDef("CPY", _cpy_grid, _build_cpy),
    OpDef("CONT", _cont_grid, _build_cont),
]}


def op_def(name: str) -> OpDef:
    key = name.strip().upper()
    for d in OPS.values():
        if key == d.name or key in d.aliases:
            return d
    raise KazeiaError(f"unknown op '{name}' (available: {', '.join(OPS)})")


def make_cases(ops: Iterable[str] | None = None, types: Iterable[str] | None = None, quick: bool = False,
               pattern: str | None = None, vtcm: int | None = None) -> list[Case]:
    """The case list: the grids of `ops` (default: all), MUL_MAT/GET_ROWS types restricted to `types`, names
    filtered by the regex `pattern` (re.search, like test-backend-ops -p)."""
    want_types = None
    if types is not None:
        want_types = tuple(t.strip().lower() for t in types if t.strip())
        bad = [t for t in want_types if t not in MM_TYPES]
        if bad:
            raise KazeiaError(f"unknown type(s) {', '.join(bad)} (available: {', '.join(MM_TYPES)})")
    opts = GridOptions(quick=quick, types=want_types, vtcm=vtcm)
    defs = list(OPS.values()) if ops is None else list(dict.fromkeys(op_def(o) for o in ops))
    try:
        rx = re.compile(pattern) if pattern else None
    except re.error as e:
        raise KazeiaError(f"bad -p regex {pattern!r}: {e}") from None
    cases = [c for d in defs for c in d.grid(opts)]
    return [c for c in _dedup(cases) if rx is None or rx.search(c.name)]


# ----------------------------------------------------------------------------------------------------------
# judging (test-backend-ops' callback checks, in order)


@dataclass
class Verdict:
    status: str
    reason: str = ""
    nmse: float | None = None


def judge(a: np.ndarray, b: np.ndarray, max_err: float, op: str = "", name_a: str = "backend") -> Verdict:
    """a = backend under test, b = reference (float64). NaN in b -> reference invalid; NaN in a -> FAIL; an
    infinity (|x| >= FLT_MAX) must be matched by one of the same sign; then NMSE over the rest vs max_err."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        return Verdict(FAIL, f"output size mismatch: {a.size} vs REF {b.size}")
    nan_b = np.flatnonzero(np.isnan(b))
    if nan_b.size:
        i = nan_b[0]
        return Verdict(REF_INVALID, f"NaN in the reference at index {i} ({nan_b.size} NaN; {name_a}={a[i]} "
                                    f"REF={b[i]}): the oracle is broken, not the backend")
    nan_a = np.flatnonzero(np.isnan(a))
    if nan_a.size:
        i = nan_a[0]
        return Verdict(FAIL, f"NaN at index {i} ({nan_a.size} NaN; {name_a}={a[i]} REF={b[i]})")
    inf_a, inf_b = np.abs(a) >= FLT_MAX, np.abs(b) >= FLT_MAX
    mism = np.flatnonzero(inf_a != inf_b)
    if mism.size:
        i = mism[0]
        return Verdict(FAIL, f"inf mismatch at index {i} ({mism.size} values; {name_a}={a[i]} REF={b[i]})")
    sign = np.flatnonzero(inf_a & (np.sign(a) != np.sign(b)))
    if sign.size:
        i = sign[0]
        return Verdict(FAIL, f"inf sign mismatch at index {i} ({name_a}={a[i]} REF={b[i]})")
    fa, fb = a[~inf_a], b[~inf_a]
    num = float(np.sum((fa - fb) ** 2))
    den = float(np.sum(fa * fa))
    err = (0.0 if num == 0.0 else math.inf) if den == 0.0 else num / den
    if err > max_err:
        return Verdict(FAIL, f"[{op}] ERR = {err:.9f} > {max_err:.9f}", err)
    return Verdict(OK, "", err)


# ----------------------------------------------------------------------------------------------------------
# running one case


@dataclass
class CaseResult:
    name: str
    op: str
    vars: str
    backend: str
    status: str
    reason: str = ""
    nmse: float | None = None
    max_nmse: float | None = None
    seed: int = 0
    seconds: float = 0.0  # the whole case, both sides
    time_us: float = 0.0  # the backend under test's compute
    flops: int = 0
    memory_kb: int = 0
    path: str | None = None  # how the backend ran the op (hmx, hvx, cpu, ref)
    detail: dict = field(default_factory=dict)  # what the backend reported about it (plan, fallback, ...)
    death: dict | None = None  # DeviceDeathError fields
    log: list[str] = field(default_factory=list)  # tail of the DSP/host log on failures

    @property
    def passed(self) -> bool:
        return self.status == OK

    @property
    def supported(self) -> bool:
        return self.status != NOT_SUPPORTED

    @property
    def failed(self) -> bool:
        return self.status in FAILED_STATUSES

    def line(self) -> str:
        """The console line: '  OP(vars): STATUS reason'."""
        tail = f" {self.reason}" if self.reason and self.status != OK else ""
        return f"  {self.name}: {self.status}{tail}"

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("nmse", "max_nmse"):
            if isinstance(d[k], float) and not math.isfinite(d[k]):
                d[k] = str(d[k])
        return d


class _Capture(Hook):
    """Remembers how the backend ran the case's op (the last computed node)."""

    def __init__(self, target: Tensor) -> None:
        self.target = target
        self.info: OpInfo | None = None
        self.fault: OpInfo | None = None

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        if node is self.target or self.info is None:
            self.info = info

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        self.fault = info


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


@dataclass
class _Built:
    graph: gb.Graph
    out: Tensor
    leaves: Leaves


def _build(case: Case) -> _Built:
    lv = Leaves()
    out = op_def(case.op).build(case, lv)
    out.flags |= TFlag.OUTPUT
    out.name = out.name or "out"
    g = gb.Graph()
    g.expand(out)
    return _Built(g, out, lv)


def _unsupported(built: _Built, be: Backend) -> str | None:
    for n in built.graph.nodes:
        if n.is_computed and not be.supports(n):
            return n.desc()
    return None


class _Data:
    """The case's input values, generated once and written identically into both sides' graphs."""

    def __init__(self, case: Case, seed: int, caches: Caches) -> None:
        self.case, self.seed, self.caches = case, seed, caches
        self.values: dict[str, np.ndarray] = {}

    def materialize(self, built: _Built) -> None:
        for leaf in built.leaves.items:
            t = leaf.tensor
            if leaf.init[0] in ("weight", "extreme"):
                t.buffer, t.offset = self._weight(leaf), 0
            elif leaf.own_buffer:
                t.buffer, t.offset = Buffer.zeros(t.name, t.nbytes), 0
        GraphAllocator(f"oracle:{self.case.op}").allocate(built.graph)
        for leaf in built.leaves.items:
            if leaf.init[0] not in ("weight", "extreme"):
                _write(leaf.tensor, self.value(leaf))

    def _weight(self, leaf: _Leaf) -> Buffer:
        t = leaf.tensor
        key = (type_name(t.type), t.ne, self.seed, leaf.init[0])
        rng = np.random.default_rng(_seed32(self.seed, "weight", key[0], key[1], *key[3:]))
        return self.caches.weight_buffer(key, lambda: _leaf_values(leaf, rng))

    def value(self, leaf: _Leaf) -> np.ndarray:
        name = leaf.tensor.name
        if name not in self.values:
            rng = np.random.default_rng(_seed32(self.seed, self.case.name, name))
            self.values[name] = _leaf_values(leaf, rng)
        return self.values[name]


def _flops(c: Case) -> int:
    if c.op == "MUL_MAT":
        bs, nr = c.get("bs", (1, 1)), c.get("nr", (1, 1))
        return 2 * c["m"] * c["n"] * c["k"] * bs[0] * nr[0] * bs[1] * nr[1]
    if c.op == "FLASH_ATTN_EXT":
        return 2 * c["nh"] * c["nr"] * c["nb"] * 2 * c["hs"] * c["kv"]
    return 0


def _memory_kb(built: _Built) -> int:
    out = built.out
    return (out.nbytes + sum(s.nbytes for s in out.src if s is not None)) // 1024


def _death_dict(e: DeviceDeathError) -> dict:
    return {"message": str(e), "code": e.code, "cause": e.cause, "kind": getattr(e, "kind", None),
            "faulting": e.faulting, "last_enqueued": e.last_enqueued}


def _backend_log(be: Backend, host_lines: list[str], n: int = 6) -> list[str]:
    lines = list(host_lines)
    if hasattr(be, "dsp_log"):
        lines += be.dsp_log()
    return lines[-n:]


def _run_side(built: _Built, be: Backend) -> tuple[_Capture, float]:
    cap = _Capture(built.out)
    sched = Scheduler([be])
    sched.add_hook(cap)
    t0 = time.perf_counter()
    sched.compute(built.graph)
    return cap, (time.perf_counter() - t0) * 1e6


def _output(built: _Built, be: Backend) -> np.ndarray:
    if isinstance(be, RefBackend):
        return np.array(be.value(built.out), dtype=np.float64)
    return np.array(array(built.out), dtype=np.float64)


def run_case(case: Case, backend: BackendSpec | str = "HTP0", seed: int = 0,
             caches: Caches | None = None) -> CaseResult:
    """Run one case in this process: the backend under test, then REF, then the checks."""
    spec = backend if isinstance(backend, BackendSpec) else BackendSpec(backend)
    caches = caches or Caches()
    t0 = time.perf_counter()
    res = CaseResult(case.name, case.op, case.vars, spec.name, OK, seed=seed, max_nmse=threshold(case.op),
                     flops=_flops(case))
    try:
        with np.errstate(all="ignore"):  # overflow in a backend is judged by the checks, not printed
            _run_case(case, spec, seed, caches, res)
    except Exception as e:  # the oracle's own failure (bad parameters, data generation) fails this case only
        res.status, res.reason = FAIL, f"oracle error: {type(e).__name__}: {e}"
    finally:
        res.seconds = time.perf_counter() - t0
    return res


def _run_case(case: Case, spec: BackendSpec, seed: int, caches: Caches, res: CaseResult) -> None:
    host_lines: list[str] = []
    be = spec.make(caches, log=host_lines.append)
    ref = RefBackend(caches.ref)
    tested, oracle = _build(case), _build(case)
    res.memory_kb = _memory_kb(tested)
    for side, b in ((tested, be), (oracle, ref)):
        op = _unsupported(side, b)
        if op is not None:
            res.status, res.reason = NOT_SUPPORTED, f"[{b.name}] {op}"
            return
    data = _Data(case, seed, caches)
    data.materialize(tested)
    try:
        cap, res.time_us = _run_side(tested, be)
    except DeviceDeathError as e:
        res.status, res.reason, res.death = DEATH, _death_reason(e), _death_dict(e)
        res.log = _backend_log(be, host_lines)
        return
    except DeviceOpError as e:
        res.status, res.reason, res.log = FAIL, f"op error: {e}", _backend_log(be, host_lines)
        return
    except Exception as e:  # a backend bug is a failure of this case, not of the sweep
        res.status, res.reason = FAIL, f"exception in {be.name}: {type(e).__name__}: {e}"
        return
    finally:
        be.close()
    if cap.info is not None:
        res.path, res.detail = cap.info.path, _jsonable(cap.info.extra)
    out = _output(tested, be)
    data.materialize(oracle)
    try:
        _run_side(oracle, ref)
        want = _output(oracle, ref)
    except Exception as e:
        res.status, res.reason = REF_INVALID, f"REF raised {type(e).__name__}: {e}"
        return
    v = judge(out, want, threshold(case.op), case.op, be.name)
    res.status, res.reason, res.nmse = v.status, v.reason, v.nmse
    if v.status != OK:
        res.log = _backend_log(be, host_lines)


def case_inputs(case: Case, seed: int = 0, caches: Caches | None = None) -> dict[str, np.ndarray]:
    """The case's leaves as stored (numpy order; raw block bytes for quantized types), by leaf name: exactly what
    run_case feeds both sides with the same seed."""
    built = _build(case)
    data = _Data(case, seed, caches or Caches())
    data.materialize(built)
    out = {}
    for leaf in built.leaves.items:
        t = leaf.tensor
        out[t.name] = np.array(array(t) if t.type in SCALAR_DTYPES else rows(t))
    return out


def reference_output(case: Case, seed: int = 0, caches: Caches | None = None) -> np.ndarray:
    """REF's float64 output for the case (numpy order, shape = ne reversed)."""
    caches = caches or Caches()
    built = _build(case)
    _Data(case, seed, caches).materialize(built)
    ref = RefBackend(caches.ref)
    _run_side(built, ref)
    return _output(built, ref)


def _death_reason(e: DeviceDeathError) -> str:
    cause = f" ({e.cause})" if e.cause else ""
    return f"{e}{cause}"


# ----------------------------------------------------------------------------------------------------------
# sweeps: a pool of forked workers, each dying or hanging one replaced


@dataclass
class SweepResult:
    backend: str
    description: str
    seed: int
    results: list[CaseResult]
    seconds: float = 0.0
    started: str = ""
    interrupted: bool = False

    @property
    def tested(self) -> list[CaseResult]:
        return [r for r in self.results if r.supported]

    @property
    def passed(self) -> list[CaseResult]:
        return [r for r in self.results if r.passed]

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if r.failed]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.interrupted

    def by_status(self, status: str) -> list[CaseResult]:
        return [r for r in self.results if r.status == status]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def summary_lines(self) -> list[str]:
        """test-backend-ops' closing lines: N/M passed, the failing list, the backend verdict."""
        lines = [f"  {len(self.passed)}/{len(self.tested)} tests passed"]
        ns = len(self.results) - len(self.tested)
        if ns:
            lines.append(f"  {ns} not supported by {self.backend} (not counted)")
        if self.failures:
            lines.append("  Failing tests:")
            for r in self.failures:
                lines.append(f"    {r.name}: {r.status} {r.reason}".rstrip())
        if self.interrupted:
            lines.append(f"  interrupted: {len(self.results)} cases run")
        lines.append(f"  Backend {self.backend}: {'OK' if self.ok else 'FAIL'}")
        return lines

    def to_json(self) -> dict:
        return {"backend": self.backend, "description": self.description, "seed": self.seed,
                "started": self.started, "seconds": round(self.seconds, 3), "interrupted": self.interrupted,
                "passed": len(self.passed), "tested": len(self.tested), "counts": self.counts(),
                "ok": self.ok, "results": [r.to_dict() for r in self.results]}

    def csv_rows(self) -> list[dict]:
        commit = build_commit()
        rows_ = []
        for r in self.results:
            rows_.append({
                "test_time": self.started, "build_commit": commit, "backend_name": self.backend,
                "op_name": r.op, "op_params": r.vars, "test_mode": "test", "supported": int(r.supported),
                "passed": int(r.passed), "error_message": "" if r.passed else f"{r.status}: {r.reason}".strip(),
                "time_us": round(r.time_us, 1), "flops": r.flops, "bandwidth_gb_s": "",
                "memory_kb": r.memory_kb, "n_runs": 1, "device_description": self.description,
                "backend_reg_name": self.backend.rstrip("0123456789"),
                "status": r.status, "nmse": "" if r.nmse is None else repr(r.nmse),
                "max_nmse": "" if r.max_nmse is None else repr(r.max_nmse), "seed": r.seed, "path": r.path or ""})
        return rows_

    def write_csv(self, path: str) -> None:
        rows_ = self.csv_rows()
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(CSV_FIELDS))
            w.writeheader()
            w.writerows(rows_)

    def write_json(self, path: str) -> None:
        import json

        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)


CSV_FIELDS = ("test_time", "build_commit", "backend_name", "op_name", "op_params", "test_mode", "supported",
              "passed", "error_message", "time_us", "flops", "bandwidth_gb_s", "memory_kb", "n_runs",
              "device_description", "backend_reg_name", "status", "nmse", "max_nmse", "seed", "path")

_COMMIT: str | None = None


def build_commit() -> str:
    """kazeia's version and git commit (the build_commit field of test-backend-ops' records)."""
    global _COMMIT
    if _COMMIT is None:
        from kazeia import __version__

        try:
            out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=os.path.dirname(os.path.abspath(__file__)), timeout=5)
            sha = out.stdout.strip() if out.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError):
            sha = ""
        _COMMIT = f"{__version__}-{sha}" if sha else __version__
    return _COMMIT


Progress = Callable[[int, int, CaseResult], None]


def run_sweep(cases: list[Case], backend: BackendSpec | str = "HTP0", seed: int = 0, jobs: int = 2,
              timeout: float = DEFAULT_TIMEOUT, progress: Progress | None = None) -> SweepResult:
    """Run every case; jobs >= 1: in that many forked worker processes (a case that kills or hangs its worker is
    reported and the worker replaced); jobs == 0: in this process (no protection against crashes or hangs)."""
    spec = backend if isinstance(backend, BackendSpec) else BackendSpec(backend)
    spec.validate()
    sweep = SweepResult(spec.name, spec.describe(), seed, [],
                        started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    t0 = time.perf_counter()
    results: dict[int, CaseResult] = {}

    def done(i: int, r: CaseResult) -> None:
        results[i] = r
        if progress:
            progress(len(results), len(cases), r)

    try:
        if jobs <= 0:
            caches = Caches()
            for i, c in enumerate(cases):
                done(i, run_case(c, spec, seed, caches))
        else:
            _Pool(spec, seed, min(jobs, max(1, len(cases))), timeout).run(cases, done)
    except KeyboardInterrupt:
        sweep.interrupted = True
    sweep.results = [results[i] for i in sorted(results)]
    sweep.seconds = time.perf_counter() - t0
    return sweep


@dataclass
class _Worker:
    proc: Any
    conn: Any
    log_path: str
    task: tuple[int, Case] | None = None
    deadline: float = 0.0
    key: tuple | None = None


def _worker_main(conn, spec: BackendSpec, seed: int, blas_threads: int | None, log_path: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends its workers
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)  # whatever a case prints must not break the parent's console
    os.dup2(fd, 2)
    if blas_threads:
        with contextlib.suppress(ImportError):
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=blas_threads)
    caches = Caches()
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        i, case = msg
        conn.send((i, run_case(case, spec, seed, caches)))


class _Pool:
    def __init__(self, spec: BackendSpec, seed: int, jobs: int, timeout: float) -> None:
        self.spec, self.seed, self.jobs, self.timeout = spec, seed, jobs, timeout
        self.ctx = mp.get_context("fork")
        self.tmp = tempfile.TemporaryDirectory(prefix="kazeia-oracle-")
        self.n_started = 0
        # more workers than cores make BLAS threads fight; one thread each then
        self.blas_threads = 1 if jobs > 1 else None

    def _spawn(self) -> _Worker:
        parent, child = self.ctx.Pipe()
        self.n_started += 1
        log_path = os.path.join(self.tmp.name, f"worker{self.n_started}.log")
        p = self.ctx.Process(target=_worker_main, args=(child, self.spec, self.seed, self.blas_threads, log_path),
                             daemon=True, name=f"kazeia-oracle-{self.n_started}")
        p.start()
        child.close()
        return _Worker(p, parent, log_path)

    def run(self, cases: list[Case], done: Callable[[int, CaseResult], None]) -> None:
        pending = _group(cases)
        workers = [self._spawn() for _ in range(self.jobs)]
        try:
            while pending or any(w.task for w in workers):
                for w in workers:
                    if w.task is None and pending:
                        self._assign(w, pending, workers)
                busy = [w for w in workers if w.task]
                wait_for = min(w.deadline for w in busy) - time.monotonic()
                mp_wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=max(0.0, wait_for))
                for idx, w in enumerate(workers):
                    if w.task is not None and not self._collect(w, done):
                        workers[idx] = self._spawn()
        finally:
            self._shutdown(workers)

    def _assign(self, w: _Worker, pending: list[tuple[int, Case]], workers: list[_Worker]) -> None:
        # keep a worker on its weight (its caches hold it); else take a weight no other worker is busy with
        held = {x.key for x in workers if x.task is not None}
        pick = next((j for j, (_, c) in enumerate(pending) if w.key is not None and c.weight_key() == w.key), None)
        if pick is None:
            pick = next((j for j, (_, c) in enumerate(pending) if c.weight_key() not in held), 0)
        task = pending.pop(pick)
        w.task, w.key = task, task[1].weight_key()
        w.deadline = time.monotonic() + self.timeout
        with contextlib.suppress(OSError):  # a worker gone between cases: _collect reports it and replaces it
            w.conn.send(task)

    def _collect(self, w: _Worker, done: Callable[[int, CaseResult], None]) -> bool:
        """Handle a busy worker after a wait; False if it is gone (dead or killed) and must be replaced."""
        i, case = w.task
        try:
            if w.conn.poll():
                j, res = w.conn.recv()
                w.task = None
                done(j, res)
                return True
        except (EOFError, OSError):
            pass
        else:
            if w.proc.is_alive():
                if time.monotonic() < w.deadline:
                    return True
                w.proc.kill()
                w.proc.join()
                done(i, self._lost(case, TIMEOUT, f"no result after {self.timeout:g} s (hang); worker killed"))
                w.task = None
                return False
        w.proc.join()
        done(i, self._lost(case, CRASH, f"worker process died ({_exit_text(w.proc.exitcode)})"
                                        f"{_log_tail(w.log_path)}"))
        w.task = None
        return False

    def _lost(self, case: Case, status: str, reason: str) -> CaseResult:
        """The result of a case whose worker never answered."""
        spent = self.timeout if status == TIMEOUT else 0.0
        return CaseResult(case.name, case.op, case.vars, self.spec.name, status, reason, seed=self.seed,
                          max_nmse=threshold(case.op), flops=_flops(case), seconds=spent)

    def _shutdown(self, workers: list[_Worker]) -> None:
        for w in workers:
            with contextlib.suppress(OSError, ValueError):
                if w.task is None:
                    w.conn.send(None)
        for w in workers:
            w.proc.join(timeout=5 if w.task is None else 0)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
            w.conn.close()
        self.tmp.cleanup()


def _group(cases: list[Case]) -> list[tuple[int, Case]]:
    """Pending work, cases of one weight together (in order of first appearance)."""
    first: dict[tuple | None, int] = {}
    for i, c in enumerate(cases):
        first.setdefault(c.weight_key(), i)
    return sorted(enumerate(cases), key=lambda ic: (first[ic[1].weight_key()], ic[0]))


def _exit_text(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _log_tail(path: str, n: int = 2) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [x.rstrip() for x in f.read().splitlines() if x.strip()]
    except OSError:
        return ""
    return (": " + " | ".join(lines[-n:])) if lines else ""


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def now_seed() -> int:
    """A fresh seed for a run that was not given one (printed, so the run can be repeated)."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
