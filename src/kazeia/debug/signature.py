"""Error signatures: what pattern a bad op output makes against its reference, and what could make it.

`classify(out, ref, ...)` looks at one output (numpy order: rows = tokens M, columns = ne0) against what it
should have been (the float64 reference, or the device's own numerics on the same inputs) and returns the
classes it finds, each with the evidence measured here and the mechanisms that make that pattern on the HTP:

- zeros: wrong outputs that are exactly 0 (a reset HMX output scale, a kernel that never wrote its dst);
- scaled: the whole output is the reference times one constant, and which (a stale HMX bias/scale block);
- non-finite: where NaN/inf are (rows, columns, tiles) when the reference is finite;
- region: which HMX 32x32 tiles / HVX row groups (per-thread weight-row ranges) / rows / columns are wrong;
- prior bytes: the wrong values equal bytes that were in some memory before (previous contents of the output,
  a VTCM area, another tensor), given as named `priors`;
- shifted rows: wrong rows equal the reference's rows a few places away (a row stride or offset error);
- fp16 saturation: outputs pinned at +-65504 or +-inf where the reference exceeds the fp16 range;
- small noise: wrong everywhere a little, with no structure (a numerics difference, not a fault).

Every number in a class's evidence comes from the arrays given; the mechanisms are the candidate causes the
design notes list for that pattern (shared/docs/htp-backend.md sections 3.2 and 6).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

FP16_MAX = 65504.0
TILE = 32

MECHANISMS = {
    "zeros": ["HMX output scale at its reset value 0 (bias/scale block not loaded)",
              "the op returned an error status and left its dst untouched (fresh buffer = zeros)",
              "DMA/scatter never landed and the area read was zero-filled"],
    "scaled": ["stale HMX output scale (bias/scale block not reloaded: the previous HMX job's scale)",
               "a wrong scale parameter (SCALE op, attention kq scale) or a wrong dequant scale"],
    "non-finite": ["fp16 staging overflow (|x| > 65504 becomes inf before the unit)",
                   "-inf mask values staged as NaN (arch quirk)", "garbage bytes read as floats"],
    "region": ["a race on those tiles (HVX scatter not drained before the HMX read, DMA not complete)",
               "a partial tile or thread range handled wrongly (tail rows, odd last row)"],
    "prior bytes": ["stale memory: the op read (or left) bytes another op wrote there before"],
    "shifted rows": ["a wrong row stride or offset (src1 read as contiguous, a view's nb[1] ignored)"],
    "fp16 saturation": ["fp16 accumulation or read-out overflow (HMX outputs are fp16 before the fp32 store)"],
    "unstructured": ["wrong inputs or weights (another tensor's bytes, a wrong quantization), not a tile or "
                     "scale pattern"],
    "small noise": ["numerics only (rounding order, fp16 staging): not a fault by itself"],
}


@dataclass
class SigClass:
    name: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    mechanisms: list[str] = field(default_factory=list)
    value: float | None = None  # the constant of "scaled"
    where: dict = field(default_factory=dict)  # rows / cols / tiles (lists of ints), prior name


@dataclass
class Signature:
    shape: tuple[int, int]
    n_wrong: int
    n: int
    classes: list[SigClass] = field(default_factory=list)

    def names(self) -> list[str]:
        return [c.name for c in self.classes]

    def get(self, name: str) -> SigClass | None:
        return next((c for c in self.classes if c.name == name), None)

    def headline(self) -> str:
        if not self.classes:
            return "matches the reference"
        return "; ".join(c.summary for c in self.classes)

    def lines(self) -> list[str]:
        out = [f"signature: {self.headline()}"]
        for c in self.classes:
            out.append(f"  [{c.name}] {c.summary}")
            out += [f"    evidence: {e}" for e in c.evidence]
            out += [f"    could be: {m}" for m in c.mechanisms]
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def ranges(idx) -> str:
    """Sorted ints as compact ranges: [0,1,2,5] -> '0..2, 5'."""
    idx = sorted(int(i) for i in idx)
    if not idx:
        return "none"
    out, lo, prev = [], idx[0], idx[0]
    for i in idx[1:]:
        if i != prev + 1:
            out.append(f"{lo}..{prev}" if lo != prev else str(lo))
            lo = i
        prev = i
    out.append(f"{lo}..{prev}" if lo != prev else str(lo))
    return ", ".join(out)


def as_matrix(a: np.ndarray) -> np.ndarray:
    """Any output as 2-D (rows, ne0) float64: leading dimensions fold into rows."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0:
        return a.reshape(1, 1)
    return a.reshape(-1, a.shape[-1])


