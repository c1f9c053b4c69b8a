"""What the non-matmul ops leave in VTCM, and what they do to the src1 shortcut.

Each HVX op streams its rows through per-thread ping-pong spads carved from vtcm_base (layouts in
op_layouts.py, read from the upstream op files). After the op, those spads hold real bytes of its inputs
and outputs, and the next op that trusts VTCM without writing it first reads them. We write, for every area the
layout says the op touches, the rows of the tensor that area streams (thread t's first block in half 0, its
second in half 1), so stale bytes are the genuine leftovers of the previous op. The src1 shortcut is then
cleared or left as the profile's rule for that op says (src1_shortcut.src1_cache_effect).
"""

from __future__ import annotations

import functools
import re
from typing import Protocol

import numpy as np

from kazeia.backends.htp.kernels.vtcm_copy import CopyRuns
from kazeia.backends.htp.msg import OpBatch, OpContext, OpDesc
from kazeia.backends.htp.profiles import Profile, get_profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm import arena as V
from kazeia.backends.htp.vtcm.hybrid_layouts import hybrid_scratch
from kazeia.backends.htp.vtcm.op_layouts import (
    OpScratch,
    act_scratch,
    binary_scratch,
    flash_attn_scratch,
    no_scratch,
    rope_scratch,
    softmax_scratch,
    unary_scratch,
)
from kazeia.backends.htp.vtcm.src1_shortcut import src1_cache_effect
from kazeia.graph.tensor import SCALAR_DTYPES, Tensor, array
from kazeia.identity import IdentityCache, binding

_AREA = re.compile(r"^(?P<base>[a-z0-9_]+)(\[(?P<t>\d+)\])?(\.(?P<h>\d))?$")


class DspView(Protocol):
    """What the scratch writer sees of the DSP (device.py's Dsp): its VTCM. A protocol, so this unit, below the
    device, does not import it."""

    vtcm: V.Vtcm


def shortcut_name(node: Tensor) -> str:
    """The op name the src1-shortcut rules use (htp op codes)."""
    if node.op == "GLU":
        return f"GLU_{node.params['glu_op']}"
    if node.op == "UNARY":
        return f"UNARY_{node.params['unary_op']}"
    return {"SOFT_MAX": "SOFTMAX", "CONT": "CPY"}.get(node.op, node.op)


def _rows2d(t: Tensor) -> np.ndarray:
    """The tensor's rows as raw bytes (nrows, row_bytes), read through ne/nb."""
    a = np.ascontiguousarray(array(t))
    return a.reshape(-1, t.ne[0]).view(np.uint8)


def op_scratch(node: Tensor, settings: HtpSettings) -> OpScratch:
    """The VTCM layout (and, for flash attention, the path) of a non-matmul op on an HTP with `settings`: what
    the executor runs and the cost model prices."""
    # the VTCM the DSP has: under 2026-10 these ops' layouts (host-solved, small row blocks upstream; kazeia lays
    # them out as May did) are sized to what the DSP was granted, so only the MUL_MAT plans, which the host solves
    # against the session's full size, can meet a smaller grant
    s, nt, vt = settings, settings.nhvx, settings.dsp_vtcm_bytes
    prof = get_profile(settings.profile)
    hybrid = hybrid_scratch(node, nt, vt, prof.ssm_conv_padded_weight_stride, prof.caps.ssm_conv_always_hvx)
    if hybrid is not None:
        return hybrid
    op = node.op
    if op in ("RMS_NORM", "SCALE"):
        return unary_scratch(node.src[0].ne[0], node.src[0].nrows, nt, vt, op=op, dst_ne0=node.ne[0])
    if op in ("ADD", "MUL", "SUB", "DIV"):
        return binary_scratch(node.src[0].ne, node.src[1].ne, nt, vt, op=op)
    if op in ("GLU", "UNARY"):
        src1_row = node.src[1].nb[1] if len(node.src) > 1 and node.src[1] is not None else None
        return act_scratch(node.src[0].nb[1], node.src[0].nrows, nt, vt, op=shortcut_name(node),
                           src1_row_bytes=src1_row, dst_row_bytes=node.nb[1])
    if op == "SOFT_MAX":
        return softmax_scratch(node.src[0].nb[1], node.src[0].nrows, nt, vt, dst_row_bytes=node.nb[1],
                               ne00=node.src[0].ne[0])
    if op == "ROPE":
        return rope_scratch(node.ne[0], node.src[0].nrows, nt, vt)
    if op == "FLASH_ATTN_EXT":
        q, k, v = node.src[0], node.src[1], node.src[2]
        return flash_attn_scratch(q.ne[0], v.ne[0], q.ne[1], k.ne[1], q.ne[2], k.ne[2], nt, vt,
                                  hmx_enabled=s.fa_hmx_enabled and node.route_path != "hvx",
                                  hmx_built=s.arch in V.HMX_ARCHS,
                                  q_f32=q.type.name == "F32", has_mask=len(node.src) > 3)
    return no_scratch(shortcut_name(node), vt)


