"""Running one model/prompt/device configuration, in process or in a child process.

Every forensic tool needs "run this exact configuration and tell me what happened": a `RunSpec` says what
(model, prompt or --n-prompt, device, HTP profile and env switches, routing, micro-batch), `run` does it in
this process with optional hooks and returns a `RunResult` (logits, the device death if any, placements),
and `run_child` does the same in a fresh Python process (so a hang or a crash of the interpreter cannot
take the caller down) with a timeout. `RunSpec.argv()` is the equivalent `kazeia run` command line, which
reports print as the reproduction command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from kazeia.backends.weights import WeightCache
from kazeia.debug.prefix import PrefixScheduler, check_prefix_run, make_scheduler
from kazeia.engine.context import Context, Model
from kazeia.engine.default_model import default_model_path
from kazeia.engine.devices import DeviceOptions, make_backends
from kazeia.engine.generate import synthetic_prompt
from kazeia.engine.scheduler import Router
from kazeia.engine.tokenizer import GGUFTokenizer
from kazeia.errors import DeviceDeathError, DeviceOpError, KazeiaError
from kazeia.graph.tensor import GGMLType


@dataclass
class RunSpec:
    model: str | None = None
    prompt: str | None = None
    n_prompt: int | None = None
    tokens: list[int] | None = None  # explicit token ids (overrides prompt / n_prompt)
    device: str = "CPU"
    htp_profile: str | None = None
    vtcm: int | None = None
    faults: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # GGML_HEXAGON_* switches for the HTP
    cpu_ops: str | None = None
    cpu_nodes: str | None = None
    cpu_node_range: str | None = None  # graph node indices forced to the CPU ("A:B,C,D:"; all nodes counted)
    gates: list[str] = field(default_factory=list)  # routing gates (engine/gates.py: "vtcm-plan", ...)
    policy: str | None = None  # a gate policy file (docs/gate_policy.md; kazeia run --gates FILE)
    ubatch: int = 512
    ctx: int = 4096
    flash_attn: bool = True
    n_predict: int = 0  # greedy tokens to generate after the prompt
    stop_after: str | None = None  # a prefix run: each graph only through this node (debug/prefix.py; no logits)

    @property
    def model_path(self) -> str:
        return self.model or default_model_path()

    def htp_settings(self):
        """The HtpSettings an HTP0 run of this spec uses (HtpBackend.from_options on the same options), or None
        for another device."""
        if self.device.upper() not in ("HTP0", "HTP"):
            return None
        from kazeia.backends.htp.settings import HtpSettings

        return HtpSettings.from_options(self.device_options())

    def device_options(self) -> DeviceOptions:
        return DeviceOptions(htp_profile=self.htp_profile, vtcm_bytes=self.vtcm, htp_env=dict(self.env),
                             fault=list(self.faults))

    def with_(self, **kw) -> RunSpec:
        d = asdict(self)
        d.update(kw)
        return RunSpec(**d)

    def argv(self) -> list[str]:
        """The equivalent `kazeia run` command line (env switches go in front as VAR=value)."""
        a = [f"{k}={v}" for k, v in sorted(self.env.items())] + ["kazeia", "run"]
        if self.model:
            a += ["-m", self.model]
        if self.tokens is None and self.n_prompt is not None:
            a += ["--n-prompt", str(self.n_prompt)]
        elif self.tokens is None and self.prompt is not None:
            a += ["-p", self.prompt]
        a += ["-dev", self.device]
        if self.htp_profile:
            a += ["--htp-profile", self.htp_profile]
        if self.vtcm:
            a += ["--vtcm", str(self.vtcm)]
        for f in self.faults:
            a += ["--fault", f]
        if self.cpu_ops:
            a += ["--cpu-ops", self.cpu_ops]
        if self.cpu_nodes:
            a += ["--cpu-nodes", self.cpu_nodes]
        if self.cpu_node_range:
            a += ["--cpu-node-range", self.cpu_node_range]
        for g in self.gates:
            a += ["--gate", g]
        if self.policy:
            a += ["--gates", self.policy]
        if self.ubatch != 512:
            a += ["-ub", str(self.ubatch)]
        if self.ctx != 4096:
            a += ["-c", str(self.ctx)]
        if not self.flash_attn:
            a += ["-fa", "off"]
        if self.stop_after:
            a += ["--stop-after", self.stop_after]
        a += ["-n", str(self.n_predict), "--temp", "0"]
        return a

    def command(self) -> str:
        import shlex

        return " ".join(shlex.quote(x) for x in self.argv())


@dataclass
class RunResult:
    ok: bool
    seconds: float = 0.0
    n_prompt: int = 0
    logits: np.ndarray | None = None  # last micro-batch's logits, rows per `all_logits` (None for a prefix run)
    stop_output: np.ndarray | None = None  # a prefix run: the stop node's output in the last micro-batch
    tokens: list[int] = field(default_factory=list)
    death: dict | None = None  # DeviceDeathError fields: message, code, last_enqueued, faulting, cause, kind
    error: str | None = None  # any other error (op status, bad input)
    placements: list[dict] = field(default_factory=list)
    dsp_log: list[str] = field(default_factory=list)
    killed: str | None = None  # the child died of something else than the run: 'killed by SIGKILL', 'out of memory'

    @property
    def output(self) -> np.ndarray | None:
        """What a judge compares: the stop node's output of a prefix run, else the logits."""
        return self.stop_output if self.stop_output is not None else self.logits

    @property
    def failed(self) -> bool:
        return not self.ok

    def signature(self) -> str:
        """What a person would see: the host error line, or 'ok'."""
        if self.death:
            return self.death["message"]
        return self.error or "ok"


