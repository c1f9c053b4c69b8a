"""Which rows: delta debugging over the rows of an op's activation, on a dumped op replayed alone."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from kazeia.backends.devices import device_name
from kazeia.debug.bisect.judges import FAIL, OTHER, PASS, Outcome, classify, could_be_numeric, first_line
from kazeia.debug.bisect.state import SearchState, step_line, table
from kazeia.debug.judge import judge
from kazeia.errors import KazeiaError
from kazeia.limits import safe_regex

# replay(rows_subset [m, K], indices into the original rows or None for synthetic values) -> verdict
Replay = Callable[[np.ndarray, "list[int] | None"], Outcome]


@dataclass
class RowsResult:
    verdict: str  # found | full-passes
    message: str
    minimal: list[int]  # row indices of the minimal failing subset (into the original rows)
    n_rows: int
    depends_on: str | None  # "row count" | "values" | None
    method: str = ""  # "row count" (prefix bisection after the value checks) or "ddmin"
    value_checks: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    runs: int = 0
    new_runs: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _rows_key(idx: list[int]) -> str:
    """A compact, exact key for a subset: runs of consecutive indices as a-b."""
    parts, i = [], 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        parts.append(str(idx[i]) if i == j else f"{idx[i]}-{idx[j]}")
        i = j + 1
    return "rows=" + ",".join(parts)


def ddmin(items: list[int], fails: Callable[[list[int]], bool]) -> list[int]:
    """Zeller's delta debugging: a 1-minimal failing subset of `items` (which must fail as a whole): removing
    any single item from the result makes it pass. Subsets keep the original order."""
    c = list(items)
    n = 2
    while len(c) >= 2:
        chunks = _split(c, n)
        reduced = False
        for ch in chunks:  # a chunk alone fails: keep only it
            if fails(ch):
                c, n, reduced = ch, 2, True
                break
        if not reduced:
            for ch in chunks:  # the rest without a chunk fails: drop the chunk
                drop = set(ch)
                comp = [x for x in c if x not in drop]
                if fails(comp):
                    c, n, reduced = comp, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(c):
                break
            n = min(len(c), 2 * n)
    return c


def _split(c: list[int], n: int) -> list[list[int]]:
    n = min(n, len(c))
    k, r = divmod(len(c), n)
    out, start = [], 0
    for i in range(n):
        size = k + (1 if i < r else 0)
        out.append(c[start:start + size])
        start += size
    return out


def ddmin_rows(rows: np.ndarray, replay: Replay, state_path: str | None = None, config: dict | None = None,
               max_steps: int | None = None, seed: int = 0, shortcut: bool = True,
               log: Callable[[str], None] | None = None) -> RowsResult:
    """Minimal failing subset of the rows of an op's activation (`rows`: [n_rows, K], what src1 held).

    With `shortcut`, the values are tested first: if all-zero rows and random rows (same count, same scale)
    fail like the real ones, the failure looks value-independent and the smallest failing row count is found
    by bisection over prefixes (O(log n) replays, confirmed with zeros and random rows at that count);
    otherwise, or if the confirmation fails, ddmin (Zeller) reduces the real rows, and the same value checks
    are made on its result. Every replay is a resumable step (see SearchState)."""
    rows = np.asarray(rows)
    n_rows = int(rows.shape[0])
    state = SearchState(state_path, "rows", config or {"n_rows": n_rows}, max_steps)
    scale = float(np.nanstd(rows.astype(np.float64))) if rows.size else 1.0
    scale = scale if np.isfinite(scale) and scale > 0 else 1.0

    def probe(key: str, data: Callable[[], np.ndarray], idx: list[int] | None, **info) -> dict:
        step = state.probe(key, lambda: replay(data(), idx), **info)
        if log:
            log(step_line(step))
        return step

    def fails(idx: list[int]) -> bool:
        return probe(_rows_key(idx), lambda: rows[idx], idx, rows=len(idx))["outcome"] == FAIL

    def value_checks(m: int) -> list[dict]:
        rng = np.random.default_rng(seed + m)
        return [probe(f"zeros={m}", lambda: np.zeros((m, *rows.shape[1:]), rows.dtype), None, rows=m,
                      values="zeros"),
                probe(f"random={m}/{seed}",
                      lambda: (rng.standard_normal((m, *rows.shape[1:])) * scale).astype(rows.dtype), None,
                      rows=m, values="random")]

    def result(verdict: str, message: str, minimal: list[int], depends: str | None, method: str,
               checks: list[dict]) -> RowsResult:
        state.result = {"verdict": verdict, "minimal": minimal, "depends_on": depends, "method": method}
        state.save()
        return RowsResult(verdict, message, minimal, n_rows, depends, method, checks, list(state.steps),
                          len(state.steps), state.new_steps)

    everything = list(range(n_rows))
    if not fails(everything):
        return result("full-passes", "the replay with all rows does not fail: nothing to reduce", [], None, "", [])
    if shortcut and all(c["outcome"] == FAIL for c in value_checks(n_rows)):
        lo, hi = 0, n_rows  # a prefix of lo rows passes (0 rows: nothing to run), of hi rows fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fails(everything[:mid]):
                hi = mid
            else:
                lo = mid
        checks = value_checks(hi)
        if all(c["outcome"] == FAIL for c in checks):
            minimal = everything[:hi]
            return result("found", f"the failure depends on the row count only: any {hi} of the {n_rows} rows "
                                   f"fail (the first {hi}, {hi} zero rows and {hi} random rows all fail; "
                                   f"{hi - 1} rows pass)", minimal, "row count", "row count", checks)
    minimal = ddmin(everything, fails)
    m = len(minimal)
    checks = value_checks(m)
    count_only = all(c["outcome"] == FAIL for c in checks)
    why = ("the row count only (zeros and random rows of the same count fail too)" if count_only
           else "the values")
    msg = f"minimal failing subset: {m} of {n_rows} rows ({_rows_key(minimal)[5:]}); it depends on {why}"
    return result("found", msg, minimal, "row count" if count_only else "values", "ddmin", checks)


# --- wiring to op dumps (kazeia.debug.dump / kazeia.debug.replay) ---


ROW_WISE_OPS = frozenset({"MUL_MAT"})  # output row i depends only on src1 row i: a subset's reference is a slice


def _with_rows(dump, values: np.ndarray):
    """The dump with src1 replaced by `values` (ne3, ne2, m, ne0) and the output shrunk to m rows."""
    from kazeia.debug.dump import TensorRecord

    m = int(values.shape[2])

    def shrink(meta: dict) -> dict:
        ne, nb = list(meta["ne"]), list(meta["nb"])
        ne[1] = m
        nb[2] = nb[1] * ne[1]
        nb[3] = nb[2] * ne[2]
        return dict(meta, ne=ne, nb=nb)

    src1 = dump.sources[1]
    sources = list(dump.sources)
    sources[1] = TensorRecord(shrink(src1.meta), np.ascontiguousarray(values))  # gap bytes (span) dropped
    manifest = dict(dump.manifest, node=shrink(dump.node))
    return replace(dump, manifest=manifest, sources=sources, output=None, output_before=None)


def dump_rows_replay(dump, device: str | None = None, htp_profile: str | None = None, vtcm: int | None = None,
                     faults: list[str] | None = None, env: dict[str, str] | None = None,
                     fail_regex: str | None = None) -> tuple[np.ndarray, Replay, dict]:
    """(rows, replay, config) for `ddmin_rows` from a dumped op (a `kazeia.debug.dump.Dump` or its path).

    The op runs alone (fresh device, as `kazeia replay` does) with src1 cut to the chosen rows; it fails if
    the device dies or errs, or its output misses the float64 reference by more than the op's threshold (for
    row-wise ops the reference of a subset is the matching slice of the full one, computed once)."""
    from kazeia.debug import replay as R
    from kazeia.debug.dump import Dump, load_dump
    from kazeia.debug.replay.alone import run_alone

    if not isinstance(dump, Dump):
        dump = load_dump(dump)
    if len(dump.sources) < 2 or dump.sources[1] is None or dump.sources[1].values is None:
        raise KazeiaError(f"{dump.id}: the op has no dumped src1 to reduce")
    vals = dump.sources[1].values
    if vals.ndim != 4 or vals.shape[0] != 1 or vals.shape[1] != 1 or dump.sources[1].type.name not in ("F32", "F16"):
        raise KazeiaError(f"{dump.id}: src1 must be a 2-D float matrix of rows (got {dump.sources[1].meta['type']}"
                          f"{dump.sources[1].meta['ne']})")
    if dump.node["ne"][1] != vals.shape[2]:
        raise KazeiaError(f"{dump.id}: the output does not have one row per src1 row: rows cannot be reduced")
    dev = device_name(device or dump.backend)
    settings = R.htp_settings_for(dump, htp_profile, vtcm, faults, env) if dev == "HTP0" else None
    regex = safe_regex(fail_regex, "--fail-regex") if fail_regex else None
    needs_ref = could_be_numeric(regex, dump.op)
    thr = R.dump_threshold(dump)
    full_ref: list[np.ndarray] = []

    def reference(variant, idx: list[int] | None) -> np.ndarray | None:
        if idx is not None and dump.op in ROW_WISE_OPS:
            if not full_ref:
                ex = run_alone(dump, "REF", None, mode="reference")
                if ex.output is None:
                    return None
                full_ref.append(ex.output)
            return full_ref[0][:, :, idx]
        return run_alone(variant, "REF", None, mode="reference").output

    def replay(sub: np.ndarray, idx: list[int] | None) -> Outcome:
        t0 = time.perf_counter()
        variant = _with_rows(dump, np.asarray(sub)[None, None])
        ex = run_alone(variant, dev, settings)
        if ex.died is not None or ex.error is not None or ex.status is not None:
            text = "\n".join(str(x) for x in (ex.verdict(), (ex.died or {}).get("message"), ex.error) if x)
            return Outcome(classify(text, regex), first_line(text), time.perf_counter() - t0)
        if not needs_ref:
            return Outcome(PASS, "ok (death check only)", time.perf_counter() - t0)
        ref = reference(variant, idx)
        if ref is None:
            return Outcome(OTHER, "the float64 reference could not run", time.perf_counter() - t0)
        c = judge(ex.output, ref, thr, op=dump.op, name_a=dev)
        if c.reference_invalid:
            return Outcome(OTHER, c.reason, time.perf_counter() - t0)
        if not c.ok:
            return Outcome(classify(c.reason, regex), c.short(), time.perf_counter() - t0)
        return Outcome(PASS, f"ok ({c.reason})", time.perf_counter() - t0)

    config = {"dump": dump.id, "digest": dump.manifest.get("digest"), "device": dev,
              "settings": None if settings is None else {k: str(v) for k, v in asdict(settings).items()},
              "fail_regex": fail_regex}
    return np.asarray(vals[0, 0]), replay, config


def bisect_rows(dump, device: str | None = None, htp_profile: str | None = None, vtcm: int | None = None,
                faults: list[str] | None = None, fail_regex: str | None = None, state_path: str | None = None,
                max_steps: int | None = None, shortcut: bool = True, seed: int = 0,
                log: Callable[[str], None] | None = None) -> RowsResult:
    """`ddmin_rows` on a dumped op (a Dump or its path): see `dump_rows_replay` for how a subset is judged."""
    rows, replay, config = dump_rows_replay(dump, device, htp_profile, vtcm, faults, fail_regex=fail_regex)
    return ddmin_rows(rows, replay, state_path, config, max_steps, seed=seed, shortcut=shortcut, log=log)


def format_rows(res: RowsResult) -> str:
    lines = [res.message, f"runs: {res.runs} replay(s); this invocation ran {res.new_runs}", ""]
    lines.append(table(["step", "rows", "outcome", "detail"],
                       [[s["step"], s["key"], s["outcome"], s["detail"]] for s in res.steps]))
    return "\n".join(lines)
