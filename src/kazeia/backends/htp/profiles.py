"""Version profiles of the HTP backend, and optional fault injections.

A profile is a set of behaviours of the backend's code at some point in time, not a scripted outcome: the
`2026-05` profile reproduces the code of the original team's window (ggml-org commits #23368..#23835,
primary reference bb4dc86a) with its defects; `robust` is the same machine with those defects fixed (no upstream
version ever shipped it); `2026-10` is the code users build today (llama.cpp 0c1e57098bba, in the llama-cpp-python
0.3.36 sdist): host-solved matmul plans, op statuses that reach the host, asynchronous graph compute, op fusion.
What happens on a given model and prompt comes out of these behaviours.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazeia.errors import KazeiaError


@dataclass(frozen=True)
class Capabilities:
    """What one upstream code generation of ggml-hexagon does, as the questions the units ask: no unit compares a
    version's name, each reads the capability it depends on (GENERATIONS has one per snapshot; a test builds a
    third by changing some). The facts and their upstream sources are in each profile's description and in the
    units that implement them."""
    generation: str            # the snapshot's name, shown to users ("2026-05", "2026-10")
    # the host solves every MUL_MAT plan (kernel params), sizes the other ops' layouts itself, and its supports_op
    # has no row limits and takes K-quant weights; the DSP only re-checks the host's layouts against its grant
    host_solves_plans: bool
    hvx_dot_order: str         # "lanes" (32 lanes, then a tree) or "sequential" (one accumulator, K order)
    env_selects: bool          # GGML_HEXAGON_NHMX / MM_SELECT / FA_SELECT / GDN_SELECT / OPFUSION (else USE_HMX)
    op_fusion: bool            # ops fused on the host (RMS_NORM+MUL, MUL_MAT+ADD, MUL_MAT_NX) under OPFUSION
    async_graph_compute: bool  # graph_compute returns with the batch open (no flush at graph end)
    lazy_l2: bool              # the DSP tracks dirty L2 ranges and flushes them lazily (hex-l2)
    host_batch_limits: bool    # the host closes a batch when its op or tensor slots are full
    op_line_with_plan: bool    # GGML_HEXAGON_VERBOSE's op line carries the host's plan
    ssm_conv_always_hvx: bool  # SSM_CONV runs its HVX kernel at every size (else small ones are scalar)
    # the VTCM images of the non-matmul ops are May's layouts (forensic data); with host-solved layouts kazeia
    # does not restate them, and nothing reads them back
    op_scratch_images: bool
    queue_shm_in_vmem: bool    # the op queue's pinned shared memory comes out of the VMEM budget
    mapping_defrag: bool       # a failed DSP mapping drops every 32-bit mapping and retries once before abort()
    dma64_above_arch: int      # archs above this map weights through 64-bit "extended" mappings (99: none)
    min_session_arch: int      # below this arch no session opens (the autodetection caps it to an absent skel)


GENERATIONS: dict[str, Capabilities] = {c.generation: c for c in (
    Capabilities(generation="2026-05", host_solves_plans=False, hvx_dot_order="lanes", env_selects=False,
                 op_fusion=False, async_graph_compute=False, lazy_l2=False, host_batch_limits=False,
                 op_line_with_plan=False, ssm_conv_always_hvx=False, op_scratch_images=True,
                 queue_shm_in_vmem=False, mapping_defrag=False, dma64_above_arch=99, min_session_arch=0),
    Capabilities(generation="2026-10", host_solves_plans=True, hvx_dot_order="sequential", env_selects=True,
                 op_fusion=True, async_graph_compute=True, lazy_l2=True, host_batch_limits=True,
                 op_line_with_plan=True, ssm_conv_always_hvx=True, op_scratch_images=False,
                 queue_shm_in_vmem=True, mapping_defrag=True, dma64_above_arch=79, min_session_arch=73),
)}


def capabilities(generation: str) -> Capabilities:
    """The capabilities of an upstream code generation by its name: the one place a version's name is looked up,
    so an unknown one is refused here, in one line."""
    c = GENERATIONS.get(generation)
    if c is None:
        raise KazeiaError(f"unknown ggml-hexagon code generation {generation!r} (modelled: {', '.join(GENERATIONS)})")
    return c


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    # HMX matmul VTCM plan: count the 2048 B rounding of each area in the chunk search?
    plan_counts_rounding: bool
    # what op_matmul does when the HMX kernel fails: "reenter" (calls itself again), "hvx" (falls back) or "status"
    # (2026-10 hmx_mm_op_matmul: returns INTERNAL-ERROR; the host had solved the plan, so only a DSP-side misfit fails)
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
    # which upstream code generation the host and DSP follow: "2026-05" (May's DSP-side plans, supports_op with
    # row limits, a flush at graph end, GGML_HEXAGON_USE_HMX) or "2026-10" (ggml-hexagon.cpp of 0c1e57098bba: host
    # solvers in kernel params, no row limits, graph_compute without a flush, NHMX / MM_SELECT / OPFUSION)
    generation: str = "2026-05"
    # what the host does with a non-OK response: "raise" (robust: the flush raises, naming the op) or "sticky"
    # (2026-10 flush_pending: log dsp-rsp, keep last_error, abort at the next synchronize / get-tensor, and a
    # later graph_compute returns GGML_STATUS_FAILED)
    status_policy: str = "raise"
    # the src1 VTCM shortcut's life: "batch" (cleared at batch start, and by the ops the profile says) or "op"
    # (2026-10 main.c: proc_op_req clears every spad src pointer after each op)
    shortcut_scope: str = "batch"
    # do op descriptors reuse an entry only for the same type too (#25968), not only the same address and shape?
    descriptor_checks_type: bool = False
    # OPBATCH and OPQUEUE when the env does not set them (ggml-hexagon.cpp opt_opbatch / opt_opqueue)
    default_opbatch: int = 1024
    default_opqueue: int = 16
    # hmx_queue_process compares a job's whole function pointer with the signals (#25677); 2026-05 casts it to the
    # one-byte enum (build_layout.py), so a build can skip a worker's jobs (fault hmx-queue-narrowing)
    queue_signal_full_width: bool = True

    # which llama.cpp graph its users build: "2026-05" (May's llama.cpp: an F32 KQ mask and its F16 cast, before
    # #23764) or "2026-10" (today's); robust is May's backend under today's llama.cpp
    llama_graph: str = "2026-10"
    # what its code does: its generation's capabilities (filled in from `generation` when not given; a test-only
    # profile gives its own)
    caps: Capabilities | None = None

    def __post_init__(self) -> None:
        if self.caps is None:
            object.__setattr__(self, "caps", capabilities(self.generation))


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
        llama_graph="2026-05",
        queue_signal_full_width=False,
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
    "2026-10": Profile(
        name="2026-10",
        description="ggml-hexagon as users build it in October 2026 (llama.cpp 0c1e57098bba): the host solves "
                    "every MUL_MAT plan against the session's VTCM (HMX from M = 5, else HVX, else the CPU) and "
                    "ships it in the op's kernel params; a DSP-side misfit returns an op status (the first of its "
                    "batch), the host keeps it sticky and aborts at the next synchronize; graph_compute returns "
                    "without flushing; RMS_NORM+MUL, MUL_MAT+ADD and MUL_MAT_NX are fused (OPFUSION); the DSP "
                    "tracks dirty L2 ranges lazily; the src1 shortcut is cleared after every op; descriptors "
                    "match on type too; HVX activations are quantized per 32 elements and summed in K order; "
                    "Q4_K and Q6_K weights and a Q8_0 KV cache run on the HTP (not modelled: the VTCM images of "
                    "the non-matmul ops and of the tiled weights; Q5_K and MXFP4 weights stay on the CPU)",
        plan_counts_rounding=True,
        hmx_failure="status",
        surface_status=True,
        vtcm_writers_clear_shortcut=True,
        shortcut_checks_format=True,
        hmx_reads_src1_layout=True,
        ssm_conv_padded_weight_stride=True,
        generation="2026-10",
        status_policy="sticky",
        shortcut_scope="op",
        descriptor_checks_type=True,
        default_opbatch=1280,
        default_opqueue=32,
    ),
}

DEFAULT = "2026-10"  # what -dev HTP0 models when nothing names a profile: the code users build today
LATEST_PROFILE = DEFAULT  # (the name the tools use: "the later code" a fault is checked against)


@dataclass(frozen=True)
class Fault:
    """One injectable fault: what it is, where it can act, and the one predicate every unit and tool asks
    (`fires`): the emulator's unit applies it when it fires on the op it runs, `kazeia check` marks the same ops."""
    name: str
    description: str
    report: str | None = None           # the public report whose symptom it injects (reported, not explained)
    only_in: str | None = None          # the code generation whose structure it needs (None: both)
    archs: tuple[int, ...] = ()         # the archs it acts on (empty: every arch)
    path: str | None = None             # the MUL_MAT path it acts on ("hmx", "hvx"; None: not a MUL_MAT path's)
    quantized_only: bool = False        # only weights in a block format (F16 and F32 weights are spared)
    scope: str | None = None            # where it acts, in words, when the fields above do not say it

    def exists_in(self, generation: str) -> bool:
        """Whether the code of this generation has the structure the fault needs."""
        return self.only_in is None or self.only_in == generation

    def fires(self, arch: int, path: str | None = None, qtype: str | None = None) -> bool:
        """Whether the fault acts on an op of this arch, run on `path`, with weights of `qtype` (a ggml type name,
        lower case: "q4_0", "f16"); None for what the caller's op does not have."""
        if self.archs and arch not in self.archs:
            return False
        if self.path is not None and path is not None and path != self.path:
            return False
        return not (self.quantized_only and qtype in ("f16", "f32"))

    def acts(self, settings, path: str | None = None, qtype: str | None = None) -> bool:
        """Injected in this session (`settings.faults`) and firing on this op (`fires`)."""
        return self.name in settings.faults and self.fires(settings.arch, path, qtype)


