"""The `cpu` backend (-dev CPU, and the host CPU beside HTP0): backend.py; nodes bound to native kernels, bind.py;
weight matmuls on the quantized bytes, qmatmul.py; the float32 numpy kernels, f32_ops.py; the native kernel
families (IR, front, portable twin), kernels/."""

from kazeia.backends.cpu.backend import CpuBackend, NumpyBackend

__all__ = ["CpuBackend", "NumpyBackend"]
