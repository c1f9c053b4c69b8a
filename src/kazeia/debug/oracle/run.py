"""Running one case in this process: the backend under test, then REF, then the checks."""

from __future__ import annotations

import time

import numpy as np

from kazeia.backends.base import Backend, Hook, OpInfo
from kazeia.backends.ref import RefBackend
from kazeia.debug.json_safe import json_safe
from kazeia.debug.judge import judge, node_threshold
from kazeia.debug.oracle.backends import BackendSpec, Caches
from kazeia.debug.oracle.cases import Case
from kazeia.debug.oracle.inputs import Leaf, leaf_values, seed32, write_values
from kazeia.debug.oracle.ops import BuiltCase, build_case
from kazeia.debug.oracle.verdicts import DEATH, FAIL, NOT_SUPPORTED, OK, REF_INVALID, CaseResult
from kazeia.debug.tensors import logical_values
from kazeia.engine.scheduler import Scheduler
from kazeia.errors import DeviceDeathError, DeviceOpError
from kazeia.graph.alloc import GraphAllocator
from kazeia.graph.tensor import Buffer, Tensor, array, type_name


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


def _unsupported(built: BuiltCase, be: Backend) -> str | None:
    for n in built.graph.nodes:
        if n.is_computed and not be.supports(n):
            return n.desc()
    return None


class _Data:
    """The case's input values, generated once and written identically into both sides' graphs; `given` values
    (by leaf name, numpy order) replace the random ones (a replayed capture)."""

    def __init__(self, case: Case, seed: int, caches: Caches, given: dict[str, np.ndarray] | None = None) -> None:
        self.case, self.seed, self.caches = case, seed, caches
        self.values: dict[str, np.ndarray] = dict(given or {})

    def materialize(self, built: BuiltCase) -> None:
        for leaf in built.leaves.items:
            t = leaf.tensor
            if leaf.init[0] in ("weight", "extreme"):
                t.buffer, t.offset = self._weight(leaf), 0
            elif leaf.own_buffer:
                t.buffer, t.offset = Buffer.zeros(t.name, t.nbytes), 0
        GraphAllocator(f"oracle:{self.case.op}").allocate(built.graph)
        for leaf in built.leaves.items:
            if leaf.init[0] not in ("weight", "extreme"):
                write_values(leaf.tensor, self.value(leaf))

    def _weight(self, leaf: Leaf) -> Buffer:
        t = leaf.tensor
        key = (type_name(t.type), t.ne, self.seed, leaf.init[0])
        rng = np.random.default_rng(seed32(self.seed, "weight", key[0], key[1], *key[3:]))
        return self.caches.weight_buffer(key, lambda: leaf_values(leaf, rng))

    def value(self, leaf: Leaf) -> np.ndarray:
        name = leaf.tensor.name
        if name not in self.values:
            rng = np.random.default_rng(seed32(self.seed, self.case.name, name))
            self.values[name] = leaf_values(leaf, rng)
        return self.values[name]


def case_flops(c: Case) -> int:
    if c.op == "MUL_MAT":
        bs, nr = c.get("bs", (1, 1)), c.get("nr", (1, 1))
        return 2 * c["m"] * c["n"] * c["k"] * bs[0] * nr[0] * bs[1] * nr[1]
    if c.op == "FLASH_ATTN_EXT":
        return 2 * c["nh"] * c["nr"] * c["nb"] * 2 * c["hs"] * c["kv"]
    return 0


def _memory_kb(built: BuiltCase) -> int:
    out = built.out
    return (out.nbytes + sum(s.nbytes for s in out.src if s is not None)) // 1024


def _backend_log(be: Backend, host_lines: list[str], n: int = 6) -> list[str]:
    lines = list(host_lines)
    if hasattr(be, "dsp_log"):
        lines += be.dsp_log()
    return lines[-n:]


def _run_side(built: BuiltCase, be: Backend) -> tuple[_Capture, float]:
    cap = _Capture(built.out)
    sched = Scheduler([be])
    sched.add_hook(cap)
    t0 = time.perf_counter()
    sched.compute(built.graph)
    sched.synchronize()
    return cap, (time.perf_counter() - t0) * 1e6


def _output(built: BuiltCase, be: Backend) -> np.ndarray:
    if isinstance(be, RefBackend):
        return np.array(be.value(built.out), dtype=np.float64)
    return np.array(array(built.out), dtype=np.float64)


def case_threshold(case: Case) -> float:
    """The NMSE threshold of the case's op node (kazeia.debug.judge.node_threshold: a CPY to F16 converts)."""
    return node_threshold(build_case(case).out)


