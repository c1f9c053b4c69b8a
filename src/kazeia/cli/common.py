"""Flags shared by the commands that run a model (llama-cli names), and building a session from them."""

from __future__ import annotations

import argparse
import os
import sys

from kazeia import settings
from kazeia.backends.devices import DeviceOptions
from kazeia.backends.ref import WeightCache
from kazeia.cli import validate as V
from kazeia.engine.context import MAX_SEQ, Model
from kazeia.engine.session import SYNC_ENV, RunSpec, Session
from kazeia.errors import KazeiaError
from kazeia.limits import decode_text
from kazeia.native.threads import set_threads  # noqa: F401 (the tools' -t, from here)

MAX_PROMPT_BYTES = 8 << 20  # -f: 8x the text of the largest real context (262144 tokens at ~4 bytes); the tokenizer
# takes ~100 bytes of memory per byte of text, so this also keeps it under 1 GB


def add_model_args(p: argparse.ArgumentParser, prompt: bool = True) -> None:
    g = p.add_argument_group("model and context")
    g.add_argument("-m", "--model", type=V.regular_file, help="GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    if prompt:
        g.add_argument("-p", "--prompt", help="prompt text")
        g.add_argument("--n-prompt", type=V.positive(), default=None, metavar="N",
                       help="use a deterministic synthetic prompt of exactly N tokens (llama-bench style)")
    if prompt:
        g.add_argument("-f", "--file", type=V.readable_stream, default=None, metavar="FILE",
                       help="read the prompt from FILE")
    g.add_argument("-c", "--ctx-size", type=V.ctx_size, default=4096,
                   help="context size in tokens (default 4096, 0 = the model's training context)")
    g.add_argument("-ub", "--ubatch-size", type=V.positive(), default=512,
                   help="micro-batch size for prefill (default 512)")
    g.add_argument("-b", "--batch-size", type=V.positive(), default=2048,
                   help="logical batch (llama-cli's; prompts are split by -ub only here, so it changes nothing)")
    g.add_argument("-t", "--threads", type=V.threads, default=None,
                   help="CPU threads for BLAS (0 or less: the core count)")
    g.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], default="on",
                   help="flash attention (default on; auto = on: every device here runs it)")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="n_gpu_layers", type=V.gpu_layers, default=None,
                   metavar="N", help="with -dev HTP0: the last N layers (and the output layer when N exceeds the "
                                     "layer count) on the device, the rest on the CPU, as llama.cpp places them; "
                                     "99, 'all' or 'auto': all (the default), 0: none")
    n = p.add_argument_group("accepted for llama-cli command lines (no effect here)")
    n.add_argument("--mlock", action="store_true", help="weights are memory-mapped and read in place, never locked")
    n.add_argument("--no-mmap", action="store_true", help="weights are always memory-mapped and never copied")
    n.add_argument("--jinja", action="store_true", help="the GGUF's chat template is always rendered with jinja2")
    n.add_argument("--poll", type=V.integer(0, 100), default=None, metavar="N", help="no thread polling to tune")
    n.add_argument("--cpu-mask", "-C", type=V.hex_mask, default=None, metavar="M", help="no thread affinity to set")
    n.add_argument("--cpu-strict", type=V.integer(0, 1), default=None, metavar="0|1", help="no thread affinity to set")
    g.add_argument("-ctk", "--cache-type-k", choices=["f16", "f32", "q8_0"], default="f16")
    g.add_argument("-ctv", "--cache-type-v", choices=["f16", "f32", "q8_0"], default="f16")


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    """-np / -kvu, for the commands that run several sequences side by side (bench, trace)."""
    g = p.add_argument_group("sequences")
    g.add_argument("-np", "--parallel", type=V.positive(MAX_SEQ), default=1, metavar="N",
                   help="sequences decoded side by side in one batch (llama.cpp's -np / llama-batched-bench's -npl; "
                        "default 1); a hybrid model's recurrent layers then see n_seqs = N")
    g.add_argument("-kvu", "--kv-unified", action="store_true",
                   help="one KV cache stream shared by the sequences (llama.cpp's -kvu); kazeia runs several "
                        "sequences only this way")


