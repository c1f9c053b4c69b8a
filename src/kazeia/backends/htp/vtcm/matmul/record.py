"""A MUL_MAT plan as every profile and tool reads it (`MatmulPlan`: path, chunks, areas, status, outcome) and the
weight-row arithmetic plans share (ggml row bytes, the x4x2 row stride)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kazeia.backends.htp.vtcm.arena import (
    Area,
    ceil_div,
    find_area,
)
from kazeia.errors import KazeiaError
from kazeia.gguf.quants import bytes_per_32

SUPER_BLOCK = 256  # x4x2 super-block: 8 ggml blocks of 32

# ggml block bytes per 32 elements, i.e. the tensor descriptor's nb[1] per 32 columns (REPACK keeps ggml strides)
QTYPES = ("q4_0", "q4_1", "q8_0", "iq4_nl", "mxfp4", "f16", "f32", "q4_k", "q5_k", "q6_k")
_BLOCK32_BYTES = {q: bytes_per_32(q) for q in QTYPES}  # gguf/quants.py (Q6_K: 26.25 B per 32)
HMX_TYPES = ("f16", "q4_0", "q4_1", "q8_0", "iq4_nl", "mxfp4")  # matmul-ops.c: op_matmul type gate


def norm_qtype(qtype: Any) -> str:
    """'q4_0' / 'Q4_0' / GGMLType.Q4_0 -> 'q4_0'."""
    name = getattr(qtype, "name", qtype)
    name = str(name).lower()
    if name not in _BLOCK32_BYTES:
        raise KazeiaError(f"unsupported HTP matmul weight type '{qtype}' (supported: {', '.join(QTYPES)})")
    return name


def ggml_row_bytes(qtype: str, k: int) -> int:
    """The weight tensor's nb[1] (what the HVX path DMAs per row)."""
    return int(_BLOCK32_BYTES[norm_qtype(qtype)] * ceil_div(k, 32))


def x4x2_row_stride(qtype: str, k: int) -> int:
    """Bytes of one repacked x4x2 weight row as the HMX kernel strides it (hmx-matmul-ops.c: get_x4x2_row_stride).

    Quants of whole super-blocks then the scales: Q4_0/IQ4_NL 128+16 B, Q4_1 128+32 B (d,m pairs), Q8_0 256+16 B,
    MXFP4 128+8 B per super-block. F16 has no x4x2 form (its HMX kernel is a sibling function); 0 there.
    """
    nb = ceil_div(k, SUPER_BLOCK)
    per = {"q4_0": 144, "iq4_nl": 144, "q4_1": 160, "q8_0": 272, "mxfp4": 136}.get(norm_qtype(qtype), 0)
    return nb * per


@dataclass(frozen=True)
class MatmulPlan:
    """One MUL_MAT's path and VTCM layout.

    status: "ok"; "overflow" (HMX rounded layout > VTCM, the kernel returns -1); "no_chunking" (HMX chunk search
    found nothing); "vtcm_too_small" (HVX spads > VTCM, the op returns VTCM_TOO_SMALL, which the batch drops).
    outcome: what the DSP then does: "runs", "reenter" (2026-05: op_matmul calls itself again, forever),
    "fallback" (robust HMX failure: op_matmul runs the HVX plan instead), "dropped" (HVX VTCM_TOO_SMALL: dst
    keeps stale contents).
    """

    path: str
    m: int
    k: int
    n: int
    qtype: str
    profile: str
    vtcm: int
    mc: int | None
    nc: int | None
    areas: tuple[Area, ...]
    used: int
    status: str
    outcome: str
    reason: str = ""
    estimate: int | None = None  # the HMX chunk search's own size estimate (what it believed it would use)
    n_threads: int | None = None
    row_stride: int | None = None  # HMX: raw weight row stride; HVX: padded src0 row stride in the ring
    hmx_attempt: MatmulPlan | None = None  # robust: the failed HMX plan that made it fall back to HVX
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def overflow(self) -> int:
        return max(0, self.used - self.vtcm)

    @property
    def fits(self) -> bool:
        return self.status == "ok"

    def area(self, name: str) -> Area:
        return find_area(self.areas, name)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "path": self.path, "m": self.m, "k": self.k, "n": self.n, "type": self.qtype, "profile": self.profile,
            "mc": self.mc, "nc": self.nc, "areas": [a.to_dict() for a in self.areas], "used": self.used,
            "vtcm": self.vtcm, "overflow": self.overflow, "status": self.status, "outcome": self.outcome,
            "reason": self.reason, "estimate": self.estimate, "n_threads": self.n_threads,
            "row_stride": self.row_stride,
        }
        d["act_threads"] = self.info.get("act_threads")  # 2026-10's HMX solver (None elsewhere)
        if self.path != "hmx":
            d["refusal"] = self.reason  # why HMX was not used (and, for "cpu", why HVX was not either)
        if self.info:
            d["info"] = dict(self.info)
        if self.hmx_attempt is not None:
            d["hmx_attempt"] = self.hmx_attempt.to_dict()
        return d
