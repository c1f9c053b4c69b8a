"""A device's op log (the team's KZOP lines, or upstream's GGML_HEXAGON_VERBOSE `execute-op` lines) rebuilt as an
op stream on the HTP model, to see whether a profile predicts what the device did.

The lines carry shapes and types, not values: each op is rebuilt as an oracle case of those shapes with seeded
inputs (kazeia.debug.oracle) and the cases run in log order on ONE emulated device, so the VTCM bytes and the
unit registers one op leaves are what the next op finds (each case is its own batch: the src1 shortcut, which
lives inside one batch, is not reproduced). Rebuilt: MUL_MAT (weight type, K, N, M), FLASH_ATTN_EXT (head size,
heads, tokens, KV length; KZOP lines do not give the KV head count: taken equal to the query heads there), RMS_NORM,
MUL and ADD; other ops are listed as not rebuilt. The result: where the device dies (op, kind, cause), else the
first op whose output departs from float64 on its inputs, with its error signature.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from kazeia.debug.oracle.cases import Case
from kazeia.debug.oracle.mul_mat import mul_mat_case

KZOP = re.compile(r"KZOP (?P<op>[A-Z_]+(?: [A-Z_]+)?) dst=\[(?P<dst>[\d,]+)\](?: src0=(?P<t0>\w+)\[(?P<s0>[\d,]+)\])?"
                  r"(?: src1=(?P<t1>\w+)\[(?P<s1>[\d,]+)\])?")
VERBOSE = "execute-op "  # upstream: "execute-op OP: names : dims : types : strides : buffers : flags"


@dataclass
class StreamOp:
    line_no: int
    line: str
    op: str
    dst: tuple[int, ...]
    srcs: list[tuple[str, tuple[int, ...]]]  # (type, dims) as the line gives them
    case: Case | None = None
    why_not: str = ""


def _dims(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.replace(":", ",").split(",") if x)


def _pad4(d: tuple[int, ...]) -> tuple[int, int, int, int]:
    return tuple((*d, 1, 1, 1, 1)[:4])


def _verbose(line: str) -> tuple[str, tuple, list] | None:
    head, *fields = line[line.index(VERBOSE) + len(VERBOSE):].split(" : ")
    if len(fields) < 2:
        return None
    groups = [g.strip() for g in fields[0].split("->")]
    types = [g.strip() for g in fields[1].split("->")]
    src_dims = [_dims(x) for x in groups[0].split(" x ")] if len(groups) > 1 else []
    src_types = [t.strip() for t in types[0].split(" x ")] if len(types) > 1 else []
    return head.split(":")[0].strip(), _dims(groups[-1]), list(zip(src_types, src_dims))


def parse_stream(text: str) -> list[StreamOp]:
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        m = KZOP.search(line)
        if m:
            srcs = [(m.group(f"t{k}"), _dims(m.group(f"s{k}"))) for k in (0, 1) if m.group(f"s{k}")]
            out.append(StreamOp(i, line.strip(), m.group("op"), _dims(m.group("dst")), srcs))
            continue
        v = _verbose(line) if VERBOSE in line else None
        if v is not None:
            out.append(StreamOp(i, line.strip(), *v))
    for o in out:
        o.case, o.why_not = to_case(o)
    return out


def to_case(o: StreamOp) -> tuple[Case | None, str]:
    """The oracle case of a logged op, or why it is not rebuilt."""
    dst = _pad4(o.dst)
    if o.op == "MUL_MAT" and len(o.srcs) == 2:
        (t0, s0), (t1, s1) = o.srcs
        if t1 != "f32" or _pad4(s0)[2:] != (1, 1) or _pad4(s1)[2:] != (1, 1):
            return None, "batched or non-f32 activations"
        return mul_mat_case(t0.lower(), m=s0[1], n=s1[1], k=s0[0]), ""
    if o.op == "FLASH_ATTN_EXT" and len(o.srcs) >= 2:
        d, h, t = dst[0], dst[1], dst[2]
        kv = o.srcs[1][1][1] if len(o.srcs[1][1]) > 1 else None
        if kv is None:
            return None, "no KV length in the line"
        kd = o.srcs[1][1]
        hkv = kd[2] if len(kd) >= 3 and kd[2] and h % kd[2] == 0 else h  # VERBOSE gives K's heads, KZOP does not
        return Case.make("FLASH_ATTN_EXT", hs=d, nh=hkv, nr=h // hkv, kv=kv, nb=t, mask=1, type_KV="f16"), ""
    if o.op == "RMS_NORM":
        return Case.make("RMS_NORM", type="f32", ne=dst, eps=1e-6, view="contig"), ""
    if o.op in ("MUL", "ADD") and len(o.srcs) == 2:
        return Case.make(o.op, type="f32", ne_a=dst, ne_b=_pad4(o.srcs[1][1]), view="contig"), ""
    return None, "op not rebuilt"


@dataclass
class StreamResult:
    ops: list[StreamOp]
    profile: str
    ran: list[tuple[StreamOp, str, str]] = field(default_factory=list)  # (op, path, outcome)
    death: tuple[StreamOp, str] | None = None
    first_wrong: tuple[StreamOp, str] | None = None

    def lines(self) -> list[str]:
        rebuilt = [o for o in self.ops if o.case is not None]
        skipped: dict[str, int] = {}
        for o in self.ops:
            if o.case is None:
                skipped[o.op] = skipped.get(o.op, 0) + 1
        out = [f"op stream: {len(self.ops)} ops, {len(rebuilt)} rebuilt on the HTP model (profile {self.profile}); "
               f"not rebuilt: " + (", ".join(f"{k} x{v}" for k, v in skipped.items()) or "none")]
        if self.death is not None:
            o, why = self.death
            out.append(f"the profile predicts a DSP death at line {o.line_no} ({o.op} {list(o.dst)}): {why}")
        elif self.first_wrong is not None:
            o, why = self.first_wrong
            out.append(f"the profile predicts wrong numbers first at line {o.line_no} ({o.op} {list(o.dst)}): {why}")
        else:
            out.append("the profile predicts no fault for this op stream")
        return out


def replay_stream(ops: list[StreamOp], settings, judge_outputs: bool = True) -> StreamResult:
    """Run the rebuilt ops in order on one emulated HTP with `settings`; stop at a death."""
    from kazeia.backends.htp import HtpBackend
    from kazeia.debug.judge import judge
    from kazeia.debug.oracle.backends import Caches
    from kazeia.debug.oracle.run import case_threshold, reference_output, run_case_on
    from kazeia.debug.signature import classify
    from kazeia.debug.tensors import logical_values
    from kazeia.errors import DeviceDeathError, DeviceOpError

    be = HtpBackend(settings)
    caches = Caches()
    res = StreamResult(ops, settings.profile)
    for o in ops:
        if o.case is None:
            continue
        try:
            out = run_case_on(o.case, be, caches=caches)
        except DeviceDeathError as e:
            res.death = (o, f"{e} ({getattr(e, 'kind', '?')}: {e.cause})")
            break
        except DeviceOpError as e:
            res.first_wrong = res.first_wrong or (o, f"op error: {e}")
            continue
        path = be.records[-1][1].path if be.records else "?"
        res.ran.append((o, path, "ran"))
        if judge_outputs and res.first_wrong is None:
            got = np.asarray(logical_values(out), dtype=np.float64)
            want = reference_output(o.case, caches=caches)
            v = judge(got, want, case_threshold(o.case), op=o.case.op)
            if not v.ok:
                res.first_wrong = (o, f"{v.short()} on {path}; signature: {classify(got, want).headline()}")
    return res
