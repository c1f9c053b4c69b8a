"""Running one op on the emulated DSP: MUL_MAT goes to matmul.py; the other ops use float32 kernels
(the HVX ops compute in fp32/qf32) and flash attention models its fp16 tiles. Every op leaves its scratch
bytes in VTCM in its own fixed layout and clears (or, per profile, forgets to clear) the src1 shortcut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kazeia.backends.htp.dsp import Dsp, OpContext, OpRecord
from kazeia.backends.htp.fast import ROUND_ROW, f16_to_f32, round_hw
from kazeia.backends.htp.fp16 import FP16_MAX, round_fp16
from kazeia.backends.htp.host import STATUS_OK, STATUS_VTCM_TOO_SMALL, OpBatch, OpDesc
from kazeia.backends.htp.hybrid_kernels import KERNELS_DSP
from kazeia.backends.htp.matmul import MatmulUnit, WeightStore
from kazeia.backends.htp.profiles import Profile
from kazeia.backends.htp.scratch import ScratchBinding, ScratchWriter
from kazeia.backends.htp.scratch_layouts import OpScratch
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.numpy_ops import KERNELS, NumpyOps, scatter_rows
from kazeia.graph.tensor import SCALAR_DTYPES, GGMLType, Tensor, array


class DspOps(NumpyOps):
    """NumpyOps over DDR: sources read from the buffers, results written at the op's L2 flush."""

    ft = np.float32

    def load(self, t: Tensor) -> np.ndarray:
        if t.type not in SCALAR_DTYPES:
            raise TypeError(f"{t.name}: the DSP reads {t.type.name} only through matmul")
        return f16_to_f32(array(t)) if t.type == GGMLType.F16 else np.asarray(array(t), dtype=np.float32)

    def load_c(self, t: Tensor) -> np.ndarray:
        """np.ascontiguousarray(load(t)), an F16 tensor widened straight into C order (a KV cache view)."""
        if t.type == GGMLType.F16:
            return f16_to_f32(array(t), order="C")
        return np.ascontiguousarray(self.load(t))

    def load_rows(self, t: Tensor, sel: np.ndarray) -> np.ndarray:
        return np.asarray(array(t)[0, 0, sel], dtype=np.float32)

    def store(self, t: Tensor, values: np.ndarray) -> None:
        out = array(t)
        out[...] = values.reshape(out.shape)

    def store_rows(self, t: Tensor, idx: np.ndarray, vals: np.ndarray) -> None:
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


FA_KV_BLOCK = 128  # KV rows per HMX flash-attention step (fp16 P@V partial results are rounded per step)


def _round16(x: np.ndarray) -> np.ndarray:
    """round_fp16(x) of a float32 array, by the native rounding kernel (fast.round_hw) when every value is within
    +-65504: there the two roundings agree (both RNE; they differ only past 65504, where round_hw gives inf), and a
    fresh C-contiguous float32 result is what round_fp16 returns for a C-contiguous input. numpy's software fp16
    conversion is the slow part of a decode's flash attention (~70 us per 8k values, the native kernel ~10)."""
    if (x.dtype == np.float32 and x.size >= ROUND_ROW and x.flags.c_contiguous
            and x.max() <= FP16_MAX and x.min() >= -FP16_MAX):  # (False for a NaN)
        return round_hw(x)
    return round_fp16(x)


TRANSPOSE_TILE = 64  # 64x64 float32 tiles (16 KB in, 16 KB out) stay in L1/L2 while numpy transposes them


def _transposed(k: np.ndarray) -> np.ndarray:
    """np.ascontiguousarray(k.transpose(0, 2, 1)) of a C-contiguous (H, n, D) array, copied tile by tile: numpy's
    whole-matrix transposed copy strides through memory (a decode's K, 8 x 256 x 128: ~400 us, tiled ~200)."""
    h, n, d = k.shape
    out = np.empty((h, d, n), dtype=k.dtype)
    t = TRANSPOSE_TILE
    for d0 in range(0, d, t):
        for c0 in range(0, n, t):
            out[:, d0:d0 + t, c0:c0 + t] = k[:, c0:c0 + t, d0:d0 + t].transpose(0, 2, 1)
    return out


