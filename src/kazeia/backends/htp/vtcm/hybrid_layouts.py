"""The VTCM scratch of the gated-delta-net layers' ops (SSM_CONV, GATED_DELTA_NET, CONCAT, and the unary ops
L2_NORM / SIGMOID / SOFTPLUS), as the May 2026 snapshot (ggml-org/ggml bb4dc86a, src/ggml-hexagon/htp/) carves it
from vtcm_base. The DSP kernels of these ops (ops/hybrid_ops.py) write the bytes themselves, so their layouts say
`kernel_writes` and the generic row streaming of scratch.py leaves them alone.
"""

from __future__ import annotations

from kazeia.backends.htp.vtcm.arena import VLEN, BumpAllocator, align_up, ceil_div
from kazeia.backends.htp.vtcm.op_layouts import OpScratch, unary_scratch
from kazeia.graph.tensor import Tensor

SSM_CONV_BUDGET = 1 << 20  # ssm-conv.c: HTP_SSM_CONV_VTCM_BUDGET, per thread
FP32_PER_VECTOR = VLEN // 4  # VLEN_FP32
GDN_MAX_SV = 128  # gated-delta-net-ops.c: HTP_GDN_MAX_SV
UNARY_OPS = ("SIGMOID", "SOFTPLUS", "NEG", "EXP", "TANH")  # unary-ops.c (SILU and GELU are act-ops.c)


def ssm_conv_rows_per_thread(d_inner: int, n_threads: int, padded: bool) -> int:
    """op_ssm_conv_f32: channels per thread. 2026-05: ceil(d_inner / n) made even; since #24470 rounded up to a
    whole vector (32 floats), which keeps every tap's weight row 128 B aligned."""
    per = ceil_div(d_inner, n_threads)
    return align_up(per, FP32_PER_VECTOR) if padded else per + (per & 1)


