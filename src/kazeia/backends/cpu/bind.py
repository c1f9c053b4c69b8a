"""Graph nodes of the `cpu` backend bound to the native small-op kernels (kernels/ops.py, kernels/attention.py) and
to the GEMV itself (kernels/gemv): the front of those families.

`bind(backend, node)` returns a callable that runs the node with every argument worked out in advance (addresses,
strides, sizes), or None when the node is outside what the kernels do (the numpy fast paths of f32_ops.py, or
the plain kernels, run it then: they are also the whole story where the native kernels are off). CpuBackend
keeps the bound calls per graph and drops them when the graph allocator places the graph anew, so a decode step
pays one ctypes call per op instead of numpy's dozen calls and temporaries, and with no hook attached the runs of
them are programs of one call each (kernels/program.py).

Addresses are taken once: a bound call is valid while its tensors stay where they were (graph.allocated_in and
graph.allocated_plan unchanged; weights and KV caches never move).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from kazeia.backends import rope_pass
from kazeia.backends.cpu.kernels import ops as K
from kazeia.backends.cpu.kernels.attention import FLASH_ATTN
from kazeia.backends.cpu.kernels.dequant import NATIVE as NATIVE_DEQUANT
from kazeia.backends.cpu.kernels.dequant import dequantize_rows
from kazeia.backends.cpu.kernels.gemv import MATVEC
from kazeia.backends.cpu.kernels.program import MEMMOVE, MEMSET, bits32, bits64, simple
from kazeia.backends.cpu.qmatmul import GEMV_CHUNK
from kazeia.backends.numpy_ops import KERNELS, freq_factors
from kazeia.gguf.quants import QK
from kazeia.graph.builder import ROPE_NEOX, ROPE_NORM
from kazeia.graph.tensor import GGMLType, Tensor, TFlag, array, rows
from kazeia.native.compile import available
from kazeia.native.pool import address, run
from kazeia.native.threads import threads

FA_MAX_T = 32         # query rows up to which flash attention runs natively (measured faster than numpy's
                      # single-thread BLAS products up to 64 rows on the default model's and Qwen3-4B's shapes)
FA_MAX_KV = 1 << 16   # KV cells the native flash attention keeps scores for on the stack
_EL = {GGMLType.F32: 4, GGMLType.F16: 2}
_KIND = {GGMLType.F32: "f32", GGMLType.F16: "f16"}


def addr(t: Tensor) -> int:
    return t.buffer.data.__array_interface__["data"][0] + t.offset


def _rows(t: Tensor) -> tuple[int, int] | None:
    """(number of rows, row stride in elements) when t's rows (dims 1..3 flattened) are equally spaced and each
    row is contiguous; else None."""
    el = _EL.get(t.type)
    if el is None or t.nb[0] != el:
        return None
    n, rs = 1, None
    for d in (1, 2, 3):
        if t.ne[d] == 1:
            continue
        if rs is None:
            rs = t.nb[d]
        elif t.nb[d] != rs * n:
            return None
        n *= t.ne[d]
    return n, (rs or t.nb[1]) // el


_KERNELS_AT_IMPORT = dict(KERNELS)


def _plain(be, node: Tensor) -> bool:
    """The backend would run this op by its own kernel: nobody (a test) has patched KERNELS since."""
    return KERNELS.get(node.op) is _KERNELS_AT_IMPORT.get(node.op)


def bind(be, node: Tensor, shared: dict | None = None) -> Callable[[], None] | None:
    """`shared`: state the bound calls of one graph share (rope tables), kept by the backend per graph placement;
    None (or a fresh dict) for a node bound on its own."""
    binder = _BINDERS.get(node.op)
    if binder is None or not _plain(be, node):
        return None
    if any(s is not None and s.buffer is None for s in node.src) or node.buffer is None:
        return None
    if node.op == "ROPE":
        return binder(be, node, {} if shared is None else shared)
    return binder(be, node)


def _f32(*ts: Tensor | None) -> bool:
    return all(t is not None and t.type == GGMLType.F32 for t in ts)


def _bind_rms_norm(be, n: Tensor) -> Callable | None:
    x = n.src[0]
    rx, ry = _rows(x), _rows(n)
    if not _f32(x, n) or rx is None or ry is None or x.ne != n.ne:
        return None
    fn, args = K.RMS_NORM.fn, (addr(x), addr(n), rx[0], x.ne[0], rx[1], ry[1], bits64(n.params["eps"]))
    return simple(fn, args)


def _bind_binary(kernel):
    def binder(be, n: Tensor) -> Callable | None:
        a, b = n.src[0], n.src[1]
        ra, rb, ry = _rows(a), _rows(b), _rows(n)
        if not _f32(a, b, n) or ra is None or rb is None or ry is None or a.ne != n.ne or b.ne[0] != a.ne[0]:
            return None
        if b.ne == a.ne:
            brs = rb[1]
        elif b.ne[1:] == (1, 1, 1):
            brs = 0  # one row of b for every row of a (a norm weight over the tokens)
        else:
            return None
        fn, args = kernel.fn, (addr(a), addr(b), addr(n), ra[0], a.ne[0], ra[1], brs, ry[1])
        return simple(fn, args)
    return binder


def _bind_glu(be, n: Tensor) -> Callable | None:
    if n.params["glu_op"] != "SWIGLU" or len(n.src) < 2 or n.src[1] is None:
        return None
    a, b = n.src[0], n.src[1]
    if n.params.get("swapped"):
        a, b = b, a
    ra, rb, ry = _rows(a), _rows(b), _rows(n)
    if not _f32(a, b, n) or ra is None or rb is None or ry is None or not a.ne == b.ne == n.ne:
        return None
    fn, args = K.SWIGLU.fn, (addr(a), addr(b), addr(n), ra[0], a.ne[0], ra[1], rb[1], ry[1])
    return simple(fn, args)


def _bind_rope(be, n: Tensor, shared: dict) -> Callable | None:
    p = n.params
    x, pos = n.src[0], n.src[1]
    if p.get("ext_factor", 0.0) != 0.0 or p["mode"] not in (ROPE_NORM, ROPE_NEOX) or not _f32(x, n) or x.ne != n.ne:
        return None
    nd = p["n_dims"]
    if (x.nb[0] != 4 or n.nb[0] != 4 or nd % 2 or nd > x.ne[0] or pos.type != GGMLType.I32 or pos.nb[0] != 4
            or pos.ne[0] != x.ne[2]):
        return None
    fn = (rope_pass.ROPE_NEOX if p["mode"] == ROPE_NEOX else rope_pass.ROPE_NORM).fn
    tab = _RopeTable.of(shared, n)
    prm = np.array([addr(x), addr(n), tab.cp, tab.sp, x.ne[3], x.ne[2], x.ne[1], x.ne[0], nd, x.nb[1] // 4,
                    x.nb[2] // 4, x.nb[3] // 4, n.nb[1] // 4, n.nb[2] // 4, n.nb[3] // 4], dtype=np.int64)
    pp = prm.ctypes.data

    def run() -> None:
        if tab.run_id != be.run_id:  # the first rope of this run: every other Q and K rope shares its table
            tab.fill(be.run_id)
        fn(pp)
        prm  # noqa: B018 - the kernel reads it
    run.steps = [(0, address(fn), (pp,))]
    run.table = tab  # a program fills it before the first rope that reads it
    return run


class _RopeTable:
    """cos/sin (T, n_dims/2) * attn_factor of one graph's positions, made natively by the first rope of each run:
    theta = (pos * freq_scale) * base^(-2i/n_dims) in float64, cos and sin by libm, rounded to float32, then times
    attn_factor in float32 (numpy_ops.rope_angles' operations, in its order)."""

    @classmethod
    def of(cls, shared: dict, node: Tensor) -> _RopeTable:
        pos, p = node.src[1], node.params
        factors = node.src[2] if len(node.src) > 2 else None  # a weight: its values never change
        key = ("rope", pos, factors, p["n_dims"], p["freq_base"], p["freq_scale"], p.get("attn_factor", 1.0))
        hit = shared.get(key)
        if hit is None:
            hit = shared[key] = cls(pos, p, freq_factors(node))
        return hit

    def __init__(self, pos: Tensor, p: dict, factors: np.ndarray | None = None) -> None:
        nd, T = p["n_dims"], pos.ne[0]
        self.inv = p["freq_base"] ** (-np.arange(0, nd, 2, dtype=np.float64) / nd)
        if factors is not None:
            self.inv = np.ascontiguousarray(self.inv / factors)
        self.cos, self.sin = np.empty((T, nd // 2), np.float32), np.empty((T, nd // 2), np.float32)
        self.cp, self.sp = self.cos.ctypes.data, self.sin.ctypes.data
        self.args = (addr(pos), self.inv.ctypes.data, bits64(p["freq_scale"]),
                     bits32(p.get("attn_factor", 1.0)), T, nd // 2, self.cp, self.sp)
        self.fn = K.ROPE_TABLE.fn
        self.steps = [(0, address(self.fn), self.args)]
        self.run_id = -1
        self.pos_buffer = pos.buffer  # the kernel reads the positions' memory

    def fill(self, run_id: int) -> None:
        self.fn(*self.args)
        self.run_id = run_id


def _bind_set_rows(be, n: Tensor) -> Callable | None:
    src, ids = n.src[0], n.src[1]
    rs, rd = _rows(src), _rows(n)
    if (src.type != GGMLType.F32 or n.type != GGMLType.F16 or ids.type != GGMLType.I64 or rs is None or rd is None
            or src.ne[2:] != (1, 1) or n.ne[2:] != (1, 1) or ids.ne[1:] != (1, 1, 1) or ids.nb[0] != 8
            or ids.ne[0] != src.ne[1] or src.ne[0] != n.ne[0]):
        return None
    fn, args = K.SET_ROWS_F16.fn, (addr(src), addr(ids), addr(n), ids.ne[0], src.ne[0], rs[1], rd[1], n.ne[1])

    def bad() -> Exception:
        return IndexError(f"{n.name}: row id out of range [0, {n.ne[1]})")

    def run() -> None:
        if fn(*args) != 0:
            raise bad()
    run.steps = [(1, address(fn), args)]
    run.error = bad
    return run


def _bind_get_rows(be, n: Tensor) -> Callable | None:
    """GET_ROWS of a 2-D table (an embedding weight, or F32 rows) at 1-D I32 ids into contiguous F32 rows."""
    a, ids = n.src[0], n.src[1]
    ro = _rows(n)
    if (ids.type != GGMLType.I32 or ids.ne[1:] != (1, 1, 1) or a.ne[2:] != (1, 1) or n.type != GGMLType.F32
            or ro is None or ro[1] != a.ne[0] or n.ne != (a.ne[0], ids.ne[0], 1, 1)):
        return None
    sel, out, nrows = array(ids).reshape(-1), array(n)[0, 0], a.ne[1]
    if a.flags & TFlag.WEIGHT and a.type in NATIVE_DEQUANT and a.ne[0] % QK == 0:
        raw, qt, k = rows(a)[0, 0], a.type, a.ne[0]

        def fetch(i):
            dequantize_rows(raw[i], qt, k, out)
    elif a.type == GGMLType.F32 and not a.flags & TFlag.WEIGHT:
        src = array(a)[0, 0]

        def fetch(i):
            out[...] = src[i]
    else:
        return None

    def run() -> None:
        if sel.size == 1:
            i = int(sel[0])
            bad = not 0 <= i < nrows
            i = slice(i, i + 1)
        else:
            i = sel
            bad = int(sel.min()) < 0 or int(sel.max()) >= nrows
        if bad:
            raise IndexError(f"{n.name}: row id out of range [0, {nrows})")
        fetch(i)
    return run


def _bind_cpy(be, n: Tensor) -> Callable | None:
    """CPY of contiguous F32 rows to F16 rows of the same shape (the KQ mask's cast): the F16 row store."""
    src = n.src[0]
    rs, rd = _rows(src), _rows(n)
    if src.type != GGMLType.F32 or n.type != GGMLType.F16 or rs is None or rd is None or src.ne != n.ne:
        return None
    ids = np.arange(rs[0], dtype=np.int64)
    fn, args = K.SET_ROWS_F16.fn, (addr(src), ids.ctypes.data, addr(n), rs[0], n.ne[0], rs[1], rd[1], rs[0])

    run = simple(fn, args)
    run.keep = ids  # the kernel reads it
    return run


def _fa_params(n: Tensor) -> list[int] | None:
    q, k, v, m = n.src[:4]
    S, H, T, D = q.ne[3], q.ne[2], q.ne[1], q.ne[0]
    ek, em = _EL.get(k.type), _EL.get(m.type)
    if (ek is None or em is None or v.type != k.type or q.type != GGMLType.F32 or n.type != GGMLType.F32
            or q.nb[0] != 4 or k.nb[0] != ek or v.nb[0] != ek or m.nb[0] != em or n.nb[0] != 4):
        return None
    Hkv, n_kv = k.ne[2], k.ne[1]
    if (T > FA_MAX_T or n_kv > FA_MAX_KV or H % Hkv or v.ne[2] != Hkv or v.ne[1] != n_kv or k.ne[0] != D
            or m.ne[0] < n_kv or m.ne[2] != 1 or n.ne != (v.ne[0], H, T, S)):
        return None
    if k.ne[3] not in (1, S) or v.ne[3] not in (1, S) or m.ne[1] < T or S % m.ne[3]:
        return None

    def seq(t: Tensor, el: int) -> int:
        return t.nb[3] // el if t.ne[3] > 1 else 0

    return [S, H, T, D, v.ne[0], Hkv, n_kv, q.nb[1] // 4, q.nb[2] // 4, q.nb[3] // 4,
            k.nb[1] // ek, k.nb[2] // ek, seq(k, ek), v.nb[1] // ek, v.nb[2] // ek, seq(v, ek),
            m.nb[1] // em, seq(m, em), m.ne[1], m.ne[3], n.nb[1] // 4, n.nb[2] // 4, n.nb[3] // 4]


def _bind_flash_attn(be, n: Tensor) -> Callable | None:
    p = n.params
    if p.get("max_bias", 0.0) > 0.0 or p.get("softcap", 0.0) or len(n.src) < 4 or n.src[3] is None:
        return None
    prm = _fa_params(n)
    if prm is None:
        return None
    q, k, v, m = n.src[:4]
    desc = np.array(prm, dtype=np.int64)
    fn = FLASH_ATTN[_KIND[k.type], _KIND[m.type]].fn
    args = (desc.ctypes.data, addr(q), addr(k), addr(v), addr(m), addr(n), bits32(p["scale"]))
    run = simple(fn, args)
    run.keep = desc  # the kernel reads it
    return run


# --- weight matmuls (M = 1): the GEMV straight from the bound addresses ---------------------------------------


class _Group:
    """Weights sharing one input (Q/K/V, gate/up): their GEMV writes one scratch row; each member copies its
    columns when it runs (a member's own memory may still hold a live tensor when the first one runs)."""

    def __init__(self, be, ws: tuple[Tensor, ...], x: Tensor) -> None:
        s = be.weight_set(ws)
        self.scratch = np.empty(s.n, dtype=np.float32)
        self.call = _gemv_call(s, addr(x), self.scratch.ctypes.data)
        self.run_id = -1


def _gemv_call(s, xp: int, yp: int) -> Callable[[], None]:
    """The call computing y[c0 + r] = x . W_g[r] for every weight g (first column c0) of WeightSet s: one row of x
    at address xp, y at yp (qmatmul's GEMV, as WeightSet.matmul calls it, with everything worked out once).
    Whether the pool's threads join is decided per call (the thread count may change between runs)."""
    desc = np.array(s.desc, dtype=np.int64)
    nw = desc.shape[0]
    ctr = np.zeros(nw, dtype=np.int64)
    fn = MATVEC[s.kind, 1].fn
    head = (desc.ctypes.data, nw, s.k // QK, xp, 0, yp, 0, ctr.ctypes.data)
    alone, shared = (*head, 1 << 40), (*head, GEMV_CHUNK)  # one chunk of every row, or chunks to share
    cp, cn = ctr.ctypes.data, ctr.nbytes
    memset = ctypes.memset

    def call() -> None:
        memset(cp, 0, cn)
        if s.parallel and threads() > 1:
            run(fn, shared, True, linger=True)  # (the decode GEMVs: the workers wait spinning for the next)
        else:
            fn(*alone)
        desc, ctr  # noqa: B018 - the kernel reads their memory
    # the program form when the pool is not used (the counters zeroed, then the kernel alone)
    call.serial_steps = [(0, MEMSET, (cp, 0, cn)), (0, address(fn), alone)]
    call.parallel = lambda: s.parallel and threads() > 1
    return call


def _gemv_ok(be, ws: tuple[Tensor, ...], x: Tensor) -> bool:
    if not available() or x.type != GGMLType.F32 or x.nb[0] != 4 or x.nelements != x.ne[0]:
        return False
    return be.weight_set(ws).kind is not None


def bind_matmul(be, n: Tensor, member, shared: dict) -> tuple[Callable[[], None], dict] | None:
    """The bound call of a MUL_MAT node on a 2-D weight with one row of input, and its hook details (fused=...),
    or None. `member`: the node's place in a fused group (CpuBackend._Member), or None; `shared`: the groups'
    products of this graph."""
    w, x = n.src[0], n.src[1]
    if not _plain(be, n) or n.type != GGMLType.F32 or n.nb[0] != 4 or n.nelements != n.ne[0]:
        return None
    if member is None:
        if not (w.flags & TFlag.WEIGHT and w.ne[2] == w.ne[3] == 1) or not _gemv_ok(be, (w,), x):
            return None
        call = _gemv_call(be.weight_set((w,)), addr(x), addr(n))
        call.gemv = call
        return call, {}
    if not _gemv_ok(be, member.weights, x):
        return None
    g = shared.get(member.key)
    if g is None:
        g = shared[member.key] = _Group(be, member.weights, x)
    yp, src, nbytes = addr(n), g.scratch.ctypes.data + 4 * member.c0, 4 * (member.c1 - member.c0)
    memmove = ctypes.memmove

    def run() -> None:
        if g.run_id != be.run_id:  # the first member of this graph run computes the product
            g.call()
            g.run_id = be.run_id
        memmove(yp, src, nbytes)
    run.gemv, run.group = g.call, g  # a program computes the product at the group's first member in the list
    run.steps = [(0, MEMMOVE, (yp, src, nbytes))]
    return run, {"fused": len(member.weights)}


_BINDERS = {"RMS_NORM": _bind_rms_norm, "ADD": _bind_binary(K.ADD), "MUL": _bind_binary(K.MUL), "GLU": _bind_glu,
            "ROPE": _bind_rope, "SET_ROWS": _bind_set_rows, "FLASH_ATTN_EXT": _bind_flash_attn,
            "GET_ROWS": _bind_get_rows, "CPY": _bind_cpy}
