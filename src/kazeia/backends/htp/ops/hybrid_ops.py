"""The gated-delta-net layers' ops on the emulated DSP: what they compute, and the bytes they leave in VTCM.

- SSM_CONV (ssm-conv.c): the scalar loop (decode, or fewer than 32 channels) reads DDR and sums the taps in
  fp32. The HVX path (prefill of 32+ tokens) stages, per thread, the conv weights transposed to [d_conv][rows]
  and tiles of the input transposed to [columns][channels] in VTCM, and reads them back with aligned vector
  loads. An aligned HVX load ignores the low 7 address bits (Qualcomm HVX PRM 80-N2040-61, "Memory: Alignment":
  "when using a general VMEM load or store, the least-significant bits of the address are ignored"), so when a
  thread's weight rows are not a multiple of 32 floats apart (2026-05: the stride is the thread's row count,
  e.g. ceil(8192 / 6) = 1366 for Qwen3.5-4B with 6 HVX threads) tap j reads the weights (j * stride) % 32
  channels earlier than its own. The `robust` profile has the June 2026 fix (#24470: rows per thread padded to
  32). Taps are summed in order, in fp32 (qf32 on device).
- GATED_DELTA_NET (gated-delta-net-ops.c): fp32 delta rule; decode keeps each thread's working state in VTCM
  (thread t ends holding the state of the last head it processed), prefill updates the state in the dst in DDR.
- CONCAT (concat-ops.c): the transposed 2-D path stages each block of rows in VTCM (src0 rows widened by the
  gathered src1 columns, and src1's transposed block).
"""

from __future__ import annotations

import numpy as np

from kazeia.backends.htp.vtcm.op_layouts import OpScratch
from kazeia.backends.numpy_ops import KERNELS, NumpyOps
from kazeia.graph.builder import gdn_snapshots
from kazeia.graph.tensor import Tensor, array

FP32_PER_VECTOR = 32


def ssm_conv(io: NumpyOps, vtcm, node: Tensor, sc: OpScratch) -> None:
    if sc.info.get("kernel") != "hvx":
        KERNELS["SSM_CONV"](io, node)  # scalar: every weight read from DDR at its own address
        return
    sx = io.load(node.src[0])[0]  # (n_s, d_inner, ncs)
    c = io.load(node.src[1])[0, 0]  # (d_inner, d_conv)
    d_inner, d_conv = c.shape
    n_s, ncs = sx.shape[0], sx.shape[2]
    n_t = node.ne[1]
    rows, tile, padded = sc.info["rows_per_thread"], sc.info["d_inner_tile"], sc.info["padded_stride"]
    w_eff = np.empty_like(c)
    for t in range(sc.n_threads):
        ir0, ir1 = rows * t, min(rows * (t + 1), d_inner)
        if ir0 >= ir1:
            continue
        n = ir1 - ir0
        stride = rows if padded else n  # where tap j's row of this thread's weights starts in src1_T
        a1 = sc.area(f"src1_T[{t}]")
        img = vtcm.view_f32(a1.offset, a1.size // 4)
        for j in range(d_conv):  # transpose_src1: [d_conv][rows]
            img[j * stride:j * stride + n] = c[ir0:ir1, j]
        for j in range(d_conv):  # the aligned loads of tap j, per 32-channel block
            base = j * stride
            w_eff[ir0:ir1, j] = img[base - base % FP32_PER_VECTOR + np.arange(n)]
        a0 = sc.area(f"src0_T[{t}]")
        img0 = vtcm.view_f32(a0.offset, tile * ncs).reshape(ncs, tile)
        for s in range(n_s):  # transpose_src0_block: [columns][channels of the tile], tile after tile
            for off in range(0, n, tile):
                m = min(tile, n - off)
                img0[:, :m] = sx[s, ir0 + off:ir0 + off + m, :].T
    acc = sx[:, :, 0:n_t] * w_eff[:, 0:1]
    for j in range(1, d_conv):
        acc = acc + sx[:, :, j:j + n_t] * w_eff[:, j:j + 1]
    io.store(node, acc.transpose(0, 2, 1)[None])


def gated_delta_net(io: NumpyOps, vtcm, node: Tensor, sc: OpScratch) -> None:
    KERNELS["GATED_DELTA_NET"](io, node)
    if not sc.info.get("vtcm_state"):
        return
    S, H, T, n_seqs = node.src[2].ne
    K = gdn_snapshots(node)
    states = array(node).reshape(-1)[S * H * T * n_seqs:].reshape(K, n_seqs * H, S * S)[K - 1]
    total, nth = n_seqs * H, sc.n_threads
    for t in range(min(nth, total)):  # rows ir = t, t + nth, ...: the spad ends with the last one's state
        last = t + (total - 1 - t) // nth * nth
        vtcm.write(sc.area(f"state[{t}]").offset, np.ascontiguousarray(states[last]))


def concat(io: NumpyOps, vtcm, node: Tensor, sc: OpScratch) -> None:
    KERNELS["CONCAT"](io, node)
    if sc.info.get("kernel") != "transposed" or sc.status != "ok":
        return
    src1 = node.src[1]
    el = node.nb[0]
    block, row_bytes, per = sc.info["block"], sc.info["row_bytes"], sc.info["rows_per_thread"]
    dst = np.ascontiguousarray(array(node)[0, 0]).view(np.uint8)  # (rows, (ne00 + ne10) * el)
    s1 = np.ascontiguousarray(array(src1)[0, 0])  # (rows, ne10): src1 as its own rows
    n_rows = node.ne[1]
    for t in range(sc.n_threads):
        start, end = t * per, min((t + 1) * per, n_rows)
        if start >= end:
            continue
        b0 = start + (end - start - 1) // block * block  # the last block this thread staged
        rows = end - b0
        a0 = sc.area(f"src0[{t}]")
        img0 = vtcm.view_u8(a0.offset, block * row_bytes).reshape(block, row_bytes)
        img0[:rows, :dst.shape[1]] = dst[b0:end]
        a1 = sc.area(f"src1[{t}]")
        lines = np.ascontiguousarray(s1[b0:end].T)  # (ne10, rows): the DMA of the transposed block
        img1 = vtcm.view_u8(a1.offset, src1.ne[0] * block * el).reshape(src1.ne[0], block * el)
        img1[:, :rows * el] = lines.view(np.uint8).reshape(src1.ne[0], rows * el)


KERNELS_DSP = {"SSM_CONV": ssm_conv, "GATED_DELTA_NET": gated_delta_net, "CONCAT": concat}