def _layout_key(node: Tensor) -> tuple | None:
    """Everything op_scratch reads of a node (op, params, route path, and type/ne/nb of the node and its
    sources), or None when a param is unhashable (then the layout is not kept)."""
    try:
        params = tuple(sorted(node.params.items()))
        hash(params)
    except TypeError:
        return None
    srcs = tuple(None if t is None else (t.type, t.ne, t.nb) for t in node.src)
    return node.op, node.type, node.ne, node.nb, node.route_path, params, srcs


class ScratchWriter:
    def __init__(self, settings: HtpSettings, profile: Profile) -> None:
        self.settings = settings
        self.profile = profile
        # by what a layout depends on (`_layout_key`): a decode runs the same few hundred layouts every token
        self._layouts: IdentityCache[OpScratch] = IdentityCache("htp.op_layouts", limit=4096, bind=True,
                                                                by_value=True)
        self._programs: IdentityCache[ScratchProgram] = IdentityCache("htp.scratch_programs", limit=4096, bind=True,
                                                                      by_value=True)

    def layout(self, node: Tensor) -> OpScratch:
        """op_scratch of the node, kept by what it depends on: a decode runs the same few hundred layouts every
        token (OpScratch is frozen; nobody writes its info)."""
        key = _layout_key(node)
        if key is None:
            return op_scratch(node, self.settings)
        return self._layouts.get(key, lambda: op_scratch(node, self.settings))

    def write(self, dsp: DspView, node: Tensor, sc: OpScratch,
              program: ScratchProgram | ScratchBinding | None = None, placement: object = None) -> None:
        """Leave the op's bytes in every area it writes (the gated-delta-net ops' kernels write their own).
        `program`: `self.program(node, sc)`, or a ScratchBinding of it, when the caller keeps one (the executor
        binds one per node)."""
        host_sized = self.profile is not None and not self.profile.caps.op_scratch_images
        if not sc.writes or sc.info.get("kernel_writes") or host_sized:
            # (2026-10: these ops' layouts are host-solved ones kazeia does not restate; their May images would be
            # forensic data of a layout October does not have, and nothing in 2026-10 reads them back: the src1
            # shortcut dies with each op. Their VTCM is left as it was.)
            return
        if isinstance(program, ScratchBinding):
            if program.run(dsp, node, placement):
                return
            program = program.program
        if program is None:
            program = self.program(node, sc)
        cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        runs = []
        for slot, offset, nbytes, start, byte0 in program:
            tensor = node if slot < 0 else node.src[slot]
            if tensor.buffer is None:
                continue
            hit = cache.get(slot)
            if hit is None:
                rows = _rows2d(tensor)
                hit = cache[slot] = (rows, rows.reshape(-1))
            if byte0 >= 0:  # rows already 128 B-aligned and all there: a slice of the tensor's bytes
                runs.append((offset, hit[1][byte0:byte0 + nbytes]))
            else:
                runs.append((offset, _stream(hit[0], start, nbytes)))
        dsp.vtcm.write_runs(runs)

    def program(self, node: Tensor, sc: OpScratch) -> ScratchProgram:
        """`scratch_program(node, sc)`, kept with the layout when `sc` is the one `layout(node)` keeps."""
        key = _layout_key(node)
        if key is None or self._layouts.peek(key) is not sc:
            return scratch_program(node, sc)
        return self._programs.get(key, lambda: scratch_program(node, sc))

    def after_op(self, dsp: DspView, octx: OpContext, op: OpDesc, batch: OpBatch, path: str,
                 sc: OpScratch | None = None, program: ScratchProgram | ScratchBinding | None = None,
                 effect: str | None = None) -> None:
        """The op's scratch bytes, then its effect on the src1 shortcut (`effect`: `src1_effect(node, path)`,
        when the caller keeps it)."""
        node = op.node
        sc = sc or self.layout(node)
        self.write(dsp, node, sc, program, op.placement)
        if effect is None:
            effect = self.src1_effect(node, path)
        if effect == "reset" and sc.status != "VTCM_TOO_SMALL":
            octx.src1_spad_src = None
            octx.src1_spad_kind = None

    def src1_effect(self, node: Tensor, path: str) -> str:
        """What the op does to the src1 shortcut under this profile (src1_shortcut.src1_cache_effect)."""
        p = path if node.op in ("MUL_MAT", "FLASH_ATTN_EXT") else None
        return src1_cache_effect(shortcut_name(node), self.profile.name, p)


