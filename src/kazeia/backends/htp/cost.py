"""Modeled device time: an estimate of how long each op would take on the phone, NOT a measurement.

The model is deliberately simple and documented term by term:

- HMX matmul (quantized or F16 weights, M >= 32): per M chunk of `mc` rows the weights stream from DDR by
  DMA and are dequantized to fp16 tiles by the HVX threads; activations are staged to fp16 once; the MACs
  run on the HMX unit; outputs go back through HVX. The 4-stage pipeline overlaps DMA, dequant and HMX, so
  a chunk costs max(DMA, dequant, HMX) plus staging, plus a per-op setup cost.
- HVX matmul: integer dot products at an effective MAC rate over all HVX threads, overlapped with the
  weight stream from DDR; plus the dynamic quantization of the activations.
- Other HVX ops: bytes moved / an effective HVX streaming bandwidth, plus a per-op cost.
- Flash attention: its two matmuls at the HMX (or HVX) MAC rate plus the softmax streaming.
- Per batch: a dspqueue round trip.
- GATED_DELTA_NET: about 3 S_v^2 fp32 MACs per token and V head on HVX (decay, S^T k and the rank-1 update,
  S^T q), plus for decode one DMA of the state in and out; SSM_CONV: d_conv MACs per output (scalar on decode,
  one MAC per cycle per thread; HVX from 32 tokens, plus the transposes into VTCM, about 2x the input bytes).
- Ops the HTP refuses, or a routing rule sends to the host, run on the phone's CPU (`PhoneCpu`: cores, GFLOP/s
  per core and memory bandwidth as stated parameters, never this machine's clock): a matmul costs
  max(FLOPs / (cores * per-core rate), weight bytes / bandwidth) plus one hand-over; other ops their bytes /
  bandwidth. A refused matmul whose weight the loader put in the HTP's REPACK buffer also pays the copy of that
  weight to the CPU on every compute (`weight_copy_seconds`).

Constants are CALIBRATED, not derived: the HMX MAC rate, the HVX dot-product rate, the dequant rate and the
HVX streaming bandwidth were chosen so that a 256-token prefill of the real Qwen3-4B Q4_0 graph (36 layers,
vocabulary 151936, lm_head and embedding lookup on the CPU, built from shapes only) comes out near the
original team's measurements: about 300 tokens/s with HMX (they saw ~295) and about 41 with HMX off (~40).
`bench/bench_htp.py` prints both against those targets. Everything else follows from the same constants,
e.g. short prompts are slower per token (per-op and per-batch costs dominate). Treat every figure as "what
the model predicts", labelled as such everywhere it is printed.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazeia.backends.htp.host.support import supports_op
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_for_node
from kazeia.backends.htp.vtcm.scratch import op_scratch
from kazeia.graph import builder as gb
from kazeia.graph import rowsplit
from kazeia.graph.tensor import GGMLType, Tensor, TFlag, is_quantized, make_tensor, row_size


@dataclass(frozen=True)
class CostModel:
    hmx_macs_per_s: float = 2.3e12  # calibrated: effective fp16 HMX MAC rate
    hvx_macs_per_s: float = 1.6e11  # calibrated: effective int8 dot-product rate, all HVX threads
    hvx_dequant_elems_per_s: float = 1.0e10  # calibrated: x4x2 -> fp16 tile dequant (vscatter bound)
    hvx_stream_bytes_per_s: float = 20e9  # calibrated: elementwise ops, staging, quantization
    dma_bytes_per_s: float = 30e9  # DDR -> VTCM
    op_overhead_s: float = 6e-6  # per op on the DSP (dispatch, worker pool wake-up)
    hmx_setup_s: float = 25e-6  # HMX lock, queue, bias load per matmul
    batch_overhead_s: float = 120e-6  # dspqueue write + read round trip per batch
    hvx_f32_macs_per_s: float = 4.0e10  # fp32 MACs on HVX (a quarter of the int8 dot rate): GATED_DELTA_NET
    dsp_scalar_macs_per_s: float = 6 * 1.0e9  # scalar loop: one MAC per cycle per thread, 6 threads at ~1 GHz


@dataclass(frozen=True)
class PhoneCpu:
    """The phone's host CPU as the gate selection prices it (stated parameters, not a measurement): `cores` big
    cores at `gflops_per_core` fp32 GFLOP/s each (NEON dot products on Q4_0), `bandwidth` bytes/s of DRAM for
    the weight stream, `handover_s` per op that leaves the device (a graph split: sync and cache maintenance)."""

    cores: int = 4
    gflops_per_core: float = 15.0
    bandwidth: float = 30e9
    handover_s: float = 150e-6
    unrepack_bytes_per_s: float = 2e9  # one host thread un-repacking x4x2 rows (get_tensor): see weight_copy_seconds

    @property
    def flops_per_s(self) -> float:
        return self.cores * self.gflops_per_core * 1e9

    def matmul_seconds(self, m: int, k: int, n: int, wtype: GGMLType) -> float:
        wbytes = n * (row_size(wtype, k) if is_quantized(wtype) or wtype == GGMLType.F16 else 4 * k)
        return max(2.0 * m * k * n / self.flops_per_s, wbytes / self.bandwidth) + self.handover_s

    def weight_copy_seconds(self, nbytes: int) -> float:
        """One copy of a weight of `nbytes` out of the HTP's REPACK buffer (get_tensor's row-by-row un-repack)."""
        return nbytes / self.unrepack_bytes_per_s

    def op_seconds(self, node: Tensor) -> float:
        if node.op == "MUL_MAT":
            w, x = node.src[0], node.src[1]
            return self.matmul_seconds(x.nrows, w.ne[0], w.ne[1], w.type)
        return node.nbytes * 2 / self.bandwidth + self.handover_s


DEFAULT = CostModel()
PHONE_CPU = PhoneCpu()


def matmul_macs(m: int, k: int, n: int) -> int:
    return m * k * n


def hmx_matmul_seconds(m: int, k: int, n: int, wtype: GGMLType, mc: int, c: CostModel = DEFAULT) -> float:
    m_pad = (m + 31) // 32 * 32
    n_chunks_m = max(1, -(-m_pad // max(mc, 32)))
    wbytes = n * (row_size(wtype, k) if is_quantized(wtype) else 2 * k)
    per_chunk = max(wbytes / c.dma_bytes_per_s,  # stage A: raw weights into VTCM
                    n * k / c.hvx_dequant_elems_per_s,  # stage B: dequant to fp16 tiles
                    matmul_macs(min(mc, m_pad), k, n) / c.hmx_macs_per_s)  # stage C: HMX
    staging = (m * k * 4 + m * n * 4) / c.hvx_stream_bytes_per_s  # activations in, outputs out
    return c.hmx_setup_s + n_chunks_m * per_chunk + staging + c.op_overhead_s


def hvx_matmul_seconds(m: int, k: int, n: int, wtype: GGMLType, c: CostModel = DEFAULT) -> float:
    wbytes = n * (row_size(wtype, k) if is_quantized(wtype) or wtype == GGMLType.F16 else 4 * k)
    compute = matmul_macs(m, k, n) / c.hvx_macs_per_s
    quant = m * k * 4 / c.hvx_stream_bytes_per_s
    return max(compute, wbytes / c.dma_bytes_per_s) + quant + c.op_overhead_s


def flash_attn_seconds(n_head: int, n_tokens: int, n_kv: int, d: int, hmx: bool, c: CostModel = DEFAULT) -> float:
    macs = 2 * n_head * n_tokens * n_kv * d
    rate = c.hmx_macs_per_s if hmx else c.hvx_macs_per_s
    softmax = n_head * n_tokens * n_kv * 4 * 3 / c.hvx_stream_bytes_per_s
    return macs / rate + softmax + (c.hmx_setup_s if hmx else 0.0) + c.op_overhead_s


def elementwise_seconds(node: Tensor, c: CostModel = DEFAULT) -> float:
    if node.op in ("SET_ROWS", "GET_ROWS"):  # moves the selected rows only, not the whole table
        rows, data = node.src[1].nelements, node.src[0] if node.op == "SET_ROWS" else node
        nbytes = data.nbytes + rows * row_size(node.type, node.ne[0]) + node.src[1].nbytes
    else:
        nbytes = node.nbytes + sum(s.nbytes for s in node.src if s is not None and not s.weight_name and s is not node)
    return nbytes / c.hvx_stream_bytes_per_s + c.op_overhead_s


def gated_delta_net_seconds(node: Tensor, c: CostModel = DEFAULT) -> float:
    """3 S_v^2 fp32 MACs per token and V head (node.src[2].ne = S_v, H, n_tokens, n_seqs) on HVX; decode also
    moves the state in and out by DMA."""
    S, H, T, n_seqs = node.src[2].ne
    macs = 3 * S * S * H * T * n_seqs
    dma = 2 * S * S * 4 * H * n_seqs / c.dma_bytes_per_s if T == 1 else 0.0
    return macs / c.hvx_f32_macs_per_s + dma + c.op_overhead_s


def ssm_conv_seconds(node: Tensor, c: CostModel = DEFAULT, always_hvx: bool = False) -> float:
    """d_conv MACs per output (node.src[1].ne[0] = d_conv, node.ne = d_inner, n_t, n_s): under May's code the scalar
    loop below 32 tokens (or 32 channels), HVX from there with the transposes into VTCM (about twice the input
    bytes); `always_hvx`: October's code runs HVX always (ssm-conv.c: its decode and prefill kernels)."""
    d_inner, n_t, n_s = node.ne[0], node.ne[1], node.ne[2]
    macs = d_inner * n_t * n_s * node.src[1].ne[0]
    if not always_hvx and (n_t < 32 or d_inner < 32):
        return macs / c.dsp_scalar_macs_per_s + c.op_overhead_s
    return macs / c.hvx_f32_macs_per_s + 2 * node.src[0].nbytes / c.hvx_stream_bytes_per_s + c.op_overhead_s


