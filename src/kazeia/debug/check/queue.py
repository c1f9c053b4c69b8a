"""`kazeia check`'s exposure to May's HMX job queue defect (fault hmx-queue-narrowing, backends/htp/build_layout.py):
which ops of the model, at which M, go through the queue under a profile whose code casts a job's function pointer
to a one-byte enum. Whether a given build skips them the header cannot say (each worker's address ends in 0x00 in
1 build of 16, a rebuild draws again), so this is an exposure beside the verdicts, not a predicted outcome.

- Quantized MUL_MAT on HMX: May's op_matmul takes HMX from M = 32 (`m_total & ~31`), and only hmx_matmul_q_f32
  pushes its jobs (hmx_matmul_worker_fn); the F16 kernels run HMX inline.
- FLASH_ATTN_EXT on HMX: the pipeline (qk, O-update, O-norm workers) runs at >= 3 KV blocks and >= 2 HVX threads;
  llama.cpp pads the attended KV cells to 256 and hmx_fa_find_chunk_size caps blocks at a third of them (64 cells),
  so every M, decode included, since #23796 removed the `neq1 < 32` HVX fallback.
"""

from __future__ import annotations

import re

from kazeia.backends.htp import QUEUE_WORKERS, get_profile

ATTN = re.compile(r"blk\.\d+\.attn_(q|qkv)\.weight$")
BLOCK_FREE = ("F16", "F32", "BF16")


def queue_exposure(tensors: dict, profiles: tuple[str, ...], ubatch: int) -> list[str]:
    """Lines naming the model's ops and M ranges a bad build skips, per profile whose code has the defect."""
    exposed = [p for p in profiles if not get_profile(p).queue_signal_full_width]
    if not exposed:
        return []
    items = []
    quantized = sorted({t.type.name for n, t in tensors.items() if n.startswith("blk.") and n.endswith(".weight")
                        and len(t.ne) >= 2 and t.type.name not in BLOCK_FREE})
    if quantized and ubatch >= 32:
        items.append(f"  quantized MUL_MAT on HMX ({', '.join(quantized)}), M 32..{ubatch}: "
                     f"{QUEUE_WORKERS['matmul']} skipped -> each output chunk keeps VTCM's old bytes")
    if any(ATTN.match(n) for n in tensors):
        items.append(f"  FLASH_ATTN_EXT on HMX (-fa on), M 1..{ubatch} and decode: {QUEUE_WORKERS['qk']}, "
                     f"{QUEUE_WORKERS['o_update']} or {QUEUE_WORKERS['o_norm']} skipped -> attention from stale S "
                     f"or O tiles")
    if not items:
        return []
    return [f"HMX job queue ({', '.join(exposed)}; llama.cpp #25677): in a build whose worker's address ends in 0x00 "
            "(1 build in 16 per worker; a rebuild draws again) the queue skips that worker's jobs and marks them "
            "done, with no error:", *items,
            "  run `kazeia determinism ... --fault hmx-queue-narrowing -N 20` to see what builds do to a prompt; "
            "GGML_HEXAGON_USE_HMX=0, or the 2026-10 code (the fix), avoids it"]
