"""Running one op on the emulated DSP: MUL_MAT goes to matmul.py; the other ops use float32 kernels
(the HVX ops compute in fp32/qf32) and flash attention models its fp16 tiles. Every op leaves its scratch
bytes in VTCM in its own fixed layout and clears (or, per profile, forgets to clear) the src1 shortcut.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from kazeia.backends.htp.build_layout import FA_WORKERS
from kazeia.backends.htp.device import Dsp
from kazeia.backends.htp.hvx.dot_sequential import quantize_q8_0_rows
from kazeia.backends.htp.kernels.expf import DSP_MATH
from kazeia.backends.htp.kernels.rounding import f16_to_f32, round_hw
from kazeia.backends.htp.msg import STATUS_OK, STATUS_VTCM_TOO_SMALL, OpBatch, OpContext, OpDesc, OpRecord
from kazeia.backends.htp.ops.bound_ops import compute_for
from kazeia.backends.htp.ops.fa_pipeline import flash_attn_skipping
from kazeia.backends.htp.ops.flash_attn import flash_attn
from kazeia.backends.htp.ops.hybrid_ops import KERNELS_DSP
from kazeia.backends.htp.ops.matmul import MatmulUnit, WeightStore
from kazeia.backends.htp.profiles import V73_INPUT_STALE, Profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.op_layouts import OpScratch
from kazeia.backends.htp.vtcm.scratch import ScratchBinding, ScratchWriter
from kazeia.backends.numpy_ops import KERNELS, NumpyOps, scatter_rows
from kazeia.backends.ordered import ordered_matmul
from kazeia.gguf.quants import dequantize
from kazeia.graph.tensor import SCALAR_DTYPES, BufferUsage, GGMLType, Tensor, array, rows
from kazeia.identity import IdentityCache, binding


class DspOps(NumpyOps):
    """NumpyOps over DDR: sources read from the buffers, results written at the op's L2 flush."""

    ft = np.float32
    math = DSP_MATH  # exp, log1p, tanh, power, cos/sin by kazeia's rules (kernels/expf.py): the same bits everywhere

    def matvec(self, m: np.ndarray, x: np.ndarray) -> np.ndarray:
        """m (..., R, C) @ x (..., C) in the device model's product order (backends/ordered.py)."""
        lead = m.shape[:-2]
        r, c = m.shape[-2:]
        y = ordered_matmul(np.ascontiguousarray(m, dtype=np.float32).reshape(-1, r, c),
                      np.ascontiguousarray(x, dtype=np.float32).reshape(-1, c, 1))
        return y.reshape(*lead, r)

    def load(self, t: Tensor) -> np.ndarray:
        if t.type not in SCALAR_DTYPES:
            raise TypeError(f"{t.name}: the DSP reads {t.type.name} only through matmul")
        return f16_to_f32(array(t)) if t.type == GGMLType.F16 else np.asarray(array(t), dtype=np.float32)

    def load_c(self, t: Tensor, linger: bool = False) -> np.ndarray:
        """np.ascontiguousarray(load(t)), an F16 tensor widened straight into C order (a KV cache view; `linger`: see
        f16_to_f32). A Q8_0 KV cache view (2026-10's flash attention) is dequantized to fp16 as the DSP does
        (hvx_dequantize_row_q8_0_f16: fp16(f32(q * d)))."""
        if t.type == GGMLType.F16:
            return f16_to_f32(array(t), order="C", linger=linger)
        if t.type == GGMLType.Q8_0:
            with np.errstate(over="ignore", invalid="ignore"):
                return round_hw(dequantize(rows(t), t.type, np.float32))
        return np.ascontiguousarray(self.load(t))

    def load_rows(self, t: Tensor, sel: np.ndarray) -> np.ndarray:
        return np.asarray(array(t)[0, 0, sel], dtype=np.float32)

    def store(self, t: Tensor, values: np.ndarray) -> None:
        out = array(t)
        out[...] = values.reshape(out.shape)

    def store_rows(self, t: Tensor, idx: np.ndarray, vals: np.ndarray) -> None:
        if t.type == GGMLType.Q8_0:  # 2026-10's SET_ROWS into a Q8_0 KV cache (hvx_quantize_row_q8_0_f32)
            scatter_rows(rows(t), idx, quantize_q8_0_rows(vals))
            return
        scatter_rows(array(t), idx, vals)


@dataclass(slots=True)
class BoundOp:
    """What the executor works out once per (non-matmul) node: its VTCM layout and path, the scratch writes
    it leaves (scratch.ScratchBinding) and its effect on the src1 shortcut, with what they were worked out from."""

    node: Tensor
    src: tuple
    route_path: str | None
    sc: OpScratch
    path: str
    program: ScratchBinding
    effect: str
    ufunc: np.ufunc | None = None  # ADD / MUL of float32 rows numpy broadcasts: computed straight into dst
    fast: FastOp | None | bool = None  # the whole op bound to memory (None: not made yet, False: not possible)
    granted_short: bool | None = None  # 2026-10: its layout exceeds the VTCM the DSP was granted (None: not asked)


