"""What every numpy kernel shares: the kernel registry (`KERNELS`, the `kernel` decorator), the interface a backend
gives its kernels (`NumpyOps`: load, weight_matmul, store) and ggml's broadcasting."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kazeia.backends.libm import HOST, HostMath, OwnedMath
from kazeia.backends.ordered import ordered_batched
from kazeia.backends.sum_squares import sum_squares
from kazeia.graph.tensor import Tensor

Kernel = Callable[["NumpyOps", Tensor], None]
KERNELS: dict[str, Kernel] = {}


def kernel(op: str):
    def deco(fn: Kernel) -> Kernel:
        KERNELS[op] = fn
        return fn
    return deco


class NumpyOps:
    """What kernels need from a backend (implemented by RefBackend and CpuBackend)."""

    ft: type  # np.float32 or np.float64
    # exp, log1p, tanh, power, cos_sin for the kernels: numpy's here (their last bits follow the host's SIMD family,
    # as a CPU build's do); REF and the emulated DSP take kazeia's own rules (backends/libm.py), the same everywhere
    math: HostMath | OwnedMath = HOST

    def load(self, t: Tensor) -> np.ndarray:
        raise NotImplementedError

    def weight_matrix(self, t: Tensor) -> np.ndarray:
        """A 2-D weight (flags WEIGHT) as an (N, K) float array."""
        raise NotImplementedError

    def weight_matmul(self, t: Tensor, y: np.ndarray) -> np.ndarray:
        """y (M, K) @ W^T for a 2-D weight (flags WEIGHT): (M, N) in the backend's float type."""
        raise NotImplementedError

    def store(self, t: Tensor, values: np.ndarray) -> None:
        raise NotImplementedError

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a (..., M, K) @ b (..., K, N) of two activations (a MUL_MAT whose src0 is not a weight: KQ, KQV): float32
        in the one order of backends/ordered.py (llama.cpp's CPU backend runs its own vec_dot there, not BLAS; a
        graph split between HTP0 and the CPU then keeps HTP0's bits on every host); REF's float64 by numpy's
        matmul."""
        if a.dtype == np.float32 and b.dtype == np.float32:
            return ordered_batched(a, b)
        return np.matmul(a, b)

    def sum_squares(self, x: np.ndarray) -> np.ndarray:
        """Each row's sum of squares in float64 (RMS_NORM, L2_NORM: ggml sums in double): float32 rows in the one
        order of backends/sum_squares.py (numpy einsum's on the builds the device's bits were recorded with, owned
        so that no numpy build moves them); REF's float64 rows by numpy's einsum."""
        if x.dtype == np.float32:
            return sum_squares(x)
        return np.einsum("...i,...i->...", x, x, dtype=np.float64)

    def matvec(self, m: np.ndarray, x: np.ndarray) -> np.ndarray:
        """m (..., R, C) @ x (..., C) -> (..., R) (the gated delta net's state products): numpy's matmul here."""
        return numpy_matvec(m, x)


def numpy_matvec(m: np.ndarray, x: np.ndarray) -> np.ndarray:
    """m (..., R, C) @ x (..., C) -> (..., R) by numpy's matmul (BLAS: its order follows the host)."""
    return np.matmul(m, x[..., None])[..., 0]


def broadcast_to(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml_repeat semantics: each dim of b divides the target dim (tile when not 1)."""
    reps = tuple(s // d for s, d in zip(shape, b.shape))
    if all(d == 1 or r == 1 for d, r in zip(b.shape, reps)):
        return np.broadcast_to(b, shape)
    return np.tile(b, reps)
