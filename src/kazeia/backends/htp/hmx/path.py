"""The HMX path of MUL_MAT on the emulated DSP (matmul.MatmulUnit's HMX half): the plan's VTCM checks and
faults, the fp16 tile product (hmx/tiles.py), and the images the kernel leaves in VTCM.

A mixin of MatmulUnit: it uses the unit's `settings`, `profile` and `weights` (the REPACK store)."""

from __future__ import annotations

import numpy as np

from kazeia.backends.htp import cost
from kazeia.backends.htp.device import Dsp
from kazeia.backends.htp.hmx import pipeline
from kazeia.backends.htp.hmx.deep_loads import BANK_BYTES, bank_crossings
from kazeia.backends.htp.hmx.tiles import (
    hmx_matmul,
    hmx_matmul_weight,
    output_from_tiles,
    output_to_tiles,
    pad_rows,
    stage_a16,
    stage_activations,
    weight_from_tiles,
    weight_to_tiles,
)
from kazeia.backends.htp.host.repack import RepackedWeight, WeightSource
from kazeia.backends.htp.kernels.rounding import ROUND_ROW, shuffled_fp16
from kazeia.backends.htp.msg import STATUS_OK, DspFault, OpDesc, OpRecord
from kazeia.backends.htp.profiles import (
    HMX_BIAS_STALE,
    L2_LAZY_STALE,
    SCATTER_UNRETIRED,
    V73_HMX_QUANT_INF,
    VTCM_BANK_CROSSING,
    Profile,
)
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm import arena as V
from kazeia.backends.htp.vtcm.matmul.record import MatmulPlan
from kazeia.graph.tensor import GGMLType, Tensor, array, type_name