# ------------------------------------------------------------------------------------------------------------
# modeled time of a whole graph the caller built (no data needed: placement and paths come from the same
# decisions the backend makes; kazeia.debug.modeled builds graphs of whole models from shapes)


@dataclass
class OpCost:
    name: str
    op: str
    where: str  # "HTP0/hmx", "HTP0/hvx", "CPU"
    seconds: float


def op_seconds(node: Tensor, settings: HtpSettings, c: CostModel = DEFAULT) -> OpCost:
    """Modeled time of one node as the HTP backend (with these settings) would place and run it; a node a routing
    rule sends to the host (`route_path` "cpu") or the HTP refuses is priced on the phone's CPU (PHONE_CPU), as
    the module says."""
    if node.route_path == "cpu":
        return OpCost(node.name, node.desc(), "CPU", PHONE_CPU.op_seconds(node))
    if not supports_op(node, settings):
        return OpCost(node.name, node.desc(), "CPU", PHONE_CPU.op_seconds(node) + weight_copy_seconds(node, settings))
    if rowsplit.parse_split(node.route_path) is not None:  # a split-op rule: the pieces, each on its own plan
        pieces = [op_seconds(p, settings, c) for p in rowsplit.split_nodes(node)]
        return OpCost(node.name, node.desc(), "+".join(p.where for p in pieces), sum(p.seconds for p in pieces))
    if node.op == "MUL_MAT":
        w, x = node.src[0], node.src[1]
        M, K, N = x.ne[1], w.ne[0], w.ne[1]
        plan = plan_for_node(node, settings)
        if plan.path == "hmx" and plan.fits:
            return OpCost(node.name, "MUL_MAT", "HTP0/hmx", hmx_matmul_seconds(M, K, N, w.type, plan.mc, c))
        return OpCost(node.name, "MUL_MAT", "HTP0/hvx", hvx_matmul_seconds(M, K, N, w.type, c))
    if node.op == "FLASH_ATTN_EXT":
        q, k = node.src[0], node.src[1]
        hmx = op_scratch(node, settings).info.get("path") == "hmx"  # the executor's own choice
        return OpCost(node.name, node.op, "HTP0/" + ("hmx" if hmx else "hvx"),
                      flash_attn_seconds(q.ne[2], q.ne[1], k.ne[1], q.ne[0], hmx, c))
    if node.op == "GATED_DELTA_NET":
        return OpCost(node.name, node.op, "HTP0/hvx", gated_delta_net_seconds(node, c))
    if node.op == "SSM_CONV":
        return OpCost(node.name, node.op, "HTP0/hvx",
                      ssm_conv_seconds(node, c, always_hvx=settings.caps.ssm_conv_always_hvx))
    return OpCost(node.name, node.desc(), "HTP0/hvx", elementwise_seconds(node, c))


