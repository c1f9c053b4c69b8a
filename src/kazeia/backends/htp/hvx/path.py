"""The HVX path of MUL_MAT on the emulated DSP (matmul.MatmulUnit's HVX half): src1 quantized into VTCM (or
the per-batch shortcut), the int8 dot (hvx/dot.py) reading the activations back from VTCM, and the ring and
dst images each thread leaves.

A mixin of MatmulUnit: it uses the unit's `settings`, `profile` and `weights` (the REPACK store)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from kazeia.backends.htp import cost
from kazeia.backends.htp.device import Dsp
from kazeia.backends.htp.host.repack import RepackedWeight, WeightSource
from kazeia.backends.htp.hvx.dot import hvx_matmul, hvx_matmul_f16_ddr
from kazeia.backends.htp.hvx.quant import (
    activation_row_size,
    q8_spill_bytes,
    quantize_activations,
    quantize_q8x4x2_into,
)
from kazeia.backends.htp.msg import STATUS_OK, STATUS_VTCM_TOO_SMALL, OpContext, OpDesc, OpRecord
from kazeia.backends.htp.profiles import DMA_UNBALANCED, Profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.arena import Area, Vtcm, span_box
from kazeia.backends.htp.vtcm.matmul.dispatch import src_layout
from kazeia.backends.htp.vtcm.matmul.record import MatmulPlan
from kazeia.graph.tensor import GGMLType, Tensor, array, type_name
from kazeia.identity import IdentityCache

_KIND = {GGMLType.Q4_1: "q8_1x4x2", GGMLType.F16: "f16"}


@functools.lru_cache(maxsize=4096)
def modeled_seconds(m: int, k: int, n: int, wtype: GGMLType) -> float:
    """cost.hvx_matmul_seconds with the default cost model (a pure function of the shape: kept)."""
    return cost.hvx_matmul_seconds(m, k, n, wtype)


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


@dataclass(frozen=True)
class LeaveProgram:
    """Where an HVX matmul of a plan leaves its bytes, worked out once per plan: each thread's ring with the
    weight rows it streams (`ring_key` names the images in `RepackedWeight.ring_images`) and each thread's dst
    area with its output columns (offset, first column, end column, area size), and the extent of those areas."""

    plan: MatmulPlan
    n: int
    stride: int
    rings: tuple[tuple[Area, int, int], ...]
    ring_key: tuple
    dsts: tuple[tuple[int, int, int, int], ...]
    dst_box: tuple[int, int]

    @classmethod
    def of(cls, plan: MatmulPlan, n: int, row_bytes: int) -> LeaveProgram:
        nt = plan.n_threads or 1
        per = -(-n // nt)
        per += per & 1
        areas = {a.name: a for a in plan.areas}
        stride = plan.row_stride or row_bytes
        rings = [areas.get(f"src0[{t}]") for t in range(nt)]
        key = ("hvx-rings", nt, stride, tuple((r.offset, r.size) if r is not None else None for r in rings))
        spans = [(t * per, min(n, (t + 1) * per)) for t in range(nt)]
        dsts = []
        for t, (r0, r1) in enumerate(spans):
            dst = areas.get(f"dst[{t}]")
            if r0 < r1 and dst is not None and dst.size:
                dsts.append((dst.offset, r0, r1, dst.size))
        return cls(plan, n, stride, tuple((r, r0, r1) for r, (r0, r1) in zip(rings, spans)), key, tuple(dsts),
                   span_box((off, size) for off, _, _, size in dsts))


def dot_scratch(cache: dict, shape: tuple[int, int, int], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The (x16, xs) scratch of `BoundDot` for `shape` (BoundDot.scratch_shape) and K, shared by the
    bindings of one path (one DSP runs one op at a time): x16 stays zero past what its callers write."""
    hit = cache.get((shape, k))
    if hit is None:
        m, n16, npad = shape
        hit = cache[(shape, k)] = (np.zeros((m, n16), dtype=np.int16), np.zeros((m, npad), dtype=np.int32))
    return hit