# (slot, VTCM offset, bytes, first row, first byte or -1) per area an op writes: slot is the source index the
# area streams (-1: the op's dst); first byte >= 0 when the run is a plain slice of the tensor's row bytes
ScratchProgram = tuple[tuple[int, int, int, int, int], ...]
_SLOTS = {"src0": 0, "src1": 1, "q": 0, "k": 1, "v": 2, "mask": 3}


def scratch_program(node: Tensor, sc: OpScratch) -> ScratchProgram:
    """The writes `ScratchWriter.write` makes for the op's layout, worked out from shapes only: for every area
    with bytes written, which tensor's rows it streams from which row (thread t's first block in half 0, its
    second in half 1), and whether those bytes are a plain slice of the tensor (128 B-aligned rows, all there)."""
    per_thread = _thread_starts(node, sc)
    block = int(sc.info.get("rows_per_half") or 0)
    out = []
    for area in sc.writes:
        n = area.written if area.written is not None else area.size
        if n <= 0:
            continue
        base, t, h = _area_parts(area.name)
        slot = _SLOTS.get(base)
        if slot is None or slot >= len(node.src) or node.src[slot] is None:
            slot = -1  # the op's own rows (dst areas, and areas of a missing source, as before)
        tensor = node if slot < 0 else node.src[slot]
        start = per_thread[t] + h * block if t < len(per_thread) else 0
        out.append((slot, area.offset, n, start, _slice_start(tensor, start, n)))
    return tuple(out)


