"""The dense layers' ops: elementwise, norms, rows, MUL_MAT, rope, the GLU and unary activations, copies."""

from __future__ import annotations

import numpy as np

from kazeia.backends.libm import HOST, HostMath, OwnedMath
from kazeia.backends.numpy_ops.base import NumpyOps, broadcast_to, kernel
from kazeia.errors import UnsupportedError
from kazeia.graph.builder import ROPE_IMROPE, ROPE_MROPE, ROPE_NEOX, ROPE_NORM
from kazeia.graph.tensor import Tensor, TFlag, array


@kernel("ADD")
def _add(be: NumpyOps, n: Tensor) -> None:
    a, b = be.load(n.src[0]), be.load(n.src[1])
    be.store(n, a + broadcast_to(b, a.shape))


@kernel("MUL")
def _mul(be: NumpyOps, n: Tensor) -> None:
    a, b = be.load(n.src[0]), be.load(n.src[1])
    be.store(n, a * broadcast_to(b, a.shape))


@kernel("SCALE")
def _scale(be: NumpyOps, n: Tensor) -> None:
    x = be.load(n.src[0])
    be.store(n, x * be.ft(n.params["scale"]) + be.ft(n.params.get("bias", 0.0)))


@kernel("RMS_NORM")
def _rms_norm(be: NumpyOps, n: Tensor) -> None:
    x = be.load(n.src[0])
    # sum of squares in float64 whatever the compute dtype (as ggml does), then scale in compute dtype
    mean = be.sum_squares(x) / x.shape[-1]
    inv = (1.0 / np.sqrt(mean + n.params["eps"])).astype(be.ft)
    be.store(n, x * inv[..., None])


@kernel("GET_ROWS")
def _get_rows(be: NumpyOps, n: Tensor) -> None:
    a, ids = n.src[0], n.src[1]
    idx = array(ids).astype(np.int64)  # (ne3, ne2, ne1, n)
    if idx.min(initial=0) < 0 or idx.max(initial=0) >= a.ne[1]:
        raise IndexError(f"{n.name}: row id out of range [0, {a.ne[1]})")
    out = np.empty(n.ne[::-1], dtype=be.ft)
    for i12 in range(ids.ne[2]):
        for i11 in range(ids.ne[1]):
            sel = idx[0, i12, i11]
            if a.flags & TFlag.WEIGHT and a.ne[2] == a.ne[3] == 1:
                out[i12, i11] = be.load_rows(a, sel)
            else:
                out[i12, i11] = be.load(a)[i12 % a.ne[3], i11 % a.ne[2]][sel]
    be.store(n, out)


