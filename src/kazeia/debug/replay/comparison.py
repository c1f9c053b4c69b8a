"""Judging a replayed output against the float64 reference or the recorded output, as test-backend-ops does."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from kazeia.debug.dump import Dump
from kazeia.debug.stats import max_errors, nmse
from kazeia.debug.thresholds import op_threshold


def dump_threshold(dump: Dump) -> float:
    """The op's NMSE threshold (kazeia.debug.thresholds); a conversion when src0 is missing or of another type."""
    src0 = dump.sources[0] if dump.sources else None
    return op_threshold(dump.op, converts=src0 is None or src0.meta["type"] != dump.node["type"])


@dataclass
class Comparison:
    """a (under test) against b (reference or recorded output)."""

    against: str  # "ref" or "recorded output"
    threshold: float
    ok: bool
    reason: str
    identical: bool = False
    nmse: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    nan_a: int = 0
    nan_b: int = 0
    inf_mismatch: int = 0
    reference_invalid: bool = False

    def short(self) -> str:
        if self.identical:
            return "identical"
        s = self.reason
        if self.nmse is not None and "NMSE" not in s:
            s += f", NMSE {self.nmse:.3g}"
        if self.max_abs is not None:
            s += f", max abs err {self.max_abs:.3g}"
        return s

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                for k, v in dataclasses.asdict(self).items()}


def compare(a: np.ndarray, b: np.ndarray, threshold: float, against: str = "ref") -> Comparison:
    """NaN check first (a NaN in the reference makes it invalid, never the backend's fault), then the inf sign
    check, then NMSE over the finite positions against the threshold."""
    if a.shape != b.shape:
        return Comparison(against, threshold, False, f"shape {list(a.shape)} differs from {list(b.shape)}")
    if a.dtype.kind != "f" or b.dtype.kind != "f":  # raw bytes: exact or not
        same = bool(np.array_equal(a, b))
        return Comparison(against, threshold, same, "identical bytes" if same else "bytes differ", identical=same)
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    identical = bool(np.array_equal(a, b, equal_nan=True))
    nan_a, nan_b = int(np.isnan(a).sum()), int(np.isnan(b).sum())
    c = Comparison(against, threshold, False, "", identical=identical, nan_a=nan_a, nan_b=nan_b)
    fin = np.isfinite(a) & np.isfinite(b)
    if fin.any():
        c.nmse = nmse(a[fin], b[fin])
        c.max_abs, c.max_rel = max_errors(a[fin], b[fin])
    if nan_b and against == "ref":
        c.reference_invalid = True
        c.reason = f"reference invalid ({nan_b} NaN in the float64 reference)"
        return c
    if nan_a or nan_b:
        c.reason = f"{nan_a} NaN in the output" + (f", {nan_b} in the {against}" if nan_b else "")
        c.ok = identical
        return c
    ia, ib = np.isinf(a), np.isinf(b)
    bad_inf = (ia | ib) & ~(ia & ib & (np.sign(a) == np.sign(b)))
    c.inf_mismatch = int(bad_inf.sum())
    if c.inf_mismatch:
        c.reason = f"{c.inf_mismatch} inf values differ from the {against}"
        return c
    e = c.nmse or 0.0
    c.ok = e <= threshold
    c.reason = f"NMSE {e:.3g} {'<=' if c.ok else '>'} {threshold:.3g}"
    return c