def hide_option(p: argparse.ArgumentParser, dest: str) -> None:
    """Leave the option that sets `dest` out of the help (a tool that refuses it must not list it)."""
    for action in p._actions:
        if action.dest == dest:
            action.help = argparse.SUPPRESS


def add_device_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("device")
    g.add_argument("-dev", "--device", type=V.device, default="CPU",
                   help="CPU, HTP0 (emulated Hexagon NPU) or REF (float64)")
    g.add_argument("--htp-profile", type=V.htp_profile, default=None,
                   help="HTP version profile: 2026-10 (default), robust or 2026-05; env KAZEIA_HTP_PROFILE")
    g.add_argument("--vtcm", type=V.vtcm_bytes, default=None, metavar="BYTES",
                   help="HTP VTCM size in bytes (default 8388608); env KAZEIA_HTP_VTCM")
    g.add_argument("--htp-arch", type=V.htp_arch, default=None, metavar="vNN",
                   help="the device's Hexagon arch, v68 .. v81 (default v79; `kazeia htp faults` lists what each "
                        "sets); env GGML_HEXAGON_ARCH")
    g.add_argument("--fault", type=V.fault(), action="append", default=[], metavar="NAME",
                   help="HTP fault injection (repeatable): see `kazeia htp faults`")
    g.add_argument("--cpu-ops", type=V.op_names, default=None, metavar="OPS",
                   help="run these ops on the CPU (MUL_MAT,ROPE,...)")
    g.add_argument("--cpu-nodes", type=V.regex, default=None, metavar="REGEX",
                   help="run nodes whose name matches on the CPU")
    # hidden (for `kazeia bisect ops`): graph node index ranges "A:B,C,D:" run on the CPU; the default comes from
    # the environment so that a bisect --check command running `kazeia run` follows each step's routing
    g.add_argument("--cpu-node-range", type=V.node_ranges, default=settings.get().cpu_node_range,
                   help=argparse.SUPPRESS)
    g.add_argument("--gate", type=V.gate, action="append", default=[], metavar="GATE",
                   help="routing gate (repeatable): 'vtcm-plan' keeps on the CPU every MUL_MAT whose HMX VTCM plan "
                        "would overflow; 'weight=REGEX,m=LO-HI' routes those weights at those M to the CPU")
    g.add_argument("--sync", action="store_true",
                   help="one op per batch, waited on (GGML_HEXAGON_OPBATCH=1 GGML_HEXAGON_OPQUEUE=1)")
    d = p.add_argument_group("op trace")
    d.add_argument("--oplog", action="store_true",
                   help="kazeia's trace: a KZOP line per op when it has COMPLETED on its device, NaN-aware statistics "
                        "of what it consumed and produced (the original team's enqueue-time log is "
                        "GGML_HEXAGON_OPLOG=1|2 on -dev HTP0)")
    d.add_argument("--oplog-file", type=V.output_file, default=None, metavar="FILE",
                   help="also write the trace as JSONL here")
    d.add_argument("--stop-on-nonfinite", action="store_true",
                   help="stop at the first op whose output holds NaN, or an infinity none of its sources held "
                        "(a mask's -inf copied on is not one), and name it")
    from kazeia.cli.routing import add_routing_args

    add_routing_args(p)
    from kazeia.debug.dump import add_dump_args

    add_dump_args(p, dump_action=V.RegexAndDir, limit_type=V.integer(0))


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks on errors")
    if "-m" in p._option_string_actions and "--temp" not in p._option_string_actions:
        add_ignored_sampling(p)


