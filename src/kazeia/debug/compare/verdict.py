"""Row statuses and the element-wise verdict of test-backend-ops (NaN, then inf, then NMSE)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kazeia.debug.stats import max_errors

MODES = ("cumulative", "isolated")

# row statuses
OK, FAIL, DRIFT, REF_INVALID, DEATH = "OK", "FAIL", "DRIFT", "REF-INVALID", "DEATH"


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
