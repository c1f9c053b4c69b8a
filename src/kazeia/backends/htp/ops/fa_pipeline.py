"""HMX flash attention's pipeline with some of its queue jobs skipped (fault hmx-queue-narrowing, build_layout.py).

May's `hmx-flash-attn-ops.c: hmx_flash_attn_ext`, pipelined (>= 3 KV blocks, >= 2 HVX threads), per KV head and
block of Br query rows (the G heads of the group interleaved: g_br rows), KV blocks of Bc columns:
- O tiles ping-pong: o_tile_prev = o_tiles[0] is zeroed, o_tile_curr = o_tiles[1];
- block b: the HMX job O_update(b-1) (`O_curr = D @ O_prev + P @ V`, then prev and curr swap), the job
  qk_dot(b) (`S = Q K^T`, the qk scale in the output conversion), then on HVX the online softmax of S plus the
  mask (m, l, P, and D = diag(exp(m_old - m_new)));
- after the blocks: O_update(last), swap, then the job o_norm (`O_curr = diag(1/l) @ O_prev`) and the store of
  O_curr.
A skipped job leaves its output as VTCM held it: qk's S tiles (never written in this op: every qk job is the same
function), O_update's O_curr, o_norm's O_curr. The HVX phases run as written.

This model runs only where a job is skipped: the numbers of the working jobs follow the kernel's order (fp16 S,
P and O tiles, float32 accumulation in kazeia's order, backends/ordered.py), not ops/flash_attn.py's bits; the tile
layouts inside a stale buffer are read as output tiles (which tile order the DSP left there is not modelled).
"""

from __future__ import annotations

import numpy as np

from kazeia.backends.htp.device import Dsp
from kazeia.backends.htp.fp16 import round_fp16_hw
from kazeia.backends.htp.hmx.tiles import output_from_tiles
from kazeia.backends.htp.kernels.expf import exp_f32
from kazeia.backends.htp.vtcm.op_layouts import OpScratch
from kazeia.backends.ordered import ordered_matmul
from kazeia.graph.tensor import Tensor

M_INIT = np.float32(-65504.0)  # hvx_splat_u16_a(m_vec, 0xfbff): the fp16 lowest


def _stale(dsp: Dsp, sc: OpScratch, area: str, rows: int, cols: int) -> np.ndarray:
    """The (rows, cols) fp16 values an area holds now, read as output tiles."""
    a = sc.area(area)
    raw = np.frombuffer(dsp.vtcm.read(a.offset, min(a.size, rows * cols * 2)), dtype=np.uint8)
    return output_from_tiles(raw, rows, cols).copy()


def _mm16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b of fp16-valued float32 matrices in kazeia's order (products exact), read out as fp16."""
    return round_fp16_hw(ordered_matmul(a[None], b[None], True)[0])


