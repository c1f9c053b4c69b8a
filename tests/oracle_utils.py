"""Helpers shared by the tests: the test-backend-ops error metric, thresholds, and a tiny op harness.

NMSE follows test-backend-ops exactly: sum((a - b)^2) / sum(a^2) in float64, with a = the output of the
backend under test and b = the reference; NaN on either side is a failure before any metric, and an
infinity must be matched by an infinity of the same sign.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES

from kazeia.backends.base import Backend
from kazeia.backends.cpu import CpuBackend
from kazeia.backends.ref import RefBackend
from kazeia.engine.scheduler import Scheduler
from kazeia.graph.alloc import GraphAllocator
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import SCALAR_DTYPES, Buffer, GGMLType, Tensor, array, make_tensor, rows

# test-backend-ops max_nmse_err
NMSE_DEFAULT = 1e-7
NMSE_THRESHOLDS = {"MUL_MAT": 5e-4, "FLASH_ATTN_EXT": 5e-4, "SOFT_MAX": 1e-6}
# two float64 computations of the same value differ only by summation order
NMSE_FLOAT64 = 1e-20


def threshold(op: str) -> float:
    return NMSE_THRESHOLDS.get(op, NMSE_DEFAULT)


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    """Normalized MSE of a (backend under test) against b (reference), after NaN and inf checks."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    assert a.shape == b.shape, f"shape mismatch {a.shape} vs {b.shape}"
    for name, x in (("tested", a), ("reference", b)):
        bad = np.flatnonzero(np.isnan(x))
        assert bad.size == 0, f"NaN in {name} output at index {bad[0]} (tested={a[bad[0]]} ref={b[bad[0]]})"
    fmax = float(np.finfo(np.float32).max)
    inf_a, inf_b = np.abs(a) >= fmax, np.abs(b) >= fmax
    mism = np.flatnonzero(inf_a != inf_b)
    assert mism.size == 0, f"inf mismatch at index {mism[0]} (tested={a[mism[0]]} ref={b[mism[0]]})"
    sign = np.flatnonzero(inf_a & (np.sign(a) != np.sign(b)))
    assert sign.size == 0, f"inf sign mismatch at index {sign[0]}"
    fin = ~inf_a
    a, b = a[fin], b[fin]
    den = float(np.sum(a * a))
    num = float(np.sum((a - b) ** 2))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


# ---------------------------------------------------------------------------------------------------
# the HMX matmul layout, transcribed from upstream hmx-matmul-ops.c (hmx_compute_chunks, hmx_matmul_q_f32), not
# from kazeia.backends.htp


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