def ssm_conv_scratch(ncs: int, d_inner: int, n_t: int, d_conv: int, n_threads: int, vtcm_size: int,
                     padded: bool = False, always_hvx: bool = False) -> OpScratch:
    """SSM_CONV (f32): ssm-conv.c: op_ssm_conv_f32. HVX path only when d_inner >= 32 and n_t >= 32 (prefill), else
    the scalar loop reads DDR. Per thread: src1_T = the thread's conv weights transposed to [d_conv][rows]
    (round_up(d_conv * rows * 4, 256)), src0_T = a tile of d_inner_tile channels x ncs columns (the largest
    multiple of 32 channels that fits the 1 MiB budget). Layout [src0_T x threads][src1_T x threads]. The spad
    pointers (src1's included) are reset whenever d_inner_tile > 0, even on the scalar path."""
    nt = max(1, min(n_threads, d_inner))
    rows = ssm_conv_rows_per_thread(d_inner, nt, padded)
    src1_size = align_up(d_conv * rows * 4, 256)
    src0_max = SSM_CONV_BUDGET - src1_size if SSM_CONV_BUDGET > src1_size else 0
    tile = (src0_max // 4) // max(1, ncs)
    tile -= tile % FP32_PER_VECTOR
    use_hvx = (always_hvx or (d_inner >= FP32_PER_VECTOR and n_t >= FP32_PER_VECTOR)) and tile > 0
    b = BumpAllocator()
    if tile > 0:
        src0_size = align_up(tile * ncs * 4, 256)
        for t in range(nt):
            b.alloc(f"src0_T[{t}]", src0_size, written=None if use_hvx else 0)
        for t in range(nt):
            b.alloc(f"src1_T[{t}]", src1_size, written=None if use_hvx else 0)
        use_hvx = use_hvx and b.used <= vtcm_size
    return OpScratch("SSM_CONV", tuple(b.areas), b.used, vtcm_size, "ok", nt, "ssm-conv.c: op_ssm_conv_f32",
                     {"path": "hvx", "kernel": "hvx" if use_hvx else "scalar", "rows_per_thread": rows,
                      "d_inner_tile": tile, "padded_stride": padded, "kernel_writes": True, "resets_spads": tile > 0})


def gdn_scratch(S: int, n_tokens: int, n_threads: int, vtcm_size: int) -> OpScratch:
    """GATED_DELTA_NET: gated-delta-net-ops.c: op_gated_delta_net. Decode (one token) keeps each thread's working
    state in VTCM (DMA in, update, DMA out): thread t at base + t * round_up(S*S*4, 128), all n_threads threads.
    Prefill works on the state in DDR (the dst) and leaves VTCM alone."""
    b = BumpAllocator()
    state = align_up(S * S * 4, 128)
    use_vtcm = n_tokens == 1 and state * n_threads <= vtcm_size
    if use_vtcm:
        for t in range(n_threads):
            b.alloc(f"state[{t}]", state)
    return OpScratch("GATED_DELTA_NET", tuple(b.areas), b.used, vtcm_size, "ok" if use_vtcm else "none",
                     n_threads, "gated-delta-net-ops.c: op_gated_delta_net",
                     {"path": "hvx", "vtcm_state": use_vtcm, "kernel_writes": True})


def concat_scratch(src0: Tensor, src1: Tensor, dst: Tensor, dim: int, n_threads: int, vtcm_size: int) -> OpScratch:
    """CONCAT: concat-ops.c: op_concat. Only dim 0 of a 2-D dst with src1 transposed (and src0 not) uses VTCM:
    per thread src0 rows (block of 32 f32 / 64 f16 rows of round_up(ne00 + padded ne10, VLEN) bytes) and src1's
    transposed block (padded ne10 lines of one block width, plus the gather buffer). Layout [src0 x threads]
    [src1 x threads]; too big -> VTCM_TOO_SMALL before anything runs. The generic path copies element by element."""
    is_2d = dst.ne[2] == 1 and dst.ne[3] == 1
    transposed = src1.nb[0] > src1.nb[1] and not src0.nb[0] > src0.nb[1]
    src = "concat-ops.c: op_concat"
    if not (dim == 0 and is_2d and transposed):
        return OpScratch("CONCAT", (), 0, vtcm_size, "none", n_threads, src, {"path": "hvx", "kernel": "generic"})
    nt = max(1, min(dst.ne[1], n_threads))
    el = 4 if dst.type.name in ("F32", "I32") else 2
    block = 32 if el == 4 else 64
    ne10_pad = align_up(src1.ne[0], block)
    row0 = align_up((src0.ne[0] + ne10_pad) * el, VLEN)
    b = BumpAllocator()
    for t in range(nt):
        b.alloc(f"src0[{t}]", block * row0)
    for t in range(nt):
        b.alloc(f"src1[{t}]", ne10_pad * block * el + block * VLEN)
    ok = b.used <= vtcm_size
    return OpScratch("CONCAT", tuple(b.areas), b.used, vtcm_size, "ok" if ok else "VTCM_TOO_SMALL", nt, src,
                     {"path": "hvx", "kernel": "transposed", "block": block, "row_bytes": row0, "ne10_padded": ne10_pad,
                      "rows_per_thread": ceil_div(dst.ne[1], nt), "kernel_writes": True})


def hybrid_scratch(node: Tensor, n_threads: int, vtcm_size: int, padded_ssm_conv: bool,
                   ssm_conv_always_hvx: bool = False) -> OpScratch | None:
    """The layout of one of these ops, or None for the others. `ssm_conv_always_hvx`: 2026-10's SSM_CONV runs an
    HVX kernel at every size (ssm-conv.c: its decode and prefill kernels); kazeia lays it out as May's HVX kernel."""
    op = node.op
    if op == "L2_NORM" or (op == "UNARY" and node.params["unary_op"] in UNARY_OPS):
        name = op if op == "L2_NORM" else f"UNARY_{node.params['unary_op']}"
        return unary_scratch(node.src[0].ne[0], node.src[0].nrows, n_threads, vtcm_size, op=name, dst_ne0=node.ne[0])
    if op == "SSM_CONV":
        sx, c = node.src[0], node.src[1]
        return ssm_conv_scratch(sx.ne[0], sx.ne[1], node.ne[1], c.ne[0], n_threads, vtcm_size, padded_ssm_conv,
                                always_hvx=ssm_conv_always_hvx)
    if op == "GATED_DELTA_NET":
        v = node.src[2]
        return gdn_scratch(v.ne[0], v.ne[2], n_threads, vtcm_size)
    if op == "CONCAT":
        return concat_scratch(node.src[0], node.src[1], node, node.params["dim"], n_threads, vtcm_size)
    return None
