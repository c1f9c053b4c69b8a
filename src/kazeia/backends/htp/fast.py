"""Entry points of the HTP numerics kernels: the AVX2 ones (simd_htp.py, through native.py) when the host has
them, else the portable numba ones (kernels.py) and numpy. Both give the same bits (tests/test_htp_simd.py).

- `round_hw(x)`: round_fp16_hw of a float32 array (the HMX read-out), `shuffled_fp16(x, arch)`: the
  staging converter f32_to_f16_shuffled;
- `hmx_weight_rows(blocks, dbits, qtype, out)`: the HMX fp16 weight values of rows of ggml blocks;
- `hvx_dot(b8, b16, qtype, image, m, k, y)`: the HVX vec_dot of ggml rows with an activation image.
"""

from __future__ import annotations

import threading

import numpy as np
from gguf import GGMLQuantizationType

from kazeia.backends import jit, native
from kazeia.backends.htp.fp16 import FP16_MAX, f32_to_f16_shuffled, from_fp16_bits, round_fp16_hw

GGMLType = GGMLQuantizationType
KIND = {GGMLType.Q4_0: 0, GGMLType.Q4_1: 1, GGMLType.Q8_0: 2, GGMLType.IQ4_NL: 3}  # type codes of htp/kernels.py

NIBBLE_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1)  # simd_hvx.NIBBLES: their dot reads the image's int8 quants
NAMES = {GGMLType.Q4_0: "q4_0", GGMLType.Q4_1: "q4_1", GGMLType.Q8_0: "q8_0", GGMLType.IQ4_NL: "iq4_nl"}
ROUND_ROW = 1024                 # elements per row of the native rounding kernel
PARALLEL_MIN_ELEMS = 1 << 18     # arrays (and weight row ranges) below this run on one thread
HVX_CHUNK = 16                   # weight rows per claimed chunk of the HVX dot
DECODE_ROWS = 8                  # HVX dots of up to this many activation rows keep the kernel threads spinning


def lib():
    """The AVX2 HTP kernels, or None where the portable ones run."""
    return native.library("kazeia.backends.htp.simd_htp") if native.available() else None


def numba_kernels():
    return jit.kernels("kazeia.backends.htp.kernels")


def ptr(a: np.ndarray) -> int:
    """The address of an array's first element (what the native kernels take)."""
    return a.__array_interface__["data"][0]


_PTRS: dict[int, tuple[np.ndarray, int]] = {}


def _kept_ptr(a: np.ndarray) -> int:
    """_ptr of an array that is passed again and again (the fp16 tables, a weight's block view): kept by the
    array object, which the entry holds (so its id is not reused while it is there)."""
    hit = _PTRS.get(id(a))
    if hit is None or hit[0] is not a:
        if len(_PTRS) > 8192:
            _PTRS.clear()
        hit = _PTRS[id(a)] = (a, ptr(a))
    return hit[1]


_SCRATCH = threading.local()