_MODELS: dict[str, Model] = {}
_CPU_CACHE: WeightCache | None = None
_TOKENIZERS: dict[int, tuple] = {}  # id(model.file) -> (the file, its tokenizer)


_THREADS: int | None = None  # this process's -t: every child process a forensic tool starts gets the same


def set_threads(n: int) -> None:
    """The -t flag, for this process and for the child processes the forensic tools start (kernels are bitwise
    reproducible at a fixed thread count, so a child must not pick its own)."""
    global _THREADS
    from kazeia.engine.threads import set_threads as set_engine_threads

    set_engine_threads(n)
    _THREADS = n


def child_threads(share: int = 1) -> int | None:
    """The -t a child process gets (None: this process was given none); `share`: children running at once."""
    return None if _THREADS is None else max(1, _THREADS // max(1, share))


def apply_threads(job: dict) -> None:
    """In a child: the thread count its parent put in the job."""
    if job.get("threads"):
        set_threads(int(job["threads"]))


def shared_cache() -> WeightCache:
    """One dequantized-weight cache per process: forensic tools build many contexts on one model."""
    global _CPU_CACHE
    if _CPU_CACHE is None:
        _CPU_CACHE = WeightCache()
    return _CPU_CACHE


def load_model(path: str) -> Model:
    """Models are cached per process: forensic tools run the same file many times."""
    key = os.path.realpath(path)
    if key not in _MODELS:
        _MODELS[key] = Model.load(path)
    return _MODELS[key]


def tokenizer(model: Model) -> GGUFTokenizer:
    """The model's tokenizer, read once per loaded model (a forensic tool runs the same prompt many times)."""
    key = id(model.file)
    if key not in _TOKENIZERS or _TOKENIZERS[key][0] is not model.file:
        _TOKENIZERS[key] = (model.file, GGUFTokenizer.from_gguf(model.file))
    return _TOKENIZERS[key][1]


def prompt_ids(spec: RunSpec, model: Model, tok: GGUFTokenizer | None = None) -> list[int]:
    if spec.tokens is not None:
        return list(spec.tokens)
    if spec.n_prompt is not None:
        tok = tok or tokenizer(model)
        return synthetic_prompt(spec.n_prompt, model.args.n_vocab, tok.is_control)
    if spec.prompt:
        tok = tok or tokenizer(model)
        return tok.encode(spec.prompt)
    raise KazeiaError("the run needs a prompt, --n-prompt or tokens")


def build_context(spec: RunSpec, model: Model | None = None, cache: WeightCache | None = None) -> Context:
    model = model or load_model(spec.model_path)
    backends = make_backends(spec.device, spec.device_options(), cache if cache is not None else shared_cache())
    router = Router.from_args(spec.cpu_ops, spec.cpu_nodes, spec.cpu_node_range)
    router.gates += gates_for(spec.gates, backends)
    policy = None
    if spec.policy:
        from kazeia.engine.policy import Policy, PolicyGate

        policy = Policy.load(spec.policy)
        router.gates.append(PolicyGate(policy))
    sched = make_scheduler(backends, router, spec.stop_after)
    n_ctx = min(spec.ctx, model.args.n_ctx_train)
    ctx = Context(model, sched, n_ctx=n_ctx, n_ubatch=spec.ubatch, flash_attn=spec.flash_attn,
                  type_k=GGMLType.F16, type_v=GGMLType.F16)
    ctx.policy = policy  # its split rules cut micro-batches
    return ctx


def close_backends(ctx: Context) -> None:
    """Release every backend of a context built for one run (HTP sessions, per-run state)."""
    for b in ctx.scheduler.backends:
        b.close()


def gates_for(names: list[str], backends) -> list:
    """Gate objects for --gate names, using the HTP backend's VTCM size and profile when there is one."""
    from kazeia.backends.htp.settings import HtpSettings
    from kazeia.engine.gates import parse_gate

    htp = next((b for b in backends if isinstance(getattr(b, "settings", None), HtpSettings)), None)
    return [parse_gate(g, htp.settings if htp else HtpSettings()) for g in names]


def run(spec: RunSpec, hooks=(), all_logits: bool = False, ctx: Context | None = None) -> RunResult:
    """Prefill the prompt (and greedily decode n_predict tokens) in this process."""
    ctx = ctx or build_context(spec)
    for h in hooks:
        ctx.scheduler.add_hook(h)
    ids = prompt_ids(spec, ctx.model)
    check_prefix_run(spec.stop_after, spec.n_predict)
    res = RunResult(ok=False, n_prompt=len(ids))
    t0 = time.perf_counter()
    try:
        logits = ctx.decode(ids, all_logits=all_logits)
        if isinstance(ctx.scheduler, PrefixScheduler):
            res.stop_output, logits = ctx.scheduler.output, None
        res.logits = logits
        for _ in range(spec.n_predict):
            tid = int(np.argmax(logits[-1]))
            res.tokens.append(tid)
            logits = ctx.decode([tid])
        res.ok = True
    except DeviceDeathError as e:
        res.death = {**e.to_dict(), "batch": getattr(e, "batch_seq", None), "batch_ops": getattr(e, "batch_ops", None)}
    except DeviceOpError as e:
        res.error = str(e)
    finally:
        res.seconds = time.perf_counter() - t0
        for h in hooks:
            ctx.scheduler.remove_hook(h)
    res.placements = [asdict(p) for p in ctx.scheduler.placements]
    for b in ctx.scheduler.backends:
        if hasattr(b, "dsp_log"):
            res.dsp_log = b.dsp_log()
    return res


# signals that come from outside the program: the kernel's out-of-memory killer sends SIGKILL
EXTERNAL_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                              signal.SIGXCPU})


