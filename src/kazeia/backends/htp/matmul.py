"""MUL_MAT on the emulated DSP: op_matmul's dispatch, the HMX and HVX paths, and what each leaves in VTCM.

op_matmul (matmul-ops.c) picks HMX or HVX by its gates and the HMX kernel plans its VTCM layout, returning -1
when the plan does not fit; both come from plan.plan_for_node, the one plan the cost model, the routing gates
and the forensic tools also use. What happens after an HMX failure is the profile's: `2026-05` calls op_matmul
again with the same inputs (each attempt takes a stack frame; the callback thread's stack runs out and the
DSP process dies), `robust` runs the HVX kernel instead.

The HVX kernel quantizes src1 into VTCM at vtcm_base unless the per-batch shortcut says the same src1
descriptor is already there, then reads its activations back FROM VTCM: whatever bytes are there are what
it multiplies. The numerics are in hvx_matmul.py / hmx_matmul.py.
"""

from __future__ import annotations

import numpy as np

from kazeia.backends.htp import cost, pipeline
from kazeia.backends.htp import vtcm as V
from kazeia.backends.htp.deep_loads import BANK_BYTES, bank_crossings
from kazeia.backends.htp.dsp import Dsp, DspFault, OpContext, OpRecord
from kazeia.backends.htp.fast import round_hw, shuffled_fp16
from kazeia.backends.htp.hmx_matmul import (
    hmx_matmul_weight,
    output_to_tiles,
    stage_activations,
    weight_from_tiles,
    weight_to_tiles,
)
from kazeia.backends.htp.host import STATUS_OK, STATUS_VTCM_TOO_SMALL, OpBatch, OpDesc
from kazeia.backends.htp.hvx_matmul import hvx_matmul, hvx_matmul_f16_ddr
from kazeia.backends.htp.hvx_quant import activation_row_size, q8_spill_bytes, quantize_activations
from kazeia.backends.htp.plan import MatmulPlan, plan_for_node, src_layout
from kazeia.backends.htp.profiles import Profile
from kazeia.backends.htp.repack import RepackedWeight
from kazeia.backends.htp.settings import HtpSettings
from kazeia.graph.tensor import GGMLType, Tensor, array, rows, type_name

_KIND = {GGMLType.Q4_1: "q8_1x4x2", GGMLType.F16: "f16"}


def _qt(t: GGMLType) -> str:
    return type_name(t)


def _contiguous_runs(pieces: list[tuple[int, np.ndarray]]) -> tuple[tuple[int, np.ndarray], ...]:
    """(offset, bytes) pieces in offset order -> the same bytes as runs, adjacent pieces joined (read-only)."""
    runs: list[tuple[int, list[np.ndarray]]] = []
    for off, data in pieces:
        if runs and runs[-1][0] + sum(d.size for d in runs[-1][1]) == off:
            runs[-1][1].append(data)
        else:
            runs.append((off, [data]))
    out = []
    for off, parts in runs:
        data = np.concatenate(parts) if len(parts) > 1 else parts[0]
        data.flags.writeable = False
        out.append((off, data))
    return tuple(out)