class FastOp:
    """A bound op's whole run with everything bound to memory: the tensors' views (made under one placement of the
    node's graph: under another, the general path runs and the op is bound again), the compute (bound_ops, the
    ufunc, or the numpy_ops kernel), the scratch copies (ScratchBinding's views) and the src1 effect. The same
    steps as `Executor.execute`'s general path, in the same order."""

    __slots__ = ("vtcm", "placement", "compute", "views", "reset")

    def run(self, dsp: Dsp, octx: OpContext, placement: object) -> bool:
        if dsp.vtcm is not self.vtcm or placement is not self.placement:
            return False
        self.compute()
        if self.views is not None:
            self.vtcm.write_views(*self.views)
        if self.reset:
            octx.src1_spad_src = None
            octx.src1_spad_kind = None
        return True

    @staticmethod
    def of(b: BoundOp, dsp: Dsp, io: DspOps, placement: object) -> FastOp | bool:
        """The FastOp of a bound op on this DSP under this placement of its graph, or False where the general path
        keeps running it."""
        node, sc = b.node, b.sc
        if sc.status != "ok" or node.op == "FLASH_ATTN_EXT" or node.op in KERNELS_DSP or node.op not in KERNELS:
            return False
        tensors = [node, *(t for t in node.src if t is not None)]
        try:
            arrays = [array(t) for t in tensors]
        except (TypeError, RuntimeError):  # a block-typed source (a quantized embedding) or no buffer
            return False
        views = None
        if sc.writes and not sc.info.get("kernel_writes") and dsp.profile.caps.op_scratch_images:  # (ScratchWriter)
            views = b.program.bind(dsp, node)
            if views is None:
                return False  # padded or strided rows: written run by run
        f = FastOp()
        f.vtcm, f.placement, f.views, f.reset = dsp.vtcm, placement, views, b.effect == "reset"
        compute = compute_for(node)
        if compute is None and b.ufunc is not None:
            fn, a0, a1, out = b.ufunc, arrays[1], array(node.src[1]), arrays[0]
            compute = lambda: fn(a0, a1, out=out)  # noqa: E731
        if compute is None:
            kernel = KERNELS[node.op]
            compute = lambda: kernel(io, node)  # noqa: E731
        f.compute = compute
        return f


def _elementwise_ufunc(node: Tensor) -> np.ufunc | None:
    """np.add / np.multiply for an ADD / MUL whose float32 src1 numpy broadcasts over src0 (each dim equal or 1)
    and whose dst has src0's shape: the kernels' `a + broadcast(b)` elementwise, the same float32 operations
    written into dst at once (no loaded copies, no temporary); None for anything else (the kernels run)."""
    fn = {"ADD": np.add, "MUL": np.multiply}.get(node.op)
    if fn is None or len(node.src) != 2 or any(t is None or t.type != GGMLType.F32 for t in (*node.src, node)):
        return None
    a, b = node.src
    if node.ne != a.ne or not all(y in (x, 1) for x, y in zip(a.ne, b.ne)):
        return None
    return fn


def _stale_add(dsp: Dsp, node: Tensor) -> OpRecord | None:
    """Fault l2-lazy-stale (#25876, reported, not explained): an ADD that is not fused into the HMX MUL_MAT whose
    output it reads, in the same batch, reads what that output's memory held before the MUL_MAT wrote it."""
    olds = [dsp.stale_reads.get(s.data_addr) if s is not None else None for s in node.src]
    if all(o is None for o in olds):
        return None
    a, b = (o if o is not None and o.shape == array(s).shape else array(s) for o, s in zip(olds, node.src))
    with np.errstate(all="ignore"):
        np.add(a, b, out=array(node))
    return OpRecord(path="hvx", status=STATUS_OK)


@contextmanager
def _host_writes_unseen(dsp: Dsp, node: Tensor):
    """Fault v73-input-stale (GenieX #1429, reported, not explained): while the op runs, the compute tensors it reads
    that the DSP did not write itself (what the host wrote: the embeddings the CPU looked up, positions, masks) read
    as zeros, the lines the DSP's cache held. Their host values come back after the op, except where the op's own
    output lies (an op computed in place)."""
    hidden = []
    for s in node.src:
        r = s.root if s is not None else None
        if (r is None or r.buffer is None or r.buffer.usage != BufferUsage.COMPUTE or id(r) in dsp.device_written
                or any(r is h for h, _ in hidden)):
            continue
        hidden.append((r, array(r).copy()))
        array(r)[...] = 0
    try:
        yield
    finally:
        out = node.root
        lo, hi = out.data_addr, out.data_addr + out.nbytes
        for r, saved in hidden:
            if r is not out and not (r.data_addr < hi and lo < r.data_addr + r.nbytes):
                array(r)[...] = saved
        dsp.device_written[id(out)] = out