FAULTS: dict[str, Fault] = {f.name: f for f in [
    Fault("scatter-unretired",
          "HMX matmul: some HVX vscatter writes of the dequantized weight tiles of the first column tile are "
          "not drained before the HMX job reads them, so HMX reads whatever VTCM held there before (the "
          "previous op's bytes). How many tiles is a timing race: it changes run to run unless "
          "KAZEIA_HTP_RACE_SEED is set. Upstream (hmx-matmul-ops.c) drains every scatter region before the HMX "
          "job.",
          path="hmx"),
    Fault("hmx-bias-stale",
          "HMX matmul: the output conversion (bias/scale) block is not reloaded, so the read-out uses the "
          "scale the HMX unit last held (1/sqrt(head_dim) after an HMX flash attention, 0 after reset). "
          "Upstream reloads the block (hmx-utils.h: hmx_init_column_scales) for every job.",
          path="hmx"),
    Fault("vtcm-bank-crossing",
          "HMX deep loads whose VTCM run crosses a 4 MiB bank boundary raise a precise bus error (0x2601) "
          "and kill the DSP process, as the March 2026 hmx-matmul-ops.c warned (weak hypothesis).",
          path="hmx"),
    Fault("vtcm-grant-short",
          "The DSP is granted less VTCM than the host planned for (main.c: vtcm_alloc takes what "
          "HAP_compute_res_attr_get_vtcm_ptr_v2 returns, the host plans against htp_iface_hwinfo's query): "
          "KAZEIA_HTP_VTCM_GRANT bytes, by default 1 MiB less than the session's size. Under 2026-10 a kernel "
          "whose exact layout no longer fits returns an op status (INTERNAL-ERROR for HMX, VTCM-TOO-SMALL for "
          "HVX) instead of running; no such report is known (code-derived).",
          only_in="2026-10"),
    Fault("v73-hmx-quant-inf",
          "Reported, not explained (llama.cpp #26123, open): on v73 (8 Gen 2) every quantized MUL_MAT the HMX takes "
          "(n >= 5 under 2026-10) fails test-backend-ops with ERR = inf; F16/F32 and n <= 4 pass; models give "
          "garbage. The fault makes the output of each quantized HMX MUL_MAT +inf on a v73 device (no effect on "
          "other archs); what the hardware or kernel does wrong is not public.",
          report="llama.cpp #26123", only_in="2026-10", archs=(73,), path="hmx",
          quantized_only=True),
    Fault("l2-lazy-stale",
          "Reported, not explained (llama.cpp #25876, closed stale): on v81 after the lazy-L2 rework an ADD that "
          "consumes an HMX MUL_MAT's output reads stale data; OPFILTER=ADD fixes it. The fault makes an ADD of the "
          "same batch that is not fused into that MUL_MAT read what the output's memory held before the MUL_MAT "
          "wrote it, on a v81 device (no effect on other archs); the root cause is not published.",
          report="llama.cpp #25876", only_in="2026-10", archs=(81,), path="hmx"),
    Fault("v73-input-stale",
          "Reported, not explained (GenieX #1429, open): on a v73 device (QCM6690) the NPU's output does not depend "
          "on the prompt at all, with no crash and no error. The fault makes every op on a v73 device read what the "
          "host wrote into compute memory (the token embeddings the CPU looked up, the positions, the KQ mask) as "
          "the DSP's cache held those lines before the host wrote them: zeros, as if the host's writes were never "
          "made visible to the DSP (no effect on other archs); the root cause is not published.",
          report="GenieX #1429", archs=(73,)),
    Fault("reentry-tail-call",
          "A build of the 2026-05 code, not a defect of its own: the compiler turned op_matmul's last statement, "
          "`return op_matmul(octx);` after a failed HMX matmul (htp/matmul-ops.c), into a jump (tail-call "
          "elimination). The re-entry then takes no stack, so instead of the seed's stack overflow the DSP retries "
          "the same failing plan forever and the host waits in dspqueue_read: a hang (llama.cpp #24963's symptom; "
          "which builds do this is kazeia's hypothesis).",
          only_in="2026-05"),
    Fault("hmx-queue-narrowing",
          "A bad build of the 2026-05 code: htp/hmx-queue.c: hmx_queue_process casts each job's function pointer to "
          "the one-byte enum hmx_queue_signal (clang's -fshort-enums on Hexagon), so a worker whose entry address "
          "ends in 0x00 is taken for HMX_QUEUE_NOOP: never run, still marked done, and the op reports success. Its "
          "output stays as VTCM held it: the quantized HMX matmul's output chunks (M >= 32), or HMX flash "
          "attention's S or O tiles (pipelined: >= 3 KV blocks). Which workers the build's link layout decides "
          "(each 1/16; KAZEIA_HTP_BUILD_SEED or KAZEIA_HTP_NARROWED pin it); fixed by llama.cpp #25677 (ggml "
          "86f41a97, July 2026): under 2026-10 and robust (Profile.queue_signal_full_width) a build skips nothing. "
          "The link to #24389's good and bad builds is kazeia's hypothesis.",
          scope="2026-05 code (accepted under 2026-10 and robust, whose full-width compare leaves it inert); the "
                "HMX queue's jobs: quantized MUL_MATs (M >= 32) and pipelined FLASH_ATTN_EXT"),
    Fault("dma-unbalanced",
          "HVX matmul leaves one DMA descriptor outstanding at the end of the op; the next op's first DMA pop "
          "returns that stale completion and its first weight row is read before it arrived. Upstream balances "
          "its DMA pushes and pops per op (dma-queue.c: dma_queue_push / dma_queue_pop).",
          only_in="2026-05", path="hvx"),
]}


