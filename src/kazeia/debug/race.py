"""Races: where two runs of the same configuration differ, in which stage of the op, and where the bytes came from.

The configuration is run a few times in process with a hook that, on the HTP, keeps per VTCM page (2 KiB) the
op that last changed it, and at the target op's start a copy of VTCM and of its activations. Then:
- the outputs of the runs are compared with each other and with the device's clean result on the same inputs
  (HMX numerics without the fault): which elements, rows, columns and 32x32 tiles differ;
- the stage: whole columns wrong with every row = the weight operand (HVX dequant + vscatter into the HMX weight
  tiles); whole rows = the activation operand; scattered elements = the read-out;
- for an HMX matmul whose weight columns differ, which K tiles of which column tile HMX read stale: solved by
  least squares against the weight tiles the VTCM area held before the op, then checked bit for bit by
  recomputing the product with those tiles taken from the pre-op VTCM; and which op last wrote those bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kazeia.backends.base import Hook, OpInfo
from kazeia.debug.runner import run
from kazeia.debug.signature import Signature, classify, ranges
from kazeia.debug.tensors import logical_values
from kazeia.engine.session import RunSpec
from kazeia.graph.tensor import Tensor

PAGE = 2048


class VtcmWriters(Hook):
    """Per VTCM page, the last op whose completion changed it; at `target`'s start VTCM and its sources."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.backend = None
        self.digest: np.ndarray | None = None
        self.writer: list[str | None] | None = None
        self.vtcm_before: np.ndarray | None = None
        self.state_before = None  # the DeviceState as the op started (registers, race generator)
        self.writers_before: list[str | None] | None = None
        self.sources: list[np.ndarray | None] | None = None
        self.output: np.ndarray | None = None
        self.node: Tensor | None = None

    def bind_backend(self, backend) -> None:
        self.backend = backend

    def _pages(self) -> np.ndarray:
        v = self.backend.snapshot().vtcm
        return v.reshape(-1, PAGE).view(np.uint64).sum(axis=1, dtype=np.uint64)

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        if node.name == self.target and self.backend is not None and self.vtcm_before is None:
            self.state_before = self.backend.snapshot()
            self.vtcm_before = self.state_before.vtcm
            self.writers_before = list(self.writer) if self.writer is not None else None
            self.sources = [logical_values(s) if s is not None else None for s in node.src]
            self.node = node

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        if self.backend is None:
            return
        if node.name == self.target and self.output is None:
            self.output = np.array(logical_values(node), dtype=np.float64)
        d = self._pages()
        if self.digest is None:
            self.digest, self.writer = np.zeros_like(d), [None] * len(d)
        for p in np.flatnonzero(d != self.digest):
            self.writer[p] = node.name
        self.digest = d


@dataclass
class RunView:
    output: np.ndarray = field(repr=False)
    signature: Signature
    stale_tiles: list[int] | None = None  # K tiles read stale (HMX weight), solved and checked
    exact: bool = False  # recomputing with those stale tiles reproduces the run's output bit for bit


@dataclass
class RaceReport:
    name: str
    runs: list[RunView]
    differ: bool
    stage: str | None = None
    area: str | None = None  # the VTCM area the stale bytes came from, with its range
    writers: list[str] = field(default_factory=list)  # ops that last wrote those bytes ("reset" = never written)
    evidence: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        head = f"race localisation on {self.name}: " + ("the runs differ" if self.differ else "the runs agree")
        return [head] + [f"  {e}" for e in self.evidence]


def _stage(sig: Signature, m: int) -> str | None:
    reg = sig.get("region")
    if reg is None:
        return None
    rows, cols = reg.where["rows"], reg.where["cols"]
    if len(rows) == m and cols:
        return "weight operand: the HVX dequantize + vscatter of the weight tiles HMX then reads"
    if rows and len(cols) == sig.shape[1]:
        return "activation operand: the staging of the activation rows"
    return "read-out: scattered output elements"