@kernel("MUL_MAT")
def _mul_mat(be: NumpyOps, n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    y = be.load(b)  # (b3, b2, M, K)
    if a.flags & TFlag.WEIGHT and a.ne[2] == a.ne[3] == 1:
        out = be.weight_matmul(a, y.reshape(-1, a.ne[0])).reshape(n.ne[::-1])  # (M, K) @ (N, K)^T
    else:
        x = be.load(a)  # (a3, a2, N, K)
        r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
        if r2 > 1:
            x = np.repeat(x, r2, axis=1)
        if r3 > 1:
            x = np.repeat(x, r3, axis=0)
        out = be.matmul(y, x.swapaxes(-1, -2))
    be.store(n, out)


def freq_factors(n: Tensor) -> np.ndarray | None:
    """A ROPE node's per-pair frequency factors (src[2], F32 [n_dims/2]), or None."""
    if len(n.src) < 3 or n.src[2] is None:
        return None
    return array(n.src[2]).reshape(-1)[: n.params["n_dims"] // 2].astype(np.float64)


def rope_angles(pos: np.ndarray, n_dims: int, freq_base: float, freq_scale: float, ft,
                factors: np.ndarray | None = None, math: HostMath | OwnedMath = HOST) -> tuple:
    """cos/sin of theta[t, i] = pos[t] * freq_scale * base^(-2i/n_dims) / factors[i], computed in float64 (`math`:
    the backend's power and cos/sin)."""
    inv_freq = math.power(freq_base, -np.arange(0, n_dims, 2, dtype=np.float64) / n_dims)
    if factors is not None:
        inv_freq = inv_freq / factors
    theta = (pos.astype(np.float64) * freq_scale)[:, None] * inv_freq[None, :]
    cos, sin = math.cos_sin(theta)
    return cos.astype(ft), sin.astype(ft)


def mrope_stream(sections, imrope: bool, n_pairs: int) -> np.ndarray:
    """Which position stream (0 t, 1 h, 2 w, 3 e) drives each rotated pair (ggml_mrope_cache_init)."""
    s0, s1, s2, s3 = sections
    total = s0 + s1 + s2 + s3
    out = np.empty(n_pairs, dtype=np.int64)
    for i in range(n_pairs):
        sec = i % total
        if imrope:  # interleaved: t h w t h w ... while each stream has pairs left, then e
            out[i] = next((st for st, s in ((1, s1), (2, s2), (0, s0)) if sec % 3 == st and sec < 3 * s), 3)
        else:
            out[i] = 0 if sec < s0 else 1 if sec < s0 + s1 else 2 if sec < s0 + s1 + s2 else 3
    return out


def mrope_angles(pos4: np.ndarray, n_dims: int, sections, imrope: bool, freq_base: float, freq_scale: float,
                 ft, math: HostMath | OwnedMath = HOST) -> tuple:
    """cos/sin (T, n_dims/2) of ggml's multi-section rope: pair i turns by the position of its stream."""
    stream = mrope_stream(sections, imrope, n_dims // 2)
    inv_freq = math.power(freq_base, -np.arange(0, n_dims, 2, dtype=np.float64) / n_dims)
    p = pos4.astype(np.float64)[stream, :].T  # (T, n_dims/2)
    theta = p * freq_scale * inv_freq[None, :]
    cos, sin = math.cos_sin(theta)
    return cos.astype(ft), sin.astype(ft)


@kernel("ROPE")
def _rope(be: NumpyOps, n: Tensor) -> None:
    p = n.params
    if p.get("ext_factor", 0.0) != 0.0:
        raise UnsupportedError(f"{n.name}: YaRN rope (ext_factor != 0) is not supported")
    x = be.load(n.src[0])  # (ne3, T, H, D)
    pos = array(n.src[1]).reshape(-1)  # I32 [T] (multi-section modes: [4T], streams t, h, w, e)
    nd = p["n_dims"]
    if p["mode"] & ROPE_MROPE:
        cos, sin = mrope_angles(pos.reshape(4, -1), nd, p["sections"], p["mode"] == ROPE_IMROPE, p["freq_base"],
                                p["freq_scale"], be.ft, be.math)
    else:
        cos, sin = rope_angles(pos, nd, p["freq_base"], p["freq_scale"], be.ft, freq_factors(n), be.math)
    cos = (cos * be.ft(p.get("attn_factor", 1.0)))[None, :, None, :]  # (1, T, 1, nd/2)
    sin = (sin * be.ft(p.get("attn_factor", 1.0)))[None, :, None, :]
    out = x.copy()
    if p["mode"] == ROPE_NEOX or p["mode"] & ROPE_MROPE:  # the multi-section modes rotate NEOX pairs
        x0, x1 = x[..., : nd // 2], x[..., nd // 2: nd]
        out[..., : nd // 2] = x0 * cos - x1 * sin
        out[..., nd // 2: nd] = x0 * sin + x1 * cos
    elif p["mode"] == ROPE_NORM:
        x0, x1 = x[..., 0:nd:2], x[..., 1:nd:2]
        out[..., 0:nd:2] = x0 * cos - x1 * sin
        out[..., 1:nd:2] = x0 * sin + x1 * cos
    else:
        raise UnsupportedError(f"{n.name}: rope mode {p['mode']}")
    be.store(n, out)


def _silu(x: np.ndarray, math: HostMath | OwnedMath = HOST) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (1 + math.exp(-x))


GELU_COEF_A = 0.044715
SQRT_2_OVER_PI = 0.79788456080286535587989211986876


def gelu_tanh(x: np.ndarray, math: HostMath | OwnedMath = HOST) -> np.ndarray:
    """ggml_gelu_f32: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), in x's dtype (`math`: the backend's tanh)."""
    ft = x.dtype.type
    with np.errstate(over="ignore", invalid="ignore"):
        return ft(0.5) * x * (ft(1) + math.tanh(ft(SQRT_2_OVER_PI) * x * (ft(1) + ft(GELU_COEF_A) * x * x)))


GLU_ACTIVATIONS = {"SWIGLU": _silu, "GEGLU": gelu_tanh}


def glu_halves(be: NumpyOps, n: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The GLU op's (activated, linear) operands: the split form's two sources, or the two halves of each row of
    one source (ggml_glu without a second source: the first half is activated unless `swapped`)."""
    if len(n.src) > 1 and n.src[1] is not None:
        a, b = be.load(n.src[0]), be.load(n.src[1])
    else:
        x = be.load(n.src[0])
        a, b = x[..., : n.ne[0]], x[..., n.ne[0]: 2 * n.ne[0]]
    return (b, a) if n.params.get("swapped") else (a, b)


@kernel("GLU")
def _glu(be: NumpyOps, n: Tensor) -> None:
    act = GLU_ACTIVATIONS.get(n.params["glu_op"])
    if act is None:
        raise UnsupportedError(f"{n.name}: GLU variant {n.params['glu_op']}")
    a, b = glu_halves(be, n)
    be.store(n, act(a, be.math) * b)


def _sigmoid(x: np.ndarray, math: HostMath | OwnedMath = HOST) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1 / (1 + math.exp(-x))


def _softplus(x: np.ndarray, math: HostMath | OwnedMath = HOST) -> np.ndarray:
    """ggml_compute_softplus_f32: x above 20, else log(1 + exp(x))."""
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, math.log1p(math.exp(np.minimum(x, 20))))


def _tanh(x: np.ndarray, math: HostMath | OwnedMath = HOST) -> np.ndarray:
    return math.tanh(x)


# each takes (x, the backend's math)
UNARY_FUNCS = {"SILU": _silu, "SIGMOID": _sigmoid, "SOFTPLUS": _softplus, "TANH": _tanh}


@kernel("UNARY")
def _unary(be: NumpyOps, n: Tensor) -> None:
    fn = UNARY_FUNCS.get(n.params["unary_op"])
    if fn is None:
        raise UnsupportedError(f"{n.name}: unary op {n.params['unary_op']}")
    be.store(n, fn(be.load(n.src[0]), be.math))


def scatter_rows(out: np.ndarray, idx: np.ndarray, vals: np.ndarray) -> None:
    """out[..., idx, :] = vals with ggml's broadcasting over dims 2/3: out (d3, d2, rows, ne0), idx (i3, i2, 1, n),
    vals (v3, v2, n, ne0). The one-block case (a KV-cache store) is a single fancy assignment."""
    if vals.shape[:2] == (1, 1) and out.shape[:2] == (1, 1):
        out[0, 0, idx.reshape(-1)] = vals[0, 0]
        return
    for i3 in range(vals.shape[0]):
        for i2 in range(vals.shape[1]):
            sel = idx[i3 % idx.shape[0], i2 % idx.shape[1], 0]
            out[i3 % out.shape[0], i2 % out.shape[1], sel] = vals[i3, i2]


@kernel("SET_ROWS")
def _set_rows(be: NumpyOps, n: Tensor) -> None:
    src, ids = n.src[0], n.src[1]
    vals = be.load(src)  # (s3, s2, n_rows, ne0)
    idx = array(ids).astype(np.int64)
    if idx.min(initial=0) < 0 or idx.max(initial=0) >= n.ne[1]:
        raise IndexError(f"{n.name}: row id out of range [0, {n.ne[1]})")
    be.store_rows(n, idx, vals)


@kernel("CPY")
def _cpy(be: NumpyOps, n: Tensor) -> None:
    be.store(n, be.load(n.src[0]).reshape(n.ne[::-1]))


@kernel("CONT")
def _cont(be: NumpyOps, n: Tensor) -> None:
    be.store(n, be.load(n.src[0]).reshape(n.ne[::-1]))
