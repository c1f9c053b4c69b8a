"""What every architecture shares: hyperparameters from GGUF keys, the weight table, the registry."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from types import ModuleType

from kazeia.errors import GGUFError, UnsupportedError
from kazeia.gguf.reader import GGUFFile
from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, Tensor, TFlag

ARCHITECTURES = {"llama": "kazeia.models.llama", "qwen2": "kazeia.models.qwen2", "qwen3": "kazeia.models.qwen3",
                 "qwen35": "kazeia.models.qwen35", "phi3": "kazeia.models.phi3", "gemma3": "kazeia.models.gemma3",
                 "lfm2": "kazeia.models.lfm2"}


@dataclass(frozen=True)
class ModelArgs:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int  # key/value length per head
    n_rot: int
    n_vocab: int
    n_ctx_train: int
    rope_freq_base: float
    rope_freq_scale: float
    rms_eps: float
    tied_embeddings: bool

    @property
    def n_embd_q(self) -> int:
        return self.n_head * self.head_dim

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.head_dim

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> ModelArgs:
        arch = f.architecture

        def key(k: str, default=None, required: bool = True, kind: type = int):
            full = f"{arch}.{k}"
            if full not in f.metadata:
                if required and default is None:
                    raise GGUFError(f.path, f"missing required key '{full}'")
                return default
            v = f.metadata[full]
            # a corrupt or foreign file may hold a string, an array or a bool where a number belongs
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if kind is int:
                ok = ok and float(v).is_integer()
            if not ok:
                raise GGUFError(f.path, f"key '{full}' has a bad value {str(v)[:40]!r} "
                                        f"(expected {'an integer' if kind is int else 'a number'})")
            return kind(v)

        n_embd = key("embedding_length")
        n_head = key("attention.head_count")
        if n_head <= 0 or n_embd <= 0:
            raise GGUFError(f.path, "embedding_length and attention.head_count must be positive")
        head_dim = key("attention.key_length", n_embd // n_head, required=False)
        kv_key = f"{arch}.attention.head_count_kv"
        if isinstance(f.metadata.get(kv_key), list):  # per layer (LFM2: 0 marks a layer without attention)
            n_head_kv = max(layer_head_counts(f, kv_key), default=0)
        else:
            n_head_kv = key("attention.head_count_kv", n_head, required=False)
        if n_head_kv <= 0 or n_head % n_head_kv:
            raise GGUFError(f.path, f"head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
        vocab = f.get("tokenizer.ggml.tokens")
        emb = f.tensors.get("token_embd.weight")
        if emb is None:
            raise GGUFError(f.path, "missing tensor 'token_embd.weight'")
        n_tok = len(vocab) if isinstance(vocab, list) and vocab else emb.ne[1]
        n_vocab = key("vocab_size", n_tok, required=False)
        scaling = f.metadata.get(f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise UnsupportedError(f"{f.path}: rope scaling '{str(scaling)[:40]}' is not supported")
        factor = key("rope.scaling.factor", 1.0, required=False, kind=float) if scaling == "linear" else 1.0
        args = cls(
            arch=arch,
            n_layer=key("block_count"),
            n_embd=n_embd,
            n_ff=key("feed_forward_length"),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_rot=key("rope.dimension_count", head_dim, required=False),
            n_vocab=n_vocab,
            n_ctx_train=key("context_length"),
            rope_freq_base=key("rope.freq_base", 10000.0, required=False, kind=float),
            rope_freq_scale=1.0 / factor if factor > 0 else 0.0,
            rms_eps=key("attention.layer_norm_rms_epsilon", kind=float),
            tied_embeddings="output.weight" not in f.tensors,
        )
        if args.n_layer <= 0 or args.n_layer > 1024:
            raise GGUFError(f.path, f"absurd block_count {args.n_layer}")
        for name in ("n_ff", "head_dim", "n_vocab", "n_ctx_train"):
            if getattr(args, name) <= 0:
                raise GGUFError(f.path, f"{name} {getattr(args, name)} must be positive")
        if args.head_dim % 2 or args.n_rot <= 0 or args.n_rot % 2 or args.n_rot > args.head_dim:
            raise GGUFError(f.path, f"rope dimension count {args.n_rot} does not fit head size {args.head_dim}")
        if args.rope_freq_base <= 0 or args.rope_freq_scale <= 0 or args.rms_eps < 0:
            raise GGUFError(f.path, "rope.freq_base, rope.scaling.factor and the RMS epsilon must be positive")
        return args


def layer_head_counts(f: GGUFFile, key: str) -> list[int]:
    """A per-layer head-count array (non-negative integers, one per block)."""
    v, n = f.metadata[key], f.metadata.get(f"{f.architecture}.block_count")
    if not isinstance(n, int) or len(v) < n or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 20 for x in v[:n]):
        raise GGUFError(f.path, f"key '{key}' must hold a non-negative head count for each of the {n} blocks")
    return list(v[:n])


def expected_shapes(a: ModelArgs) -> dict[str, tuple[int, ...]]:
    """ggml shapes (ne) of every tensor the llama/qwen3 graphs may use, as llama.cpp's loader checks them."""
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (a.n_embd, a.n_vocab),
        "output_norm.weight": (a.n_embd,),
        "output.weight": (a.n_embd, a.n_vocab),
    }
    for il in range(a.n_layer):
        p = f"blk.{il}."
        shapes.update({
            p + "attn_norm.weight": (a.n_embd,),
            p + "attn_q.weight": (a.n_embd, a.n_embd_q),
            p + "attn_k.weight": (a.n_embd, a.n_embd_kv),
            p + "attn_v.weight": (a.n_embd, a.n_embd_kv),
            p + "attn_q.bias": (a.n_embd_q,),
            p + "attn_k.bias": (a.n_embd_kv,),
            p + "attn_v.bias": (a.n_embd_kv,),
            p + "attn_q_norm.weight": (a.head_dim,),
            p + "attn_k_norm.weight": (a.head_dim,),
            p + "attn_output.weight": (a.n_embd_q, a.n_embd),
            p + "attn_output.bias": (a.n_embd,),
            p + "ffn_norm.weight": (a.n_embd,),
            p + "ffn_gate.weight": (a.n_embd, a.n_ff),
            p + "ffn_up.weight": (a.n_embd, a.n_ff),
            p + "ffn_down.weight": (a.n_ff, a.n_embd),
        })
    return shapes


