"""kazeia: GGUF models op by op, a software model of ggml's Hexagon (HTP) backend, and op-level forensics."""

import os as _os

__version__ = "0.1.0"

# OpenBLAS's idle threads spin for 2^28 cycles (~0.1 s) after each call before they sleep. On two cores the
# spinning thread takes the core that the native kernels' second thread needs right after a GEMM (the HMX
# dequant of the next weight tile, the HVX dots of a decode step). 4 (its minimum, 2^4 cycles) makes them sleep
# at once; waking them costs microseconds against a GEMM's milliseconds. Measured on the 36-layer Qwen3-4B Q4_0
# (kazeia bench, 2 threads): HTP0 pp128 16.0-16.6 -> 17.6-18.1 t/s, tg16 4.2-4.7 -> 5.4-5.5 t/s, CPU within
# noise. Read by OpenBLAS when numpy loads it, so it is set before anything imports numpy; a user's own value
# wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
