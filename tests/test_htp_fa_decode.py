"""A decode step's flash attention in one native pass (htp/kernels/fa_decode/) stores the bits of flash_attn's
numpy form (its operations in its order, tests/test_htp_fa_native.py's harness with the cache given as the float32
of its fp16 values), or declines: on decode shapes (T <= 8 rows), GQA and MHA, cache lengths around the 8-lane,
16-lane and 128-cell block edges, F16 and F32 masks (none, partial, fully masked rows), a permuted Q, HMX and HVX,
tiny probabilities (fp16 subnormal read-outs), and the inputs it must decline (NaN or |q| > 65504, +inf or NaN
scores, a P V read-out past 65504). A declined call must be one the numpy form handles: it runs then."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia import native
from kazeia.backends.htp.kernels import fa_decode
from kazeia.backends.htp.ops import flash_attn as fa
from test_htp_fa_native import _IO, _T, _Node  # the numpy form's harness (F32 caches: its decode pass declines)

pytestmark = pytest.mark.skipif(not native.available(), reason="no AVX2/FMA/F16C on this host")


def _case(seed: int, h: int, hkv: int, t: int, n: int, d: int, dv: int, mask: str, special: str, perm: bool):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((t, h, d)) * 3).astype(np.float32).transpose(1, 0, 2) if perm else \
        (rng.standard_normal((h, t, d)) * 3).astype(np.float32)
    cells = n + 5  # the cache holds more cells than the view reads
    k = (rng.standard_normal((1, cells, hkv, d)) * 2).astype(np.float16).transpose(0, 2, 1, 3)[:, :, :n]
    v = (rng.standard_normal((1, cells, hkv, dv)) * 4).astype(np.float16).transpose(0, 2, 1, 3)[:, :, :n]
    m = np.zeros((-(-t // 8) * 8, n + 3), np.float32)
    fill = int(rng.integers(1, n + 1)) if not special.startswith("tail") else max(1, n // 3)
    for r in range(m.shape[0]):
        m[r, min(n, fill + r):] = -np.inf
    if mask == "row":
        m[0] = -np.inf
    if special == "nan_q":
        q[1, 0, 3] = np.nan
    elif special == "huge_q":
        q[0, 0, 1] = 70000.0
    elif special == "big_k":
        k[0, 0, min(5, n - 1)] = 60000.0
    elif special == "big_v":
        v[0, 0, : min(n, 40)] = 65000.0
    elif special in ("inf_mask", "nan_mask"):
        m[0, min(2, n - 1)] = np.inf if special == "inf_mask" else np.nan
    elif special == "tiny_p":  # one dominant score: the others' exp lands in fp16's subnormals or 0
        q[...] = 0.0
        q[:, :, 0] = 40.0
        k[0, :, :, 0] = np.linspace(-3, 3, n, dtype=np.float16)[None]
    elif special == "zeros":
        q[...] = 0.0
        q[::2] = -0.0
    elif special == "tail_nan_k":  # the last cell, masked for every row: what the pass may leave out
        k[0, -1, n - 1, 0] = np.nan
    elif special == "tail_inf_v":
        v[0, 0, n - 1, 2] = np.inf
    elif special == "tail_big_k":  # finite, but S * scale of a masked cell past fp16 under HMX
        k[0, :, n - 1] = 65000.0
        q[...] = np.abs(q) + 100.0
    mk = None if mask == "none" else (m.astype(np.float16) if mask.startswith("f16") or mask == "row" else m)
    return q, k, v, mk, 1 / np.sqrt(d)


def _numpy_form(q, k, v, mask, scale, hmx: bool) -> np.ndarray:
    src = [_T(q[None]), _T(k.astype(np.float32)), _T(v.astype(np.float32))]
    if mask is not None:
        src.append(_T(mask.astype(np.float32)[None, None]))
    io = _IO()
    with np.errstate(all="ignore"):
        fa.flash_attn(io, _Node(src, scale), hmx)
    return io.out


SHAPES = [(32, 8, 1, 256, 128, 128), (32, 8, 1, 29, 128, 128), (8, 2, 3, 129, 32, 32), (4, 4, 8, 13, 16, 16),
          (6, 3, 2, 300, 64, 24), (2, 1, 1, 1, 8, 8), (16, 2, 5, 136, 64, 64)]
SPECIAL = ["", "nan_q", "huge_q", "big_k", "big_v", "inf_mask", "nan_mask", "tiny_p", "zeros", "tail", "tail_nan_k",
           "tail_inf_v", "tail_big_k"]


@pytest.mark.parametrize("hmx", [True, False], ids=["hmx", "hvx"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", ["f16", "f32", "row", "none"])
def test_decode_pass_stores_the_numpy_forms_bits(shape, mask, hmx):
    h, hkv, t, n, d, dv = shape
    for seed, special in enumerate(SPECIAL):
        q, k, v, m, scale = _case(seed, h, hkv, t, n, d, dv, mask, special, perm=seed % 2 == 1)
        want = _numpy_form(q, k, v, m, scale, hmx)
        dst = np.full((1, t, h, dv), np.nan, np.float32)
        with np.errstate(all="ignore"):
            done = fa_decode.decode(q, k, v, m, scale, hmx, dst)
        if done:
            assert dst.tobytes() == want.tobytes(), (special, int((dst != want).sum()))
        else:
            assert special not in ("", "tiny_p", "zeros", "tail"), f"the pass declined plain inputs ({special!r})"
            assert special in ("nan_q", "huge_q", "big_k", "big_v", "inf_mask", "nan_mask", "tail_nan_k", "tail_inf_v",
                               "tail_big_k"), special


def test_decode_pass_runs_on_plain_inputs_and_declines_what_it_must():
    q, k, v, m, scale = _case(0, 8, 2, 1, 64, 32, 32, "f16", "", perm=False)
    dst = np.empty((1, 1, 8, 32), np.float32)
    assert fa_decode.decode(q, k, v, m, scale, True, dst)
    for special in ("nan_q", "inf_mask"):
        q, k, v, m, scale = _case(0, 8, 2, 1, 64, 32, 32, "f16", special, perm=False)
        with np.errstate(all="ignore"):
            assert not fa_decode.decode(q, k, v, m, scale, True, dst), special
    assert not fa_decode.decode(q, k.astype(np.float32), v, m, scale, True, dst)  # an F32 cache: the numpy form


def test_decode_pass_gives_the_same_bits_on_one_thread_and_two():
    from kazeia.native.threads import set_threads, threads

    q, k, v, m, scale = _case(3, 32, 8, 1, 512, 128, 128, "f16", "", perm=False)
    outs = []
    before = threads()
    try:
        for n in (1, 2):
            set_threads(n)
            dst = np.empty((1, 1, 32, 128), np.float32)
            assert fa_decode.decode(q, k, v, m, scale, True, dst)
            outs.append(dst)
    finally:
        set_threads(before)
    assert outs[0].tobytes() == outs[1].tobytes()


@pytest.mark.parametrize("hmx", [True, False], ids=["hmx", "hvx"])
def test_kept_call_follows_the_arrays_contents_and_its_scale(hmx):
    """decode_bound keeps its call by the very arrays (a decode graph's views): each token writes new values into the
    same q, cache, mask and dst, and the kept call must give decode's bits for them, decline a token decode declines
    and run the next plain one again; another scale on the same arrays is another call."""
    q4 = np.empty((1, 8, 1, 32), np.float32)
    k = np.empty((1, 2, 64, 32), np.float16)
    v = np.empty((1, 2, 64, 32), np.float16)
    m4 = np.empty((1, 1, 8, 67), np.float16)
    dst = np.empty((1, 1, 8, 32), np.float32)
    for token, special in enumerate(["", "tiny_p", "nan_q", "", "zeros"]):
        q, kk, vv, m, scale = _case(10 + token, 8, 2, 1, 64, 32, 32, "f16", special, perm=False)
        q4[0], k[...], v[...], m4[0, 0] = q, kk, vv, m[:8]
        for sc in (scale, scale * 0.5):
            want = np.empty_like(dst)
            with np.errstate(all="ignore"):
                done = fa_decode.decode(q, kk, vv, m[:8], sc, hmx, want)
                got = fa_decode.decode_bound(q4, k, v, m4, sc, hmx, dst)
            assert got == done, (token, special)
            if done:
                assert dst.tobytes() == want.tobytes(), (token, special, sc)
