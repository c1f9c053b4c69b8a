"""The native element-wise passes of the HTP flash attention (htp/simd_fa.py through htp/fast_fa.py) give the bits of
the numpy expressions they replace: flash_attn with the kernels and with them switched off (native.portable_only, the
numpy form) must store the same bits, NaN payloads included, on decode and prefill shapes, GQA, a row length that is
not a multiple of 8, the prefill's permuted Q layout, no mask, fully masked rows, and the inputs the kernels decline
(NaN in Q or the mask, +inf in the mask, scores or P@V past 65504, signed zeros)."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia import native
from kazeia.backends.htp.kernels import fa as fast_fa
from kazeia.backends.htp.ops import flash_attn as fa

pytestmark = pytest.mark.skipif(not native.available(), reason="no AVX2/FMA/F16C on this host")


class _T:
    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.type = None  # (not F16: flash_attn loads K through load_c)


class _Node:
    def __init__(self, src: list, scale: float) -> None:
        self.src, self.params = src, {"scale": scale}


class _IO:
    def load(self, t: _T) -> np.ndarray:
        return t.a

    def load_c(self, t: _T, linger: bool = False) -> np.ndarray:
        return np.ascontiguousarray(t.a)

    def store(self, n, values: np.ndarray) -> None:
        self.out = np.array(values)


def node(seed: int, h: int, hkv: int, t: int, nkv: int, d: int, perm_q: bool, mask: str, special: str) -> _Node:
    rng = np.random.default_rng(seed)
    if perm_q:  # the prefill's Q: an (H, T, D) view of a (T, H, D) buffer
        q = (rng.standard_normal((t, h, d)) * 3).astype(np.float32).transpose(1, 0, 2)[None]
    else:
        q = (rng.standard_normal((1, h, t, d)) * 3).astype(np.float32)
    k = (rng.standard_normal((1, hkv, nkv, d)) * 2).astype(np.float16).astype(np.float32)
    v = (rng.standard_normal((1, hkv, nkv, d)) * 4).astype(np.float16).astype(np.float32)
    m = np.zeros((1, 1, -(-t // 8) * 8, nkv), np.float32)
    fill = int(rng.integers(1, nkv + 1))
    for r in range(m.shape[2]):
        m[0, 0, r, min(nkv, fill + r):] = -np.inf
    if mask == "row":
        m[0, 0, 0] = -np.inf
    q = q.copy() if special in ("nan_q", "zeros") else q
    if special == "nan_q":
        q[0, 1, 0, 3] = np.nan
    elif special == "big_k":
        k[0, 0, 5] = 60000.0
    elif special == "big_v":
        v[0, 1, 7:9] = 65000.0
    elif special in ("inf_mask", "nan_mask"):
        m[0, 0, 0, 2] = np.inf if special == "inf_mask" else np.nan
    elif special == "zeros":
        q[...] = 0.0
        q[0, ::2] = -0.0
    src = [_T(q), _T(k), _T(v)] + ([] if mask == "none" else [_T(m)])
    return _Node(src, 1 / np.sqrt(d))


def run(n: _Node, hmx: bool) -> np.ndarray:
    io = _IO()
    with np.errstate(all="ignore"):
        fa.flash_attn(io, n, hmx)
    return io.out


SHAPES = [(32, 8, 1, 256, 128), (8, 2, 20, 132, 32), (4, 4, 3, 13, 16), (9, 3, 40, 64, 64)]
SPECIAL = ["", "nan_q", "big_k", "big_v", "inf_mask", "nan_mask", "zeros"]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_flash_attn_native_is_numpy(shape, monkeypatch):
    for special in SPECIAL:
        for perm_q, mask in ((False, "causal"), (True, "row"), (False, "none")):
            n = node(len(special) + shape[2], *shape, perm_q, mask, special)
            for hmx in (True, False):
                got = run(n, hmx)
                with monkeypatch.context() as mp:
                    mp.setattr(native.compile, "_portable", True)
                    want = run(n, hmx)
                assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
                    (special, perm_q, mask, hmx)


def test_kernels_take_the_plain_inputs():
    """The comparison above is between two forms only if the kernels run: on plain inputs none declines."""
    rng = np.random.default_rng(3)
    s = rng.standard_normal((8, 5, 13)).astype(np.float32)
    mask = np.zeros((8, 13), np.float32)
    mask[:, 9:] = -np.inf
    assert fast_fa.scores(s, mask, np.float32(0.5), True) is not None
    assert fast_fa.scores(s, None, np.float32(0.5), False) is not None
    o, pv = np.zeros_like(s), s * 100
    assert fast_fa.acc16(o, pv) and np.array_equal(o, pv.astype(np.float16).astype(np.float32))
    assert not fast_fa.acc16(o, pv * 1000)  # past 65504: declined, o untouched
    assert np.array_equal(o, pv.astype(np.float16).astype(np.float32))
    k = rng.standard_normal((3, 21, 19)).astype(np.float32)
    assert np.array_equal(fast_fa.transposed(k), np.ascontiguousarray(k.transpose(0, 2, 1)))


def test_round16_of_a_permuted_view_keeps_values_and_layout():
    x = (np.random.default_rng(5).standard_normal((16, 8, 32)) * 100).astype(np.float32).transpose(1, 0, 2)
    got, want = fa._round16(x), fa.round_fp16(x)
    assert got.strides == want.strides and np.array_equal(got.view(np.uint32), want.view(np.uint32))


TAIL_SPECIAL = ["", "tail_nan_k", "tail_inf_v", "tail_big_k", "nan_q", "big_v", "zeros"]


def _with_masked_tail(seed: int, shape: tuple, special: str) -> _Node:
    """node()'s causal case with every row's mask -inf from a third of the cells on, and `special` in that tail."""
    n = node(seed, *shape, False, "causal", special if not special.startswith("tail") else "")
    q, k, v, m = (t.a for t in n.src)
    nkv = k.shape[2]
    m[..., max(1, nkv // 3):] = -np.inf
    if special == "tail_nan_k":
        k[0, -1, nkv - 1, 0] = np.nan
    elif special == "tail_inf_v":
        v[0, 0, nkv - 1, 2] = np.inf
    elif special == "tail_big_k":  # finite, but S * scale of a masked cell past fp16 under HMX
        k[0, :, nkv - 1] = 65000.0
        n.src[0] = _T(np.abs(q) + 100.0)
    return n


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_a_left_out_masked_tail_keeps_the_bits(shape, monkeypatch):
    """A prefill leaves out the tail of cells every row's mask holds at -inf (flash_attn.computed_cells): the same
    bits, NaN payloads included, as computing every cell, on a plain tail and on tails holding a NaN K, an inf V
    or (HMX) a K whose scores pass fp16, where nothing may be left out."""
    calls = []
    left_out = fa._left_out_tail
    monkeypatch.setattr(fa, "_left_out_tail", lambda *a: calls.append(a[-2]) or left_out(*a))
    for special in TAIL_SPECIAL:
        n = _with_masked_tail(len(special) + shape[2], shape, special)
        for hmx in (True, False):
            calls.clear()
            got = run(n, hmx)
            if special in ("", "big_v", "zeros") and shape[3] >= 2 * fa.TAIL_CELLS:
                assert calls, (special, hmx)  # the tail was left out
            with monkeypatch.context() as mp:
                mp.setattr(fa, "computed_cells", lambda q16, kt, *a: kt.shape[2])
                want = run(n, hmx)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (special, hmx)
