"""Statuses, the test-backend-ops checks on one output, and the result of one case."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from kazeia.debug.json_safe import json_safe
from kazeia.debug.stats import nmse

FLT_MAX = float(np.finfo(np.float32).max)

OK = "OK"
FAIL = "FAIL"
DEATH = "DEVICE DEATH"
CRASH = "CRASH"  # the worker process died (not a device death: the interpreter itself)
TIMEOUT = "TIMEOUT"
NOT_SUPPORTED = "not supported"
REF_INVALID = "reference invalid"
FAILED_STATUSES = (FAIL, DEATH, CRASH, TIMEOUT, REF_INVALID)


@dataclass
class Verdict:
    status: str
    reason: str = ""
    nmse: float | None = None


def judge(a: np.ndarray, b: np.ndarray, max_err: float, op: str = "", name_a: str = "backend") -> Verdict:
    """test-backend-ops' callback checks, in order. a = backend under test, b = reference (float64). NaN in b ->
    reference invalid; NaN in a -> FAIL; an infinity (|x| >= FLT_MAX) must be matched by one of the same sign;
    then NMSE over the rest vs max_err."""
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
    err = nmse(a[~inf_a], b[~inf_a])
    if err > max_err:
        return Verdict(FAIL, f"[{op}] ERR = {err:.9f} > {max_err:.9f}", err)
    return Verdict(OK, "", err)


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
            d[k] = json_safe(d[k])
        return d
