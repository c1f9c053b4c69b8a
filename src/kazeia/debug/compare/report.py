"""The comparison report: rows per mode, deaths, the first failure; as JSON, as a table, as summary lines."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from kazeia.debug.compare.rows import OpRow
from kazeia.debug.compare.verdict import DRIFT, MODES, OK, REF_INVALID
from kazeia.debug.json_safe import json_safe
from kazeia.debug.judge import WHOLE_MODEL_NMSE
from kazeia.engine.session import RunSpec


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
        """No op out of tolerance and, where the logits were judged, within the whole-model bound (a drift that
        takes them past it is wrong numbers with no faulting op: `drift`)."""
        return all(not self.failures(m) for m in self.modes) and not self.drift

    @property
    def drift(self) -> list[str]:
        """The modes whose logits are past the whole-model bound (or not finite) with no op out of tolerance."""
        return [m for m in self.modes if not self.failures(m) and (lg := self.logits_nmse.get(m)) is not None
                and not lg <= WHOLE_MODEL_NMSE]

    @property
    def exit_status(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict:
        """A JSON-ready dict (non-finite numbers as the strings "inf", "-inf", "nan")."""
        ff = self.first_failure
        return json_safe({
            "spec": asdict(self.spec),
            "command": compare_command(self.spec, self.modes, self.strict),
            "modes": list(self.modes),
            "n_tokens": self.n_tokens,
            "ok": self.ok,
            "first_failure": ff.to_dict() if ff else None,
            "first_failure_by_mode": {m: (f.to_dict() if (f := self.first_failure_in(m)) else None)
                                      for m in self.modes},
            "logits_nmse": {m: v for m, v in self.logits_nmse.items()},
            "whole_model_threshold": WHOLE_MODEL_NMSE,
            "strict": self.strict,
            "deaths": self.deaths,
            "not_run": self.not_run,
            "rows": {m: [r.to_dict() for r in rs] for m, rs in self.rows.items()},
        })


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


# the upstream code each device path's numerics transcribe (as cited where kazeia models them)
UPSTREAM_CODE = {("MUL_MAT", "hvx"): "matmul-ops.c: op_matmul_hvx, src1 converted to the HVX blocks",
                 ("MUL_MAT", "hmx"): "matmul-ops.c: op_matmul's HMX kernel, fp16 tiles",
                 ("FLASH_ATTN_EXT", "hmx"): "the HMX flash attention's fp16 tiles"}


def drift_source(report: CompareReport) -> str | None:
    """For a drift (logits past the bound, no op out of tolerance): the op class whose own error, on REF's inputs,
    is largest (isolated mode), each op within its threshold: upstream numerics as kazeia models them, the code
    named. None without isolated rows."""
    rows = [r for r in report.rows.get("isolated", []) if r.nmse is not None and math.isfinite(r.nmse)]
    if not rows:
        return None
    by: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        by.setdefault((r.op, f"{r.backend}/{r.path}"), []).append(r.nmse)
    (op, where), errs = max(by.items(), key=lambda kv: max(kv[1]))
    path = where.rsplit("/", 1)[-1]
    code = UPSTREAM_CODE.get((op, path))
    return (f"upstream numerics, modelled: the largest error on REF's inputs is {op} on {where} ({len(errs)} ops, NMSE "
            f"up to {max(errs):.3g}, each within its threshold)" + (f"; the code: {code}" if code else ""))


def summary_lines(report: CompareReport) -> list[str]:
    out = [f"compared {report.spec.device} against REF on {report.n_tokens} prompt tokens: "
           f"{compare_command(report.spec, report.modes, report.strict)}"]
    for m in report.modes:
        rows = report.rows.get(m, [])
        f = report.first_failure_in(m)
        n_fail = len(report.failures(m))
        if m == "cumulative":
            lg = report.logits_nmse.get(m)
            verdict = "-" if lg is None else ("OK" if lg <= WHOLE_MODEL_NMSE else "FAIL")
            out.append(f"cumulative: logits NMSE {_fmt(lg).strip()} (whole-model threshold "
                       f"{WHOLE_MODEL_NMSE:g}): {verdict}; {sum(r.status == DRIFT for r in rows)} ops drift past "
                       f"their per-op threshold after their inputs had drifted")
        if f is None:
            out.append(f"{m}: no op out of tolerance ({len(rows)} ops compared)")
        else:
            out.append(f"{m}: {n_fail} op(s) out of tolerance; first: {f.label()}: {f.reason}"
                       + (f" [minimum required tolerance {_fmt(f.min_tolerance).strip()}]" if f.nmse is not None
                          and math.isfinite(f.nmse) else ""))
            if f.extra.get("signature"):
                out.append(f"{m}: error signature of {f.name}: {f.extra['signature']}")
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
