"""The device's float32 kernels for one bound node (executor.FastOp): the numpy_ops kernel's own operations, the
same ufuncs on the same operands in the same order, written into dst and into temporaries kept with the node
instead of new arrays (a decode runs each node every token). What they compute is bitwise the kernel's
(tests/test_htp_dev_ops.py); `compute_for` returns None for every case it does not restate (other ops, modes,
types or layouts), and the executor runs the numpy_ops kernel for those.

ROPE's cos/sin tables depend only on the positions and the params: they are computed by numpy_ops.rope_angles
exactly as the kernel computes them and kept by those values (every rope of a decode step has the same
positions).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kazeia.backends import rope_pass
from kazeia.backends.htp.kernels.expf import DSP_MATH, exp_f32, swiglu_f32
from kazeia.backends.numpy_ops import rope_angles
from kazeia.backends.sum_squares import RmsRows, sum_squares
from kazeia.graph.builder import ROPE_NEOX
from kazeia.graph.tensor import GGMLType, Tensor, array
from kazeia.native.buffers import ptr
from kazeia.native.compile import available

F32 = np.float32


def compute_for(node: Tensor) -> Callable[[], None] | None:
    """A closure computing the node into its dst from its sources' current values, or None (see the module)."""
    if node.op == "SET_ROWS":
        return _set_rows(node)
    if node.type != GGMLType.F32 or any(t is None or t.type not in (GGMLType.F32, GGMLType.I32) for t in node.src):
        return None
    make = {"RMS_NORM": _rms_norm, "GLU": _swiglu, "ROPE": _rope}.get(node.op)
    return make(node) if make is not None else None


def _rms_norm(node: Tensor) -> Callable[[], None] | None:
    """numpy_ops._rms_norm: the float64 sum of squares in the one order (backends/sum_squares.py), then the same
    steps; one native pass over the rows where the kernel runs (RmsRows, its arguments bound), else these numpy
    steps."""
    x, dst = array(node.src[0]), array(node)
    if node.src[0].type != GGMLType.F32 or x.shape != dst.shape:
        return None
    eps, k = node.params["eps"], x.shape[-1]
    native = RmsRows.of(x, dst, eps)
    if native is not None:
        return native

    def run() -> None:
        with np.errstate(all="ignore"):  # non-finite rows stay non-finite, as on the device, without a warning
            mean = sum_squares(x) / k
            inv = (1.0 / np.sqrt(mean + eps)).astype(F32)
            np.multiply(x, inv[..., None], out=dst)

    return run


def _set_rows(node: Tensor) -> Callable[[], None] | None:
    """numpy_ops._set_rows of float32 rows into an F16 or F32 tensor of one block (a KV-cache store): the same range
    check, then scatter_rows' one fancy assignment (numpy's float32 -> fp16 cast), without the int64 copy of the
    ids and its two reductions for a decode's single row; None for other types and layouts (a Q8_0 cache: the
    DSP's quantizer)."""
    src, ids = node.src[0], node.src[1]
    if node.type not in (GGMLType.F16, GGMLType.F32) or src.type != GGMLType.F32 or ids.type not in (
            GGMLType.I32, GGMLType.I64):
        return None
    vals, idx, out = array(src), array(ids), array(node)
    if vals.shape[:2] != (1, 1) or out.shape[:2] != (1, 1) or idx.shape[:3] != (1, 1, 1):
        return None
    sel, rows_in, rows_out, nrows = idx.reshape(-1), vals[0, 0], out[0, 0], node.ne[1]

    def out_of_range() -> IndexError:
        return IndexError(f"{node.name}: row id out of range [0, {nrows})")

    def run() -> None:
        if sel.size == 1:
            i = int(sel[0])
            if not 0 <= i < nrows:
                raise out_of_range()
            rows_out[i] = rows_in[0]
            return
        ii = sel.astype(np.int64)
        if ii.min(initial=0) < 0 or ii.max(initial=0) >= nrows:
            raise out_of_range()
        rows_out[ii] = rows_in

    return run


def _swiglu(node: Tensor) -> Callable[[], None] | None:
    """numpy_ops._glu (SWIGLU): silu(a) * b = a / (1 + exp(-a)) * b (the device's exp), each step into kept
    temporaries (exp reads a fresh contiguous array and writes another, as in the kernel)."""
    if node.params.get("glu_op") != "SWIGLU" or len(node.src) != 2:
        return None
    a, b, dst = array(node.src[0]), array(node.src[1]), array(node)
    if node.params.get("swapped"):
        a, b = b, a
    if not (a.shape == b.shape == dst.shape) or any(t.type != GGMLType.F32 for t in node.src):
        return None
    neg, e = np.empty(a.shape, F32), np.empty(a.shape, F32)

    def run() -> None:
        if swiglu_f32(a, b, dst, linger=True):  # the same operations in one native pass (kernels/expf.py)
            return
        with np.errstate(over="ignore"):
            np.negative(a, out=neg)
            exp_f32(neg, out=e)
            np.add(1, e, out=e)
            np.divide(a, e, out=e)
        np.multiply(e, b, out=dst)

    return run


