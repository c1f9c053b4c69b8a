"""May's HMX job queue (htp/hmx-queue.c of bb4dc86a) and its enum-narrowing defect, fixed by llama.cpp #25677.

What upstream's code does (read in ggml-org/ggml bb4dc86a and 86f41a97):
- `hmx_queue_process` tells signals from jobs by
  `enum hmx_queue_signal sig = (enum hmx_queue_signal) (unsigned int) d->func;` (NOOP = 0, SUSPEND, KILL), runs
  `d->func(d->data)` only in the switch's `default:` case, and marks every descriptor done
  (`atomic_fetch_add(&d->done, 1)`) whatever the case. `hmx_queue_pop` waits for `done` and returns no status.
- The four functions pushed as jobs: `hmx_matmul_worker_fn` (hmx-matmul-ops.c: `hmx_matmul_q_f32`, the quantized
  matmul, M >= 32 under May's op_matmul), `hmx_fa_qk_dot_worker`, `hmx_fa_o_update_worker` and
  `hmx_fa_o_norm_worker` (hmx-flash-attn-ops.c: `hmx_flash_attn_ext`'s pipeline, taken when the op has at least
  3 KV blocks and 2 HVX threads). The F16 matmul and the non-pipelined flash attention run HMX inline.
- The fix (#25677, ggml 86f41a97, 2026-07-15) is that one line: `uintptr_t sig = (uintptr_t) d->func;`.

Where it bites (kazeia's reading, labelled as such where it is not upstream text):
- clang makes enums short on Hexagon by default (`-fshort-enums` unless `-fno-short-enums`: its driver's
  Clang.cpp); May's build flags do not turn that off (the SDK's hexagon_fun.cmake is not public), so the enum is
  one byte and `sig` is the low byte of the worker's address. Functions are 16-byte aligned (LLVM's Hexagon
  lowering prefers Align(16)): the low byte is one of 0x00, 0x10, .. 0xf0, so a job can only be taken for NOOP
  (skipped, marked done), never for SUSPEND or KILL (no hang).
- The address is the skel's load base (page-aligned) plus the function's link-time offset: the same on every run
  of one build, and re-drawn by a rebuild (#22347: "a good build consistently produces correct results, while a
  bad build yields completely incorrect PPL - even though both are clean compiled from the exact same code";
  #24389: FARF logging "fixes the problem"). Each worker lands on 0x00 with probability 1/16 per build.
- A skipped job leaves its output buffer as VTCM held it: the matmul's output chunks, flash attention's S tiles
  or O tiles (ops/fa_pipeline.py). The queue itself has no run-to-run race (one job in flight, the descriptor is
  written before `idx_write` is published).

The fault `hmx-queue-narrowing` (profiles.py) stands for a bad build of the 2026-05 code: one whose layout put at
least one worker at an address ending in 0x00. Which ones comes from KAZEIA_HTP_NARROWED, else from the build's
layout seed KAZEIA_HTP_BUILD_SEED (each worker 1/16, drawn again until one lands on 0x00: the fault says the
build is bad), else from a draw made once per process (kazeia does not know which build the user has; every
session of one process is the same build).
"""

from __future__ import annotations

import numpy as np

from kazeia.errors import KazeiaError

# short name -> the upstream function pushed as the job
QUEUE_WORKERS: dict[str, str] = {
    "matmul": "hmx_matmul_worker_fn",
    "qk": "hmx_fa_qk_dot_worker",
    "o_update": "hmx_fa_o_update_worker",
    "o_norm": "hmx_fa_o_norm_worker",
}
FA_WORKERS = ("qk", "o_update", "o_norm")
ENTRY_ALIGN = 16  # LLVM Hexagon: setPrefFunctionAlignment(Align(16))
_LAYOUT_STREAM = 0x686D78  # ("hmx": the layout's own random stream, apart from the timing race's)