def hmx_q_layout_bytes(m_tok: int, k: int, n_w: int, qtype: str, vtcm: int) -> int:
    """Bytes of hmx_matmul_q_f32's VTCM layout for M=m_tok tokens, K=k, N=n_w weight rows: the chunk search
    budgets 256 B of overhead beyond the unrounded areas, then every area but the 256 B scale block is rounded
    up to 2048 B. 0 when no chunking is found."""
    row_stride = -(-k // 256) * {"q4_0": 144, "q4_1": 160, "q8_0": 272}[qtype]
    per_n, per_m, per_mn = row_stride + 4 * k, 2 * k, 4
    m32 = _up(m_tok, 32)
    best = None
    for nc in range(n_w // 32 * 32, 31, -32):
        rest = vtcm - 256 - nc * per_n
        if rest <= 0:
            continue
        mc = min(rest // (per_m + nc * per_mn) // 32 * 32, m32)
        if mc == 0:
            continue
        cost = -(-m32 // mc) * 3 * n_w + -(-n_w // nc) * 2 * m_tok
        if best is None or cost < best[0] or (cost == best[0] and mc * nc > best[1]):
            best = (cost, mc * nc, mc, nc)
    if best is None:
        return 0
    _, _, mc, nc = best
    r = lambda x: _up(x, 2048)  # noqa: E731
    return r(nc * row_stride) + r(mc * k * 2) + 2 * r(mc * nc * 2) + 2 * r(nc * k * 2) + 256


def assert_nmse(a: np.ndarray, b: np.ndarray, limit: float, what: str = "") -> float:
    err = nmse(a, b)
    assert err <= limit, f"{what}: NMSE {err:.3e} > {limit:.1e}"
    return err


# ---------------------------------------------------------------------------------------------------
# a one-graph harness: leaves get their own buffers, the graph allocator places the rest


def leaf(t: GGMLType, ne, data: np.ndarray | None = None, name: str = "", flags: int = 0,
         pad: int = 0) -> Tensor:
    """A leaf tensor with its own buffer, filled with `data` (numpy order; raw uint8 rows for block types)."""
    x = make_tensor(GGMLType(t), tuple(ne), name=name or "leaf", flags=flags)
    x.buffer, x.offset = Buffer.zeros(name or "leaf", x.nbytes + pad), 0
    if data is not None:
        if x.type in SCALAR_DTYPES:
            array(x)[...] = np.asarray(data).reshape(array(x).shape)
        elif x.type == GGMLType.BF16:
            rows(x)[...] = np.ascontiguousarray(data).view(np.uint8).reshape(rows(x).shape)
        else:
            rows(x)[...] = np.asarray(data, dtype=np.uint8).reshape(rows(x).shape)
    return x


def run_graph(build: Callable[[], Tensor], backend: Backend) -> np.ndarray:
    """Build a fresh graph with `build()`, allocate it, run it on `backend`; the output in float64."""
    out = build()
    g = Graph()
    g.expand(out)
    GraphAllocator().allocate(g)
    Scheduler([backend]).compute(g)
    if isinstance(backend, RefBackend):
        return np.array(backend.value(out), dtype=np.float64)
    return np.array(array(out), dtype=np.float64)


def cpu_and_ref(build: Callable[[], Tensor]) -> tuple[np.ndarray, np.ndarray]:
    return run_graph(build, CpuBackend()), run_graph(build, RefBackend())


# ---------------------------------------------------------------------------------------------------
# random but valid quantized blocks

T = GGMLType
# byte offsets of the f16 fields inside one block, per format (ggml-common.h)
F16_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q8_0: [0], T.Q4_K: [0, 2], T.Q6_K: [208]}


def _finite_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    inf_nan = (bits & 0x7C00) == 0x7C00
    bits[inf_nan] &= 0xBFFF  # clear the top exponent bit: finite, same sign
    return bits


def random_blocks(qtype: T, n_rows: int, n_blocks: int, seed: int, scale_kind: str = "any") -> np.ndarray:
    """(n_rows, n_blocks * type_size) uint8 of random valid blocks."""
    rng = np.random.default_rng(seed)
    bs, ts = GGML_QUANT_SIZES[qtype]
    if qtype == T.BF16:
        bits = rng.integers(0, 1 << 16, size=n_rows * n_blocks, dtype=np.uint32).astype(np.uint16)
        bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF  # bf16: exponent all ones is inf/NaN; make it finite
        return bits.view(np.uint8).reshape(n_rows, n_blocks * ts)
    blocks = rng.integers(0, 256, size=(n_rows * n_blocks, ts), dtype=np.uint16).astype(np.uint8)
    for off in F16_FIELDS[qtype]:
        if scale_kind == "any":
            bits = _finite_f16_bits(rng, blocks.shape[0])
        else:  # realistic scales: small positive numbers
            bits = (rng.uniform(1e-4, 0.1, blocks.shape[0]).astype(np.float16)).view(np.uint16)
        blocks[:, off:off + 2] = bits.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n_rows, n_blocks * ts)


# ---------------------------------------------------------------------------------------------------
# loaded models and dequantized weights, shared by the test modules (loading and dequantizing the default
# model takes seconds; the data is read-only)

_models: dict = {}
_caches: dict = {}


def shared_model(path: str):
    from kazeia.engine.context import Model

    if path not in _models:
        _models[path] = Model.load(path)
    return _models[path]


def shared_cache(path: str):
    from kazeia.backends.ref import WeightCache

    return _caches.setdefault(path, WeightCache())


CANONICAL_NAN = np.uint32(0x7FC00000).view(np.float32)


def ordered_products(a: np.ndarray, w: np.ndarray, canonical_nan: bool = True) -> np.ndarray:
    """The device model's product order, computed independently of its kernels (kernels/gemm.py's rule):
    y[m, n] = fl(...fl(fl(+0 + a[m, 0] w[n, 0]) + a[m, 1] w[n, 1]) ... ), float32, k ascending, each product
    rounded to float32 and then added, by numpy's element-wise float32 operations (IEEE, no reordering).
    a (M, K), w (N, K). `canonical_nan`: a NaN output as 0x7FC00000 (the HMX kernels' read-in of a NaN sum)."""
    a = np.asarray(a, dtype=np.float32)
    w = np.asarray(w, dtype=np.float32)
    acc = np.zeros((a.shape[0], w.shape[0]), dtype=np.float32)
    with np.errstate(all="ignore"):
        for k in range(a.shape[1]):
            acc = acc + a[:, k:k + 1] * w[None, :, k]
    if canonical_nan:
        acc[np.isnan(acc)] = CANONICAL_NAN
    return acc
