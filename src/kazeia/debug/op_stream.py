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
from kazeia.limits import InputLimitError, TextLimits, at, numbered_lines, parse_dims

KZOP = re.compile(r"KZOP (?P<op>[A-Z_]+(?: [A-Z_]+)?) dst=\[(?P<dst>[^\]]*)\](?: src0=(?P<t0>\w+)\[(?P<s0>[^\]]*)\])?"
                  r"(?: src1=(?P<t1>\w+)\[(?P<s1>[^\]]*)\])?")
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


OP_STREAM = TextLimits("op-stream log", max_bytes=64 << 20, max_line=16 << 10, max_lines=2_000_000)
MAX_OPS = 100_000  # ops rebuilt from one log (a 36-layer prefill graph has ~1,300)
MAX_OP_ELEMENTS = 1 << 26  # elements of one rebuilt tensor: the REF oracle holds it in float64 (512 MiB); a 4B
# model's largest MUL_MAT weight (ffn, 9728 x 2560) has 25 Mi
MUL_MAT_TYPES = ("f32", "f16", "q4_0", "q8_0")  # what the oracle builds MUL_MAT weights of


def _dims(s: str, where: str, what: str) -> tuple[int, ...]:
    return parse_dims([x for x in s.replace(":", ",").split(",")], where, what, max_elements=MAX_OP_ELEMENTS)


def _pad4(d: tuple[int, ...]) -> tuple[int, int, int, int]:
    return tuple((*d, 1, 1, 1, 1)[:4])


def _verbose(line: str, where: str) -> tuple[str, tuple, list] | None:
    head, *fields = line[line.index(VERBOSE) + len(VERBOSE):].split(" : ")
    if len(fields) < 2:
        return None
    groups = [g.strip() for g in fields[0].split("->")]
    types = [g.strip() for g in fields[1].split("->")]
    src_dims = [_dims(x, where, f"src{i} shape") for i, x in enumerate(groups[0].split(" x "))] \
        if len(groups) > 1 else []
    src_types = [t.strip() for t in types[0].split(" x ")] if len(types) > 1 else []
    return head.split(":")[0].strip(), _dims(groups[-1], where, "dst shape"), list(zip(src_types, src_dims))


def parse_stream(text: str, path: str = "<op stream>") -> list[StreamOp]:
    """The ops of a KZOP / VERBOSE log. A line that names an op but whose shapes are not shapes (blank, zero,
    negative, non-numeric, more than 4-D, past MAX_OP_ELEMENTS) is refused as FILE:LINE; an op kazeia does not
    rebuild is kept with the reason (to_case)."""
    out = []
    for i, line in numbered_lines(text, path, OP_STREAM):
        where = at(path, i)
        m = KZOP.search(line)
        if m:
            srcs = [(m.group(f"t{k}"), _dims(m.group(f"s{k}"), where, f"src{k} shape")) for k in (0, 1)
                    if m.group(f"s{k}")]
            out.append(StreamOp(i, line.strip(), m.group("op"), _dims(m.group("dst"), where, "dst shape"), srcs))
        elif VERBOSE in line:
            v = _verbose(line, where)
            if v is not None:
                out.append(StreamOp(i, line.strip(), *v))
        if len(out) > MAX_OPS:
            raise InputLimitError(f"{where}: more than {MAX_OPS} ops (the op-stream limit)")
    for o in out:
        o.case, o.why_not = to_case(o)
    return out


def to_case(o: StreamOp) -> tuple[Case | None, str]:
    """The oracle case of a logged op, or why it is not rebuilt (shapes that do not fit together, a type the
    oracle does not build)."""
    dst = _pad4(o.dst)
    if o.op == "MUL_MAT" and len(o.srcs) == 2:
        return _mul_mat(o, dst)
    if o.op == "FLASH_ATTN_EXT" and len(o.srcs) >= 2:
        d, h, t = dst[0], dst[1], dst[2]
        kd = o.srcs[1][1]
        if len(kd) < 2:
            return None, "no KV length in the line"
        hkv = kd[2] if len(kd) >= 3 and h % kd[2] == 0 else h  # VERBOSE gives K's heads, KZOP does not
        if kd[0] != d or d % 32 or d > 512:
            return None, f"head size {d} (K rows {kd[0]}) is not one the oracle builds (a multiple of 32, <= 512)"
        if d * h * t > MAX_OP_ELEMENTS or d * hkv * kd[1] > MAX_OP_ELEMENTS:
            return None, f"larger than {MAX_OP_ELEMENTS} elements"
        return Case.make("FLASH_ATTN_EXT", hs=d, nh=hkv, nr=h // hkv, kv=kd[1], nb=t, mask=1, type_KV="f16"), ""
    if o.op == "RMS_NORM":
        return Case.make("RMS_NORM", type="f32", ne=dst, eps=1e-6, view="contig"), ""
    if o.op in ("MUL", "ADD") and len(o.srcs) == 2:
        b = _pad4(o.srcs[1][1])
        if any(x % y for x, y in zip(dst, b)):
            return None, f"src1 {list(b)} does not broadcast to dst {list(dst)}"
        return Case.make(o.op, type="f32", ne_a=dst, ne_b=b, view="contig"), ""
    return None, "op not rebuilt"


def _mul_mat(o: StreamOp, dst: tuple[int, int, int, int]) -> tuple[Case | None, str]:
    (t0, s0), (t1, s1) = o.srcs
    t0 = (t0 or "").lower()
    if t1 != "f32" or _pad4(s0)[2:] != (1, 1) or _pad4(s1)[2:] != (1, 1):
        return None, "batched or non-f32 activations"
    if t0 not in MUL_MAT_TYPES:
        return None, f"weight type {t0!r} is not one the oracle builds ({', '.join(MUL_MAT_TYPES)})"
    k, m = _pad4(s0)[:2]
    k1, n = _pad4(s1)[:2]
    if k1 != k or dst[:2] != (m, n):
        return None, f"src0 {list(s0)} x src1 {list(s1)} -> {list(o.dst)} is not a MUL_MAT shape"
    if t0 not in ("f32", "f16") and k % 32:
        return None, f"K = {k} is not a multiple of the {t0} block (32)"
    return mul_mat_case(t0, m=m, n=n, k=k), ""


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
