"""A sweep's result: test-backend-ops' summary lines, and its records as JSON and CSV."""

from __future__ import annotations

import csv
import os
import subprocess
from dataclasses import dataclass

from kazeia.debug.oracle.verdicts import CaseResult
from kazeia.outputs import atomic_write


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
        with atomic_write(path) as f:
            w = csv.DictWriter(f, fieldnames=list(CSV_FIELDS))
            w.writeheader()
            w.writerows(rows_)

    def write_json(self, path: str) -> None:
        import json

        with atomic_write(path) as f:
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