FA_JOBS = frozenset(FA_WORKERS)


class Executor:
    """The DSP's OpRunner (msg.py): one op through the MUL_MAT unit, the bound fast path or the general kernels."""

    def __init__(self, settings: HtpSettings, profile: Profile, weights: WeightStore | None = None) -> None:
        self.settings = settings
        self.profile = profile
        self.io = DspOps()
        self.matmul = MatmulUnit(settings, profile, weights)
        self.scratch = ScratchWriter(settings, profile)
        self._bound: IdentityCache[BoundOp] = IdentityCache("htp.bound_ops", limit=16384, bind=True)

    def execute(self, dsp: Dsp, octx: OpContext, op: OpDesc, batch: OpBatch) -> OpRecord:
        if V73_INPUT_STALE.acts(self.settings):
            with _host_writes_unseen(dsp, op.node):
                return self._execute(dsp, octx, op, batch)
        return self._execute(dsp, octx, op, batch)

    def _execute(self, dsp: Dsp, octx: OpContext, op: OpDesc, batch: OpBatch) -> OpRecord:
        node = op.node
        if node.op == "MUL_MAT":
            return self.matmul.op_matmul(dsp, octx, op, batch)
        if dsp.stale_reads and node.op == "ADD" and not dsp.in_fused:
            rec = _stale_add(dsp, node)
            if rec is not None:
                return rec
        b = self._bound.get(node, lambda: self._bind(node),
                            lambda b: b.src is node.src and b.route_path == node.route_path)
        placement = op.placement
        if b.granted_short is None:
            b.granted_short = self.profile.caps.host_solves_plans and b.sc.used > self.settings.dsp_vtcm_bytes
        if b.granted_short:  # 2026-10: the kernel checks its host-sized layout against what the DSP was granted
            dsp.farf("ERROR", f"{node.desc()}: VTCM reservation {self.settings.dsp_vtcm_bytes} is too small, "
                              f"needed {b.sc.used}")
            return OpRecord(path=b.path, status=STATUS_VTCM_TOO_SMALL)
        if b.fast is not False and placement is not None and binding():
            # the bound run; made (again) when missing or bound under another placement
            if b.fast is not None and b.fast.run(dsp, octx, placement):
                return OpRecord(path=b.path, status=STATUS_OK)
            b.fast = FastOp.of(b, dsp, self.io, placement)
            if b.fast is not False and b.fast.run(dsp, octx, placement):
                return OpRecord(path=b.path, status=STATUS_OK)
        sc, path = b.sc, b.path
        if sc.status == "VTCM_TOO_SMALL":
            # the op returns before touching anything: dst keeps whatever it held
            dsp.farf("ERROR", f"{node.desc()}: VTCM reservation {sc.vtcm} is too small, needed {sc.used}")
            return OpRecord(path=path, status=STATUS_VTCM_TOO_SMALL)
        if node.op == "FLASH_ATTN_EXT":
            if path == "hmx" and dsp.skipped_workers & FA_JOBS and sc.info.get("pipeline"):
                flash_attn_skipping(self.io, dsp, node, sc)  # a bad build's queue (hmx-queue-narrowing)
            else:
                flash_attn(self.io, node, use_hmx=path == "hmx")
            if path == "hmx":
                dsp.hmx_scale = float(node.params["scale"])  # its qk-scale block is the last one loaded
        elif node.op in KERNELS_DSP:  # SSM_CONV, GATED_DELTA_NET, CONCAT: their own VTCM use and numerics
            KERNELS_DSP[node.op](self.io, dsp.vtcm, node, sc)
        elif b.ufunc is not None:
            b.ufunc(array(node.src[0]), array(node.src[1]), out=array(node))
        else:
            KERNELS[node.op](self.io, node)
        self.scratch.after_op(dsp, octx, op, batch, path, sc, b.program, b.effect)
        return OpRecord(path=path, status=STATUS_OK)

    def _bind(self, node: Tensor) -> BoundOp:
        """The node's layout, scratch program and src1 effect, kept by node: a decode runs the same graph's
        nodes every token, so each op is planned once (what the layout depends on is the node's shapes, params
        and route path; a node whose sources or route path changed is bound again)."""
        sc = self.scratch.layout(node)
        path = sc.info.get("path", "hvx")
        return BoundOp(node, node.src, node.route_path, sc, path, ScratchBinding(self.scratch.program(node, sc)),
                       self.scratch.src1_effect(node, path), _elementwise_ufunc(node))