def get_profile(name: str) -> Profile:
    p = PROFILES.get(name)
    if p is None:
        raise KazeiaError(f"unknown HTP profile '{name}' (available: {', '.join(PROFILES)})")
    return p


# the units' handles on the faults (no unit names one by its string)
SCATTER_UNRETIRED = FAULTS["scatter-unretired"]
HMX_BIAS_STALE = FAULTS["hmx-bias-stale"]
VTCM_BANK_CROSSING = FAULTS["vtcm-bank-crossing"]
VTCM_GRANT_SHORT = FAULTS["vtcm-grant-short"]
V73_HMX_QUANT_INF = FAULTS["v73-hmx-quant-inf"]
L2_LAZY_STALE = FAULTS["l2-lazy-stale"]
REENTRY_TAIL_CALL = FAULTS["reentry-tail-call"]
DMA_UNBALANCED = FAULTS["dma-unbalanced"]
V73_INPUT_STALE = FAULTS["v73-input-stale"]
HMX_QUEUE_NARROWING = FAULTS["hmx-queue-narrowing"]

# faults that inject a public report's symptom whose cause is not published: the report they stand for
REPORTED = {f.name: f.report for f in FAULTS.values() if f.report}


def check_faults(names: tuple[str, ...] | list[str], profile: str | None = None) -> tuple[str, ...]:
    """The fault names, checked; with `profile`, also that each exists in that profile's code (dma-unbalanced:
    May's HVX weight rings, which October's tiled kernels do not have; vtcm-grant-short: a host plan the DSP
    re-checks, which May does not make)."""
    for n in names:
        if n not in FAULTS:
            raise KazeiaError(f"unknown HTP fault '{n}' (have: {', '.join(FAULTS)})")
        f = FAULTS[n]
        if profile is not None and not f.exists_in(get_profile(profile).caps.generation):
            raise KazeiaError(f"HTP fault '{n}' models {f.only_in} code; the {profile} profile does not have it")
    return tuple(names)
