"""What `kazeia check` predicts for the ops that are not a weight's MUL_MAT, from the header, with the rules the
emulator runs (issue 37): May's defects that act on other ops.

- SSM_CONV (`blk.N.ssm_conv1d.weight`, `blk.N.shortconv.conv.weight`): the HVX kernel runs from 32 tokens
  (ssm-conv.c: d_inner >= 32 and n_t >= 32, a tile that fits the 1 MiB budget); under a profile whose conv weight
  stride is not padded to 32 floats (2026-05; fixed by llama.cpp #24470) a thread whose row count is not a
  multiple of 32 reads every tap j > 0 from (j * rows) % 32 channels earlier: wrong numbers, decided by the shapes
  (vtcm/hybrid_layouts.ssm_conv_scratch, the emulator's own layout).
- FLASH_ATTN_EXT and GATED_DELTA_NET under a profile where they leave the src1 shortcut stale (2026-05,
  backends/htp/vtcm/src1_shortcut.py): the MUL_MAT after them multiplies stale activations only when its src1
  lands at the address of the last quantized src1, which the graph allocator decides, not the header: "depends",
  with the command that finds out (`kazeia upgrade` / `kazeia investigate` on the scenario).
(The HMX job queue's per-build skips are an exposure, not a predicted outcome: check/queue.py.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kazeia.backends.htp import DEFAULT_HVX_THREADS, get_profile, src1_cache_effect, ssm_conv_scratch

CONV = re.compile(r"blk\.\d+\.(ssm_conv1d|shortconv\.conv)\.weight$")
ATTN = re.compile(r"blk\.\d+\.attn_(q|qkv)\.weight$")  # separate or fused (phi3) projections
GDN = re.compile(r"blk\.\d+\.ssm_(alpha|beta|a)\b")


@dataclass(frozen=True)
class OpRisk:
    """An op's predicted outcome over a range of M: "wrong" (wrong numbers, from the shapes) or "depends" (on
    what the header cannot say)."""

    op: str
    m_lo: int
    m_hi: int
    outcome: str
    reason: str
    report: str | None = None
    gate: str = ""

    def m(self) -> str:
        return str(self.m_lo) if self.m_lo == self.m_hi else f"{self.m_lo}..{self.m_hi}"


def op_risks(tensors: dict, profile: str, vtcm: int, ubatch: int, has_hmx: bool) -> list[OpRisk]:
    """The non-MUL_MAT ops' risks of a model (its GGUF tensor table) under one configuration."""
    out = []
    prof = get_profile(profile)
    conv = next((t for n, t in tensors.items() if CONV.match(n)), None)
    if conv is not None and not prof.ssm_conv_padded_weight_stride:
        risk = _ssm_conv(conv, vtcm, ubatch)
        if risk is not None:
            out.append(risk)
    stale = []
    if has_hmx and any(ATTN.match(n) for n in tensors) and src1_cache_effect("FLASH_ATTN_EXT", profile,
                                                                              "hmx") == "stale":
        stale.append("FLASH_ATTN_EXT")
    if any(GDN.match(n) for n in tensors) and src1_cache_effect("GATED_DELTA_NET", profile) == "stale":
        stale.append("GATED_DELTA_NET")
    for op in stale:
        out.append(OpRisk(op, 1, ubatch, "depends",
                          f"{op} leaves the src1 shortcut stale ({profile}): the HVX MUL_MAT after it multiplies "
                          f"stale activations when its src1 lands where the last quantized src1 was, which the "
                          f"graph allocator decides: run `kazeia upgrade` (or investigate) on the scenario",
                          gate=f"--cpu-ops {op}"))
    return out


def _ssm_conv(conv, vtcm: int, ubatch: int) -> OpRisk | None:
    """SSM_CONV's wrong-number range: the M (tokens) at which the HVX kernel runs with a misaligned weight stride."""
    d_conv, d_inner = int(conv.ne[0]), int(conv.ne[1])
    bad = []
    for m in range(32, ubatch + 1):
        sc = ssm_conv_scratch(d_conv - 1 + m, d_inner, m, d_conv, DEFAULT_HVX_THREADS, vtcm, padded=False)
        rows = sc.info["rows_per_thread"]
        if sc.info["kernel"] == "hvx" and rows % 32:
            bad.append((m, rows))
    if not bad:
        return None
    rows = bad[0][1]
    return OpRisk("SSM_CONV", bad[0][0], bad[-1][0], "wrong",
                  f"the HVX kernel (from 32 tokens) stages {rows} channels a thread ({d_inner} / "
                  f"{DEFAULT_HVX_THREADS} threads, made even), not a multiple of 32 floats: tap j reads the weights "
                  f"(j x {rows}) % 32 channels early", "llama.cpp #24470", gate="--cpu-ops SSM_CONV")

