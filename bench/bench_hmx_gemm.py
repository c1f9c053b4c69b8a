"""The HMX GEMM beside the machine's float32 FMA peak, both measured in this run (issue 34).

    python bench/bench_hmx_gemm.py                 # Qwen3-4B's layer shapes at M = 128, the threads of -t
    python bench/bench_hmx_gemm.py -m 38 -t 1

The peak is a register-only loop of independent vector FMAs (fma_peak.py, as wide as the host's vectors: zmm where
the CPU has AVX-512), run on every thread at once. The GEMM rows are `kernels.gemm.hmx_products` on random Q4_0
weights of each shape (the dequantization into its blocks and the activations' packing included, as in a run).
On a shared machine the speed drifts while this runs: the peak is measured again before each shape, in turn with
its GEMM calls, and each row divides the best GEMM call by the best peak of those rounds (--reps of each).
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


def shape_gflops(m: int, n: int, k: int, reps: int, rng: np.random.Generator) -> tuple[float, float]:
    """(best GEMM GFLOP/s, best FMA peak GFLOP/s) over `reps` rounds of one peak run then one GEMM call."""
    raw = quants.quantize(rng.standard_normal((n, k)).astype(np.float32), GGMLQuantizationType.Q4_0)
    w = RepackedWeight.from_ggml(raw, GGMLQuantizationType.Q4_0, k)
    b8, _ = w.blocks()
    a16 = rng.standard_normal((m, k)).astype(np.float16).astype(np.float32)
    gemm.hmx_products(a16, n, "q4_0", b8, b8.strides[0])  # compiles or loads the kernels, touches the scratch
    best, peak = float("inf"), 0.0
    for _ in range(reps):
        peak = max(peak, fma_peak_gflops(threads()))
        t0 = time.perf_counter()
        gemm.hmx_products(a16, n, "q4_0", b8, b8.strides[0])
        best = min(best, time.perf_counter() - t0)
    return 2.0 * m * n * k / best / 1e9, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", type=int, default=128, help="activation rows (tokens)")
    ap.add_argument("-t", type=int, default=2, help="threads")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    set_threads(args.t)
    rng = np.random.default_rng(0)
    print(f"fp32 FMA peak and the HMX GEMM, {threads()} threads, best of {args.reps} rounds each (M = {args.m})")
    print(f"{'weight':<12} {'N':>6} {'K':>6} {'GFLOP/s':>8} {'peak':>7} {'of peak':>8}")
    total_flop = total_s = total_peak_s = 0.0
    for name, n, k in SHAPES:
        g, peak = shape_gflops(args.m, n, k, args.reps, rng)
        flop = 2.0 * args.m * n * k
        total_flop += flop
        total_s += flop / (g * 1e9)
        total_peak_s += flop / (peak * 1e9)
        print(f"{name:<12} {n:>6} {k:>6} {g:8.1f} {peak:7.1f} {g / peak:8.0%}")
    g, peak = total_flop / total_s / 1e9, total_flop / total_peak_s / 1e9
    print(f"{'layer':<12} {'':>6} {'':>6} {g:8.1f} {peak:7.1f} {g / peak:8.0%}")


if __name__ == "__main__":
    main()