def run_case(case: Case, backend: BackendSpec | str = "HTP0", seed: int = 0,
             caches: Caches | None = None, values: dict[str, np.ndarray] | None = None) -> CaseResult:
    """Run one case in this process: the backend under test, then REF, then the checks. `values`: leaf values to
    use instead of random ones (leaf name -> numpy-order array, e.g. {"b": a captured activation})."""
    spec = backend if isinstance(backend, BackendSpec) else BackendSpec(backend)
    caches = caches or Caches()
    t0 = time.perf_counter()
    res = CaseResult(case.name, case.op, case.vars, spec.name, OK, seed=seed, flops=case_flops(case))
    try:
        with np.errstate(all="ignore"):  # overflow in a backend is judged by the checks, not printed
            _run_case(case, spec, seed, caches, res, values)
    except Exception as e:  # the oracle's own failure (bad parameters, data generation) fails this case only
        res.status, res.reason = FAIL, f"oracle error: {type(e).__name__}: {e}"
    finally:
        res.seconds = time.perf_counter() - t0
    return res


def _run_case(case: Case, spec: BackendSpec, seed: int, caches: Caches, res: CaseResult,
              values: dict[str, np.ndarray] | None = None) -> None:
    host_lines: list[str] = []
    be = spec.make(caches, log=host_lines.append)
    ref = RefBackend(caches.ref)
    tested, oracle = build_case(case), build_case(case)
    res.max_nmse = node_threshold(tested.out)
    res.memory_kb = _memory_kb(tested)
    for side, b in ((tested, be), (oracle, ref)):
        op = _unsupported(side, b)
        if op is not None:
            res.status, res.reason = NOT_SUPPORTED, f"[{b.name}] {op}"
            return
    data = _Data(case, seed, caches, values)
    data.materialize(tested)
    try:
        cap, res.time_us = _run_side(tested, be)
    except DeviceDeathError as e:
        res.status, res.reason, res.death = DEATH, _death_reason(e), e.to_dict()
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
        res.path, res.detail = cap.info.path, json_safe(cap.info.extra)
    out = _output(tested, be)
    res.outputs = {be.name: _finiteness(out)}
    data.materialize(oracle)
    try:
        _run_side(oracle, ref)
        want = _output(oracle, ref)
        res.outputs["REF"] = _finiteness(want)
    except Exception as e:
        res.status, res.reason = REF_INVALID, f"REF raised {type(e).__name__}: {e}"
        return
    v = judge(out, want, res.max_nmse, op=case.op, name_a=be.name)
    res.status, res.reason, res.nmse = v.status, v.reason, v.nmse
    if v.status != OK:
        res.log = _backend_log(be, host_lines)


def case_inputs(case: Case, seed: int = 0, caches: Caches | None = None) -> dict[str, np.ndarray]:
    """The case's leaves as stored (numpy order; raw block bytes for quantized types), by leaf name: exactly what
    run_case feeds both sides with the same seed."""
    built = build_case(case)
    data = _Data(case, seed, caches or Caches())
    data.materialize(built)
    out = {}
    for leaf in built.leaves.items:
        t = leaf.tensor
        out[t.name] = logical_values(t)
    return out


def reference_output(case: Case, seed: int = 0, caches: Caches | None = None) -> np.ndarray:
    """REF's float64 output for the case (numpy order, shape = ne reversed)."""
    caches = caches or Caches()
    built = build_case(case)
    _Data(case, seed, caches).materialize(built)
    ref = RefBackend(caches.ref)
    _run_side(built, ref)
    return _output(built, ref)


def _finiteness(a: np.ndarray) -> dict:
    """How many of an output's values are NaN or infinite, and the largest finite magnitude."""
    fin = a[np.isfinite(a)]
    return {"n": int(a.size), "nan": int(np.isnan(a).sum()), "inf": int(np.isinf(a).sum()),
            "amax": float(np.abs(fin).max()) if fin.size else 0.0}


def _death_reason(e: DeviceDeathError) -> str:
    cause = f" ({e.cause})" if e.cause else ""
    return f"{e}{cause}"


def run_case_on(case: Case, backend: Backend, seed: int = 0, caches: Caches | None = None) -> Tensor:
    """Build the case with its seeded inputs and compute it on `backend` (an existing device, whose state it
    then leaves behind: the forensic experiments run it before the op they study); returns the case's output."""
    built = build_case(case)
    _Data(case, seed, caches or Caches()).materialize(built)
    with np.errstate(all="ignore"):
        _run_side(built, backend)
    return built.out
