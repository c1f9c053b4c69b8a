"""Emulated HTP prefill vs the cpu backend, measured in the same run, and the modeled device rate.

    python bench/bench_htp.py [--layers 2] [--tokens 256] [-r 3] [-t 2]

Writes a Qwen3-4B-shaped model (Q4_0, `--layers` blocks) to a temporary file, then measures prompt processing
of `--tokens` synthetic tokens (one micro-batch) on:
- the cpu backend (the peer: the emulator must stay within 3x of it so investigations stay fast),
- HTP0 robust with HMX (the default path),
- HTP0 robust with GGML_HEXAGON_USE_HMX=0 (the HVX path: exact integer dots, slower to emulate),
and prints wall-clock tokens/s, the ratio to the cpu backend, and the MODELED device tokens/s of the same
graph (cost.py: calibrated, not measured). It also prints the modeled prefill rate of the real Qwen3-4B graph
(36 layers, vocabulary 151936) built from shapes only, against the original team's figures (about 295 t/s
with HMX, about 40 with HVX) that the cost model was calibrated on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from kazeia.backends.htp import HtpSettings
from kazeia.debug.modeled import modeled_prefill_tps
from kazeia.engine.session import RunSpec, build_context, prompt_ids
from kazeia.gguf.writer import preset, write_model
from kazeia.models.base import ModelArgs
from kazeia.native.threads import set_threads

QWEN3_4B = ModelArgs(arch="qwen3", n_layer=36, n_embd=2560, n_ff=9728, n_head=32, n_head_kv=8, head_dim=128,
                     n_rot=128, n_vocab=151936, n_ctx_train=40960, rope_freq_base=1e6, rope_freq_scale=1.0,
                     rms_eps=1e-6, tied_embeddings=True)
TEAM = {"hmx": 295.0, "hvx": 40.0}


def measure(spec: RunSpec, reps: int) -> tuple[list[float], float | None]:
    ctx = build_context(spec)
    ids = prompt_ids(spec, ctx.model)
    ctx.decode(ids)  # warm-up: repack/dequantize weights into the caches
    rates, modeled = [], None
    for _ in range(reps):
        ctx.reset()
        t0 = time.perf_counter()
        ctx.decode(ids)
        rates.append(len(ids) / (time.perf_counter() - t0))
    htp = next((b for b in ctx.scheduler.backends if hasattr(b, "modeled_graph_seconds")), None)
    if htp is not None:
        modeled = len(ids) / htp.modeled_graph_seconds(ctx.last_graph)
    return rates, modeled


def fmt(rates: list[float]) -> str:
    sd = statistics.stdev(rates) if len(rates) > 1 else 0.0
    return f"{statistics.mean(rates):8.1f} ± {sd:5.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("-r", "--reps", type=int, default=3)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-m", "--model", default=None, help="use this GGUF instead of writing a Qwen3-4B-shaped one")
    a = p.parse_args(argv)
    set_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = a.model or os.path.join(tmp, "q4b.gguf")
        if a.model is None:
            write_model(preset("qwen3-4b", n_layer=a.layers), path)
        base = RunSpec(model=path, n_prompt=a.tokens, ubatch=max(512, a.tokens), ctx=max(1024, a.tokens + 256))
        rows = [("cpu backend (peer)", base.with_(device="CPU")),
                ("HTP0 robust, HMX", base.with_(device="HTP0", htp_profile="robust")),
                ("HTP0 robust, HVX only", base.with_(device="HTP0", htp_profile="robust",
                                                     env={"GGML_HEXAGON_USE_HMX": "0"}))]
        print(f"prefill of {a.tokens} tokens, Qwen3-4B shapes with {a.layers} layer(s), Q4_0, {a.threads} BLAS "
              f"threads, {a.reps} repetitions (load average {os.getloadavg()[0]:.2f})\n")
        print(f"| {'configuration':24s} | {'wall t/s':17s} | {'vs cpu':7s} | {'modeled device t/s':18s} |")
        print(f"| {'-' * 24} | {'-' * 17} | {'-' * 7} | {'-' * 18} |")
        cpu_mean = None
        for label, spec in rows:
            rates, modeled = measure(spec, a.reps)
            mean = statistics.mean(rates)
            cpu_mean = cpu_mean or mean
            ratio = f"{cpu_mean / mean:5.2f}x" + (" slower" if mean < cpu_mean else "")
            mod = f"{modeled:10.1f}" if modeled else "-"
            print(f"| {label:24s} | {fmt(rates):17s} | {ratio:7s} | {mod:18s} |")
    print("\nmodeled prefill of the real Qwen3-4B Q4_0 graph (36 layers, shapes only; cost model calibrated on the "
          "team's measurements):")
    for path_name, hmx in (("hmx", "1"), ("hvx", "0")):
        s = HtpSettings.from_env({"GGML_HEXAGON_USE_HMX": hmx})
        tps = modeled_prefill_tps(QWEN3_4B, 256, s)
        print(f"  {path_name}: {tps:6.1f} t/s modeled  (team measured about {TEAM[path_name]:.0f}; "
              f"ratio {tps / TEAM[path_name]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