def wrong_mask(out: np.ndarray, ref: np.ndarray, rel: float = 0.02) -> np.ndarray:
    """Elements that are wrong beyond rounding: non-finite mismatch, or |out - ref| above `rel` x rms(ref) plus
    a few fp16 ulps of |ref|."""
    fin = np.isfinite(ref)
    rms = float(np.sqrt(np.mean(ref[fin] ** 2))) if fin.any() else 0.0
    with np.errstate(all="ignore"):
        d = np.abs(out - ref)
        bad = d > rel * rms + 4 * 2.0 ** -11 * np.abs(ref)
    bad |= np.isfinite(out) != fin
    bad |= np.isnan(out) & ~np.isnan(ref)
    return bad & ~(np.isnan(ref) & np.isnan(out))


def _scale_fit(out: np.ndarray, ref: np.ndarray) -> tuple[float, float] | None:
    """(c, residual) of out ~ c * ref by least squares over the finite elements, or None."""
    m = np.isfinite(out) & np.isfinite(ref)
    r, o = ref[m], out[m]
    rr = float(np.dot(r, r))
    if rr == 0 or m.sum() < 2:
        return None
    c = float(np.dot(o, r)) / rr
    res = float(np.sqrt(np.sum((o - c * r) ** 2) / rr)) if c != 0 else float(np.sqrt(np.sum(o ** 2) / rr))
    return c, res


def name_constant(c: float) -> str:
    """A constant, and the simple form it has when it has one (powers of two, 1/sqrt(d) of a head size)."""
    if c == 0:
        return "0"
    for d in (32, 48, 64, 80, 96, 112, 128, 160, 192, 256):
        if abs(c - d ** -0.5) <= 2e-3 * d ** -0.5:
            return f"{c:.6g} (= 1/sqrt({d}))"
    lg = np.log2(abs(c))
    if abs(lg - round(lg)) < 1e-6:
        return f"{c:.6g} (= {'-' if c < 0 else ''}2^{int(round(lg))})"
    return f"{c:.6g}"


