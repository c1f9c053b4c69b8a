"""This machine's streaming bandwidth, measured now, beside the GEMV bandwidth of kazeia's CPU device (issue 38).

    python bench/stream.py [-m qwen3-4b-q4_0.gguf] [-t 2] [-r 5] [--mib 1024]

- read: every byte of a buffer far larger than the caches read once by T threads (a native kernel sums it as
  <4 x i64> lanes, so no load can be dropped), best of R passes: the rate a decode's weight stream cannot beat;
- copy: numpy's copyto of the same buffer (one thread; read plus write bytes);
- GEMV: with -m, the CPU device's decode GEMV (`backends/cpu/qmatmul.WeightSet`, M = 1, its activation
  quantization included) over every layer weight of the model, in file order, at T threads, reading the weights'
  packed copies as a run does (backends/cpu/packs.py: made now if the cache has none): the weight bytes it streams
  per second, and that as a share of the read rate; then the same from the file's rows (no packed copies).

It also prints the vector extensions the CPU has and those the native kernels are compiled for (the host's LLVM
features). Timings on a shared machine move between runs: the ratios are those of this run.
"""

from __future__ import annotations

import argparse
import re
import time

import numpy as np

from kazeia.native.compile import available, host_has
from kazeia.native.stream import read_gbs
from kazeia.native.threads import set_threads, threads

ISA = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avxvnni")  # LLVM's feature names
CPUINFO_NAME = {"avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni"}  # where /proc/cpuinfo spells them otherwise


def isa_line() -> str:
    """The vector extensions the CPU reports (/proc/cpuinfo) and those the native kernels are compiled for (LLVM's
    names; KAZEIA_ISA=avx2 turns the AVX-512 ones off)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags"))
    except (OSError, StopIteration):
        flags = []
    cpu = " ".join(f for f in ISA if CPUINFO_NAME.get(f, f) in flags)
    llvm = " ".join(f for f in ISA if host_has(f))
    return f"CPU flags: {cpu or '?'}; the native kernels are compiled for: {llvm or 'the portable twins'}"


def copy_gbs(buf: np.ndarray, reps: int) -> float:
    dst = np.empty_like(buf)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, buf)
        best = min(best, time.perf_counter() - t)
    return 2 * buf.nbytes / best / 1e9


LAYER_WEIGHT = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$")


def gemv_gbs(model: str, reps: int, packed: bool = True) -> tuple[float, int, float]:
    """(GB/s, bytes, seconds a pass) of the CPU device's M = 1 GEMV over every layer weight of `model`: from their
    packed copies as a run reads them (backends/cpu/packs.py, packed now if need be), or from the file's rows."""
    from kazeia.backends.cpu.packs import packed_copy
    from kazeia.backends.cpu.qmatmul import WeightSet
    from kazeia.gguf.reader import load_gguf

    f = load_gguf(model)
    sets = []
    for name, t in f.tensors.items():
        if LAYER_WEIGHT.search(name):
            k, n = t.ne[0], t.ne[1]
            s = WeightSet([(f.data[t.offset:t.offset + t.nbytes].reshape(n, -1), t.type, k)])
            if packed and s.kind is not None:
                s.use_packed([packed_copy(s.weights[0][0], s.kind, f.path, t.offset)])
            sets.append(s)
    rng = np.random.default_rng(0)
    xs = {s.k: rng.standard_normal((1, s.k)).astype(np.float32) for s in sets}
    total = sum(raw.nbytes for s in sets for raw, _, _ in s.weights)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for s in sets:
            s.matmul(xs[s.k])
        best = min(best, time.perf_counter() - t)
    return total / best / 1e9, total, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="a GGUF whose layer weights the GEMV row streams (e.g. the 36-layer "
                                          "Qwen3-4B-shaped Q4_0)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--mib", type=int, default=1024, help="the streamed buffer (MiB), far past the caches")
    args = ap.parse_args()
    set_threads(args.threads)
    print(isa_line())
    if not available():
        print("native kernels not available here (KAZEIA_SIMD=0 or no AVX2): no read rate")
        return
    buf = np.ones(args.mib << 20, dtype=np.uint8)  # touched: every page is there before the timing
    read = read_gbs(buf, args.reps)
    print(f"stream read  {read:6.1f} GB/s  ({threads()} threads, {args.mib} MiB, best of {args.reps})")
    print(f"stream copy  {copy_gbs(buf, args.reps):6.1f} GB/s  (numpy copyto, one thread, read + write)")
    del buf
    if args.model:
        rows, _, _ = gemv_gbs(args.model, args.reps, packed=False)
        gbs, total, sec = gemv_gbs(args.model, args.reps)
        print(f"CPU GEMV     {gbs:6.1f} GB/s  ({total / 1e9:.2f} GB of layer weights in {sec * 1e3:.1f} ms, M = 1, "
              f"{threads()} threads): {gbs / read:.0%} of the read rate")
        print(f"  (from the file's rows, without the packed copies: {rows:.1f} GB/s, {rows / read:.0%})")


if __name__ == "__main__":
    main()