def weight_copy_seconds(node: Tensor, settings: HtpSettings) -> float:
    """The copy of a refused MUL_MAT's weight to the CPU, on every compute. llama.cpp's loader puts a weight in the
    HTP's REPACK buffer when the HTP takes a probe MUL_MAT of it with a [K, 512] src1 (llama-model-loader.cpp
    weight_buft_supported); that buffer is not host memory (ggml_backend_hexagon_repack_buffer_type_is_host:
    false), so when the op itself is refused at run time (a src1 shape the probe did not have: #26094's
    [K, T, n_seqs]) ggml-backend's scheduler copies the weight into the CPU split on every graph compute
    (ggml_backend_sched_compute_splits), through get_tensor's row-by-row un-repack (repack_q4x4x2_q4_0). 0 for an
    op whose weight the loader kept on the CPU (the lm_head past 16K rows, an OPFILTER match). A routing rule's
    CPU op (`route_path`) is priced without it: kazeia's gates are not a scheduler copy."""
    if node.op != "MUL_MAT" or not node.src[0].flags & TFlag.WEIGHT:
        return 0.0
    w = node.src[0]
    probe = gb.mul_mat(w, make_tensor(GGMLType.F32, (w.ne[0], 512, w.ne[2], w.ne[3])))
    return PHONE_CPU.weight_copy_seconds(w.nbytes) if supports_op(probe, settings) else 0.0


