"""Statuses and the result of one case; the output itself is judged by kazeia.debug.judge."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kazeia.debug.json_safe import json_safe
from kazeia.debug.judge import FAIL, OK, REF_INVALID

DEATH = "DEVICE DEATH"
CRASH = "CRASH"  # the worker process died (not a device death: the interpreter itself)
TIMEOUT = "TIMEOUT"
NOT_SUPPORTED = "not supported"
FAILED_STATUSES = (FAIL, DEATH, CRASH, TIMEOUT, REF_INVALID)


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
    outputs: dict = field(default_factory=dict)  # backend name -> {n, nan, inf, amax} of its output

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
