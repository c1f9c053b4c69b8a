"""A device's `llama-eval-callback` log read and compared with kazeia's float64 reference of the same graph.

llama.cpp's `llama-eval-callback` prints, for every graph node, a line
`name = (type) OP(src0{ne}, src1{ne}}) = {ne}` (after a `common_debug_cb_eval:` logger prefix), then the first
and last 3 values along each dimension (ggml's order: i3, i2, i1, i0 nested; a dimension of more than 6 prints
its first 3 and last 3 indices) and `sum = S` of the whole tensor. The evaluated token ids are printed too
("number of input tokens = N" and one id per line) and are used as the prompt when present.

`compare_log` aligns the log with the REF run of the same model and tokens by llama.cpp names (kazeia's `#k`
repeat suffix taken off; ggml's unnamed `node_<i>` by op and shape), op and shape, and judges every computed
tensor: each printed value against REF's value at the same index (print precision 5e-5 plus `rel` x the
tensor's rms: what a device's numerics explain: fp16 staging, int8 activation blocks), and the printed sum
against REF's. The first tensor departing is named with the error signature of its printed values.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import numpy as np

from kazeia.debug.signature import MECHANISMS, SigClass, Signature, classify, ranges, wrong_mask
from kazeia.limits import InputLimitError, TextLimits, at, numbered_lines, parse_dims, parse_int

EVALCB = TextLimits("eval-callback log", max_bytes=512 << 20, max_line=64 << 10, max_lines=20_000_000)
MAX_TENSORS = 1_000_000  # tensors of one log (a 36-layer prefill prints ~1,300 per evaluated graph)
MAX_VALUES = 1 << 16  # printed values of one tensor (3 of each end per dim: at most 6^4 = 1,296)
MAX_TOKENS = 1 << 20
PREFIX = "common_debug_cb_eval:"
SUM = re.compile(r"^\s*sum\s*=\s*(?P<v>\S+)\s*$")
NUM = re.compile(r"-?(?:\d+\.\d*|\d*\.\d+|\d+)(?:[eE][-+]?\d+)?|-?inf|nan", re.IGNORECASE)
TOKENS = re.compile(r"number of input tokens = (\d+)")
VIEW_OPS = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"}
N_PRINT = 3
PRINT_ABS = 5e-5  # %.4f


@dataclass
class LogTensor:
    name: str
    type: str
    op: str
    ne: tuple[int, int, int, int]
    values: list[float] = field(default_factory=list)
    sum: float | None = None

    def indices(self) -> list[tuple[int, int, int, int]]:
        """The (i3, i2, i1, i0) of the printed values, in print order."""
        per = [_printed(n) for n in reversed(self.ne)]
        return list(itertools.product(*per))


def _printed(n: int) -> list[int]:
    return list(range(n)) if n <= 2 * N_PRINT else [*range(N_PRINT), *range(n - N_PRINT, n)]


def parse_head(line: str, where: str) -> LogTensor | None:
    """`name = (type) OP(args) = {ne}` by string search, not a regular expression: a line of user text must
    cost linear time whatever its shape (the old pattern's nested `.*?` backtracked for minutes on a 1 MB line)."""
    text = line.split(PREFIX, 1)[1] if PREFIX in line else line
    text = text.strip()
    eq = text.find(" = (")
    close = text.find(")", eq + 4)
    tail = text.rfind(") = {")
    if eq <= 0 or close < 0 or tail <= close or not text.endswith("}"):
        return None
    type_ = text[eq + 4:close]
    op_and_args = text[close + 1:tail].lstrip()
    paren = op_and_args.find("(")
    op = op_and_args[:paren] if paren > 0 else ""
    if not (type_.isidentifier() and op.isidentifier()):
        return None
    ne = [x for x in text[tail + 5:-1].split(",")]
    # ggml prints empty tensors too (build_rs's zero-row copies: {128, 0, 1, 1})
    dims = parse_dims([x.strip() for x in ne], where, "output shape", max_elements=1 << 62, min_extent=0)
    return LogTensor(text[:eq].strip(), type_, op, (*dims, 1, 1, 1)[:4])


def parse_log(text: str, path: str = "<eval-callback log>") -> tuple[list[LogTensor], list[int] | None]:
    """The tensors of a llama-eval-callback log, and the token ids it lists (None if it lists none). Malformed
    shapes and counts past the limits are refused as FILE:LINE."""
    out: list[LogTensor] = []
    cur: LogTensor | None = None
    tokens: list[int] | None = None
    want_tokens = 0
    for n, line in numbered_lines(text, path, EVALCB):
        where = at(path, n)
        head = parse_head(line, where) if " = (" in line else None
        if head is not None:
            if len(out) >= MAX_TENSORS:
                raise InputLimitError(f"{where}: more than {MAX_TENSORS} tensors (the eval-callback log limit)")
            cur = head
            out.append(cur)
            continue
        t = TOKENS.search(line)
        if t:
            want_tokens, tokens = parse_int(t.group(1), where, "number of input tokens", 0, MAX_TOKENS), []
            continue
        if want_tokens and tokens is not None and len(tokens) < want_tokens:
            v = line.split()[-1] if line.split() else ""
            if v.isascii() and v.isdigit():
                tokens.append(parse_int(v, where, "token id", 0, 1 << 31))
                continue
        if cur is None:
            continue
        s = SUM.match(line)
        if s:
            try:
                cur.sum = float(s.group("v"))
            except ValueError:
                cur.sum = None
            cur = None
            continue
        if "[" in line or "]" in line:
            cur.values += [float(x) for x in NUM.findall(line.replace("...", " "))]
            if len(cur.values) > MAX_VALUES:
                raise InputLimitError(f"{where}: more than {MAX_VALUES} printed values for {cur.name} "
                                      f"(llama-eval-callback prints at most 1,296)")
    return out, tokens if tokens else None


@dataclass
class TensorCheck:
    name: str
    op: str
    ne: tuple
    status: str  # OK | DEPARTS | UNMATCHED | VIEW | NO-VALUES
    reason: str = ""
    max_err: float | None = None
    signature: Signature | None = None


@dataclass
class AgainstReport:
    checks: list[TensorCheck]
    n_tokens: int

    @property
    def first_departure(self) -> TensorCheck | None:
        return next((c for c in self.checks if c.status == "DEPARTS"), None)

    def lines(self) -> list[str]:
        judged = [c for c in self.checks if c.status in ("OK", "DEPARTS")]
        out = [f"{len(judged)} tensors of the log judged against the float64 reference "
               f"({sum(c.status == 'UNMATCHED' for c in self.checks)} unmatched, "
               f"{sum(c.status == 'VIEW' for c in self.checks)} views)"]
        first = self.first_departure
        if first is None:
            out.append("no tensor departs from the float64 reference beyond the device's numerics")
        else:
            out.append(f"first tensor departing: {first.name} ({first.op} {list(first.ne)}): {first.reason}")
            if first.signature is not None:
                out += ["  " + s for s in first.signature.lines()]
        return out


def _base(name: str) -> str:
    return name.split("#", 1)[0]


def _is_unnamed(name: str) -> bool:
    return re.fullmatch(r"node_\d+", name) is not None


def align(log: list[LogTensor], nodes: list[tuple[str, str, tuple]]) -> list[int | None]:
    """For each log tensor, the index into `nodes` ((name, op, ne)) of its node, in order, or None."""
    out: list[int | None] = []
    pos = 0
    for t in log:
        hit = None
        for j in range(pos, min(len(nodes), pos + 64)):
            name, op, ne = nodes[j]
            same_name = _base(name) == t.name or (_is_unnamed(t.name) and _is_unnamed(_base(name)))
            if same_name and op == t.op and tuple(ne) == t.ne:
                hit = j
                break
        out.append(hit)
        if hit is not None:
            pos = hit + 1
    return out


def judge_tensor(t: LogTensor, ref: np.ndarray, rel: float) -> TensorCheck:
    """Printed values and sum of `t` against REF's `ref` (numpy order, ne reversed)."""
    c = TensorCheck(t.name, t.op, t.ne, "OK")
    if np.asarray(ref).size != int(np.prod(t.ne)):
        c.status, c.reason = "UNMATCHED", "the reference keeps only part of this tensor (rows written)"
        return c
    r = np.asarray(ref, dtype=np.float64).reshape(tuple(reversed(t.ne)))
    idx = t.indices()
    if len(t.values) != len(idx):
        c.status, c.reason = "NO-VALUES", f"{len(t.values)} printed values for {len(idx)} expected"
        return c
    got = np.array(t.values)
    want = np.array([r[i] for i in idx])
    fin = np.isfinite(r)
    rms = float(np.sqrt(np.mean(r[fin] ** 2))) if fin.any() else 0.0
    tol = PRINT_ABS + rel * rms
    with np.errstate(all="ignore"):
        err = np.abs(got - want)
    bad_vals = ~((err <= tol) | (np.isnan(got) & np.isnan(want)) | ((got == want) & np.isinf(want)))
    c.max_err = float(np.nanmax(err)) if err.size else 0.0
    reasons = []
    if bad_vals.any():
        reasons.append(f"{int(bad_vals.sum())} of {len(idx)} printed values off by more than {tol:.3g} "
                       f"(max {c.max_err:.4g})")
    if t.sum is not None and fin.all():
        s_ref = float(r.sum())
        s_tol = 1e-5 * abs(s_ref) + 3 * rel * rms * np.sqrt(r.size) + PRINT_ABS * 10
        if not abs(t.sum - s_ref) <= s_tol:
            reasons.append(f"sum {t.sum:.6g} vs reference {s_ref:.6g} (tolerance {s_tol:.3g})")
    if reasons:
        c.status, c.reason = "DEPARTS", "; ".join(reasons)
        c.signature = printed_signature(t, got, want)
    return c


def printed_signature(t: LogTensor, got: np.ndarray, want: np.ndarray) -> Signature:
    """The error signature of the printed values (a rows x columns grid of what the log shows), with the wrong
    rows, columns and 32x32 tiles named by their real indices."""
    per = [_printed(n) for n in reversed(t.ne)]
    n_cols = len(per[3])
    g, w = got.reshape(-1, n_cols), want.reshape(-1, n_cols)
    sig = classify(g, w)
    sig.classes = [c for c in sig.classes if c.name != "region"]  # compact-grid tiles mean nothing
    bad = wrong_mask(g, w)
    if bad.any() and not bad.all():
        real_rows = [i1 + t.ne[1] * (i2 + t.ne[2] * i3) for i3, i2, i1 in itertools.product(*per[:3])]
        rows = sorted({real_rows[i] for i in np.flatnonzero(bad.any(axis=1))})
        cols = sorted({per[3][j] for j in np.flatnonzero(bad.any(axis=0))})
        tiles = sorted({(real_rows[i] // 32, per[3][j] // 32) for i, j in zip(*np.nonzero(bad))})
        sig.classes.append(SigClass(
            "region", f"wrong in the printed rows {ranges(rows)} and columns {ranges(cols)}: 32x32 tile(s) "
                      f"{', '.join(f'({a},{b})' for a, b in tiles)}",
            [f"{int(bad.sum())} of {bad.size} printed values wrong; the others match"], MECHANISMS["region"],
            where={"rows": rows, "cols": cols, "col_tiles": sorted({c // 32 for c in cols}),
                   "row_tiles": sorted({r // 32 for r in rows})}))
    return sig


def compare_log(log: list[LogTensor], ref_nodes: list[tuple[str, str, tuple, np.ndarray | None]],
                rel: float = 2e-2) -> list[TensorCheck]:
    """Judge every log tensor against its aligned reference node ((name, op, ne, float64 output or None))."""
    match = align(log, [(n, o, ne) for n, o, ne, _ in ref_nodes])
    checks = []
    for t, j in zip(log, match):
        if t.op in VIEW_OPS:
            checks.append(TensorCheck(t.name, t.op, t.ne, "VIEW"))
        elif j is None or ref_nodes[j][3] is None:
            checks.append(TensorCheck(t.name, t.op, t.ne, "UNMATCHED", "no node of kazeia's graph with this name, "
                                                                      "op and shape"))
        else:
            checks.append(judge_tensor(t, ref_nodes[j][3], rel))
    return checks


def reference_nodes(spec) -> list[tuple[str, str, tuple, np.ndarray | None]]:
    """(llama.cpp name, op, ne, REF's float64 output) of every node REF computes for `spec`'s prefill, in order."""
    from kazeia.backends.base import Hook
    from kazeia.backends.ref import RefBackend
    from kazeia.debug.compare.op_io import ref_output
    from kazeia.debug.compare.reference import ref_spec
    from kazeia.debug.runner import run
    from kazeia.engine.session import build_context
    from kazeia.errors import KazeiaError
    from kazeia.graph.builder import ggml_name

    rspec = ref_spec(spec)
    ctx = build_context(rspec)
    ref = next(b for b in ctx.scheduler.backends if isinstance(b, RefBackend))
    nodes: list[tuple[str, str, tuple, np.ndarray | None]] = []

    class Capture(Hook):
        def on_complete(self, node, info) -> None:
            try:
                v = ref_output(ref, node)
            except (TypeError, ValueError):
                v = None
            nodes.append((ggml_name(node), node.desc(), tuple(node.ne), v))

    res = run(rspec, hooks=[Capture()], ctx=ctx)
    if not res.ok:
        raise KazeiaError(f"the REF run failed: {res.signature()}")
    return nodes