class WeightStore:
    """The REPACK buffer: one `RepackedWeight` per weight, made when the weight is first used (as set_tensor
    repacks it). A RepackedWeight is a view of the weight's memory-mapped ggml rows (the x4x2 repack is a byte
    permutation, computed only for the rows that land in VTCM), so the store holds no copies; `budget` is kept
    for callers that pass one and bounds nothing.

    One store is shared by every HTP session of the process (`shared_store()`): forensic tools open many
    sessions on the same model."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = budget
        self._items: dict[tuple, RepackedWeight] = {}

    def get(self, w: Tensor) -> RepackedWeight:
        key = (w.data_addr, w.type, w.ne)
        rw = self._items.get(key)
        if rw is None:
            if len(self._items) > 4096:  # views of models no longer in use: let their maps go
                self._items.clear()
            rw = self._items[key] = RepackedWeight.from_ggml(rows(w)[0, 0], w.type, w.ne[0])
        return rw


_SHARED: WeightStore | None = None


def shared_store() -> WeightStore:
    global _SHARED
    if _SHARED is None:
        _SHARED = WeightStore()
    return _SHARED


class MatmulUnit:
    def __init__(self, settings: HtpSettings, profile: Profile, weights: WeightStore | None = None) -> None:
        self.settings = settings
        self.profile = profile
        self.weights = weights if weights is not None else shared_store()
        self._plans: dict[tuple, MatmulPlan] = {}

    # --- op_matmul ---
    def op_matmul(self, dsp: Dsp, octx: OpContext, op: OpDesc, batch: OpBatch) -> OpRecord:
        return self._op_matmul(dsp, octx, op, self._plan(op.node))

    def _plan(self, node: Tensor) -> MatmulPlan:
        """plan_for_node with this unit's settings, kept by what it reads of the node (type, ne and nb of both
        sources, the route path): a decode plans the same few shapes every token. MatmulPlan is frozen."""
        w, x = node.src[0], node.src[1]
        key = (w.type, w.ne, w.nb, x.type, x.ne, x.nb, node.route_path)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 4096:
                self._plans.clear()
            plan = self._plans[key] = plan_for_node(node, self.settings)
        return plan

    def _op_matmul(self, dsp: Dsp, octx: OpContext, op: OpDesc, plan: MatmulPlan) -> OpRecord:
        node = op.node
        w, x = node.src[0], node.src[1]
        M, K, N = x.ne[1], w.ne[0], w.ne[1]
        batched, _ = src_layout(w, x)
        hmx = plan if plan.path == "hmx" else plan.hmx_attempt  # None: the dispatch chose HVX
        if hmx is None:
            return self._hvx(dsp, octx, op, plan.reason, plan)
        octx.src1_spad_src = None  # "always re-quantize src1 since HMX kernel overwrites vtcm"
        octx.src1_spad_kind = None
        rec = self._hmx(dsp, op, batched, hmx)
        if rec is not None:
            return rec
        if self.profile.hmx_failure == "reenter":
            # upstream: `return op_matmul(octx);` -- same inputs, same plan, same failure, one more frame
            octx.stack_used += self.profile.matmul_frame_bytes
            if octx.stack_used > self.profile.dsp_stack_bytes:
                attempts = octx.stack_used // self.profile.matmul_frame_bytes
                raise DspFault("stack-overflow",
                               f"stack overflow after {attempts} op_matmul -> hmx_matmul_q_f32 re-entries on "
                               f"{node.name} (M={M} K={K} N={N})")
            return self._op_matmul(dsp, octx, op, plan)
        rec = self._hvx(dsp, octx, op, "HMX failed, fell back to HVX", plan)
        rec.detail["hmx_fallback"] = True
        return rec

    # --- HMX ---
    def _hmx(self, dsp: Dsp, op: OpDesc, batched: bool, plan: MatmulPlan) -> OpRecord | None:
        node = op.node
        w, x = node.src[0], node.src[1]
        M, K, N = x.ne[1], w.ne[0], w.ne[1]
        if not plan.fits:
            tag = "hmx-mm-q" if w.type != GGMLType.F16 else "hmx-mm-f16"
            if plan.status == "overflow":
                dsp.farf("ERROR", f"{tag}: VTCM overflow: used {plan.used} budget {plan.vtcm}")
            else:
                dsp.farf("ERROR", f"{tag}: no chunking fits VTCM {plan.vtcm} ({plan.reason})")
            return None
        if "vtcm-bank-crossing" in self.settings.faults:
            crossing = bank_crossings(plan)
            if crossing:
                c = crossing[0]
                boundary = (c.offset // BANK_BYTES + 1) * BANK_BYTES
                raise DspFault("bus-error", f"precise bus error 0x2601: HMX {c.kind} load run 0x{c.offset:06x}-"
                                            f"0x{c.end - 1:06x} crosses a 4 MiB VTCM bank ({node.name})",
                               {"vtcm_offset": boundary, **c.to_dict()})
        if batched or not (w.ne[2] == w.ne[3] == 1):
            y = self._hmx_batched_f16(node)
        else:
            y = self._hmx_2d(dsp, node, plan)
        dsp.hmx_scale = 1.0
        out = array(node)
        out[...] = y.reshape(out.shape)
        return OpRecord("hmx", STATUS_OK, {"mc": plan.mc, "nc": plan.nc, "vtcm_used": plan.used,
                                           "modeled_s": cost.hmx_matmul_seconds(M, K, N, w.type, plan.mc or 32),
                                           "pipeline": f"{-(-M // (plan.mc or M))} M chunk(s) x "
                                                       f"[{pipeline.describe(-(-N // (plan.nc or N)))}]"})

    def _src1_rows_assumed_contiguous(self, x: Tensor, M: int, K: int) -> np.ndarray:
        """The quantized HMX kernel (2026-05) is given neither src1's row stride nor its type: it reads M*K
        float32 from the data pointer. A strided view or F16 activations therefore feed it the wrong bytes
        (past the tensor's end: whatever follows in the buffer; past the buffer: zeros here)."""
        n = M * K * 4
        raw = np.zeros(n, dtype=np.uint8)
        avail = max(0, min(n, x.buffer.size - x.offset))
        raw[:avail] = x.buffer.data[x.offset:x.offset + avail]
        return raw.view(np.float32).reshape(M, K).copy()

    def _hmx_2d(self, dsp: Dsp, node: Tensor, plan: MatmulPlan) -> np.ndarray:
        w, x = node.src[0], node.src[1]
        M, K = x.ne[1], w.ne[0]
        if w.type == GGMLType.F16 or self.profile.hmx_reads_src1_layout:
            xs = np.asarray(array(x)[0, 0], dtype=np.float32)  # stride and type honoured (F16 kernel; robust)
        else:
            xs = self._src1_rows_assumed_contiguous(x, M, K)
        rw = self.weights.get(w)
        a16 = shuffled_fp16(xs, self.settings.arch)  # below v79 a -inf activation stages as NaN
        faults = self.settings.faults
        patch = self._unretired_scatter(dsp, node, plan, K) if "scatter-unretired" in faults else None
        scale = dsp.hmx_scale if "hmx-bias-stale" in faults else 1.0
        y = hmx_matmul_weight(a16, rw, patch, scale)
        self._leave_hmx_bytes(dsp, plan, rw, xs, a16, y)
        return y

    def _unretired_scatter(self, dsp: Dsp, node: Tensor, plan: MatmulPlan, K: int):
        """Fault: some weight tiles of column chunk 0 were still in flight (vscatter not drained) when HMX read
        them, so for those tiles HMX sees what VTCM held before. How many is a race: it depends on timing, so it
        changes run to run unless KAZEIA_HTP_RACE_SEED pins it. Returns the patch hmx_matmul_weight applies to
        the first tile of weight rows."""
        nc = plan.nc
        wt0 = plan.area("wt0" if any(a.name == "wt0" for a in plan.areas) else "weight")
        stale = weight_from_tiles(np.frombuffer(dsp.vtcm.read(wt0.offset, nc * K * 2), dtype=np.uint8), nc, K)
        k_tiles = K // 32
        n_late = int(dsp.race.integers(1, k_tiles + 1))  # K tiles of the first column tile still in flight
        late = np.sort(dsp.race.choice(k_tiles, size=n_late, replace=False))
        cols = np.concatenate([np.arange(t * 32, t * 32 + 32) for t in late])
        dsp.farf("HIGH", f"{node.name}: {n_late} of {k_tiles} weight tiles of column tile 0 read before their "
                         f"scatter drained")

        def patch(r0: int, w16: np.ndarray) -> np.ndarray:
            if r0 == 0:
                w16 = w16.copy()
                w16[:32, cols] = stale[:32, cols]
            return w16
        return patch

    def _hmx_batched_f16(self, node: Tensor) -> np.ndarray:
        """F16 batched HMX (hmx_matmul_f16_f32_batched): per batch, same numerics."""
        w, x = node.src[0], node.src[1]
        wv = np.asarray(array(w), dtype=np.float32)  # (a3, a2, N, K)
        xv = np.asarray(array(x), dtype=np.float32)  # (b3, b2, M, K)
        r2, r3 = x.ne[2] // w.ne[2], x.ne[3] // w.ne[3]
        wv = np.repeat(np.repeat(wv, r2, axis=1), r3, axis=0)
        a16 = shuffled_fp16(xv, None)
        with np.errstate(all="ignore"):
            return round_hw(np.matmul(a16, wv.swapaxes(-1, -2)))

    def _leave_hmx_bytes(self, dsp: Dsp, plan: MatmulPlan, rw: RepackedWeight, xs: np.ndarray,
                         a16: np.ndarray, y: np.ndarray) -> None:
        """VTCM after the kernel: the last M chunk's activation tiles, the last column chunks' raw rows, weight
        tiles and output tiles in their ping-pong buffers, and the 256 B scale block.

        The images are deferred writes (`Vtcm.write_lazy`): made only if something reads those bytes before a
        later op overwrites them (a stale-read fault, a snapshot, a dump), which in a plain run is never. What
        they capture is copied now (src1 rows, the previous activation bytes) or immutable (the mapped weight
        rows, this op's private output)."""
        vt = dsp.vtcm
        M, N = y.shape
        K = xs.shape[1]
        mc, nc = plan.mc, plan.nc
        names = {a.name for a in plan.areas}
        m0 = (max(M - 1, 0) // mc) * mc
        m_pad = -(-(M - m0) // 32) * 32  # rows of the last M chunk's tiles
        a = plan.area("activation")
        # rows past M in the last tile: zero-filled (since #22724) or whatever the area held before
        prev = None if self.profile.zero_fill_m_tail else np.frombuffer(
            vt.read(a.offset, min(a.size, m_pad * K * 2)), dtype=np.uint8)
        x_last = np.array(xs[m0:], dtype=np.float32)  # src1's buffer is reused by later ops
        vt.write_lazy(a.offset, min(a.size, m_pad * K * 2), lambda: stage_activations(x_last, prev=prev)[: a.size])

        def lazy(area, n0: int, n1: int) -> None:
            ar = plan.area(area)
            if area.startswith("wt") or area == "weight":
                nbytes, make = (n1 - n0) * K * 2, lambda: weight_to_tiles(rw.w16_rows(n0, n1))
            elif area.startswith("out"):
                nbytes, make = m_pad * (n1 - n0) * 2, lambda: output_to_tiles(y[m0:, n0:n1])
            else:  # qweight: the raw x4x2 rows of chunk j, at the plan's row stride
                nbytes, make = (n1 - n0) * plan.row_stride, lambda: self._qweight_rows(rw, n0, n1, plan.row_stride)
            vt.write_lazy(ar.offset, min(nbytes, ar.size), lambda: make()[: ar.size])

        n_chunks = -(-N // nc)
        if "wt0" not in names:  # F16 kernel: [weight][activation][output][scratch0][scratch1][scales]
            n0 = (n_chunks - 1) * nc
            lazy("weight", n0, N)
            lazy("output", n0, N)
        else:
            # what each area holds when the 4-stage pipeline ends (pipeline.py replays its program order)
            for area, j in pipeline.final_contents(n_chunks).items():
                lazy(area, j * nc, min(N, (j + 1) * nc))
        s = plan.area("scales")
        vt.write(s.offset, V.hmx_scale_block(1.0))

    @staticmethod
    def _qweight_rows(rw: RepackedWeight, n0: int, n1: int, stride: int) -> np.ndarray:
        """The x4x2 rows n0..n1 as the DMA leaves them in `qweight`: `stride` bytes a row, zero-padded."""
        raw = rw.x4x2_rows(n0, n1)
        buf = np.zeros((raw.shape[0], stride), dtype=np.uint8)
        buf[:, : min(raw.shape[1], stride)] = raw[:, :stride]
        return buf.reshape(-1)

    # --- HVX ---
    def _hvx(self, dsp: Dsp, octx: OpContext, op: OpDesc, reason: str, plan: MatmulPlan) -> OpRecord:
        node = op.node
        w, x = node.src[0], node.src[1]
        M, K, N = x.ne[1], w.ne[0], w.ne[1]
        batched, permuted = src_layout(w, x)
        if plan.status == "vtcm_too_small":
            dsp.farf("ERROR", f"matmul-{_qt(w.type)} : current VTCM reservation {plan.vtcm} is too small, "
                              f"needed {plan.used}")
            return OpRecord("hvx", STATUS_VTCM_TOO_SMALL, {"reason": reason})
        if w.type == GGMLType.F16 and (batched or permuted or plan.info.get("kernel") == "f16-ddr"):
            y = self._hvx_f16_ddr(node)
            reused = False
        else:
            y, reused = self._hvx_vtcm(dsp, octx, op, plan)
        out = array(node)
        out[...] = y.reshape(out.shape)
        return OpRecord("hvx", STATUS_OK, {"reason": reason, "src1_reused": reused, "vtcm_used": plan.used,
                                           "modeled_s": cost.hvx_matmul_seconds(M, K, N, w.type)})

    def _hvx_vtcm(self, dsp: Dsp, octx: OpContext, op: OpDesc, plan: MatmulPlan) -> tuple[np.ndarray, bool]:
        node = op.node
        w, x = node.src[0], node.src[1]
        M, K = x.ne[1], w.ne[0]
        kind = _KIND.get(w.type, "q8x4x2")
        stride = activation_row_size(K, w.type)
        nbytes = M * stride
        src1 = op.src[1]
        reuse = octx.src1_spad_src == src1 and (not self.profile.shortcut_checks_format
                                                    or octx.src1_spad_kind == kind)
        if reuse:
            image = np.frombuffer(dsp.vtcm.read(0, nbytes), dtype=np.uint8).reshape(M, stride)
        else:
            xs = np.asarray(array(x)[0, 0], dtype=np.float32)  # rows through nb[1]
            prev = np.frombuffer(dsp.vtcm.read(0, nbytes), dtype=np.uint8).reshape(M, stride)
            image = quantize_activations(xs, w.type, self.settings.fp32_quantize_group, prev=prev)
            dsp.vtcm.write(0, image.reshape(-1))
            spill = min(q8_spill_bytes(K, w.type), dsp.vtcm.size - nbytes)
            if spill > 0:
                dsp.vtcm.fill(nbytes, spill, 0)
            octx.src1_spad_src = src1
            octx.src1_spad_kind = kind
        rw = self.weights.get(w)
        y = hvx_matmul(rw, image, M)
        if dsp.dma_stale_pop:
            y = self._first_row_read_early(dsp, plan, rw, image, M, y)
        if "dma-unbalanced" in self.settings.faults:
            dsp.dma_stale_pop = True  # this op leaves one descriptor outstanding
        self._leave_hvx_bytes(dsp, plan, rw, y)
        return y, reuse

    def _first_row_read_early(self, dsp: Dsp, plan: MatmulPlan, rw: RepackedWeight, image: np.ndarray, M: int,
                              y: np.ndarray) -> np.ndarray:
        """Fault: the previous op left a DMA descriptor outstanding, so thread 0's first pop returned that stale
        completion and its first weight row was used before its DMA landed: the ring slot still held what
        VTCM had there (the previous op's row)."""
        dsp.dma_stale_pop = False
        ring = plan.area("src0[0]")
        stale = np.frombuffer(dsp.vtcm.read(ring.offset, rw.row_bytes), dtype=np.uint8).reshape(1, -1)
        row0 = RepackedWeight(rw.qtype, rw.k, 1, stale.copy())
        y = y.copy()
        y[:, :1] = hvx_matmul(row0, image, M)
        dsp.farf("HIGH", "matmul: DMA pop returned a stale completion; weight row 0 read before it arrived")
        return y

    def _hvx_f16_ddr(self, node: Tensor) -> np.ndarray:
        w, x = node.src[0], node.src[1]
        wv = np.asarray(array(w), dtype=np.float32)
        xv = np.asarray(array(x), dtype=np.float32)
        r2, r3 = x.ne[2] // w.ne[2], x.ne[3] // w.ne[3]
        out = np.empty(node.ne[::-1], dtype=np.float32)
        for i3 in range(x.ne[3]):
            for i2 in range(x.ne[2]):
                wm = wv[i3 // r3, i2 // r2].astype(np.float16)
                out[i3, i2] = hvx_matmul_f16_ddr(wm, xv[i3, i2], src1_f16=x.type == GGMLType.F16)
        return out

    def _leave_hvx_bytes(self, dsp: Dsp, plan: MatmulPlan, rw: RepackedWeight, y: np.ndarray) -> None:
        """Each thread's src0 ring ends holding its last weight rows, its dst area its last output rows.

        The ring images depend only on the weight and the layout, so each weight keeps them, as runs of adjacent
        rings written at once, for the last few layouts it has run with (`RepackedWeight.ring_images`, 96 rows
        per weight and layout: ~50 MB for a 4B model's decode): a decode repacks each weight's last rows once
        instead of on every token. The bytes written are the same."""
        vt = dsp.vtcm
        nt = plan.n_threads or 1
        N = rw.n
        per = -(-N // nt)
        per += per & 1
        areas = {a.name: a for a in plan.areas}
        stride = plan.row_stride or rw.row_bytes
        rings = [areas.get(f"src0[{t}]") for t in range(nt)]
        key = ("hvx-rings", nt, stride, tuple((r.offset, r.size) if r is not None else None for r in rings))
        segments = rw.ring_images.get(key)
        if segments is None:
            if len(rw.ring_images) >= 4:  # layouts differ by M (the src1 area before the rings): keep a few
                rw.ring_images.clear()
            images = [(r.offset, self._ring_image(rw, r, t * per, min(N, (t + 1) * per), stride))
                      for t, r in enumerate(rings)]
            segments = rw.ring_images[key] = _contiguous_runs([(o, im) for o, im in images if im is not None])
        for offset, data in segments:  # the rings are disjoint: one write per run of adjacent rings
            vt.write(offset, data)
        for t in range(nt):
            r0, r1 = t * per, min(N, (t + 1) * per)
            if r0 >= r1:
                continue
            dst = areas.get(f"dst[{t}]")
            if dst is not None and dst.size:
                rowsb = np.ascontiguousarray(y[-2:, r0:r1]).view(np.uint8).reshape(-1)
                vt.write(dst.offset, rowsb[: dst.size])

    @staticmethod
    def _ring_image(rw: RepackedWeight, ring, r0: int, r1: int, stride: int) -> np.ndarray | None:
        """The bytes thread ring `ring` holds after streaming weight rows r0..r1: the last rows that fit, as x4x2
        rows zero-padded to `stride`, cut to the ring; None when the thread has no rows or no ring."""
        if r0 >= r1 or ring is None or not ring.size:
            return None
        last = rw.x4x2_rows(max(r0, r1 - ring.size // stride), r1)
        buf = np.zeros((last.shape[0], stride), dtype=np.uint8)
        buf[:, : rw.row_bytes] = last
        img = buf.reshape(-1)[: ring.size]
        img.flags.writeable = False
        return img