class _Pipeline:
    """One op's buffers: S tiles and the two O tiles, as VTCM held them when the op began."""

    def __init__(self, dsp: Dsp, sc: OpScratch, dv: int, skipped: frozenset[str]) -> None:
        self.g_br, self.bc = int(sc.info["g_br"]), int(sc.info["Bc"])
        self.s = _stale(dsp, sc, "s_tiles", self.g_br, self.bc)
        self.o = [_stale(dsp, sc, f"o_tiles{i}", self.g_br, dv) for i in (0, 1)]
        self.skipped = skipped

    def q_block(self, q16: np.ndarray, k16: np.ndarray, v16: np.ndarray, mask: np.ndarray | None,
                scale: np.float32) -> np.ndarray:
        """O for the rows of one (KV head, query block): q16 (rows, D), k16 (n_kv, D), v16 (n_kv, Dv), mask
        (rows, n_kv) or None. Returns (rows, Dv) float32."""
        rows, n_kv = q16.shape[0], k16.shape[0]
        self.o[0][...] = 0.0
        prev, curr = 0, 1
        m = np.full((rows, 1), M_INIT, dtype=np.float32)
        l = np.zeros((rows, 1), dtype=np.float32)
        p16 = d16 = v_prev = None
        for c0 in range(0, n_kv, self.bc):
            c1 = min(n_kv, c0 + self.bc)
            if p16 is not None:
                self._o_update(prev, curr, d16, p16, v_prev, rows)
                prev, curr = curr, prev
            if "qk" not in self.skipped:
                self.s[:rows, : c1 - c0] = round_fp16_hw(_mm16(q16, np.ascontiguousarray(k16[c0:c1].T)) * scale)
            x = self.s[:rows, : c1 - c0]
            with np.errstate(invalid="ignore", over="ignore"):  # (stale S may hold inf and NaN patterns)
                if mask is not None:
                    x = x + mask[:, c0:c1]
                m_new = np.maximum(m, x.max(axis=-1, keepdims=True))
                p = exp_f32((x - m_new).astype(np.float32))
                d = exp_f32((m - m_new).astype(np.float32))
            l = (l * d + p.sum(axis=-1, keepdims=True, dtype=np.float32)).astype(np.float32)
            m, p16, d16, v_prev = m_new, round_fp16_hw(p), round_fp16_hw(d), v16[c0:c1]
        if p16 is not None:
            self._o_update(prev, curr, d16, p16, v_prev, rows)
            prev, curr = curr, prev
        if "o_norm" not in self.skipped:
            with np.errstate(divide="ignore"):
                inv = round_fp16_hw(np.where(l > 0, np.float32(1.0) / l, np.float32(0.0)))
            self.o[curr][:rows] = round_fp16_hw(inv * self.o[prev][:rows])
        return self.o[curr][:rows].copy()

    def _o_update(self, prev: int, curr: int, d16: np.ndarray, p16: np.ndarray, v16: np.ndarray, rows: int) -> None:
        if "o_update" in self.skipped:
            return
        acc = ordered_matmul(p16[None], np.ascontiguousarray(v16)[None], True)[0]
        with np.errstate(invalid="ignore", over="ignore"):
            self.o[curr][:rows] = round_fp16_hw(d16 * self.o[prev][:rows] + acc)


def flash_attn_skipping(io, dsp: Dsp, n: Tensor, sc: OpScratch) -> None:
    """FLASH_ATTN_EXT through May's HMX pipeline with the build's skipped jobs (`dsp.skipped_workers`)."""
    q = io.load(n.src[0])[0]                                          # (H, T, D)
    k = io.load_c(n.src[1])[0]                                        # (Hkv, n_kv, D)
    v = io.load_c(n.src[2])[0]                                        # (Hkv, n_kv, Dv)
    mask = io.load(n.src[3])[0, 0] if len(n.src) > 3 and n.src[3] is not None else None  # (T', n_kv)
    h, t = q.shape[0], q.shape[1]
    hkv, dv = k.shape[0], v.shape[-1]
    g = h // hkv
    br = int(sc.info["Br"])
    scale = np.float32(n.params["scale"])
    pipe = _Pipeline(dsp, sc, dv, dsp.skipped_workers)
    q16, k16, v16 = round_fp16_hw(q), round_fp16_hw(k), round_fp16_hw(v)
    o = np.empty((h, t, dv), dtype=np.float32)
    for hk in range(hkv):
        for q0 in range(0, t, br):
            q1 = min(t, q0 + br)
            # rows interleave the group's heads: row (i, j) = token q0 + i, head hk * g + j
            qb = q16[hk * g:(hk + 1) * g, q0:q1].transpose(1, 0, 2).reshape(-1, q.shape[-1])
            mb = None if mask is None else np.repeat(mask[q0:q1], g, axis=0)
            ob = pipe.q_block(qb, k16[hk], v16[hk], mb, scale)
            o[hk * g:(hk + 1) * g, q0:q1] = ob.reshape(q1 - q0, g, dv).transpose(1, 0, 2)
    dsp.farf("HIGH", f"{n.name}: HMX flash-attention jobs taken for HMX_QUEUE_NOOP: "
                     f"{', '.join(sorted(dsp.skipped_workers & {'qk', 'o_update', 'o_norm'}))}")
    io.store(n, o.transpose(1, 0, 2)[None])
