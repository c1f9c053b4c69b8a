"""Version profiles of the HTP backend, and optional fault injections.

A profile is a set of behaviours of the backend's code at some point in time, not a scripted outcome: the
`2026-05` profile reproduces the code of the original team's window (ggml-org commits #23368..#23835,
primary reference bb4dc86a) with its defects; `robust` is the same machine with those defects fixed. What
happens on a given model and prompt comes out of these behaviours.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazeia.errors import KazeiaError


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    # HMX matmul VTCM plan: count the 2048 B rounding of each area in the chunk search?
    plan_counts_rounding: bool
    # what op_matmul does when the HMX kernel fails: "reenter" (calls itself again) or "hvx" (falls back)
    hmx_failure: str
    # do op status codes reach the host? (2026-05: responses always say OK)
    surface_status: bool
    # does every op that writes VTCM clear the src1 shortcut (the per-op rules are in src1_shortcut.py), and
    # does HVX matmul check that the cached image has its own format (not only the same descriptor)?
    vtcm_writers_clear_shortcut: bool = False
    shortcut_checks_format: bool = False
    # the partial last M tile of HMX activations: zero-filled rows (since #22724) or left stale
    zero_fill_m_tail: bool = True
    # the quantized HMX kernel reads src1 through its row stride and type (2026-05: M*K float32 from the data
    # pointer, whatever the view's stride or an F16 src1)
    hmx_reads_src1_layout: bool = False
    # HVX SSM_CONV stages the conv weights in VTCM per thread as [d_conv][rows of the thread]; 2026-05 strides them
    # by the thread's row count (often not a multiple of 32 floats), so the aligned vector loads of taps 1..d_conv-1
    # start below their row and read shifted weights (fixed upstream by ggml-org/llama.cpp #24470, June 2026:
    # "use padded stride for ssm-conv weights", rows per thread rounded up to 32)
    ssm_conv_padded_weight_stride: bool = False
    # DSP callback-thread stack and the bytes one op_matmul -> hmx_matmul_q_f32 attempt takes from it
    dsp_stack_bytes: int = 64 * 1024
    matmul_frame_bytes: int = 1536


PROFILES: dict[str, Profile] = {
    "2026-05": Profile(
        name="2026-05",
        description="ggml-hexagon as of late May 2026 (bb4dc86a): HMX plan budgets 256 B of overhead but "
                    "rounds every area to 2048 B; a failing HMX matmul re-enters op_matmul; unary ops, "
                    "argsort, concat, pad, gated delta net and HMX flash attention leave the src1 VTCM shortcut "
                    "stale; the quantized HMX kernel ignores src1's row stride and type; HVX SSM_CONV reads its "
                    "conv weights through an unpadded VTCM stride; op statuses are dropped",
        plan_counts_rounding=False,
        hmx_failure="reenter",
        surface_status=False,
    ),
    "robust": Profile(
        name="robust",
        description="the same backend with the defects fixed: the plan accounts for rounding and never "
                    "exceeds VTCM, an HMX failure falls back to HVX for that op, every op that writes VTCM "
                    "clears the src1 shortcut, HMX reads src1 through its stride and type, op statuses reach "
                    "the host as errors naming the op",
        plan_counts_rounding=True,
        hmx_failure="hvx",
        surface_status=True,
        vtcm_writers_clear_shortcut=True,
        shortcut_checks_format=True,
        hmx_reads_src1_layout=True,
        ssm_conv_padded_weight_stride=True,
    ),
}


@dataclass(frozen=True)
class Fault:
    name: str
    description: str


FAULTS: dict[str, Fault] = {f.name: f for f in [
    Fault("scatter-unretired",
          "HMX matmul: some HVX vscatter writes of the dequantized weight tiles of the first column tile are "
          "not drained before the HMX job reads them, so HMX reads whatever VTCM held there before (the "
          "previous op's bytes). How many tiles is a timing race: it changes run to run unless "
          "KAZEIA_HTP_RACE_SEED is set. Upstream (hmx-matmul-ops.c) drains every scatter region before the HMX "
          "job."),
    Fault("hmx-bias-stale",
          "HMX matmul: the output conversion (bias/scale) block is not reloaded, so the read-out uses the "
          "scale the HMX unit last held (1/sqrt(head_dim) after an HMX flash attention, 0 after reset). "
          "Upstream reloads the block (hmx-utils.h: hmx_init_column_scales) for every job."),
    Fault("vtcm-bank-crossing",
          "HMX deep loads whose VTCM run crosses a 4 MiB bank boundary raise a precise bus error (0x2601) "
          "and kill the DSP process, as the March 2026 hmx-matmul-ops.c warned (weak hypothesis)."),
    Fault("dma-unbalanced",
          "HVX matmul leaves one DMA descriptor outstanding at the end of the op; the next op's first DMA pop "
          "returns that stale completion and its first weight row is read before it arrived. Upstream balances "
          "its DMA pushes and pops per op (dma-queue.c: dma_queue_push / dma_queue_pop)."),
]}


def get_profile(name: str) -> Profile:
    p = PROFILES.get(name)
    if p is None:
        raise KazeiaError(f"unknown HTP profile '{name}' (available: {', '.join(PROFILES)})")
    return p


def check_faults(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    for n in names:
        if n not in FAULTS:
            raise KazeiaError(f"unknown HTP fault '{n}' (have: {', '.join(FAULTS)})")
    return tuple(names)