def add_ignored_sampling(p: argparse.ArgumentParser) -> None:
    """llama-cli's sampling flags on a tool that decodes greedily (the scenarios the tools print carry `--temp 0`):
    checked as `kazeia run` checks them, then ignored."""
    g = p.add_argument_group("sampling (accepted as llama-cli takes them and ignored: this tool decodes greedily)")
    g.add_argument("--temp", "--temperature", dest="ignored_temp", type=V.temperature, default=None, metavar="T")
    g.add_argument("--top-k", dest="ignored_top_k", type=V.integer(None), default=None, metavar="N")
    g.add_argument("--top-p", dest="ignored_top_p", type=V.probability, default=None, metavar="P")
    g.add_argument("--min-p", dest="ignored_min_p", type=V.probability, default=None, metavar="P")
    g.add_argument("-s", "--seed", dest="ignored_seed", type=V.seed, default=None, metavar="SEED")


def spec_from_args(args: argparse.Namespace, device: str | None = None) -> RunSpec:
    """The RunSpec of every model, device and routing flag, with the meaning `kazeia run` gives it: the one
    mapping from flags to a run, which `kazeia run` and every forensic tool use (a tool refuses the flags it does
    not honour itself). `--gates auto` is resolved by `open_session` (it validates on the device)."""
    g = lambda name, default=None: getattr(args, name, default)  # noqa: E731 - tools define subsets of the flags
    n_prompt = g("n_prompt")
    if n_prompt is not None and n_prompt <= 0:
        raise KazeiaError("--n-prompt must be positive")
    policy = g("gates")
    n_predict = g("n_predict", 0) or 0
    n_seq = g("parallel", 1) or 1
    if n_seq > 1 and not g("kv_unified", False):
        raise KazeiaError(f"-np {n_seq}: kazeia runs several sequences in one unified KV cache only; add -kvu "
                          f"(llama.cpp's default, a KV stream per sequence, is not modelled)")
    return RunSpec(model=g("model"), prompt=prompt_text(args), n_prompt=n_prompt, device=(device or g("device", "CPU")),
                   htp_profile=g("htp_profile"), vtcm=g("vtcm"), faults=list(g("fault") or []),
                   env=_htp_env(args), cpu_ops=g("cpu_ops"), cpu_nodes=g("cpu_nodes"),
                   cpu_node_range=g("cpu_node_range"), gates=list(g("gate") or []),
                   policy=None if policy in (None, "auto") else policy, ubatch=g("ubatch_size", 512),
                   ctx=g("ctx_size", 4096), flash_attn=g("flash_attn", "on") != "off",
                   n_predict=max(0, n_predict), stop_after=g("stop_after"), n_gpu_layers=g("n_gpu_layers"),
                   type_k=g("cache_type_k", "f16"), type_v=g("cache_type_v", "f16"), recover=g("recover", False),
                   max_deaths=g("max_deaths", 12), n_seq=n_seq)


def _htp_env(args: argparse.Namespace) -> dict[str, str]:
    """The GGML_HEXAGON_* switches the flags stand for: --sync (OPBATCH=1 OPQUEUE=1), --htp-arch (ARCH)."""
    env = dict(SYNC_ENV) if getattr(args, "sync", False) else {}
    if getattr(args, "htp_arch", None):
        env["GGML_HEXAGON_ARCH"] = args.htp_arch
    return env


RUN_ONLY = ("oplog", "oplog_file", "stop_on_nonfinite", "dump", "inject_death_at", "inject_death_rate")


def tool_spec(args: argparse.Namespace, tool: str, refuse: tuple[str, ...] = RUN_ONLY) -> RunSpec:
    """`spec_from_args` for a forensic tool: -t set, --gates auto resolved to the validated policy file, and the
    flags only `kazeia run` honours refused with one line (accepted and ignored, they would mislead)."""
    set_threads(getattr(args, "threads", None))
    for flag in refuse:
        if getattr(args, flag, None):
            raise KazeiaError(f"--{flag.replace('_', '-')} belongs to kazeia run / kazeia trace, not {tool}")
    spec = spec_from_args(args)
    if getattr(args, "gates", None) == "auto":
        spec.policy = auto_policy_file(spec)
    return spec


