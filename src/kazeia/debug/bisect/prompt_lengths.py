"""Which prompt lengths: the smallest and largest failing M around a failing one, or the confirmation of a
predicted range."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from kazeia.debug.bisect.judges import FAIL, Judge
from kazeia.debug.bisect.state import SearchState, spec_config, step_line, table
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError


@dataclass
class MResult:
    verdict: str  # found | confirmed | no-failure
    message: str
    smallest: int | None
    largest: int | None
    largest_capped: bool  # the largest failing M reached the search limit
    confirmed: bool | None  # predicted range: confirmed (True), refuted (False), not asked (None)
    steps: list[dict]
    runs: int
    new_runs: int
    reference_runs: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def bisect_m(spec: RunSpec, judge: Judge, fail_m: int | None = None, pass_m: int = 1, limit: int = 1024,
             predicted: tuple[int, int] | None = None, state_path: str | None = None,
             max_steps: int | None = None, log: Callable[[str], None] | None = None) -> MResult:
    """The smallest and largest failing prompt length around `fail_m` (default: the spec's --n-prompt).

    Below: from `pass_m` (halved while it fails) binary search up to the boundary. Above: double from the
    failing M until a run passes or `limit` (capped by the context) is reached, then binary search. With
    `predicted=(lo, hi)` only M-1, M, M+1 at both ends are run; if they do not show exactly that range the
    full search continues from what they showed. The memo is shared: steps already run are never rerun."""
    base = spec.with_(prompt=None, tokens=None, n_prompt=None)
    limit = max(1, min(limit, spec.ctx))
    config = {"spec": spec_config(base), "judge": judge.describe()}
    state = SearchState(state_path, "m", config, max_steps)

    def fails(m: int) -> bool:
        step = state.probe(f"m={m}", lambda: judge(base.with_(n_prompt=m)), m=m)
        if log:
            log(step_line(step))
        return step["outcome"] == FAIL

    def result(verdict: str, message: str, lo: int | None, hi: int | None, capped: bool = False,
               confirmed: bool | None = None) -> MResult:
        state.result = {"verdict": verdict, "smallest": lo, "largest": hi, "confirmed": confirmed}
        state.save()
        return MResult(verdict, message, lo, hi, capped, confirmed, list(state.steps), len(state.steps),
                       state.new_steps, getattr(judge, "reference_runs", 0))

    confirmed = None
    if predicted is not None:
        lo, hi = predicted
        if not 1 <= lo <= hi <= limit:
            raise KazeiaError(f"predicted range {lo}..{hi} is not within 1..{limit}")
        if _confirm(fails, lo, hi, limit):
            passing = [str(m) for m in (lo - 1, hi + 1) if 1 <= m <= limit]
            edge = f"{' and '.join(passing)} pass" if passing else "no other M to try"
            capped = f" (the largest M tried is {limit})" if hi == limit else ""
            return result("confirmed", f"predicted range confirmed: M = {lo}..{hi} fail, {edge}{capped}",
                          lo, hi, confirmed=True)
        confirmed = False
        if fail_m is None:  # search from a failing point the confirmation found
            fail_m = next((s["m"] for s in state.steps if s["outcome"] == FAIL), None)
    if fail_m is None:
        fail_m = spec.n_prompt
    if fail_m is None:
        raise KazeiaError("bisect m needs a failing prompt length: --n-prompt M (or --fail M)")
    if not fails(fail_m):
        return result("no-failure", f"M={fail_m} does not fail: give a failing --n-prompt", None, None,
                      confirmed=confirmed)
    smallest = _lower_boundary(fails, min(pass_m, fail_m - 1) if fail_m > 1 else 0, fail_m)
    largest, capped = _upper_boundary(fails, fail_m, limit)
    pre = "predicted range refuted; " if confirmed is False else ""
    above = f"{largest} (the limit {limit}: larger M not tried)" if capped else f"{largest}"
    return result("found", f"{pre}failing prompt lengths: smallest M = {smallest}, largest M = {above}",
                  smallest, largest, capped, confirmed)


def _confirm(fails: Callable[[int], bool], lo: int, hi: int, limit: int) -> bool:
    expect: dict[int, bool] = {}
    for m in (lo - 1, lo, lo + 1, hi - 1, hi, hi + 1):
        if 1 <= m <= limit:
            expect[m] = lo <= m <= hi
    for m, want in sorted(expect.items()):
        if fails(m) != want:
            return False
    return True


def _lower_boundary(fails: Callable[[int], bool], p: int, f: int) -> int:
    """Smallest failing M of the failing run containing f; p < f is a first guess at a passing M (0 = none)."""
    while p >= 1 and fails(p):  # the guess fails too: look further down
        f, p = p, p // 2
    while f - p > 1:  # p passes (or is 0), f fails
        mid = (p + f) // 2
        if fails(mid):
            f = mid
        else:
            p = mid
    return f


def _upper_boundary(fails: Callable[[int], bool], f: int, limit: int) -> tuple[int, bool]:
    p = None
    while p is None:
        nxt = min(2 * f, limit)
        if nxt <= f:
            return f, True
        if fails(nxt):
            f = nxt
        else:
            p = nxt
    while p - f > 1:
        mid = (p + f) // 2
        if fails(mid):
            f = mid
        else:
            p = mid
    return f, False


def format_m(res: MResult) -> str:
    lines = [res.message, f"runs: {res.runs} step(s) (+{res.reference_runs} reference run(s)); this invocation "
                          f"ran {res.new_runs}", ""]
    lines.append(table(["step", "M", "outcome", "seconds", "detail"],
                       [[s["step"], s["m"], s["outcome"], f"{s['seconds']:.1f}", s["detail"]] for s in res.steps]))
    return "\n".join(lines)
