"""The HMX GEMM beside the machine's float32 FMA peak, both measured in this run (issue 34).

    python bench/bench_hmx_gemm.py                 # Qwen3-4B's layer shapes at M = 128, the threads of -t
    python bench/bench_hmx_gemm.py -m 38 -t 1

The peak is a register-only loop of independent vector FMAs (fma_peak.py, as wide as the host's vectors: zmm where
the CPU has AVX-512), run on every thread at once. The GEMM rows are `kernels.gemm.hmx_products` on random Q4_0
weights of each shape (the dequantization into its blocks included, as in a run), the best of --reps calls.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gguf import GGMLQuantizationType, quants

from fma_peak import fma_peak_gflops  # bench/fma_peak.py
from kazeia.backends.htp.host.repack import RepackedWeight
from kazeia.backends.htp.kernels import gemm
from kazeia.native.threads import set_threads, threads

# (name, N, K) of Qwen3-4B's layer weights
SHAPES = (("attn_q", 4096, 2560), ("attn_k/v", 1024, 2560), ("attn_output", 2560, 4096),
          ("ffn_gate/up", 9728, 2560), ("ffn_down", 2560, 9728))


def gemm_gflops(m: int, n: int, k: int, reps: int, rng: np.random.Generator) -> float:
    raw = quants.quantize(rng.standard_normal((n, k)).astype(np.float32), GGMLQuantizationType.Q4_0)
    w = RepackedWeight.from_ggml(raw, GGMLQuantizationType.Q4_0, k)
    b8, _ = w.blocks()
    a16 = rng.standard_normal((m, k)).astype(np.float16).astype(np.float32)
    best = float("inf")
    for _ in range(reps + 1):  # the first call compiles or loads the kernels and touches the scratch
        t0 = time.perf_counter()
        gemm.hmx_products(a16, n, "q4_0", b8, b8.strides[0])
        best = min(best, time.perf_counter() - t0)
    return 2.0 * m * n * k / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", type=int, default=128, help="activation rows (tokens)")
    ap.add_argument("-t", type=int, default=2, help="threads")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    set_threads(args.t)
    rng = np.random.default_rng(0)
    peak = fma_peak_gflops(threads())
    print(f"fp32 FMA peak, {threads()} threads: {peak:.1f} GFLOP/s")
    print(f"{'weight':<12} {'N':>6} {'K':>6} {'GFLOP/s':>8} {'of peak':>8}")
    total_flop = total_s = 0.0
    for name, n, k in SHAPES:
        g = gemm_gflops(args.m, n, k, args.reps, rng)
        total_flop += 2.0 * args.m * n * k
        total_s += 2.0 * args.m * n * k / (g * 1e9)
        print(f"{name:<12} {n:>6} {k:>6} {g:8.1f} {g / peak:8.0%}")
    g = total_flop / total_s / 1e9
    print(f"{'layer':<12} {'':>6} {'':>6} {g:8.1f} {g / peak:8.0%}   (M = {args.m})")


if __name__ == "__main__":
    main()
