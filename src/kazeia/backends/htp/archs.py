"""Hexagon arch profiles: what one DSP generation (v68 .. v81) changes in one upstream version of ggml-hexagon.

The device's arch comes from `GGML_HEXAGON_ARCH` (or `--htp-arch`), as if the host had detected it. Each field
below names its source in the upstream trees kazeia models (May: ggml-org/ggml bb4dc86a, October: llama.cpp
0c1e57098bba); where no public source gives a number, the field says it is assumed.

    arch_profile(73, "2026-10").hmx       # True: October compiles HMX into every skel it builds
    arch_profile(68, "2026-10").skel      # False: October builds no v68 skel, the session cannot open
"""

from __future__ import annotations

from dataclasses import dataclass

from kazeia.backends.htp.profiles import GENERATIONS, capabilities
from kazeia.errors import KazeiaError

MiB = 1 << 20
KNOWN_ARCHS = (68, 69, 73, 75, 79, 81)
DEFAULT_ARCH = 79

# CMakeLists.txt build_htp_skel(...) of each version: the DSP libraries libggml-htp-v<N>.so that exist.
SKELS = {"2026-05": (68, 69, 73, 75, 79, 81), "2026-10": (73, 75, 79, 81)}
# May htp/CMakeLists.txt HTP_HMX_VERSIONS (HTP_HAS_HMX only there; op_matmul -> op_matmul_hvx elsewhere);
# October compiles HMX into every skel (cmake-toolchain.cmake -mhmx; htp_iface_hwinfo reports n_hmx = 1).
HMX_SKELS = {"2026-05": (73, 75, 79, 81), "2026-10": (73, 75, 79, 81)}
VMEM_DEFAULT = 3_355_443_200       # htp-ops.h HTP_OP_MAX_VMEM_DEFAULT (3200 MiB), v75 and later
VMEM_BELOW_V75 = 3000 * MiB        # ggml_hexagon_init: opt_vmem = opt_arch >= 75 ? DEFAULT : 3000 * MiB
MMAP_SLOTS = {"2026-05": 16, "2026-10": 64}   # htp-ctx.h HTP_MAX_MMAPS
VTCM_ASSUMED = 8 * MiB             # main.c vtcm_alloc's fallback when HAP_compute_res_query_VTCM fails
HAP_MMAP_MAX = 2 * 1024 * MiB      # htp-ops.h HTP_MMAP_MAX_VMEM: HAP_mmap's per-mapping limit (v73 and older, #21071)


def october_shm_bytes(opbatch: int = 1280, opqueue: int = 32) -> int:
    """The op queue's pinned shared memory, which 2026-10 subtracts from VMEM (max_vmem): per batch 16 buffer
    descriptors (htp_buf_desc, 24 B), 14 tensors per op (htp_tensor, 56 B; 4 outputs + 10 inputs), one op
    descriptor (htp_op_desc, 232 B) and one profile record (htp_prof_desc, 48 B) per op, times the queue depth,
    rounded to pages, plus a guard page (ggml-hexagon.cpp ggml_hexagon_opqueue, ggml_hexagon_shared_buffer;
    htp/htp-ops.h). 1280 x 32: 43,597,824 B."""
    block = 24 * 16 + (56 * 14 + 232 + 48) * opbatch
    return (block * opqueue + 4095) // 4096 * 4096 + 4096


def host_vmem_budget(vmem_bytes: int, generation: str, opbatch: int = 1280, opqueue: int = 32) -> int:
    """The host's VMEM budget per batch (ggml_hexagon_session::allocate: max_vmem) from opt_vmem: 2026-10
    subtracts its op queue's shared memory (when opt_vmem is larger), 2026-05 does not."""
    if not capabilities(generation).queue_shm_in_vmem:
        return vmem_bytes
    shm = october_shm_bytes(opbatch, opqueue)
    return vmem_bytes - shm if vmem_bytes > shm else vmem_bytes