def model_args(f: GGUFFile) -> ModelArgs:
    """The hyperparameters of f's model: an architecture file with keys of its own extends ModelArgs (`Args`)."""
    return getattr(arch_module(f.architecture, f.path), "Args", ModelArgs).from_gguf(f)


def arch_expected_shapes(a: ModelArgs) -> dict[str, tuple[int, ...]]:
    """expected_shapes, or the architecture file's own when its tensors differ (the hybrid's)."""
    return getattr(arch_module(a.arch), "expected_shapes", expected_shapes)(a)


def arch_module(arch: str, path: str | None = None) -> ModuleType:
    mod = ARCHITECTURES.get(arch)
    if mod is None:
        where = f"{path}: " if path else ""
        raise UnsupportedError(f"{where}unsupported architecture '{str(arch)[:40]}' "
                               f"(kazeia runs: {', '.join(ARCHITECTURES)})")
    return importlib.import_module(mod)


def weight_tensor(name: str, info) -> Tensor:
    """A GGUF tensor (its header entry) as a data-less weight of the file's type and shape, its layer from its name."""
    from kazeia.graph.tensor import make_tensor

    parts = name.split(".")
    layer = int(parts[1]) if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() else None
    return make_tensor(GGMLType(info.type), info.ne, name=name, flags=TFlag.WEIGHT, weight_name=name, layer=layer)


def weight_tensors(f: GGUFFile) -> tuple[Buffer, dict[str, Tensor]]:
    """Every GGUF tensor as a Tensor over the memory-mapped file (zero-copy)."""
    buf = Buffer(f"weights:{f.path}", f.data, BufferUsage.WEIGHTS, source=f.path)
    out: dict[str, Tensor] = {}
    for name, info in f.tensors.items():
        t = weight_tensor(name, info)
        t.buffer, t.offset = buf, info.offset
        out[name] = t
    return buf, out


def require_weights(f: GGUFFile, weights: dict[str, Tensor], names: list[str]) -> None:
    """Every required tensor is present, and every tensor the graph may use has the shape the hyperparameters
    imply and a type kazeia can read (else the error would surface mid-graph, without the file's name)."""
    for n in names:
        if n not in weights:
            raise GGUFError(f.path, f"missing tensor '{n}'")
    from kazeia.gguf.quants import supported_types

    readable = set(supported_types())
    for n, shape in arch_expected_shapes(model_args(f)).items():
        t = weights.get(n)
        if t is None:
            continue
        want = tuple(shape) + (1,) * (4 - len(shape))
        if t.ne != want:
            dims = max(len(shape), *(i + 1 for i, d in enumerate(t.ne) if d != 1))  # the whole shape, ggml order
            raise GGUFError(f.path, f"tensor '{n}' has shape {list(t.ne[:dims])}, expected {list(shape)} "
                                    f"from the model's hyperparameters")
        if t.type not in readable:
            raise GGUFError(f.path, f"tensor '{n}' has type {t.type.name}, which kazeia cannot read")
