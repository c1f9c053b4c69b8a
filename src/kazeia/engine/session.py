"""A configured run: `RunSpec` (everything the command line says about one run), the per-process model and
tokenizer caches, and `Session.open(spec)`, which `kazeia run` and every forensic tool use to build the same thing
from the same flags (cli/common.py `spec_from_args` maps them).

A session is a model, its tokenizer and a context: backends for the device (`-dev`, the HTP settings and fault
injections), a router (--cpu-ops, --cpu-nodes, --cpu-node-range, -ngl, --gate rules, a --gates policy file), a
scheduler (a prefix scheduler for --stop-after), the KV cache (-c, -ctk, -ctv) and the micro-batch (-ub), and
with --recover a recovery that outlives device deaths. `RunSpec.argv()` is the equivalent `kazeia run` command
line, which reports print as the reproduction command.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from kazeia.backends.devices import DeviceOptions, device_settings, llama_graph, make_backends
from kazeia.backends.ref import WeightCache
from kazeia.engine import gc_policy
from kazeia.engine.context import Context, Model
from kazeia.engine.default_model import default_model_path
from kazeia.engine.generate import synthetic_prompt
from kazeia.engine.prefix import make_scheduler
from kazeia.engine.scheduler import Router
from kazeia.engine.tokenizer import GGUFTokenizer
from kazeia.errors import ContextOverflowError, KazeiaError
from kazeia.graph.tensor import GGMLType

SYNC_ENV = {"GGML_HEXAGON_OPBATCH": "1", "GGML_HEXAGON_OPQUEUE": "1"}  # --sync: one op per batch, waited on
KV_TYPES = {"f16": GGMLType.F16, "f32": GGMLType.F32, "q8_0": GGMLType.Q8_0}  # -ctk / -ctv
LLAMA_GRAPHS = ("2026-05", "2026-10")  # the llama.cpp graphs kazeia builds (RunSpec.graph)
KQ_MASK_CAST_GRAPHS = ("2026-05",)     # May's llama.cpp: an F32 KQ mask and its F16 cast (before #23764)


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
    ctx: int = 4096  # -c; 0: the model's training context
    flash_attn: bool = True
    n_predict: int = 0  # greedy tokens to generate after the prompt
    stop_after: str | None = None  # a prefix run: each graph only through this node (engine/prefix.py; no logits)
    n_gpu_layers: int | None = None  # -ngl: the last N layers on the device (None: all)
    type_k: str = "f16"  # -ctk
    type_v: str = "f16"  # -ctv
    recover: bool = False  # --recover: survive device deaths (engine/recovery.py)
    max_deaths: int = 12
    n_seq: int = 1  # -np: sequences run side by side (bench, trace), in one unified KV cache (-kvu)
    graph: str | None = None  # the llama.cpp graph: "2026-05" or "2026-10"; None: the profile's (graph_generation)

    @property
    def model_path(self) -> str:
        return self.model or default_model_path()

    @property
    def sync(self) -> bool:
        return all(self.env.get(k) == v for k, v in SYNC_ENV.items())

    def htp_settings(self):
        """The HtpSettings an HTP0 run of this spec uses (HtpBackend.from_options on the same options), or None
        for another device (the registry's settings of the device)."""
        return device_settings(self.device, self.device_options())

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
        for flag, value in (("--htp-profile", self.htp_profile), ("--vtcm", self.vtcm),
                            ("--cpu-ops", self.cpu_ops), ("--cpu-nodes", self.cpu_nodes),
                            ("--cpu-node-range", self.cpu_node_range), ("--gates", self.policy),
                            ("-ngl", self.n_gpu_layers), ("--stop-after", self.stop_after)):
            if value is not None and value != "":
                a += [flag, str(value)]
        for f in self.faults:
            a += ["--fault", f]
        for g in self.gates:
            a += ["--gate", g]
        for flag, value, default in (("-ub", self.ubatch, 512), ("-c", self.ctx, 4096), ("-ctk", self.type_k, "f16"),
                                     ("-ctv", self.type_v, "f16")):
            if value != default:
                a += [flag, str(value)]
        if not self.flash_attn:
            a += ["-fa", "off"]
        if self.recover:
            a += ["--recover"] + (["--max-deaths", str(self.max_deaths)] if self.max_deaths != 12 else [])
        a += ["-n", str(self.n_predict), "--temp", "0"]
        return a

    def command(self) -> str:
        import shlex

        return " ".join(shlex.quote(x) for x in self.argv())


# --- per-process caches: forensic tools run the same file, prompt and device many times -----------------------

_MODELS: dict[str, Model] = {}
_TOKENIZERS: dict[str, tuple] = {}  # model path -> (the file, its tokenizer)
_CPU_CACHE: WeightCache | None = None


def shared_cache() -> WeightCache:
    """One dequantized-weight cache per process (the float64 oracle's): forensic tools build many contexts on one
    model."""
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
    hit = _TOKENIZERS.get(model.path)
    if hit is None or hit[0] is not model.file:
        hit = _TOKENIZERS[model.path] = (model.file, GGUFTokenizer.from_gguf(model.file))
    return hit[1]


def prompt_ids(spec: RunSpec, model: Model, tok: GGUFTokenizer | None = None) -> list[int]:
    if spec.tokens is not None:
        return list(spec.tokens)
    n_ctx = n_ctx_for(spec, model)
    if spec.n_prompt is not None:
        if spec.n_prompt <= 0:
            raise KazeiaError("--n-prompt must be positive")
        if spec.n_prompt > n_ctx:  # refused before the tokens are drawn (10^8 of them took 3.8 GB)
            raise ContextOverflowError(f"--n-prompt {spec.n_prompt} does not fit in the context of {n_ctx} tokens "
                                       f"(raise -c, up to the model's {model.args.n_ctx_train})")
        tok = tok or tokenizer(model)
        return synthetic_prompt(spec.n_prompt, model.args.n_vocab, tok.is_control)
    if spec.prompt:
        tok = tok or tokenizer(model)
        _check_prompt_size(spec.prompt, n_ctx, tok)
        ids = tok.encode(spec.prompt)
        if not ids:
            raise KazeiaError("the prompt encodes to no tokens")
        return ids
    raise KazeiaError("the run needs a prompt, --n-prompt or tokens")


def check_generation(n_prompt: int, n_predict: int, n_ctx: int) -> None:
    """Refuse up front a greedy generation the context cannot hold (the tools decode each of the n_predict
    tokens, so prompt + n_predict positions), instead of failing at the context's end minutes later."""
    if n_predict > 0 and n_prompt + n_predict > n_ctx:
        raise ContextOverflowError(f"-n {n_predict} cannot finish: {n_prompt} prompt tokens and {n_predict} generated "
                                   f"ones need {n_prompt + n_predict} positions, the context holds {n_ctx} (raise -c "
                                   f"or lower -n to {max(n_ctx - n_prompt, 0)})")


def _check_prompt_size(text: str, n_ctx: int, tok: GGUFTokenizer) -> None:
    """A prompt longer than n_ctx times the longest token cannot fit however it tokenizes: refused before the
    tokenizer spends memory on it (a 50 MB prompt took 5.8 GB)."""
    longest = max(tok.longest_token_bytes, 1)
    n_bytes = len(text.encode("utf-8", "replace"))
    if n_bytes > n_ctx * longest:
        raise ContextOverflowError(f"a prompt of {n_bytes} bytes cannot fit in the context of {n_ctx} tokens (the "
                                   f"longest token holds {longest} bytes); raise -c or shorten the prompt")


# --- building a run ------------------------------------------------------------------------------------------


CTX_PAD = 256  # llama_context pads n_ctx to 256 cells (llama-context.cpp, #17046)


def n_ctx_for(spec: RunSpec, model: Model) -> int:
    """-c: the context size, at most the training context (0: the training context, llama-cli's meaning), padded
    to 256 cells as llama_context pads it (so a model trained on 128 tokens gets 256 cells, as in llama.cpp)."""
    n = min(spec.ctx, model.args.n_ctx_train) if spec.ctx > 0 else model.args.n_ctx_train
    return -(-n // CTX_PAD) * CTX_PAD


def kv_type(name: str, flag: str) -> GGMLType:
    try:
        return KV_TYPES[name.lower()]
    except (KeyError, AttributeError):
        raise KazeiaError(f"{flag} {name}: the KV cache types here are {', '.join(KV_TYPES)}") from None


def build_context(spec: RunSpec, model: Model | None = None, cache: WeightCache | None = None) -> Context:
    """The context of a run: backends, router, scheduler and KV cache as the spec says (no tokenizer)."""
    model = model or load_model(spec.model_path)
    backends = make_backends(spec.device, spec.device_options(), cache if cache is not None else shared_cache())
    router = Router.from_args(spec.cpu_ops, spec.cpu_nodes, spec.cpu_node_range)
    router.gates += gates_for(spec.gates, backends)
    ngl = spec.n_gpu_layers
    if ngl is not None and 0 <= ngl <= model.args.n_layer:  # more than the layer count (99): all on the device
        router.n_gpu_layers, router.n_layer = ngl, model.args.n_layer
    type_k, type_v = kv_type(spec.type_k, "-ctk"), kv_type(spec.type_v, "-ctv")
    if type_v == GGMLType.Q8_0 and not spec.flash_attn:  # llama_init_from_model refuses it the same way
        raise KazeiaError("-ctv q8_0: V cache quantization requires flash attention (-fa on)")
    sched = make_scheduler(backends, router, spec.stop_after)
    ctx = Context(model, sched, n_ctx=n_ctx_for(spec, model), n_ubatch=spec.ubatch, flash_attn=spec.flash_attn,
                  type_k=type_k, type_v=type_v, n_seq=spec.n_seq,
                  kq_mask_cast=graph_generation(spec) in KQ_MASK_CAST_GRAPHS)
    if spec.policy:
        from kazeia.engine.policy import Policy

        apply_policy(ctx, Policy.load(spec.policy))
    if spec.recover:
        from kazeia.engine.recovery import Recovery

        ctx.recovery = Recovery(sched, max_attempts=spec.max_deaths)  # its rules route through its own gate
    return ctx


def graph_generation(spec: RunSpec) -> str:
    """Which llama.cpp graph the run builds: `spec.graph` when pinned, else "2026-05" (the May graph: an F32 KQ mask
    and its F16 cast, before #23764) for the 2026-05 profile, the llama.cpp the original team ran, and today's
    ("2026-10") for every other profile (robust is May's backend with its defects fixed, not May's llama.cpp),
    whatever the device. A reference run (CPU, REF) of an HTP run pins it, so the two name their nodes alike."""
    if spec.graph is not None:
        if spec.graph not in LLAMA_GRAPHS:
            raise KazeiaError(f"unknown llama.cpp graph {spec.graph!r} ({' or '.join(LLAMA_GRAPHS)})")
        return spec.graph
    return llama_graph(spec.device_options())


def reference_spec(spec: RunSpec, **kw) -> RunSpec:
    """`spec` with `kw` changed (another device, no profile or faults...), on the same llama.cpp graph."""
    return spec.with_(graph=graph_generation(spec), **kw)


def apply_policy(ctx: Context, policy) -> None:
    """A gate policy (engine/policy.py) on a context: its gate after the others, its split rules cutting
    micro-batches."""
    from kazeia.engine.policy import PolicyGate

    ctx.scheduler.router.gates.append(PolicyGate(policy))
    ctx.policy = policy


def gates_for(names: list[str], backends) -> list:
    """Gate objects for --gate names; a device's gate (vtcm-plan) is made by the run's backend that has it, under
    that backend's own settings, and left out when no backend of the run has it."""
    if not names:
        return []
    from kazeia.engine.gates import parse_gate

    return [g for g in (parse_gate(name, backends) for name in names) if g is not None]


def close_backends(ctx: Context) -> None:
    """Release every backend of a context built for one run (HTP sessions, per-run state)."""
    for b in ctx.scheduler.backends:
        b.close()


@dataclass
class Session:
    """A model, its tokenizer and a context built from one RunSpec."""

    model: Model
    tok: GGUFTokenizer
    ctx: Context
    spec: RunSpec
    injector: object | None = None  # --inject-death-*: engine/recovery.py DeathInjector

    @property
    def scheduler(self):
        return self.ctx.scheduler

    @classmethod
    def open(cls, spec: RunSpec, model: Model | None = None, cache: WeightCache | None = None) -> Session:
        model = model or load_model(spec.model_path)
        s = cls(model, tokenizer(model), build_context(spec, model, cache), spec)
        gc_policy.hold()  # released by close
        return s

    def prompt_ids(self) -> list[int]:
        return prompt_ids(self.spec, self.model, self.tok)

    def close(self) -> None:
        close_backends(self.ctx)
        gc_policy.release()