@dataclass(frozen=True)
class ArchProfile:
    arch: int
    generation: str        # "2026-05" (May, and robust, which is May with its defects fixed) or "2026-10"
    skel: bool             # this version builds libggml-htp-v<arch>.so
    hmx: bool              # that skel has HMX code
    ieee_f32_add: bool     # HVX fp32 adds/muls in IEEE sf (v79+); below, qf32 then a conversion to sf
    vmem_bytes: int        # the host's budget for DSP mappings (opt_vmem) before GGML_HEXAGON_VMEM
    mmap_slots: int        # DSP mapping cache entries
    defrag: bool           # a failed DSP mapping drops every 32-bit mapping and retries once before abort()
    dma64: bool            # 64-bit "extended" weight mappings (not counted in VMEM)
    vtcm_bytes: int        # VTCM the DSP reports (assumed: no per-arch figure is public)
    mmap_max_bytes: int | None = None  # one mapping's limit: HAP_mmap's 2 GiB at v73 and below (HAP_mmap2 above)

    @property
    def opens(self) -> bool:
        """Whether a session opens at all on a device of this arch."""
        return self.skel and self.arch >= capabilities(self.generation).min_session_arch


def arch_profile(arch: int, generation: str) -> ArchProfile:
    """The profile of a device of `arch` under the code generation `generation`."""
    if arch not in KNOWN_ARCHS:
        raise KazeiaError(f"Hexagon arch v{arch} is not modelled (known: {', '.join(f'v{a}' for a in KNOWN_ARCHS)})")
    caps = capabilities(generation)
    return ArchProfile(
        arch=arch, generation=generation, skel=arch in SKELS[generation], hmx=arch in HMX_SKELS[generation],
        ieee_f32_add=arch >= 79, vmem_bytes=VMEM_DEFAULT if arch >= 75 else VMEM_BELOW_V75,
        mmap_slots=MMAP_SLOTS[generation], defrag=caps.mapping_defrag, dma64=arch > caps.dma64_above_arch,
        vtcm_bytes=VTCM_ASSUMED, mmap_max_bytes=HAP_MMAP_MAX if arch <= 73 else None)


def parse_arch(raw: str, where: str = "GGML_HEXAGON_ARCH") -> int:
    """'v79', 'V73' or '75' -> the arch number (ggml_hexagon_init skips one 'v'/'V', then strtoul); one line
    naming `where` for anything kazeia does not model."""
    text = str(raw).strip()
    digits = text[1:] if text[:1] in ("v", "V") else text
    if not digits.isdigit() or len(digits) > 3:
        raise KazeiaError(f"{where}={text!r} is not an arch like v79")
    arch = int(digits)
    if arch not in KNOWN_ARCHS:
        raise KazeiaError(f"{where}={text!r}: kazeia models {', '.join(f'v{a}' for a in KNOWN_ARCHS)}")
    return arch


def session_refusal(arch: int, generation: str) -> str | None:
    """The one line a session on this device ends in under `generation`, or None when it opens.

    October builds skels for v73..v81 only. On a device below v73 its autodetection caps the arch to v73 with a
    warning (ggml-hexagon.cpp ggml_hexagon_init) and opens libggml-htp-v73.so, which is not expected to load on
    an older DSP (kazeia's hypothesis: no public report shows that load); with GGML_HEXAGON_ARCH set to the
    device's arch, the URI names a skel that does not exist. Either way `htp_iface_open` fails, the session
    constructor throws "failed to open session", and llama.cpp's model load reports it: no CPU fallback."""
    p = arch_profile(arch, generation)
    if p.opens:
        return None
    built = ", ".join(f"v{a}" for a in SKELS[generation])
    return (f"HTP0 on a v{arch} device under {generation}: no session. {generation} builds skels for {built} only: "
            f"with GGML_HEXAGON_ARCH=v{arch} the host asks for libggml-htp-v{arch}.so, which does not exist; "
            f"autodetected, v{arch} is capped to v73 and the v73 skel is not expected to load on a v{arch} DSP "
            f"(kazeia's hypothesis). Either way upstream logs 'failed to open session' and llama.cpp 'error "
            f"loading model', with no CPU fallback. Use --htp-profile 2026-05 (its v{arch} skel runs HVX only) or "
            f"-dev CPU")