def _region(bad: np.ndarray, hvx_row_groups: list[tuple[int, int]] | None) -> SigClass | None:
    M, N = bad.shape
    rows = np.flatnonzero(bad.any(axis=1))
    cols = np.flatnonzero(bad.any(axis=0))
    tiles = sorted({(int(r) // TILE, int(c) // TILE) for r, c in zip(*np.nonzero(bad))})
    n_tiles = (-(-M // TILE)) * (-(-N // TILE))
    ev = [f"{int(bad.sum())} of {bad.size} outputs wrong; rows {ranges(rows)} of {M}; columns {ranges(cols)} of "
          f"{N}", f"HMX 32x32 output tiles wrong: {len(tiles)} of {n_tiles}"
          + (f" ({', '.join(f'({a},{b})' for a, b in tiles[:8])}{', ...' if len(tiles) > 8 else ''})"
             if len(tiles) < n_tiles else "")]
    col_tiles = sorted({c for _, c in tiles})
    where = {"rows": rows.tolist(), "cols": cols.tolist(), "col_tiles": col_tiles,
             "row_tiles": sorted({r for r, _ in tiles})}
    if hvx_row_groups:
        groups = [i for i, (a, b) in enumerate(hvx_row_groups) if bad[:, a:b].any()]
        ev.append(f"HVX row groups (per-thread weight rows) touched: {ranges(groups)} of {len(hvx_row_groups)}")
        where["hvx_groups"] = groups
    if len(tiles) == n_tiles:
        return None  # every tile: not a region
    summ = (f"wrong only in column tile(s) {ranges(col_tiles)} (columns {ranges(cols)}), all {len(rows)} rows"
            if len(rows) == M and len(col_tiles) < -(-N // TILE) else
            f"wrong in {len(tiles)} of {n_tiles} 32x32 tiles (rows {ranges(rows)}, columns {ranges(cols)})")
    return SigClass("region", summ, ev, MECHANISMS["region"], where=where)


def _prior_bytes(out: np.ndarray, bad: np.ndarray, priors: dict[str, np.ndarray]) -> SigClass | None:
    best = None
    n_bad = int(bad.sum())
    for name, p in priors.items():
        p = as_matrix(p)
        if p.shape != out.shape or n_bad == 0:
            continue
        same = (out[bad] == p[bad]) | (np.isnan(out[bad]) & np.isnan(p[bad]))
        k = int(same.sum())
        if k and (best is None or k > best[1]):
            best = (name, k)
    if best is None or best[1] < max(1, n_bad // 2):
        return None
    name, k = best
    return SigClass("prior bytes", f"{k} of {n_bad} wrong outputs equal, bit for bit, what {name} held before",
                    [f"{k}/{n_bad} wrong elements identical to {name}"], MECHANISMS["prior bytes"],
                    where={"prior": name})


def _shifted_rows(out: np.ndarray, ref: np.ndarray, bad: np.ndarray) -> SigClass | None:
    rows = np.flatnonzero(bad.any(axis=1))
    M = out.shape[0]
    if len(rows) == 0 or M < 2:
        return None
    for s in (1, -1, 2, -2, 3, -3, 4, -4):
        src = rows + s
        ok = (src >= 0) & (src < M)
        if ok.sum() < max(1, len(rows) // 2):
            continue
        if np.allclose(out[rows[ok]], ref[src[ok]], rtol=1e-2, atol=1e-3 * (np.abs(ref).max() + 1e-30)):
            return SigClass("shifted rows", f"wrong rows equal the reference's rows {s:+d} places away",
                            [f"{int(ok.sum())} wrong rows r match reference row r{s:+d}"], MECHANISMS["shifted rows"],
                            value=float(s))
    return None


def classify(out: np.ndarray, ref: np.ndarray, *, priors: dict[str, np.ndarray] | None = None,
             hvx_row_groups: list[tuple[int, int]] | None = None, rel: float = 0.02) -> Signature:
    """The error signature of `out` against `ref` (same shape). `priors`: named arrays (same shape) of what the
    memory held before (previous output contents, a VTCM area, another tensor); `hvx_row_groups`: the column
    ranges each HVX thread computed (weight rows per thread), when the op ran on HVX."""
    o, r = as_matrix(out), as_matrix(ref)
    if o.shape != r.shape:
        raise ValueError(f"shape mismatch: {o.shape} vs {r.shape}")
    bad = wrong_mask(o, r, rel)
    sig = Signature(o.shape, int(bad.sum()), int(bad.size))
    if not bad.any():
        return sig
    classes = sig.classes
    zero_bad = bad & (o == 0) & (r != 0)
    if zero_bad.sum() == bad.sum():
        whole = bad.mean() > 0.99 or not np.any(o[~bad] != 0)
        classes.append(SigClass("zeros", f"{'all outputs are' if bad.all() or whole else 'the wrong outputs are'} "
                                         f"exactly 0 where the reference is not",
                                [f"{int((o == 0).sum())} of {bad.size} outputs are 0.0, {int(zero_bad.sum())} of "
                                 f"them where the reference is beyond rounding from 0 (reference rms "
                                 f"{float(np.sqrt(np.nanmean(r ** 2))):.4g})"], MECHANISMS["zeros"], value=0.0))
    fit = _scale_fit(o, r)
    if fit is not None and "zeros" not in sig.names():
        c, res = fit
        if res < 5e-3 and abs(c - 1) > 5e-3:
            classes.append(SigClass("scaled", f"exactly scaled by one constant c = {name_constant(c)}",
                                    [f"least-squares c = {c:.6g}; residual |out - c*ref|/|ref| = {res:.2g}"],
                                    MECHANISMS["scaled"], value=c))
    nf = ~np.isfinite(o) & np.isfinite(r)
    if nf.any():
        rows, cols = np.flatnonzero(nf.any(axis=1)), np.flatnonzero(nf.any(axis=0))
        classes.append(SigClass("non-finite", f"{int(np.isnan(o[nf]).sum())} NaN and {int(np.isinf(o[nf]).sum())} "
                                              f"inf where the reference is finite",
                                [f"rows {ranges(rows)}, columns {ranges(cols)}"], MECHANISMS["non-finite"],
                                where={"rows": rows.tolist(), "cols": cols.tolist()}))
    sat = bad & ((np.abs(o) == FP16_MAX) | np.isinf(o)) & (np.abs(r) > FP16_MAX * 0.9)
    if sat.any():
        classes.append(SigClass("fp16 saturation", f"{int(sat.sum())} outputs pinned at +-{FP16_MAX:g}/inf where "
                                                   f"|ref| reaches {float(np.nanmax(np.abs(r))):.4g}",
                                [f"largest |ref| {float(np.nanmax(np.abs(r))):.4g} > fp16 max {FP16_MAX:g}"],
                                MECHANISMS["fp16 saturation"]))
    if not any(c.name in ("zeros", "scaled") and bad.mean() > 0.99 for c in classes):
        reg = _region(bad, hvx_row_groups)
        if reg is not None:
            classes.append(reg)
    pb = _prior_bytes(o, bad, priors or {})
    if pb is not None and not ("zeros" in sig.names() and not np.any(o[bad])):  # zeros = zeros says nothing more
        classes.append(pb)
    sh = _shifted_rows(o, r, bad)
    if sh is not None:
        classes.append(sh)
    if not classes:
        fin = np.isfinite(o) & np.isfinite(r)
        rel_err = float(np.sqrt(np.sum((o[fin] - r[fin]) ** 2) / max(np.sum(r[fin] ** 2), 1e-300)))
        name = "small noise" if rel_err < 0.05 else "unstructured"
        classes.append(SigClass(name, f"{'small ' if name == 'small noise' else ''}unstructured error over the whole "
                                      f"output (relative rms {rel_err:.2g})",
                                [f"{int(bad.sum())} of {bad.size} outputs beyond {rel:g} x rms, spread over "
                                 f"rows and columns"], MECHANISMS[name], value=rel_err))
    return sig
