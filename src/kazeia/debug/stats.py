"""NaN-aware tensor statistics, read through ne/nb (never `nbytes` from the start).

The original team's amax skipped NaN (`v > amax` is false for NaN), so a NaN-filled activation read as
harmless. Here amax is over finite values only and NaN, +inf, -inf and zeros are counted separately, so a
non-finite value can never hide.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import numpy as np

from kazeia.graph.tensor import SCALAR_DTYPES, Tensor, array, rows


@dataclass
class Stats:
    n: int
    amax: float  # max |x| over finite values (0 if none)
    nan: int
    pinf: int
    ninf: int
    zeros: int
    min: float  # over finite values (nan if none)
    max: float
    mean: float

    @property
    def nonfinite(self) -> int:
        return self.nan + self.pinf + self.ninf

    def short(self) -> str:
        return (f"amax={self.amax:.4g} nan={self.nan} +inf={self.pinf} -inf={self.ninf} zero={self.zeros} "
                f"min={self.min:.4g} max={self.max:.4g} mean={self.mean:.4g}")

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in asdict(self).items()}


def values_stats(a: np.ndarray) -> Stats:
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating):
        a = a.astype(np.float64)
    if a.size:
        mn, mx = a.min(), a.max()  # NaN and inf propagate: both finite means every value is
        if np.isfinite(mn) and np.isfinite(mx):
            f64 = a.astype(np.float64, order="C").reshape(-1)  # the values in the order the masked path takes them
            return Stats(int(a.size), float(max(abs(mn), abs(mx))), 0, 0, 0, int(a.size - np.count_nonzero(a)),
                         float(mn), float(mx), float(f64.mean()))
    nan = np.isnan(a)
    pinf = np.isposinf(a)
    ninf = np.isneginf(a)
    finite = a[~(nan | pinf | ninf)]
    n_nan, n_pinf, n_ninf = int(nan.sum()), int(pinf.sum()), int(ninf.sum())
    if finite.size:
        f64 = finite.astype(np.float64)
        amax = float(np.abs(f64).max())
        mn, mx, mean = float(f64.min()), float(f64.max()), float(f64.mean())
    else:
        amax, mn, mx, mean = 0.0, float("nan"), float("nan"), float("nan")
    return Stats(int(a.size), amax, n_nan, n_pinf, n_ninf, int((a == 0).sum()), mn, mx, mean)


def tensor_stats(t: Tensor) -> Stats | None:
    """Statistics of a float tensor's logical elements; None for integer or block-quantized tensors."""
    if t.type not in SCALAR_DTYPES or not np.issubdtype(SCALAR_DTYPES[t.type], np.floating):
        return None
    return values_stats(array(t))


def tensor_hash(t: Tensor) -> str:
    """A content hash of the tensor's logical elements (bytes in ne order), for determinism checks."""
    if t.type in SCALAR_DTYPES:
        data = np.ascontiguousarray(array(t)).view(np.uint8)
    else:
        data = np.ascontiguousarray(rows(t))
    return hashlib.blake2b(data.tobytes(), digest_size=12).hexdigest()
