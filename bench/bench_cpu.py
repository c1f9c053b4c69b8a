"""CPU benchmark: kazeia's `cpu` backend beside llama.cpp's llama-bench on the same GGUF, in the same run.

    python bench/bench_cpu.py                  # default model, pp256 + tg16, 2 threads, 5 repetitions
    python bench/bench_cpu.py --q4-0           # also a Q4_0 requantized copy (llama-quantize or bench/requant.py)
    python bench/bench_cpu.py --no-peer --json

Prints, per test, our tokens/s, llama.cpp's (`llama-bench -p 256 -n 16 -t 2`) and the ratio against the
project's goals (issue 8: pp >= 1.5x and tg >= 0.5x on the shipped Q4_1 file, pp >= 0.5x on its Q4_0
copy), then a "numpy floor": the fp32 GEMM rate numpy reaches on this
model's own matmul shapes (measured now, same threads), the FLOPs each token costs, and the tokens/s that
rate would give (FLOPs per token / GEMM FLOP/s). llama-bench is looked up in $LLAMA_BENCH, then PATH, then
the peer build tree; without it only our numbers are printed ("peer: not available"), never an error.
Timings on a shared machine are perturbed by whatever else runs: read them as "this run", not as truth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np

import requant  # bench/requant.py
from kazeia.cli import bench
from kazeia.cli.common import Session, open_session
from kazeia.cli.main import build_parser
from kazeia.engine.context import FA_KV_PAD, Model
from kazeia.engine.default_model import default_model_path
from kazeia.errors import KazeiaError
from peer import find_tool, llama_bench  # bench/peer.py

# kazeia / llama.cpp tokens/s the project aims for (issue 8): the shipped default model, and its Q4_0 copy
GOALS = {"pp": 1.5, "tg": 0.5}
GOALS_Q4_0_COPY = {"pp": 0.5}
MATMULS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


# ---------------------------------------------------------------------------------------------------
# the two engines


@dataclass
class Row:
    model: str
    test: str
    ours: list[float]  # tokens/s per repetition
    peer: list[float] | None = None
    floor_ts: float = 0.0  # numpy fp32 GEMM floor, tokens/s
    extra: dict = field(default_factory=dict)
    peak_rss: int = 0  # bytes, after kazeia's measurements (before the floor's)
    goals: dict = field(default_factory=lambda: dict(GOALS))


def mean_sd(xs: list[float]) -> tuple[float, float]:
    return bench.mean_sd(xs)


def ours(path: str, tests: list[bench.BenchTest], threads: int, reps: int) -> tuple[Session, dict[str, list[float]]]:
    argv = ["bench", "-m", path, "-t", str(threads), "-dev", "CPU",
            "-p", ",".join(str(t.n) for t in tests if t.kind == "pp") or "0",
            "-n", ",".join(str(t.n) for t in tests if t.kind == "tg") or "0"]
    args = bench._session_args(build_parser().parse_args(argv), tests)
    s = open_session(args, model=Model.load(path))
    out = {}
    for t in tests:
        seconds, _ = bench.measure(s, t, reps)
        out[t.name] = [t.n / x for x in seconds]
    return s, out


def peer(exe: str, path: str, tests: list[bench.BenchTest], threads: int, reps: int) -> dict[str, list[float]]:
    return llama_bench(exe, path, [t.n for t in tests if t.kind == "pp"], [t.n for t in tests if t.kind == "tg"],
                       threads, reps, timeout=900)


# ---------------------------------------------------------------------------------------------------
# the numpy floor


def matmul_weights(s: Session) -> list[np.ndarray]:
    """Float32 (N, K) matrices of the shapes of every layer's matmuls, in execution order: layer 0's weights
    dequantized once and reused for every layer (the floor needs shapes and bandwidth, not a float copy of the
    whole model)."""
    be = s.scheduler.backends[0]
    w = s.model.weights
    layer0 = [be.weight_matrix(w[f"blk.0.{m}.weight"]) for m in MATMULS]
    return layer0 * s.model.args.n_layer


def lm_head(s: Session) -> np.ndarray:
    w = s.model.weights
    return s.scheduler.backends[0].weight_matrix(w.get("output.weight", w["token_embd.weight"]))


def gemm_rate(mats: list[np.ndarray], m: int, reps: int = 3) -> float:
    """FLOP/s of y(m, K) @ W.T over the given weights (the model's shapes, fp32, current BLAS threads)."""
    rng = np.random.default_rng(0)
    xs = {k: rng.standard_normal((m, k), dtype=np.float32) for k in {w.shape[1] for w in mats}}
    flops = 2.0 * m * sum(w.shape[0] * w.shape[1] for w in mats)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for w in mats:
            xs[w.shape[1]] @ w.T
        best = min(best, time.perf_counter() - t0)
    return flops / best


def flops_per_token(s: Session, test: bench.BenchTest, n_kv: int) -> float:
    """Matmul FLOPs (+ attention over the padded KV the engine computes, + lm_head for the output rows)."""
    a = s.model.args
    mats = sum(w.shape[0] * w.shape[1] for w in matmul_weights(s))
    attn = a.n_layer * 2 * 2 * a.n_head * a.head_dim * n_kv  # QK^T and PV
    head = lm_head(s)
    head_flops = 2 * head.shape[0] * head.shape[1]
    per_out = head_flops if test.kind == "tg" else head_flops / test.n  # pp: logits of the last row only
    return 2 * mats + attn + per_out


def floor_ts(s: Session, test: bench.BenchTest) -> tuple[float, float, float]:
    """(GEMM FLOP/s, FLOPs per token, tokens/s) for a test."""
    n_end = test.depth + (test.n if test.kind == "pp" else 1)
    n_kv = min(s.ctx.n_ctx, -(-n_end // FA_KV_PAD) * FA_KV_PAD)  # the KV cells flash attention computes
    m = test.n if test.kind == "pp" else 1
    rate = gemm_rate(matmul_weights(s) + [lm_head(s)], m)
    fpt = flops_per_token(s, test, n_kv)
    return rate, fpt, rate / fpt


# ---------------------------------------------------------------------------------------------------


def requantize_q4_0(src: str) -> str:
    """A Q4_0 copy of src in the temp directory (reused): llama-quantize --pure when it is found, else
    bench/requant.py (gguf-py's dequantize + Q4_0 quantizer, the same bytes for these formats)."""
    exe = find_tool("llama-quantize")
    dst = os.path.join(tempfile.gettempdir(), "kazeia-bench", os.path.basename(src).replace(".gguf", "") + ".Q4_0.gguf")
    if not os.path.exists(dst) or os.path.getmtime(dst) < os.path.getmtime(src):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if exe is None:
            requant.requantize_q4_0(src, dst)
        else:
            subprocess.run([exe, "--allow-requantize", "--pure", src, dst, "Q4_0"], capture_output=True, check=True,
                           timeout=600)
    return dst


def _fmt(xs: list[float] | None) -> str:
    if not xs:
        return "-"
    m, sd = mean_sd(xs)
    return f"{m:.2f} ± {sd:.2f}"


def ratio(row: Row) -> float | None:
    if not row.peer:
        return None
    return statistics.fmean(row.ours) / statistics.fmean(row.peer)


def best_ratio(row: Row) -> float | None:
    """Fastest repetition against fastest repetition: steadier than the means when other jobs interfere."""
    return max(row.ours) / max(row.peer) if row.peer else None


def table(rows: list[Row]) -> str:
    head = ["model", "test", "kazeia t/s", "llama.cpp t/s", "ratio", "best/best", "goal", "numpy floor t/s",
            "of floor"]
    lines = []
    for r in rows:
        q = ratio(r)
        goal = r.goals.get(r.test[:2])
        ok = "" if q is None or goal is None else (" ok" if q >= goal else " below")
        of_floor = statistics.fmean(r.ours) / r.floor_ts if r.floor_ts else 0.0
        b = best_ratio(r)
        lines.append([r.model, r.test, _fmt(r.ours), _fmt(r.peer), "-" if q is None else f"{q:.2f}x",
                      "-" if b is None else f"{b:.2f}x", "-" if goal is None else f">= {goal:.1f}x{ok}",
                      f"{r.floor_ts:.1f}", f"{of_floor:.2f}x"])
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(head)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([fmt(head), "| " + " | ".join("-" * w for w in widths) + " |"] + [fmt(x) for x in lines])


def run_model(path: str, label: str, tests: list[bench.BenchTest], a: argparse.Namespace,
              peer_exe: str | None, goals: dict) -> list[Row]:
    peer_ts: dict[str, list[float]] = {}
    if peer_exe:
        try:
            peer_ts = peer(peer_exe, path, tests, a.threads, a.repetitions)
        except (subprocess.SubprocessError, OSError, ValueError, KeyError) as e:
            print(f"peer: failed ({type(e).__name__}: {e})", file=sys.stderr)
    s, our_ts = ours(path, tests, a.threads, a.repetitions)
    rss = bench.peak_rss_bytes()
    rows = []
    for t in tests:
        rate, fpt, fts = floor_ts(s, t)
        rows.append(Row(label, t.name, our_ts[t.name], peer_ts.get(t.name), fts,
                        {"gemm_gflops": rate / 1e9, "gflop_per_token": fpt / 1e9}, rss, goals))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the embedded SmolLM2-135M Q4_1)")
    ap.add_argument("-p", type=int, default=256, help="prompt tokens (default 256)")
    ap.add_argument("-n", type=int, default=16, help="generated tokens (default 16)")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads for both engines (default 2)")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--no-peer", action="store_true", help="do not run llama-bench")
    ap.add_argument("--q4-0", action="store_true", help="also measure a Q4_0 requantized copy (llama-quantize)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args(argv)
    path = a.model or default_model_path()
    tests = [bench.BenchTest("pp", a.p), bench.BenchTest("tg", a.n)]
    peer_exe = None if a.no_peer else find_tool("llama-bench")
    info = bench.model_info(Model.load(path))
    models = [(path, info.type, GOALS)]
    if a.q4_0:
        models.append((requantize_q4_0(path), info.type.rsplit(" ", 1)[0] + " Q4_0 (requant)", GOALS_Q4_0_COPY))
    load_before = os.getloadavg()[0]
    rows = []
    for p, label, goals in models:
        rows += run_model(p, label, tests, a, peer_exe, goals)
    load = (load_before, os.getloadavg()[0])
    if a.json:
        print(json.dumps({"peer": peer_exe, "threads": a.threads, "rows": [asdict(r) for r in rows], "loadavg": load,
                          "peak_rss_bytes": max(r.peak_rss for r in rows)}, indent=2))
        return 0
    print(f"kazeia cpu backend vs llama.cpp: {os.path.basename(path)}, {a.threads} threads, "
          f"{a.repetitions} repetitions (t/s mean ± sd; the machine may be shared: timings are this run's)")
    print(f"peer: {peer_exe}" if peer_exe else "peer: not available")
    print()
    print(table(rows))
    print()
    for r in rows:
        e = r.extra
        print(f"numpy floor {r.model} {r.test}: fp32 GEMM {e['gemm_gflops']:.1f} GFLOP/s on the model's shapes "
              f"(M={a.p if r.test.startswith('pp') else 1}) / {e['gflop_per_token']:.3f} GFLOP per token "
              f"= {r.floor_ts:.1f} t/s")
    print(f"peak memory (RSS) after kazeia's runs: {max(r.peak_rss for r in rows) / 2**20:.1f} MiB")
    print(f"1-min load average before / after: {load[0]:.2f} / {load[1]:.2f} on {os.cpu_count()} CPUs"
          + (" (other jobs were running before: timings are perturbed)" if load[0] > 0.7 else ""))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KazeiaError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(e.exit_code) from None