def auto_policy_file(spec: RunSpec) -> str:
    """The policy file `kazeia gate --auto` validated (or had cached) for this model and device settings."""
    from kazeia.cli.routing import gate_summary, progress_bar
    from kazeia.debug.gate.auto import auto_policy

    settings = spec.htp_settings()
    if settings is None:
        raise KazeiaError("--gates auto: validates for a device (-dev HTP0)")
    res = auto_policy(spec.model_path, settings, spec.ubatch, progress=progress_bar)
    print(gate_summary(res), file=sys.stderr, flush=True)
    if not os.path.isfile(res.cache_path):
        raise KazeiaError(f"--gates auto: the validated policy could not be kept at {res.cache_path}; write it with "
                          f"`kazeia gate --auto -o FILE` and pass --gates FILE")
    return res.cache_path


def device_options(args: argparse.Namespace) -> DeviceOptions:
    """The device settings of the flags (`kazeia gate` validates on them)."""
    return spec_from_args(args).device_options()


def model_path(args: argparse.Namespace) -> str:
    return RunSpec(model=getattr(args, "model", None)).model_path


def open_session(args: argparse.Namespace, model: Model | None = None, device: str | None = None) -> Session:
    """The session of `kazeia run` (and trace, bench): the spec of the flags, then what only a command line
    adds: -t, kazeia's op trace (--oplog), dumps, --gates auto and injected deaths."""
    set_threads(getattr(args, "threads", None))
    spec = spec_from_args(args, device)
    s = Session.open(spec, model or Model.load(spec.model_path), WeightCache())
    trace = make_trace(args)
    if trace is not None:
        s.scheduler.add_hook(trace)
    from kazeia.debug.dump import install_dump

    install_dump(args, s.scheduler)
    from kazeia.cli.routing import install_routing

    install_routing(args, s, spec.model_path)
    return s


def prompt_tokens(args: argparse.Namespace, s: Session) -> list[int]:
    if s.spec.n_prompt is None and not s.spec.prompt:
        raise KazeiaError("nothing to do: give -p PROMPT, -f FILE, --n-prompt N, or -cnv for a chat")
    return s.prompt_ids()


def user_text(text: str | bytes | None, what: str) -> str | None:
    """Text a user typed or piped, decoded as llama-cli does (each byte that is not valid UTF-8 becomes U+FFFD),
    with one warning line saying how many bytes were replaced."""
    if text is None:
        return None
    clean, replaced = decode_text(text)
    if replaced:
        print(f"warning: {what} is not valid UTF-8: {replaced} byte(s) replaced by U+FFFD, as llama-cli does",
              file=sys.stderr)
    return clean


def prompt_text(args: argparse.Namespace) -> str | None:
    """-p, or the contents of -f FILE (llama-cli's order: -f replaces -p), read and decoded once and kept in
    args."""
    if getattr(args, "_prompt_text", None) is not None:
        return args._prompt_text
    path = getattr(args, "file", None)
    if path:
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_PROMPT_BYTES + 1)  # bounded: -f /dev/zero never ends
        except OSError as e:
            raise KazeiaError(f"-f {path}: {e.strerror}") from None
        if len(raw) > MAX_PROMPT_BYTES:
            raise KazeiaError(f"-f {path}: more than {MAX_PROMPT_BYTES >> 20} MiB of prompt (the prompt limit; no "
                              f"context holds that many tokens)")
        args._prompt_text = user_text(raw, f"-f {path}")
    else:
        args._prompt_text = user_text(getattr(args, "prompt", None), "-p")
    return args._prompt_text


def make_trace(args: argparse.Namespace):
    """kazeia's completion-time trace hook if --oplog, --oplog-file or --stop-on-nonfinite asks for it
    (GGML_HEXAGON_OPLOG is the HTP host's own log, backends/htp/host/oplog.py)."""
    from kazeia.debug.trace import TraceHook

    want = (getattr(args, "oplog", False) or getattr(args, "oplog_file", None)
            or getattr(args, "stop_on_nonfinite", False))
    if not want:
        return None
    from kazeia.outputs import StreamedFile

    jsonl = StreamedFile(args.oplog_file) if getattr(args, "oplog_file", None) else None
    show = getattr(args, "oplog", False)
    return TraceHook(sys.stderr if show else None, jsonl, getattr(args, "stop_on_nonfinite", False))

