"""The float32 products in kazeia's one order (backends/ordered.py) against an element-wise numpy statement of the
rule (oracle_utils.ordered_products): the native kernel, its portable twin, strided and repeated operands, any
thread count; and the CPU device's MUL_MAT of two activations, which multiplies this way (float32) while REF keeps
numpy's float64 matmul."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia.backends.numpy_ops.base import NumpyOps
from kazeia.backends.ordered import ordered_batched, ordered_matmul
from kazeia.native.compile import portable_only
from kazeia.native.threads import set_threads, threads
from oracle_utils import ordered_products


def _oracle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.stack([ordered_products(a[i], b[i].T, canonical_nan=False) for i in range(a.shape[0])])


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint32)


@pytest.mark.parametrize("g,m,k,n", [(1, 1, 128, 256), (8, 4, 128, 384), (3, 13, 200, 37), (2, 40, 128, 128),
                                     (5, 7, 1, 3)])
def test_products_multiply_then_add(g, m, k, n):
    rng = np.random.default_rng(g * m + n)
    a = rng.standard_normal((g, m, k)).astype(np.float32)   # float32 operands: products not exact
    b = rng.standard_normal((g, k, n)).astype(np.float32)
    want = _bits(_oracle(a, b))
    assert np.array_equal(_bits(ordered_matmul(a, b)), want)
    with portable_only():
        assert np.array_equal(_bits(ordered_matmul(a, b)), want)
    view = np.ascontiguousarray(np.concatenate([b, b], axis=2))[:, :, :n]   # a strided B (a block of V)
    assert np.array_equal(_bits(ordered_matmul(a, view)), want)
    before = threads()
    try:
        for t in (1, 3):
            set_threads(t)
            assert np.array_equal(_bits(ordered_matmul(a, b)), want)
    finally:
        set_threads(before)


def test_transposed_and_broadcast_operands_give_the_same_bits():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 1, 9, 40)).astype(np.float32)        # (S, 1, M, K): broadcast over 4 heads
    bt = rng.standard_normal((2, 4, 24, 40)).astype(np.float32)      # (S, H, N, K), read transposed
    got = ordered_batched(a, bt.swapaxes(-1, -2))
    want = _oracle(np.broadcast_to(a, (2, 4, 9, 40)).reshape(8, 9, 40), bt.swapaxes(-1, -2).reshape(8, 40, 24))
    assert got.shape == (2, 4, 9, 24)
    assert np.array_equal(_bits(got.reshape(8, 9, 24)), _bits(want))


def test_cpu_activation_products_are_ordered_and_ref_stays_float64():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 6, 50)).astype(np.float32)
    b = rng.standard_normal((3, 50, 20)).astype(np.float32)
    ops = NumpyOps()
    assert np.array_equal(_bits(ops.matmul(a, b)), _bits(_oracle(a, b)))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    got64 = ops.matmul(a64, b64)
    assert got64.dtype == np.float64 and np.allclose(got64, np.matmul(a64, b64), rtol=0, atol=1e-12)


def test_special_values_propagate():
    a = np.array([[[np.inf, 1.0], [np.nan, 1.0], [0.0, 1.0]]], dtype=np.float32)
    b = np.array([[[0.0, 2.0], [3.0, -0.0]]], dtype=np.float32)
    got = ordered_matmul(a, b)
    with portable_only():
        twin = ordered_matmul(a, b)
    assert np.isnan(got[0, 0, 0]) and np.isposinf(got[0, 0, 1])      # inf * 0 = NaN; inf * 2 + 1 * -0 = inf
    assert np.isnan(got[0, 1]).all()
    assert _bits(got[0, 2])[1] == 0                                   # +0 + 0*2 + 1*-0 = +0
    assert np.array_equal(np.isnan(got), np.isnan(twin)) and np.array_equal(got[~np.isnan(got)], twin[~np.isnan(twin)])


@pytest.mark.parametrize("g,m,k,n", [(8, 4, 128, 256), (2, 33, 70, 19)])
def test_fused_products_of_fp16_values_give_the_same_bits(g, m, k, n):
    """`exact=True` (a fused multiply-add, for HMX's fp16 tiles) is the multiply-then-add's rounding, since every
    product of two fp16 values is exact in float32; tiny and huge values included (subnormal-range products)."""
    rng = np.random.default_rng(m)
    scale = np.exp2(rng.integers(-14, 15, (g, m, 1))).astype(np.float32)
    a = (rng.standard_normal((g, m, k)) * scale).astype(np.float16).astype(np.float32)
    b = (rng.standard_normal((g, k, n)) * 1e-3).astype(np.float16).astype(np.float32)
    want = _bits(_oracle(a, b))
    assert np.array_equal(_bits(ordered_matmul(a, b, exact=True)), want)
    with portable_only():
        assert np.array_equal(_bits(ordered_matmul(a, b, exact=True)), want)