# (field, rule, source) for `kazeia htp faults`: every number with where it comes from
SOURCES = (
    ("skels", "2026-05: v68 v69 v73 v75 v79 v81; 2026-10: v73 v75 v79 v81 (a device below v73 gets no session)",
     "CMakeLists.txt build_htp_skel (both versions); ggml-hexagon.cpp ggml_hexagon_init (the v73 cap)"),
    ("HMX", "v73 and later (May: HTP_HAS_HMX only there, v68/v69 run every matmul on HVX); October: every skel",
     "May htp/CMakeLists.txt HTP_HMX_VERSIONS; October htp/cmake-toolchain.cmake -mhmx, main.c htp_iface_hwinfo"),
    ("fp32 adds", "IEEE sf from v79; qf32 then sf below (kazeia computes IEEE fp32 on every arch: an approximation "
     "below v79)", "htp/hvx-base.h hvx_vec_add_f32_f32 (#if __HVX_ARCH__ < 79), hvx-arith.h HVX_OP_ADD_F32"),
    ("VMEM", "3200 MiB from v75, 3000 MiB below; GGML_HEXAGON_VMEM in MiB overrides; October subtracts the "
     "op queue's shared memory", "htp/htp-ops.h HTP_OP_MAX_VMEM_DEFAULT; ggml-hexagon.cpp ggml_hexagon_init, "
     "ggml_hexagon_session::allocate (max_vmem)"),
    ("mappings", "2026-05: 16 cached DSP mappings, abort on a failed mmap; 2026-10: 64, one defrag pass, then "
     "abort", "htp/htp-ctx.h HTP_MAX_MMAPS; htp/main.c prep_op_bufs, mmap_buf"),
    ("mapping size", "v73 and older map with HAP_mmap, at most 2 GiB a buffer: a larger one aborts the DSP ('mmap "
     "failed : size ... exceeds 2GB limit for HAP_mmap'); the host's buffers are at most GGML_HEXAGON_MBUF (1 GiB), "
     "so only an MBUF above 2048 reaches it (llama.cpp #21071)", "htp/main.c mmap_buf (both versions), htp-ops.h "
     "HTP_MMAP_MAX_VMEM"),
    ("DMA64", "2026-10 above v79: weights mapped extended (not counted in VMEM)",
     "ggml-hexagon.cpp ggml_hexagon_init (opt_dma64 = opt_arch > 79 && ...)"),
    ("VTCM", "8 MiB on every arch: assumed (no per-arch figure is public; 8 MiB is main.c's fallback and what "
     "#25876 reports on v81); --vtcm sets it", "htp/main.c vtcm_alloc, htp_iface_hwinfo"),
)


def describe_archs(generations: tuple[str, ...] = tuple(GENERATIONS)) -> list[str]:
    """Lines for `kazeia htp faults`: one per arch and version, then where each rule comes from."""
    lines = []
    for gen in generations:
        for a in KNOWN_ARCHS:
            p = arch_profile(a, gen)
            state = "no session" if not p.opens else ("HMX+HVX" if p.hmx else "HVX only")
            lines.append(f"  v{a} {gen}  {state:10s} fp32 adds {'IEEE' if p.ieee_f32_add else 'qf32'}  "
                         f"VMEM {p.vmem_bytes // MiB} MiB  {p.mmap_slots} mappings{' + defrag' if p.defrag else ''}"
                         f"{'  DMA64' if p.dma64 else ''}  VTCM {p.vtcm_bytes // MiB} MiB (assumed)")
    lines.append("  sources:")
    lines += [f"    {name}: {rule} [{src}]" for name, rule, src in SOURCES]
    return lines
