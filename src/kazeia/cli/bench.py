"""kazeia bench: prompt-processing and generation speed, in the style of llama-bench.

Each test runs once as a warm-up (the first call builds the graph and loads the compiled matmul
kernels), then `-r` measured repetitions, each from an empty KV cache. `ppN` feeds a synthetic N-token prompt
as one decode call (split into micro-batches of `-ub`); `tgN` feeds N single tokens one by one, like
llama-bench. t/s is the mean ± sample standard deviation over the repetitions of tokens / seconds. With
`-np N -kvu`, N sequences get their own tokens in the same decode calls (llama-batched-bench's PP and TG with
npl = N, prompts not shared) and t/s counts the tokens of all of them.

Backend columns (extension point). A backend in the session may add columns to the table by exposing

    bench_counters(self) -> dict[str, float]   # cumulative seconds per column name, e.g. {"modeled": 1.25}

or just `modeled_seconds(self) -> float` (read as {"modeled": ...}). The counters are sampled before and
after every measured repetition; the difference d gives that repetition's `<name> t/s` = tokens / d, shown
as mean ± sd beside the wall-clock t/s (the HTP model reports its modeled device time this way). Counters
of the same name from several backends are added. A column appears when some row has it; others show "-".
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import time
from collections.abc import Callable

from kazeia.backends.base import Backend
from kazeia.cli import validate as V
from kazeia.cli.bench_report import (  # noqa: F401  (BenchResult, format_md, record: bench.X for callers)
    BenchResult,
    BenchTest,
    ModelInfo,
    format_md,
    format_records,
    mean_sd,
    record,
)
from kazeia.cli.common import (
    Session,
    add_common,
    add_device_args,
    add_model_args,
    add_parallel_args,
    model_path,
    open_session,
    spec_from_args,
)
from kazeia.engine.context import MAX_SEQ, Model
from kazeia.engine.generate import synthetic_prompt
from kazeia.errors import KazeiaError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="measure prompt processing and generation speed (like llama-bench)",
                       description=__doc__, epilog="exit status: 0 measured; 2 a bad input or flag; 3 the device died "
                       "during a test (the rows measured before it are printed).",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, prompt=False)
    add_parallel_args(p)
    add_device_args(p)
    p.set_defaults(ctx_size=None)  # default: just enough for the largest test, as llama-bench sizes it
    _help(p, "ctx_size", "context size in tokens (default: the largest pp + the largest tg, like llama-bench, times "
                         "-np)")
    _help(p, "device", "CPU, HTP0 (emulated Hexagon NPU) or REF (float64); a comma list benchmarks each")
    V.retype(p, {"device": V.devices, "parallel": V.int_list(1, MAX_SEQ)})
    p.set_defaults(parallel="1")
    _help(p, "parallel", "sequences decoded side by side, comma list (llama-batched-bench's -npl; default 1); "
                         "several need -kvu")
    g = p.add_argument_group("tests")
    g.add_argument("-p", "--n-prompt", type=V.int_list(0), default="64,256", metavar="N[,N...]",
                   help="prompt sizes for ppN tests, comma list, 0 = none (default 64,256)")
    g.add_argument("-n", "--n-gen", type=V.int_list(0), default="16", metavar="N[,N...]",
                   help="generation lengths for tgN tests, comma list, 0 = none (default 16)")
    g.add_argument("-d", "--n-depth", type=V.int_list(0), default="0", metavar="N[,N...]",
                   help="KV cache depth: tokens decoded (untimed) before each repetition, comma list (default 0)")
    g.add_argument("-r", "--repetitions", type=V.positive(1 << 20), default=5,
                   help="measured repetitions per test (default 5)")
    g.add_argument("--no-warmup", action="store_true", help="skip the warm-up run of each test")
    g.add_argument("-o", "--output", choices=["md", "csv", "json", "jsonl"], default="md",
                   help="output format (default md)")
    g.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")
    g.add_argument("--progress", action="store_true", help="print progress to stderr")
    add_common(p)
    p.set_defaults(func=main)
    return p


def _help(p: argparse.ArgumentParser, dest: str, text: str) -> None:
    """Reword the help of a shared flag whose meaning differs here."""
    for a in p._actions:
        if a.dest == dest:
            a.help = text


# ---------------------------------------------------------------------------------------------------
# what is measured


def parse_list(s: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in str(s).split(",") if x.strip()]
    except ValueError:
        raise KazeiaError(f"{what}: expected a comma list of integers, got '{s}'") from None
    if any(v < 0 for v in vals):
        raise KazeiaError(f"{what}: sizes must be >= 0")
    return vals


def bench_tests(args: argparse.Namespace) -> list[BenchTest]:
    depths = parse_list(getattr(args, "n_depth", "0"), "-d") or [0]
    seqs = parse_list(str(getattr(args, "parallel", 1) or 1), "-np")
    tests = [BenchTest("pp", n, d, k) for k in seqs for d in depths for n in parse_list(args.n_prompt, "-p") if n > 0]
    tests += [BenchTest("tg", n, d, k) for k in seqs for d in depths for n in parse_list(args.n_gen, "-n") if n > 0]
    if not tests:
        raise KazeiaError("nothing to measure: give -p and/or -n sizes above 0")
    return tests


def model_info(model: Model) -> ModelInfo:
    f = model.file
    size = sum(t.nbytes for t in f.tensors.values())
    params = sum(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3] for t in f.tensors.values())
    label = f.get("general.size_label") or _si(params)
    return ModelInfo(model.path, f"{f.architecture} {label} {_ftype(model)}", size, params)


def _ftype(model: Model) -> str:
    ft = model.file.get("general.file_type")
    if ft is not None:
        try:
            from gguf import LlamaFileType

            return LlamaFileType(int(ft)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    # no file type key: the type holding most of the bytes
    by_type: dict[str, int] = {}
    for t in model.file.tensors.values():
        by_type[t.type.name] = by_type.get(t.type.name, 0) + t.nbytes
    return max(by_type, key=by_type.get) if by_type else "?"


def _si(n: int) -> str:
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.0f}{suffix}"
    return str(n)


# ---------------------------------------------------------------------------------------------------
# backend columns (see the module docstring)


def backend_counters(backends: list[Backend]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in backends:
        counters: dict[str, float] = {}
        hook = getattr(b, "bench_counters", None)
        if callable(hook):
            counters.update(hook())
        modeled = getattr(b, "modeled_seconds", None)
        if callable(modeled) and "modeled" not in counters:
            counters["modeled"] = float(modeled())
        for k, v in counters.items():
            out[k] = out.get(k, 0.0) + float(v)
    return out


def _timed(s: Session, run: Callable[[], None]) -> tuple[float, dict[str, float]]:
    """Wall seconds of run() and the change of every backend counter over it."""
    before = backend_counters(s.scheduler.backends)
    t0 = time.perf_counter()
    run()
    dt = time.perf_counter() - t0
    after = backend_counters(s.scheduler.backends)
    return dt, {k: after[k] - before.get(k, 0.0) for k in after}


def _runners(s: Session, test: BenchTest) -> tuple[Callable[[], None], Callable[[], None]]:
    """(measured run, warm-up run): ppN decodes N prompt tokens at once, tgN decodes N tokens one by one
    (warmed up with one token, as llama-bench does). Both start where the cache is (see `_fill`). With -np, every
    sequence gets tokens of its own in the same decode calls (llama-batched-bench's PP and TG, prompts not
    shared)."""
    if test.kind == "pp":
        prompts = _tokens(s, test.n, test.n_seq, seed=0)

        def pp() -> None:
            s.ctx.decode_seqs(prompts)

        return pp, pp
    tokens = _tokens(s, test.n, test.n_seq, seed=1)

    def tg() -> None:
        for i in range(test.n):
            s.ctx.decode_seqs([t[i:i + 1] for t in tokens])

    def warm() -> None:
        s.ctx.decode_seqs([t[:1] for t in tokens])

    return tg, warm


def _tokens(s: Session, n: int, n_seq: int, seed: int) -> list[list[int]]:
    """n synthetic tokens per sequence (sequence k's drawn with seed + 100 k, so the first is llama-bench's)."""
    return [synthetic_prompt(n, s.model.args.n_vocab, s.tok.is_control, seed=seed + 100 * k) for k in range(n_seq)]


def _fill(s: Session, test: BenchTest) -> None:
    """Empty the KV cache, then decode test.depth tokens per sequence (untimed) so the test starts at that depth."""
    s.ctx.reset()
    if test.depth:
        s.ctx.decode_seqs(_tokens(s, test.depth, test.n_seq, seed=2))


def measure(s: Session, test: BenchTest, reps: int, warmup: bool = True,
            progress: Callable[[str], None] | None = None) -> tuple[list[float], dict[str, list[float]]]:
    """Seconds per repetition (each from an empty KV cache, filled to the test's depth) and backend counter
    deltas per repetition."""
    run, warm = _runners(s, test)
    if warmup:
        _fill(s, test)
        warm()
    seconds: list[float] = []
    extra: dict[str, list[float]] = {}
    for i in range(reps):
        _fill(s, test)
        dt, counters = _timed(s, run)
        seconds.append(dt)
        for k, v in counters.items():
            extra.setdefault(k, []).append(v)
        if progress:
            progress(f"{test.name} rep {i + 1}/{reps}: {test.tokens / dt:.2f} t/s")
    return seconds, extra


def blas_threads() -> int:
    try:
        from threadpoolctl import threadpool_info

        n = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
        return max(n) if n else os.cpu_count() or 1
    except Exception:  # threadpoolctl missing or confused: report what the machine has
        return os.cpu_count() or 1


def peak_rss_bytes() -> int:
    """This process's peak resident set. Linux's VmHWM belongs to the process image (getrusage's ru_maxrss survives
    execve, so a kazeia started from a 6 GB pytest reported 6 GB); elsewhere getrusage."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)


# ---------------------------------------------------------------------------------------------------


def _session_args(args: argparse.Namespace, tests: list[BenchTest]) -> argparse.Namespace:
    ns = argparse.Namespace(**vars(args))
    ns.n_prompt = None  # (llama-bench's -p / --n-prompt are the test sizes here, not a prompt)
    ns.parallel = max(t.n_seq for t in tests)  # spec_from_args refuses several sequences without -kvu, early
    if ns.ctx_size is None:  # several sequences share the one (unified) KV cache
        ns.ctx_size = (max(t.depth for t in tests) + max([t.n for t in tests if t.kind == "pp"], default=0)
                       + max([t.n for t in tests if t.kind == "tg"], default=0)) * ns.parallel
    return ns


def bench_device(args: argparse.Namespace, model: Model, info: ModelInfo, device: str, tests: list[BenchTest],
                 progress: Callable[[str], None] | None) -> list[BenchResult]:
    """The tests on one device: a session per number of sequences (its recurrent cache holds one cell each)."""
    out = []
    for n_seq in dict.fromkeys(t.n_seq for t in tests):
        s = open_session(argparse.Namespace(**{**vars(args), "parallel": n_seq}), model=model, device=device)
        try:
            threads = blas_threads()
            for test in (t for t in tests if t.n_seq == n_seq):
                say = (lambda m, t=test: progress(f"{device} {m}")) if progress else None
                seconds, extra = measure(s, test, args.repetitions, not args.no_warmup, say)
                out.append(BenchResult(info, device.upper(), ",".join(b.name for b in s.scheduler.backends),
                                       threads, args.ubatch_size, args.flash_attn != "off", args.cache_type_k,
                                       args.cache_type_v, test, seconds, extra))
        finally:
            s.close()
    return out


def main(args: argparse.Namespace) -> int:
    if args.repetitions <= 0:
        raise KazeiaError("-r must be at least 1")
    tests = bench_tests(args)
    devices = [d.strip() for d in args.device.split(",") if d.strip()]
    if not devices:
        raise KazeiaError("-dev: no device given")
    sargs = _session_args(args, tests)
    spec_from_args(sargs)  # the flags' own refusals (-np without -kvu) before the model loads
    need = max((t.depth + t.n) * t.n_seq for t in tests)
    if sargs.ctx_size > 0 and need > sargs.ctx_size:
        raise KazeiaError(f"a test needs {need} tokens of context; -c is {sargs.ctx_size}")
    model = Model.load(model_path(args))
    if need > model.args.n_ctx_train:  # before any prompt is drawn: -p 100000000 would take gigabytes first
        raise KazeiaError(f"a test needs {need} tokens of context; the model's context is {model.args.n_ctx_train}")
    info = model_info(model)
    progress = (lambda m: print(f"kazeia bench: {m}", file=sys.stderr, flush=True)) if args.progress else None
    results: list[BenchResult] = []
    for dev in devices:
        results += bench_device(sargs, model, info, dev, tests, progress)
        gc.collect()  # drop the previous device's dequantized weights before the next one loads its own
    rss = peak_rss_bytes()
    if args.output == "md":
        print(format_md(results, rss))
    else:
        print(format_records(results, rss, args.output))
    return 0