def entry_low_bytes(build_seed: int, bad_only: bool = True) -> dict[str, int]:
    """The low byte of each worker's entry address in the build `build_seed` names: each a multiple of 16 drawn
    uniformly (any build: `bad_only=False`); for the fault, drawn again until at least one is 0x00 (the fault is a
    bad build; which workers is the build's). A seed whose first layout is bad gives the same one either way."""
    rng = np.random.default_rng((build_seed, _LAYOUT_STREAM))
    while True:
        low = {w: ENTRY_ALIGN * int(rng.integers(0, 256 // ENTRY_ALIGN)) for w in QUEUE_WORKERS}
        if 0 in low.values() or not bad_only:
            return low


def taken_for_noop(low_byte: int) -> bool:
    """May's cast: `(enum hmx_queue_signal)(unsigned int) func` keeps the low byte under -fshort-enums; the switch
    skips the job when that byte is HMX_QUEUE_NOOP (0). SUSPEND (1) and KILL (2) need an address no aligned function
    has."""
    return (low_byte & 0xFF) == 0


def parse_narrowed(raw: str) -> tuple[str, ...]:
    """KAZEIA_HTP_NARROWED: a comma list of workers by short name (matmul, qk, o_update, o_norm) or upstream name,
    or "none"."""
    names = [s.strip() for s in raw.split(",") if s.strip()]
    if names == ["none"]:
        return ()
    by_upstream = {v: k for k, v in QUEUE_WORKERS.items()}
    out = []
    for n in names:
        short = n if n in QUEUE_WORKERS else by_upstream.get(n)
        if short is None:
            raise KazeiaError(f"KAZEIA_HTP_NARROWED: unknown HMX queue worker {n!r} (have: "
                              f"{', '.join(QUEUE_WORKERS)}, or none)")
        out.append(short)
    return tuple(dict.fromkeys(out))


_process_build: list[int] = []  # the build an unpinned process runs: drawn once (every session of it is that build)


def process_build_seed() -> int:
    """The build seed this process runs when nothing pins one (drawn on first use)."""
    if not _process_build:
        _process_build.append(int(np.random.default_rng().integers(0, 1 << 63)))
    return _process_build[0]


def narrowed_workers(narrowed: tuple[str, ...] | None, build_seed: int | None) -> frozenset[str]:
    """The workers a bad build skips: the explicit list, else those its layout seed puts on 0x00, else those of the
    build this process runs (drawn once: kazeia does not know which build the user has)."""
    if narrowed is not None:
        return frozenset(narrowed)
    seed = build_seed if build_seed is not None else process_build_seed()
    return frozenset(w for w, b in skipped_in(seed).items() if b)


def skipped_in(build_seed: int, bad_only: bool = True) -> dict[str, bool]:
    """Per worker: is it taken for HMX_QUEUE_NOOP in this build?"""
    return {w: taken_for_noop(b) for w, b in entry_low_bytes(build_seed, bad_only).items()}


def describe_skips(skipped: frozenset[str]) -> str:
    """The skipped workers by their upstream names, in queue order."""
    return ", ".join(QUEUE_WORKERS[w] for w in QUEUE_WORKERS if w in skipped) or "none"


def _bad_build(settings) -> bool:
    """The fault is injected and the profile's code has the narrowing cast (not #25677's full-width compare)."""
    from kazeia.backends.htp.profiles import HMX_QUEUE_NARROWING, get_profile

    return HMX_QUEUE_NARROWING.name in settings.faults and not get_profile(settings.profile).queue_signal_full_width


def session_skips(settings) -> frozenset[str]:
    """The workers a session of these settings skips (the device asks once, at session open)."""
    return narrowed_workers(settings.narrowed, settings.build_seed) if _bad_build(settings) else frozenset()


def build_skips(settings) -> frozenset[str] | None:
    """`session_skips`, when it is fixed before the run (its workers named or its build seed pinned); None when
    the build is this process's draw. (The tools ask here, before they run.)"""
    if _bad_build(settings) and settings.narrowed is None and settings.build_seed is None:
        return None
    return session_skips(settings)


def pin_build(env: dict[str, str], settings) -> dict[str, str]:
    """`env` with KAZEIA_HTP_BUILD_SEED set to this process's build when the settings inject a bad build that
    nothing pins (a tool whose steps run in several processes then sees one build throughout, and names it)."""
    if build_skips(settings) is None:
        return {**env, "KAZEIA_HTP_BUILD_SEED": str(process_build_seed())}
    return env