class HvxPath:
    """The HVX path of MUL_MAT (MatmulUnit holds one): built with the session's settings, profile and REPACK
    buffer; `run` is the DSP-planned kernel (May's), `run_host_plan` October's kernel under the host's plan. The
    bound decode matmuls (bound.py) get this path, its leave programs and its dot scratch."""

    def __init__(self, settings: HtpSettings, profile: Profile, weights: WeightSource) -> None:
        self.settings = settings
        self.profile = profile
        self.weights = weights
        self._leave_programs: IdentityCache[LeaveProgram] = IdentityCache("htp.leave_programs", bind=True)  # by plan
        self._dot_scratch: dict = {}

    def dot_scratch(self, shape: tuple[int, int, int], k: int) -> tuple[np.ndarray, np.ndarray]:
        return dot_scratch(self._dot_scratch, shape, k)

    def run(self, dsp: Dsp, octx: OpContext, op: OpDesc, reason: str, plan: MatmulPlan) -> OpRecord:
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
                                           "modeled_s": modeled_seconds(M, K, N, w.type)})

    def run_host_plan(self, dsp: Dsp, octx: OpContext, op: OpDesc, plan: MatmulPlan) -> OpRecord:
        """2026-10's HVX MUL_MAT (hvx_mm_matmul with the host's plan): quantized weights by the October numerics
        (dot_sequential.py), F16 weights by the F16 kernel. The VTCM image October's kernels leave is not modelled:
        under 2026-10 nothing reads it back (the src1 shortcut dies with the op)."""
        from kazeia.backends.htp.hvx.dot_sequential import hvx_matmul_sequential

        node = op.node
        w, x = node.src[0], node.src[1]
        M, K, N = x.ne[1], w.ne[0], w.ne[1]
        if w.type == GGMLType.F16:
            y = self._hvx_f16_ddr(node)
        else:
            y = hvx_matmul_sequential(self.weights.get(w), np.asarray(array(x), dtype=np.float32).reshape(-1, K))
        out = array(node)
        out[...] = y.reshape(out.shape)
        return OpRecord("hvx", STATUS_OK, {"reason": plan.reason, "vtcm_used": plan.used,
                                           "kernel": plan.info.get("kernel"),
                                           "modeled_s": modeled_seconds(M, K, N, w.type)})

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
            group = self.settings.fp32_quantize_group
            area = dsp.vtcm.view(0, np.uint8, nbytes).reshape(M, stride)  # (lands any deferred bytes there)
            if kind == "q8x4x2" and quantize_q8x4x2_into(xs, group, area):
                image = area  # quantized in place: the bytes `write` would copy there (nothing else owns them now)
            else:
                image = quantize_activations(xs, w.type, group, prev=area)  # (a copy of the area, then written)
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
        if DMA_UNBALANCED.acts(self.settings, "hvx"):
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
        prog = self.leave_program(plan, rw)
        self.leave_rings(dsp.vtcm, rw, prog)
        dsp.vtcm.write_runs(self.dst_runs(prog, y), prog.dst_box)  # (each run lies inside its dst area)

    def leave_program(self, plan: MatmulPlan, rw: RepackedWeight) -> LeaveProgram:
        """The LeaveProgram of `plan` for a weight of rw.n rows, kept by plan."""
        return self._leave_programs.get(plan, lambda: LeaveProgram.of(plan, rw.n, rw.row_bytes),
                                        lambda prog: prog.n == rw.n)

    def leave_rings(self, vt: Vtcm, rw: RepackedWeight, prog: LeaveProgram) -> None:
        """The weight rows each thread's ring holds at the end, written deferred (see `_leave_hvx_bytes`)."""
        segments = rw.ring_images.get(prog.ring_key)
        if segments is None:
            if len(rw.ring_images) >= 4:  # layouts differ by M (the src1 area before the rings): keep a few
                rw.ring_images.clear()
            images = [(r.offset, self._ring_image(rw, r, r0, r1, prog.stride)) for r, r0, r1 in prog.rings]
            segments = rw.ring_images[prog.ring_key] = _contiguous_runs([(o, im) for o, im in images
                                                                        if im is not None])
        for offset, data in segments:  # the rings are disjoint: one write per run of adjacent rings
            vt.write_deferred(offset, data)  # (the next matmul of the same K writes the same bytes over them)

    @staticmethod
    def dst_runs(prog: LeaveProgram, y: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(offset, bytes) of each thread's dst area at the end: its last output rows (M == 1 and y C-contiguous:
        views of y's bytes)."""
        if y.shape[0] == 1 and y.dtype == np.float32 and y.flags.c_contiguous:
            out = y.reshape(-1).view(np.uint8)  # one output row: each thread's columns are a slice of it
            return [(offset, out[4 * r0:4 * r0 + min(4 * (r1 - r0), size)]) for offset, r0, r1, size in prog.dsts]
        runs = []
        for offset, r0, r1, size in prog.dsts:
            rowsb = np.ascontiguousarray(y[-2:, r0:r1]).view(np.uint8).reshape(-1)
            runs.append((offset, rowsb[:size]))
        return runs

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