class HmxPath:
    """The HMX path of MUL_MAT (MatmulUnit holds one): built with the session's settings, profile and REPACK
    buffer; `run` multiplies one op on HMX under its plan, or returns None when the plan does not fit."""

    def __init__(self, settings: HtpSettings, profile: Profile, weights: WeightSource) -> None:
        self.settings = settings
        self.profile = profile
        self.weights = weights

    def run(self, dsp: Dsp, op: OpDesc, batched: bool, plan: MatmulPlan) -> OpRecord | None:
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
        qtype = type_name(w.type)
        if VTCM_BANK_CROSSING.acts(self.settings, "hmx", qtype):
            crossing = bank_crossings(plan)
            if crossing:
                c = crossing[0]
                boundary = (c.offset // BANK_BYTES + 1) * BANK_BYTES
                raise DspFault("bus-error", f"precise bus error 0x2601: HMX {c.kind} load run 0x{c.offset:06x}-"
                                            f"0x{c.end - 1:06x} crosses a 4 MiB VTCM bank ({node.name})",
                               {"vtcm_offset": boundary, **c.to_dict()})
        out = array(node)
        if L2_LAZY_STALE.acts(self.settings, "hmx", qtype):
            dsp.stale_reads[node.data_addr] = out.copy()  # what an unfused consumer will read (#25876)
        if batched or not (w.ne[2] == w.ne[3] == 1):
            y = self._hmx_batched_f16(node)
        else:
            y = self._hmx_2d(dsp, node, plan, out)
        dsp.hmx_scale = 1.0
        if y is not None:  # (None: computed in dst itself)
            out[...] = y.reshape(out.shape)
        if V73_HMX_QUANT_INF.acts(self.settings, "hmx", qtype):
            out[...] = np.inf  # #26123 as reported (ERR = inf), not explained
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

    def _hmx_2d(self, dsp: Dsp, node: Tensor, plan: MatmulPlan, out: np.ndarray) -> np.ndarray | None:
        """The 2-D HMX product; computed straight into `out` (dst) when that is a C-contiguous float32 (M, N)
        array (returns None then), else returned."""
        w, x = node.src[0], node.src[1]
        M, K = x.ne[1], w.ne[0]
        if w.type == GGMLType.F16 or self.profile.hmx_reads_src1_layout:
            xs = np.asarray(array(x)[0, 0], dtype=np.float32)  # stride and type honoured (F16 kernel; robust)
        else:
            xs = self._src1_rows_assumed_contiguous(x, M, K)
        rw = self.weights.get(w)
        a16 = shuffled_fp16(xs, self.settings.arch)  # below v79 a -inf activation stages as NaN
        if "matmul" in dsp.skipped_workers and w.type != GGMLType.F16:  # (the F16 kernel runs HMX inline)
            y = self._skipped_jobs_output(dsp, node, plan, M, w.ne[1])
            self._leave_hmx_bytes(dsp, plan, rw, xs, a16, y)  # (the HVX stages still ran)
            return y  # (run stores it into dst)
        s = self.settings
        patch = self._unretired_scatter(dsp, node, plan, K) if SCATTER_UNRETIRED.acts(s, "hmx") else None
        scale = dsp.hmx_scale if HMX_BIAS_STALE.acts(s, "hmx") else 1.0
        N = w.ne[1]
        dst = None  # dst itself, when the product can be computed there (not over src1: xs is read after)
        if (out.dtype == np.float32 and out.flags.c_contiguous and out.size == M * N
                and not np.may_share_memory(out, xs)):
            dst = out.reshape(M, N)
        y = hmx_matmul_weight(a16, rw, patch, scale, out=dst)
        self._leave_hmx_bytes(dsp, plan, rw, xs, a16, y, y_kept=dst is None)
        return None if dst is not None else y

    @staticmethod
    def _skipped_jobs_output(dsp: Dsp, node: Tensor, plan: MatmulPlan, M: int, N: int) -> np.ndarray:
        """Fault hmx-queue-narrowing, hmx_matmul_worker_fn skipped (build_layout.py): hmx_matmul_q_f32 pushes one
        job per (M chunk, column chunk) into output buffer out{i % 2}, the queue marks it done without running it,
        and transfer_output_chunk_threaded converts what that buffer held (fp16 tiles) into dst. Every job of the
        op is skipped (the same function), so each chunk reads the buffer as it was before the op."""
        mc, nc = plan.mc or 32, plan.nc or 32
        stale = [np.frombuffer(dsp.vtcm.read(plan.area(a).offset, plan.area(a).size), dtype=np.uint8)
                 for a in ("out0", "out1")]
        y = np.empty((M, N), dtype=np.float32)
        for m0 in range(0, M, mc):
            rows = min(mc, M - m0)
            m_pad = -(-rows // 32) * 32
            for i, n0 in enumerate(range(0, N, nc)):
                cols = min(nc, N - n0)
                n_pad = -(-cols // 32) * 32
                y[m0:m0 + rows, n0:n0 + cols] = output_from_tiles(stale[i % 2][: m_pad * n_pad * 2], rows,
                                                                  n_pad)[:, :cols]
        dsp.farf("HIGH", f"{node.name}: {-(-M // mc) * -(-N // nc)} hmx_matmul_worker_fn jobs taken for "
                         f"HMX_QUEUE_NOOP: dst holds the output buffers' old bytes")
        return y

    def _unretired_scatter(self, dsp: Dsp, node: Tensor, plan: MatmulPlan, K: int):
        """Fault: some weight tiles of column chunk 0 were still in flight (vscatter not drained) when HMX read
        them, so for those tiles HMX sees what VTCM held before. How many is a race: it depends on timing, so it
        changes run to run unless KAZEIA_HTP_RACE_SEED pins it. Returns the patch hmx_matmul_weight applies to
        the first tile of weight rows."""
        nc = plan.nc
        names = {a.name for a in plan.areas}
        october = "act_f32" in names  # (2026-10: HMX reads the dequant scratch)
        wt0 = plan.area(next(n for n in (("scratch0",) if october else ("wt0", "weight")) if n in names))
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
        y = np.empty(a16.shape[:-1] + (wv.shape[-2],), dtype=np.float32)
        for i3 in range(y.shape[0]):
            for i2 in range(y.shape[1]):
                y[i3, i2] = hmx_matmul(a16[i3, i2], wv[i3, i2])
        return y

    def _leave_hmx_bytes(self, dsp: Dsp, plan: MatmulPlan, rw: RepackedWeight, xs: np.ndarray,
                         a16: np.ndarray, y: np.ndarray, y_kept: bool = True) -> None:
        """VTCM after the kernel: the last M chunk's activation tiles, the last column chunks' raw rows, weight
        tiles and output tiles in their ping-pong buffers, and the 256 B scale block.

        The images are deferred writes (`Vtcm.write_lazy`): made only if something reads those bytes before a
        later op overwrites them (a stale-read fault, a snapshot, a dump), which in a plain run is never. What
        they capture is copied now (src1 rows, the previous activation bytes) or immutable (the mapped weight
        rows, this op's private output; when `y` is dst itself, not `y_kept`, the output chunks the areas hold are
        copied now). The activation image is made from a16, the rows as converted (an elementwise rounding: the
        bits of converting the last chunk's rows again), unless the staging converter differs from the op's
        (an arch below v79) or the chunk does not start on a 1024-element row of the rounding kernel."""
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
        arch = self.settings.arch
        if (arch is None or arch >= 79) and (m0 * K) % ROUND_ROW == 0:
            a_last = a16[m0:]  # a16 is this op's own array
            vt.write_lazy(a.offset, min(a.size, m_pad * K * 2), lambda: stage_a16(a_last, prev)[: a.size])
        else:
            x_last = np.array(xs[m0:], dtype=np.float32)  # src1's buffer is reused by later ops
            vt.write_lazy(a.offset, min(a.size, m_pad * K * 2),
                          lambda: stage_activations(x_last, prev=prev)[: a.size])

        def lazy(area, n0: int, n1: int) -> None:
            ar = plan.area(area)
            # 2026-10 plans an N that is not a multiple of 32 (padded to 32 by the solver): the last chunk's tiles
            # are whole, their columns past N zero here (what the DSP leaves there is not modelled)
            n_tiles = -(-(n1 - n0) // 32) * 32
            if area.startswith("wt") or area == "weight" or area.startswith("scratch"):
                nbytes, make = n_tiles * K * 2, lambda: weight_to_tiles(pad_rows(rw.w16_rows(n0, n1), n_tiles))
            elif area.startswith("out"):
                y_chunk = y[m0:, n0:n1] if y_kept else np.array(y[m0:, n0:n1])  # dst is reused by later ops
                nbytes, make = m_pad * n_tiles * 2, lambda: output_to_tiles(pad_rows(y_chunk.T, n_tiles).T)
            else:  # qweight: the raw x4x2 rows of chunk j, at the plan's row stride
                nbytes, make = (n1 - n0) * plan.row_stride, lambda: self._qweight_rows(rw, n0, n1, plan.row_stride)
            vt.write_lazy(ar.offset, min(nbytes, ar.size), lambda: make()[: ar.size])

        n_chunks = -(-N // nc)
        if "act_f32" in names:  # 2026-10: chunk j's dequantized tiles and outputs in buffer j % 2 (j % 1 unpipelined)
            bufs = 2 if "scratch1" in names else 1
            for j in range(max(0, n_chunks - bufs), n_chunks):
                lazy(f"scratch{j % bufs}", j * nc, min(N, (j + 1) * nc))
                lazy(f"out{j % bufs}", j * nc, min(N, (j + 1) * nc))
        elif "wt0" not in names:  # F16 kernel: [weight][activation][output][scratch0][scratch1][scales]
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