def _stale_solve(x: np.ndarray, rw, stale: np.ndarray, y: np.ndarray, clean: np.ndarray, arch,
                 col_tile: int) -> tuple[list[int], bool]:
    """Which K tiles of column tile `col_tile` HMX took from `stale` (the weight the VTCM area held): least
    squares on the output difference, then the product recomputed with those tiles, compared bit for bit."""
    from kazeia.backends.htp.forensics import shuffled_fp16

    a16 = shuffled_fp16(np.asarray(x, dtype=np.float32), arch)
    c0, c1 = col_tile * 32, col_tile * 32 + 32
    w16 = rw.w16_rows(c0, c1)
    k_tiles = rw.k // 32
    cols = [slice(t * 32, t * 32 + 32) for t in range(k_tiles)]
    # a non-finite stale value in a tile HMX read would make its whole output column non-finite: columns that
    # stayed finite only constrain the tiles through their finite values (the others count 0 there)
    delta = np.nan_to_num((stale[c0:c1] - w16).astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    keep = np.isfinite(y[:, c0:c1]).all(axis=0) & np.isfinite(clean[:, c0:c1]).all(axis=0)
    if not keep.any():
        return [], False
    a64 = a16.astype(np.float64)
    basis = np.stack([(a64[:, c] @ delta[keep][:, c].T).ravel() for c in cols], axis=1)
    target = (y[:, c0:c1][:, keep] - clean[:, c0:c1][:, keep]).ravel()
    coef = np.linalg.lstsq(basis, target, rcond=None)[0]
    late = [t for t in range(k_tiles) if coef[t] > 0.5]
    return late, _recompute(x, rw, stale, late, y, arch, col_tile)


def _recompute(x: np.ndarray, rw, stale: np.ndarray, late: list[int], y: np.ndarray, arch, col_tile: int) -> bool:
    """Does the HMX product with K tiles `late` of column tile `col_tile` taken from `stale` give `y` exactly?"""
    from kazeia.backends.htp.forensics import hmx_matmul_weight, shuffled_fp16

    a16 = shuffled_fp16(np.asarray(x, dtype=np.float32), arch)
    c0, c1 = col_tile * 32, col_tile * 32 + 32
    idx = np.concatenate([np.arange(t * 32, t * 32 + 32) for t in late]) if late else np.array([], dtype=int)

    def patch(r0: int, t: np.ndarray) -> np.ndarray:
        t = t.copy()
        lo, hi = max(c0 - r0, 0), min(c1 - r0, t.shape[0])
        if lo < hi and idx.size:
            t[lo:hi, idx] = stale[r0 + lo:r0 + hi, idx]
        return t
    again = hmx_matmul_weight(a16, rw, patch).astype(np.float64)
    return bool(np.array_equal(again, y, equal_nan=True))


def _probe(dump, settings, h: VtcmWriters, area, nbytes: int) -> np.ndarray | None:
    """Replay the dumped op on a fresh device holding the pre-op VTCM of run `h` with `area` zeroed, and the
    timing-race state the op started with: the same tiles go stale, now as zeros (finite, easy to solve for)."""
    import dataclasses

    from kazeia.backends.htp import HtpBackend
    from kazeia.debug.state_experiment import run_dumped_op

    be = HtpBackend(dataclasses.replace(settings, race_seed=None))
    st = be.snapshot()
    v = h.vtcm_before.copy()
    v[area.offset:area.offset + nbytes] = 0
    st.vtcm = v
    st.race_rng = h.state_before.race_rng
    st.hmx_scale, st.dma_stale_pop = h.state_before.hmx_scale, h.state_before.dma_stale_pop
    be.restore(st)
    out, err = run_dumped_op(dump, be)
    return None if out is None else out.reshape(-1, out.shape[-1])


def _localise_stale(rep: RaceReport, done: list, views: list, plan, rw, clean, settings, col_tile: int,
                    dump) -> None:
    from kazeia.backends.htp.forensics import weight_from_tiles

    area = plan.area("wt0" if any(a.name == "wt0" for a in plan.areas) else "weight")
    nbytes = plan.nc * rw.k * 2
    rep.area = f"{area.name} 0x{area.offset:06x}-0x{area.offset + area.size - 1:06x}"
    for i, (h, v) in enumerate(zip(done, views)):
        raw = np.ascontiguousarray(h.vtcm_before[area.offset:area.offset + nbytes])
        stale = weight_from_tiles(raw, plan.nc, rw.k)
        x = h.sources[1].reshape(-1, rw.k)
        probe_note = ""
        if not np.isfinite(v.output[:, col_tile * 32:col_tile * 32 + 32]).all() and dump is not None:
            z = _probe(dump, settings, h, area, nbytes)
            if z is not None:
                late, _ = _stale_solve(x, rw, np.zeros_like(stale), z, clean, settings.arch, col_tile)
                v.stale_tiles = late
                v.exact = _recompute(x, rw, stale, late, v.output, settings.arch, col_tile)
                probe_note = (" (found on a replay from the run's pre-op VTCM with that area zeroed and the op's "
                              "timing state, then checked on the run itself)")
        if v.stale_tiles is None:
            v.stale_tiles, v.exact = _stale_solve(x, rw, stale, v.output, clean, settings.arch, col_tile)
        rep.evidence.append(f"run {i + 1}: K tiles {ranges(v.stale_tiles)} ({len(v.stale_tiles)} of {rw.k // 32}) "
                            f"of column tile {col_tile} hold the bytes VTCM area {rep.area} held before the op"
                            f"{probe_note}; recomputing the run's product with them "
                            f"{'reproduces its output bit for bit' if v.exact else 'does NOT reproduce its output'}")
    pages = range(area.offset // PAGE, -(-(area.offset + nbytes) // PAGE))
    wb = done[0].writers_before or []
    rep.writers = list(dict.fromkeys((wb[p] if p < len(wb) and wb[p] else "reset") for p in pages))
    rep.evidence.append("those VTCM bytes were last written by: " + ", ".join(
        "nothing since reset (zeros)" if w == "reset" else w for w in rep.writers))


def localise_race(spec: RunSpec, target: str, n_runs: int = 2, dump=None) -> RaceReport:
    """Run `spec` `n_runs` times (under different timing seeds, see determinism.timing_seeded) and localise how
    the target op's outputs differ; `dump`: the target's dump (lets a probe replay see through non-finite stale
    bytes)."""
    from kazeia.backends.htp import plan_for_node
    from kazeia.backends.htp.forensics import hmx_matmul_weight, shuffled_fp16
    from kazeia.debug.determinism import timing_seeded

    hooks = []
    for one in timing_seeded(spec, n_runs, base=101):  # other timings than the determinism step's
        h = VtcmWriters(target)
        run(one, hooks=(h,))
        hooks.append(h)
    done = [h for h in hooks if h.output is not None]
    if not done:
        return RaceReport(target, [], False, evidence=[f"{target} did not complete on the HTP in any run"])
    node, settings = done[0].node, spec.htp_settings()
    out0 = done[0].output.reshape(-1, done[0].output.shape[-1])
    clean = None
    plan = plan_for_node(node, settings) if node.op == "MUL_MAT" else None
    rw = done[0].backend.weights_for(node) if plan is not None and plan.path == "hmx" else None
    if rw is not None:
        x = done[0].sources[1].reshape(-1, rw.k)
        with np.errstate(all="ignore"):
            clean = hmx_matmul_weight(shuffled_fp16(x.astype(np.float32), settings.arch), rw).astype(np.float64)
    base = clean if clean is not None else out0
    views = [RunView(h.output.reshape(base.shape), classify(h.output.reshape(base.shape), base)) for h in done]
    differ = any(not np.array_equal(v.output, views[0].output, equal_nan=True) for v in views[1:])
    rep = RaceReport(target, views, differ)
    if differ:
        between = classify(views[1].output, views[0].output)
        reg = between.get("region")
        rep.evidence.append(f"run 1 vs run 2: {between.n_wrong} of {between.n} outputs differ"
                            + (f"; {reg.summary}" if reg else f"; {between.headline()}"))
    for i, v in enumerate(views):
        rep.evidence.append(f"run {i + 1} vs the device's clean result on the same inputs: {v.signature.headline()}")
    rep.stage = _stage(views[0].signature, base.shape[0])
    if rep.stage:
        rep.evidence.append(f"pipeline stage: {rep.stage}")
    reg = views[0].signature.get("region")
    if rw is not None and rep.stage and rep.stage.startswith("weight") and reg is not None:
        with np.errstate(all="ignore"):
            _localise_stale(rep, done, views, plan, rw, clean, settings, reg.where["col_tiles"][0], dump)
    return rep