class Executor:
    def __init__(self, settings: HtpSettings, profile: Profile, weights: WeightStore | None = None) -> None:
        self.settings = settings
        self.profile = profile
        self.io = DspOps()
        self.matmul = MatmulUnit(settings, profile, weights)
        self.scratch = ScratchWriter(settings, profile)
        self._bound: dict[int, BoundOp] = {}

    def execute(self, dsp: Dsp, octx: OpContext, op: OpDesc, batch: OpBatch) -> OpRecord:
        node = op.node
        if node.op == "MUL_MAT":
            return self.matmul.op_matmul(dsp, octx, op, batch)
        b = self._bound.get(id(node))
        if b is None or b.node is not node or b.src is not node.src or b.route_path != node.route_path:
            b = self._bind(node)
        sc, path = b.sc, b.path
        if sc.status == "VTCM_TOO_SMALL":
            # the op returns before touching anything: dst keeps whatever it held
            dsp.farf("ERROR", f"{node.desc()}: VTCM reservation {sc.vtcm} is too small, needed {sc.used}")
            return OpRecord(path=path, status=STATUS_VTCM_TOO_SMALL)
        if node.op == "FLASH_ATTN_EXT":
            self._flash_attn(node, use_hmx=path == "hmx")
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
        if len(self._bound) > 16384:  # nodes of graphs long gone
            self._bound.clear()
        sc = self.scratch.layout(node)
        path = sc.info.get("path", "hvx")
        b = BoundOp(node, node.src, node.route_path, sc, path, ScratchBinding(self.scratch.program(node, sc)),
                    self.scratch.src1_effect(node, path), _elementwise_ufunc(node))
        self._bound[id(node)] = b
        return b

    # --- flash attention ---
    def _flash_attn(self, n: Tensor, use_hmx: bool) -> None:
        # (S, H, T, D) with S = 1 (ne3): work on 3-D stacks of C-contiguous matrices so numpy uses BLAS
        q = self.io.load(n.src[0])[0]                                     # (H, T, D)
        k, v = (self.io.load_c(s)[0] for s in n.src[1:3])                # (Hkv, n_kv, D), (Hkv, n_kv, Dv)
        mask = self.io.load(n.src[3])[0, 0] if len(n.src) > 3 and n.src[3] is not None else None  # (T', n_kv)
        hkv = k.shape[0]
        # GQA: query head h reads KV head h // (H / Hkv). The KV matrices are broadcast over the g heads of their group
        # (stride 0) instead of repeated: numpy calls the same BLAS product on the same C-contiguous matrices.
        v = np.ascontiguousarray(v)[:, None]                              # (Hkv, 1, n_kv, Dv)
        scale = np.float32(n.params["scale"])
        q16 = _round16(q)
        kt = _transposed(k)[:, None]                                       # (Hkv, 1, D, n_kv)
        s = self._grouped(np.matmul, q16, kt, hkv)
        # HMX: the S tile is read out as fp16 with the qk scale applied by the output conversion block
        s = _round16(s * scale) if use_hmx else s * scale
        if mask is not None:
            s = s + mask[None, : s.shape[1], : s.shape[2]]
        with np.errstate(invalid="ignore", over="ignore"):
            m = np.max(s, axis=-1, keepdims=True)
            m = np.where(np.isneginf(m), 0.0, m).astype(np.float32)
            p = np.exp(s - m).astype(np.float32)
        l = p.sum(axis=-1, keepdims=True, dtype=np.float32)
        if use_hmx:
            p16 = _round16(p)
            o = np.zeros(q.shape[:-1] + (v.shape[-1],), dtype=np.float32)
            for j in range(0, p.shape[-1], FA_KV_BLOCK):  # per KV block: fp16 read-out, fp32 accumulation
                # the blocks are views: each of their matrices is row-contiguous, so numpy makes the same BLAS
                # calls as on copies (only the leading dimension differs; the same bits on 882 shapes tried)
                pj = p16[..., j:j + FA_KV_BLOCK]
                vj = v[:, :, j:j + FA_KV_BLOCK]
                o += _round16(self._grouped(np.matmul, pj, vj, hkv))
        else:
            o = self._grouped(np.matmul, p, v, hkv)
        o = o / np.where(l == 0, 1.0, l)
        self.io.store(n, o.transpose(1, 0, 2)[None])  # (T, H, Dv): dst ne = [Dv, H, T]

    @staticmethod
    def _grouped(matmul, a: np.ndarray, b: np.ndarray, hkv: int) -> np.ndarray:
        """(H, T, X) @ (Hkv, 1, X, Y) -> (H, T, Y), head h against matrix h // (H / Hkv)."""
        h = a.shape[0]
        return matmul(a.reshape(hkv, h // hkv, *a.shape[1:]), b).reshape(h, a.shape[1], b.shape[-1])