def graph_seconds(nodes: list[Tensor], settings: HtpSettings, c: CostModel = DEFAULT) -> tuple[float, list[OpCost]]:
    """Sum over the computed nodes, plus one batch round trip per OPBATCH ops sent to the HTP. Under 2026-10 with
    fusion, an ADD the host would merge into its MUL_MAT, or a MUL into its RMS_NORM, costs nothing of its own (it
    is folded into the op's output pass) and is not an op of the batch."""
    computed = [n for n in nodes if n.is_computed]
    folded = _folded(computed, settings)
    costs = [OpCost(n.name, n.desc(), "HTP0/fused", 0.0) if n in folded else op_seconds(n, settings, c)
             for n in computed]
    n_htp = sum(1 for oc in costs if oc.where.startswith("HTP0") and oc.where != "HTP0/fused")
    batches = -(-n_htp // max(1, settings.opbatch)) if n_htp else 0
    return sum(oc.seconds for oc in costs) + batches * c.batch_overhead_s, costs


def _folded(nodes: list[Tensor], settings: HtpSettings) -> set[Tensor]:
    """The ADD and MUL nodes 2026-10's host would fuse into the op before them (host/fusion.py's pair_fusion on
    consecutive HTP nodes; the batch table's room is not checked here)."""
    from kazeia.backends.htp.host.fusion import fuseable_nodes, pair_fusion

    if not settings.caps.op_fusion or settings.opfusion <= 0:
        return set()
    tags = fuseable_nodes(nodes)
    return {n for prev, n in zip(nodes, nodes[1:])
            if prev in tags and supports_op(prev, settings) and supports_op(n, settings)
            and pair_fusion(prev, n, settings, tags) is not None}