class ScratchBinding:
    """A node's scratch program bound to memory: for each run, the VTCM bytes and the tensor bytes it copies, as
    views made once. They stay valid under the placement of the node's graph they were made under (graph/alloc.py:
    its tensors stay where they were) and the same VTCM; otherwise they are made again. A node of no placed graph,
    programs with a padded run (rows not 128 B-aligned) and tensors that are not contiguous are written run by
    run."""

    __slots__ = ("program", "slots", "key", "views")

    def __init__(self, program: ScratchProgram) -> None:
        self.program = program
        self.slots = tuple(sorted({e[0] for e in program}))
        self.key: tuple | None = None
        self.views: tuple | None = None

    def run(self, dsp: DspView, node: Tensor, placement: object) -> bool:
        """Copy every run; False (nothing written) when the program cannot be bound: write it run by run."""
        if placement is None or not binding():
            return False
        key = self.key
        if key is None or key[0] is not dsp.vtcm or key[1] is not placement:
            self.views = self.bind(dsp, node)
            self.key = (dsp.vtcm, placement)
        if self.views is None:
            return False
        dsp.vtcm.write_views(*self.views)
        return True

    def bind(self, dsp: DspView, node: Tensor) -> tuple | None:
        """`write_views` arguments of the program for the node's current views (what `run` would write), or None
        where `run` would write run by run (executor.FastOp keeps them and checks the views itself)."""
        src = node.src
        try:
            arrays = tuple(array(node if s < 0 else src[s]) for s in self.slots)
        except (TypeError, RuntimeError):
            return None
        return self._bind(dsp, arrays)

    def _bind(self, dsp: DspView, arrays: tuple) -> tuple | None:
        if any(e[4] < 0 for e in self.program) or not all(a.flags.c_contiguous for a in arrays):
            return None
        flat = {s: a.reshape(-1).view(np.uint8) for s, a in zip(self.slots, arrays)}
        spans = [(off, n) for _, off, n, _, _ in self.program]
        try:
            dst = dsp.vtcm.run_views(spans)
        except V.VtcmAccessError:
            return None  # the run-by-run write raises it, at the same run
        pairs = [(d, flat[slot][b0:b0 + n]) for d, (slot, _, n, _, b0) in zip(dst, self.program)]
        return spans, pairs, V.span_box(spans), CopyRuns.of(pairs)  # (the copies in one native call)


def _thread_starts(node: Tensor, sc: OpScratch) -> list[int]:
    """The first row of each thread's share of the op's rows (src0's, or the op's own without sources)."""
    nrows = node.src[0].nrows if node.src else node.nrows
    nt = max(1, sc.n_threads)
    per = -(-nrows // nt)
    return [min(i * per, nrows) for i in range(nt)]


def _slice_start(t: Tensor, start: int, nbytes: int) -> int:
    """The byte where `_stream(_rows2d(t), start, nbytes)` starts inside the tensor's row bytes when it is a
    plain slice of them (rows a multiple of 128 B, every row it takes there), else -1."""
    dt = SCALAR_DTYPES.get(t.type)
    if dt is None or t.ne[0] == 0:
        return -1
    row_bytes = t.ne[0] * np.dtype(dt).itemsize
    n_total = t.nelements // t.ne[0]
    if row_bytes % V.VLEN:
        return -1
    n_rows = max(1, -(-nbytes // row_bytes))
    first = start if start < n_total else n_total - n_rows
    if first < 0 or first + n_rows > n_total:
        return -1
    return first * row_bytes


@functools.lru_cache(maxsize=4096)
def _area_parts(name: str) -> tuple[str, int, int]:
    """An area name -> (the tensor it streams, thread, half): "src0[3].1" -> ("src0", 3, 1)."""
    m = _AREA.match(name)
    if not m:
        return name, 0, 0
    return m.group("base"), int(m.group("t") or 0), int(m.group("h") or 0)


def _stream(rows: np.ndarray, start: int, nbytes: int) -> np.ndarray:
    """Rows from `start` on, each padded to a 128 B stride, cut to nbytes (what a spad holds)."""
    row_bytes = rows.shape[1]
    stride = -(-row_bytes // V.VLEN) * V.VLEN
    n_rows = max(1, -(-nbytes // stride))
    sel = rows[start:start + n_rows] if start < rows.shape[0] else rows[-n_rows:]
    if stride == row_bytes and sel.shape[0] == n_rows and sel.flags.c_contiguous:
        return sel.reshape(-1)[:nbytes]  # rows already 128 B-aligned and all there: no padding to add
    buf = np.zeros((n_rows, stride), dtype=np.uint8)
    buf[: sel.shape[0], :row_bytes] = sel
    return buf.reshape(-1)[:nbytes]
