"""The CPU device's prefill GEMM (cpu/kernels/gemm.py) on Qwen3-4B's layer shapes, integer multiply-adds per second
(issue 38): the vector width it was compiled for, and each shape's best call of --reps.

    python bench/bench_cpu_gemm.py               # M = 128, 2 threads
    KAZEIA_ISA=avx2 python bench/bench_cpu_gemm.py -t 1
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from kazeia.backends.cpu.kernels.gemm import lanes, rows_per_tile
from kazeia.backends.cpu.qmatmul import weight_matmul
from kazeia.native.threads import set_threads, threads

# (name, N, K, per layer) of Qwen3-4B's layer weights
SHAPES = (("attn_q", 4096, 2560, 1), ("attn_k/v", 1024, 2560, 2), ("attn_output", 2560, 4096, 1),
          ("ffn_gate/up", 9728, 2560, 2), ("ffn_down", 2560, 9728, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", type=int, default=128, help="activation rows (tokens)")
    ap.add_argument("-t", type=int, default=2, help="threads")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    set_threads(args.t)
    rng = np.random.default_rng(0)
    print(f"CPU Q4_0 GEMM, {threads()} threads, {lanes()} int32 lanes a vector, {rows_per_tile()} rows of x a tile, "
          f"M = {args.m}, best of {args.reps}")
    print(f"{'weight':<12} {'N':>6} {'K':>6} {'GOP/s':>8}")
    ops = secs = 0.0
    for name, n, k, count in SHAPES:
        raw = quantize(rng.standard_normal((n, k)).astype(np.float32), GGMLQuantizationType.Q4_0)
        x = rng.standard_normal((args.m, k)).astype(np.float32)
        out = np.empty((args.m, n), np.float32)
        weight_matmul(raw, GGMLQuantizationType.Q4_0, k, x, out)  # compiles or loads the kernels
        best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            weight_matmul(raw, GGMLQuantizationType.Q4_0, k, x, out)
            best = min(best, time.perf_counter() - t0)
        flop = 2.0 * args.m * n * k
        print(f"{name:<12} {n:>6} {k:>6} {flop / best / 1e9:>8.1f}")
        ops += count * flop
        secs += count * best
    print(f"{'layer':<26} {ops / secs / 1e9:>8.1f}")


if __name__ == "__main__":
    main()