def _dot_scratch(m: int, n16: int, npad: int, k: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """This thread's (x16 (m, n16) int16, xs (m, npad) int32) scratch of the HVX dot for K = k and their
    pointers: x16 is zero past what the callers of one (m, n16, npad, k) write."""
    cache = getattr(_SCRATCH, "dot", None)
    if cache is None:
        cache = _SCRATCH.dot = {}
    hit = cache.get((m, n16, npad, k))
    if hit is None:
        if len(cache) > 64:
            cache.clear()
        x16 = np.zeros((m, n16), dtype=np.int16)
        xs = np.zeros((m, npad), dtype=np.int32)
        hit = cache[(m, n16, npad, k)] = (x16, xs, ptr(x16), ptr(xs))
    return hit


def _run(fn, args: tuple, n: int, chunk: int, parallel: bool, linger: bool = False) -> None:
    """A row-range kernel on rows [0, n): whole on this thread, or in chunks on the kernel threads (`linger`:
    they spin for the next job, see native.run)."""
    if parallel and native.threads() > 1 and n > chunk:
        ctr = np.zeros(1, dtype=np.int64)
        native.run(fn[1], (*args, ptr(ctr), n, chunk), linger=linger)
    else:
        fn[0](*args, 0, n)


def _pair(k, name: str):
    return k[name], k[name + "_par"]


def round_hw(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """round_fp16_hw(x) (RNE to fp16, |x| > 65504 -> +-inf, NaN kept) as a new float32 array, or into `out`
    (same shape, float32; `out` may be `x` itself)."""
    k = lib()
    x = np.asarray(x)
    if out is not None:
        if out.shape != x.shape or out.dtype != np.float32:
            raise ValueError(f"round_hw out must be float32 of shape {x.shape}")
        if k is None or x.dtype != np.float32 or x.size < ROUND_ROW or not (
                x.flags.c_contiguous and out.flags.c_contiguous):
            out[...] = round_fp16_hw(x)
            return out
    if k is None or x.dtype != np.float32 or x.size < ROUND_ROW:
        return round_fp16_hw(x)
    xc = np.ascontiguousarray(x)
    y = np.empty_like(xc) if out is None else out
    flat_x, flat_y = xc.reshape(-1), y.reshape(-1)
    rows = xc.size // ROUND_ROW
    _run(_pair(k, "round_f16_hw"), (ptr(xc), ptr(y)), rows, 64, xc.size >= PARALLEL_MIN_ELEMS)
    tail = rows * ROUND_ROW
    if tail < xc.size:
        flat_y[tail:] = round_fp16_hw(flat_x[tail:])
    return y


F16_LOAD_MIN_ELEMS = 1 << 14     # fp16 arrays below this are widened by numpy


def f16_to_f32(a: np.ndarray, order: str = "K") -> np.ndarray:
    """np.asarray(a, dtype=np.float32) of a float16 array (a KV cache view: (1, heads, cells, D), strided), the
    same bits, NaN payloads included, in the same memory order numpy picks (numpy widens fp16 in software:
    ~2 ns an element, this ~7x less); order="C": np.ascontiguousarray of that (made C-contiguous directly)."""
    k = lib()
    if (k is None or a.dtype != np.float16 or a.ndim != 4 or a.shape[0] != 1 or a.size < F16_LOAD_MIN_ELEMS
            or a.shape[3] % 8 or a.strides[3] != 2):
        return np.asarray(a, dtype=np.float32, order=order)
    out = np.empty_like(a, dtype=np.float32, order=order)  # "K": as np.asarray lays its copy out
    if out.strides[3] != 4:
        return np.asarray(a, dtype=np.float32, order=order)
    _, n2, n1, d = a.shape
    k["f16_rows_f32"](ptr(a), a.strides[2], a.strides[1], n1, d, ptr(out), out.strides[2] // 4,
                      out.strides[1] // 4, 0, n2 * n1)
    return out


def q8_groups(x: np.ndarray, k: int, kp: int, group: int, tinv: np.ndarray,
              ti8: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """hvx_quant._quantize_groups of the rows x (M, k) float32 zero-padded to kp: (int8 quants (M, kp), fp16
    scales (M, kp/group) as float32), the same bits, from the two fp16 tables of hvx_quant (`tinv` uint16,
    `ti8` int8, both indexed by fp16 bits). None when the native kernels are missing or a value is outside
    what the kernel takes (|x| > 65504, inf or NaN): the numpy quantizer handles those."""
    lk = lib()
    m = x.shape[0]
    if lk is None or m == 0:
        return None
    xc = np.ascontiguousarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        if not np.abs(xc).max() <= FP16_MAX:  # False for NaN too
            return None
    q = np.empty((m, kp), dtype=np.int8)
    d = np.empty((m, kp // group), dtype=np.uint16)
    tinv, ti8 = np.ascontiguousarray(tinv, dtype=np.uint16), np.ascontiguousarray(ti8, dtype=np.int8)
    lk["q8_groups"](ptr(xc), k, k, kp, group, _kept_ptr(tinv), _kept_ptr(ti8), ptr(q), kp, ptr(d), 0, m)
    return q, from_fp16_bits(d)


def shuffled_fp16(x: np.ndarray, arch: int | None = None) -> np.ndarray:
    """fp16.f32_to_f16_shuffled (the HMX activation staging converter), rounding with `round_hw`."""
    return f32_to_f16_shuffled(x, arch, round_hw)


def hmx_weight_rows(b8: np.ndarray, b16: np.ndarray, qtype: GGMLType, out: np.ndarray, iq4: np.ndarray,
                    lut: np.ndarray) -> None:
    """out (R, nb, 32) float32 = the HMX fp16 weight values of the ggml rows b8 (R, nb, type_size) (b16: the
    same bytes as uint16)."""
    k = lib()
    r, nb = b8.shape[0], b8.shape[1]
    if k is None or not out.flags.c_contiguous or b8.strides[2] != 1:
        numba_kernels().hmx_weight_rows(b8, b16, KIND[qtype], iq4, lut, out)
        return
    args = (ptr(b8), b8.strides[0], nb, ptr(out), nb * 32)
    _run(_pair(k, f"hmx_weight_{NAMES[qtype]}"), args, r, 16, out.size >= PARALLEL_MIN_ELEMS)


def hvx_dot(b8: np.ndarray, b16: np.ndarray, qtype: GGMLType, image: np.ndarray, m: int, k: int,
            parse, iq4: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """y (M, N) float32 = the HVX MUL_MAT of the ggml rows b8 (N, nb, type_size) with the M rows of the
    activation image (q8_1x4x2 for Q4_1, q8x4x2 else; `parse(image, k, m)` reads it for the portable
    kernel)."""
    n, nb = b8.shape[0], b8.shape[1]
    y = np.empty((m, n), dtype=np.float32)
    lk = lib()
    img = np.asarray(image, dtype=np.uint8)
    if lk is None or b8.strides[2] != 1 or img.ndim != 2 or img.strides[1] != 1 or m == 0:
        parsed = parse(image, k, m)
        aq, ad = parsed[0], parsed[1]
        asum = parsed[2] if len(parsed) > 2 else ad
        numba_kernels().hvx_dot(b8, b16, KIND[qtype], iq4, lut, np.ascontiguousarray(aq),
                                np.ascontiguousarray(ad, dtype=np.float32),
                                np.ascontiguousarray(asum, dtype=np.float32), y)
        return y
    npad, pimg = -(-nb // 8) * 8, ptr(img)
    if qtype in NIBBLE_TYPES:  # the int8 quants in the kernel's pair order, and their sums per sub-block
        x16, xs, p16, ps = _dot_scratch(m, npad * 16, npad, k)
        lk["hvx_pairs"](pimg, img.strides[0], nb, npad, p16, ps, 0, m)
    else:
        x16, xs, p16, ps = _dot_scratch(m, npad * 32, npad, k)  # the int8 quants widened once (zero past K)
        x16[:, :k] = img[:m, :k].view(np.int8)
    args = (_kept_ptr(b8), b8.strides[0], nb, p16, ps, pimg, img.strides[0], k, m, ptr(y), n, n)
    # a decode's HVX dots come one after another, a few hundred us of Python apart: the worker waits spinning
    # (as for the CPU decode GEMVs); after a batch of many rows it sleeps at once
    _run(_pair(lk, f"hvx_dot_{NAMES[qtype]}"), args, n, HVX_CHUNK, n * nb * 32 * m >= PARALLEL_MIN_ELEMS,
         linger=m <= DECODE_ROWS)
    return y


def q8x4x2_image(x: np.ndarray, kp: int, group: int, tinv: np.ndarray, ti8: np.ndarray, img: np.ndarray,
                 dbits: np.ndarray) -> bool:
    """hvx_quant.quantize_q8x4x2_into of the rows x (M, k) float32 over `img` (uint8 (M, stride), C-contiguous,
    stride >= kp) in one native call, quants and scale bits placed (`dbits`: uint16 (M, kp/group) scratch);
    False (img untouched) where `q8_groups` gives None: no native kernels, or some |x| > 65504 or NaN."""
    lk = lib()
    m, k = x.shape
    if lk is None or m == 0 or img.shape[1] < kp or not img.flags.c_contiguous or img.dtype != np.uint8:
        return False
    xc = np.ascontiguousarray(x, dtype=np.float32)
    ok = np.zeros(1, dtype=np.int64)
    lk["q8x4x2_image"](ptr(xc), k, k, kp, group, _kept_ptr(tinv), _kept_ptr(ti8), ptr(img), img.shape[1],
                       ptr(dbits), ptr(ok), 0, m)
    return bool(ok[0])


class BoundDot:
    """`hvx_dot` of one weight's ggml rows b8 (N, nb, type_size) with M activation rows, its arguments worked out
    once: a decode runs the same matmul every token. `run(pimg, imgstride, py)` multiplies the image at address
    pimg (rows imgstride bytes apart) into y at address py (rows N floats apart), as `hvx_dot` does; the int16 /
    pair-order scratch is the caller's (`scratch`: (x16, xs) of `dot_scratch_shape`), since two sessions may
    run on two threads."""

    __slots__ = ("lk", "fn", "qtype", "m", "k", "n", "nb", "npad", "pw", "wstride", "p16", "ps", "x16",
                 "parallel", "linger", "ctr", "pctr")

    def __init__(self, b8: np.ndarray, qtype: GGMLType, m: int, k: int, scratch: tuple[np.ndarray, np.ndarray]):
        self.lk = lk = lib()
        self.qtype, self.m, self.k = qtype, m, k
        self.n, self.nb = b8.shape[0], b8.shape[1]
        self.npad = -(-self.nb // 8) * 8
        self.pw, self.wstride = _kept_ptr(b8), b8.strides[0]
        self.x16 = scratch[0]
        self.p16, self.ps = ptr(scratch[0]), ptr(scratch[1])
        self.fn = _pair(lk, f"hvx_dot_{NAMES[qtype]}")
        self.parallel = self.n > HVX_CHUNK and self.n * self.nb * 32 * m >= PARALLEL_MIN_ELEMS
        self.linger = m <= DECODE_ROWS
        self.ctr = np.zeros(1, dtype=np.int64)
        self.pctr = ptr(self.ctr)

    @staticmethod
    def usable(b8: np.ndarray, qtype: GGMLType, m: int) -> bool:
        """Whether `hvx_dot` would run these through the native kernel (else the caller keeps the general path)."""
        return lib() is not None and b8.strides[2] == 1 and m > 0 and qtype in NAMES

    @staticmethod
    def scratch_shape(qtype: GGMLType, nb: int, m: int) -> tuple[int, int, int]:
        """(m, int16 columns, npad) of the scratch `hvx_dot` uses for these (`_dot_scratch`)."""
        npad = -(-nb // 8) * 8
        return m, npad * (16 if qtype in NIBBLE_TYPES else 32), npad

    def run(self, img: np.ndarray, pimg: int, imgstride: int, py: int) -> None:
        m, nb, npad = self.m, self.nb, self.npad
        if self.qtype in NIBBLE_TYPES:
            self.lk["hvx_pairs"](pimg, imgstride, nb, npad, self.p16, self.ps, 0, m)
        else:
            self.x16[:, :self.k] = img[:m, :self.k].view(np.int8)
        args = (self.pw, self.wstride, nb, self.p16, self.ps, pimg, imgstride, self.k, m, py, self.n, self.n)
        if self.parallel and native.threads() > 1:  # as `_run`: the threads claim chunks of rows from the counter
            self.ctr[0] = 0
            native.run(self.fn[1], (*args, self.pctr, self.n, HVX_CHUNK), linger=self.linger)
        else:
            self.fn[0](*args, 0, self.n)


class BoundQuant:
    """`q8x4x2_image` of fixed rows x (M, k) float32, C-contiguous, into a fixed image (uint8 (M, stride),
    C-contiguous, stride >= kp): the arguments worked out once; calling it reads x as it is then."""

    __slots__ = ("fn", "args", "ok", "dbits", "keep")

    def __init__(self, x: np.ndarray, kp: int, group: int, tinv: np.ndarray, ti8: np.ndarray, img: np.ndarray):
        m, k = x.shape
        if not (x.flags.c_contiguous and x.dtype == np.float32 and img.flags.c_contiguous and img.shape[1] >= kp):
            raise ValueError("BoundQuant needs C-contiguous float32 rows and an image of rows >= kp bytes")
        self.fn = lib()["q8x4x2_image"]
        self.ok = np.zeros(1, dtype=np.int64)
        self.dbits = np.empty((m, kp // group), dtype=np.uint16)
        self.keep = (x, tinv, ti8, img)  # the arrays whose addresses the arguments hold
        self.args = (ptr(x), k, k, kp, group, ptr(tinv), ptr(ti8), ptr(img), img.shape[1], ptr(self.dbits),
                     ptr(self.ok), 0, m)

    def __call__(self) -> bool:
        self.fn(*self.args)
        return self.ok[0] == 1


class CopyRuns:
    """dst[...] = src for fixed (dst, src) pairs of C-contiguous uint8 views (the same number of bytes each) in
    one native call (simd_hvx.copy_runs). The pairs are kept, so the addresses stay theirs."""

    __slots__ = ("fn", "table", "ptab", "n", "keep")

    def __init__(self, pairs: list[tuple[np.ndarray, np.ndarray]]):
        self.fn = lib()["copy_runs"]
        for d, s in pairs:
            if d.nbytes != s.nbytes or not (d.flags.c_contiguous and s.flags.c_contiguous):
                raise ValueError("CopyRuns needs C-contiguous pairs of the same size")
        self.keep = list(pairs)
        self.table = np.array([(ptr(d), ptr(s), d.nbytes) for d, s in pairs], dtype=np.int64).reshape(-1, 3)
        self.ptab, self.n = ptr(self.table), len(pairs)

    @staticmethod
    def of(pairs: list[tuple[np.ndarray, np.ndarray]]) -> CopyRuns | None:
        """A CopyRuns of the pairs, or None where the native kernels are missing (the caller copies them)."""
        return CopyRuns(pairs) if lib() is not None and pairs else None

    def __call__(self) -> None:
        self.fn(self.ptab, 0, self.n)