def external_kill(returncode: int | None, output: str = "") -> str | None:
    """Why a child died of something other than itself ('killed by SIGKILL', 'out of memory'), or None. A shell
    reports a child killed by signal N as exit status 128+N."""
    if returncode is not None and returncode != 0:
        n = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 160 else None
        if n is not None and n in {int(s) for s in EXTERNAL_SIGNALS}:
            return f"killed by {signal.Signals(n).name}"
    if "MemoryError" in output or "Cannot allocate memory" in output or "std::bad_alloc" in output:
        return "out of memory"
    return None


def run_child(spec: RunSpec, timeout: float = 600.0, all_logits: bool = False) -> RunResult:
    """`run` in a fresh Python process; a timeout or an interpreter crash becomes a failed RunResult."""
    with tempfile.TemporaryDirectory(prefix="kazeia-child-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        out_path = os.path.join(tmp, "result.json")
        with open(spec_path, "w") as f:
            json.dump({"spec": asdict(spec), "all_logits": all_logits, "out": out_path, "threads": child_threads()}, f)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "kazeia.debug.child", spec_path], capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return RunResult(ok=False, seconds=time.perf_counter() - t0,
                             error=f"child timed out after {timeout:.0f} s (hang)")
        if not os.path.exists(out_path):
            tail = (proc.stderr or "").strip().splitlines()[-3:]
            return RunResult(ok=False, seconds=time.perf_counter() - t0, killed=external_kill(proc.returncode,
                                                                                              proc.stderr or ""),
                             error=f"child exited with status {proc.returncode}: {' | '.join(tail)}")
        with open(out_path) as f:
            d = json.load(f)
        arrays = {k: np.load(path) if (path := d.pop(f"{k}_path", None)) else None for k in ("logits", "stop_output")}
        return RunResult(**arrays, **d)