_ANGLES: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def rope_tables(pos: np.ndarray, nd: int, base: float, scale: float, attn: float) -> tuple[np.ndarray, np.ndarray]:
    """numpy_ops._rope's cos and sin (1, T, 1, nd/2) for these positions and params, kept by them (read-only)."""
    key = (pos.tobytes(), pos.dtype.str, nd, base, scale, attn)
    hit = _ANGLES.get(key)
    if hit is None:
        if len(_ANGLES) > 64:
            _ANGLES.clear()
        cos, sin = rope_angles(pos, nd, base, scale, F32, math=DSP_MATH)
        cos = (cos * F32(attn))[None, :, None, :]
        sin = (sin * F32(attn))[None, :, None, :]
        cos.flags.writeable = sin.flags.writeable = False
        hit = _ANGLES[key] = (cos, sin)
    return hit


def _rope(node: Tensor) -> Callable[[], None] | None:
    """numpy_ops._rope for the NEOX mode: out[:h] = x0*cos - x1*sin, out[h:nd] = x0*sin + x1*cos (each product,
    then the difference or sum, rounded to float32 as there), dims past nd copied; into dst directly when dst
    does not share memory with x. A dst that is x itself (the allocator gave the rope its source's buffer, as for
    a decode's Q and K) gets the first half through a kept temporary: the kernel reads x0 again after writing it.
    Where the native kernels run, the same operations are one pass (backends/rope_pass.py, `_rope_pass`)."""
    p = node.params
    if p.get("ext_factor", 0.0) != 0.0 or p.get("mode") != ROPE_NEOX or node.src[0].type != GGMLType.F32:
        return None
    if len(node.src) != 2 or node.src[1].type != GGMLType.I32:  # (frequency factors: the general kernel)
        return None
    x, dst, posv = array(node.src[0]), array(node), array(node.src[1])
    nd = p["n_dims"]
    h = nd // 2
    if x.shape != dst.shape or nd % 2 or nd > x.shape[-1]:
        return None
    in_place = np.shares_memory(x, dst)
    same_view = x.__array_interface__["data"][0] == dst.__array_interface__["data"][0] and x.strides == dst.strides
    if in_place and not same_view:
        return None  # overlapping, not the same view: the general kernel's copies
    pos = posv.reshape(-1)  # (a view: read at each call, as the kernel reads it)
    if pos.size != x.shape[1] or not posv.flags.c_contiguous:
        return None
    base, scale, attn = p["freq_base"], p["freq_scale"], p.get("attn_factor", 1.0)
    native = _rope_pass(x, dst, nd, pos, (nd, base, scale, attn))
    if native is not None:
        return native
    x0, x1, d0, d1 = x[..., :h], x[..., h:nd], dst[..., :h], dst[..., h:nd]
    t0, t1 = np.empty(x0.shape, F32), np.empty(x0.shape, F32)
    first = np.empty(x0.shape, F32) if in_place else d0  # (in place: written into d0 once x0 is read)
    tail = nd < x.shape[-1] and not in_place

    def run() -> None:
        cos, sin = rope_tables(pos, nd, base, scale, attn)
        np.multiply(x0, cos, out=t0)
        np.multiply(x1, sin, out=t1)
        np.subtract(t0, t1, out=first)
        np.multiply(x0, sin, out=t0)
        np.multiply(x1, cos, out=t1)
        np.add(t0, t1, out=d1)
        if in_place:
            d0[...] = first
        if tail:
            dst[..., nd:] = x[..., nd:]

    return run


def _rope_pass(x: np.ndarray, dst: np.ndarray, nd: int, pos: np.ndarray, table: tuple) -> Callable[[], None] | None:
    """_rope's operations as backends/rope_pass.py's one native NEOX pass (the same products, rounded, then the same
    difference and sum; x may be dst itself), reading the table of rope_tables(pos, *table) at each call; None where
    the kernel does not run or the rows' elements are not adjacent floats."""
    if not available() or x.strides[3] != 4 or dst.strides[3] != 4 or any(v % 4 for v in x.strides + dst.strides):
        return None
    prm = np.array([ptr(x), ptr(dst), 0, 0, *x.shape, nd, x.strides[2] // 4, x.strides[1] // 4, x.strides[0] // 4,
                    dst.strides[2] // 4, dst.strides[1] // 4, dst.strides[0] // 4], dtype=np.int64)
    fn, pp = rope_pass.ROPE_NEOX.fn, ptr(prm)
    held: list = [None, None]  # the table the block points at (kept alive while it does)

    def run() -> None:
        cos, sin = rope_tables(pos, *table)
        if cos is not held[0]:
            prm[2], prm[3] = ptr(cos), ptr(sin)
            held[0], held[1] = cos, sin
        fn(pp)

    return run
