"""What every architecture shares: hyperparameters from GGUF keys, the weight table, the registry."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from kazeia.errors import GGUFError, UnsupportedError
from kazeia.gguf.reader import GGUFFile
from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, Tensor, TFlag

ARCHITECTURES = {"llama": "kazeia.models.llama", "qwen3": "kazeia.models.qwen3"}


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

        def key(k: str, default=None, required: bool = True):
            full = f"{arch}.{k}"
            if full in f.metadata:
                return f.metadata[full]
            if required and default is None:
                raise GGUFError(f.path, f"missing required key '{full}'")
            return default

        n_embd = int(key("embedding_length"))
        n_head = int(key("attention.head_count"))
        if n_head <= 0 or n_embd <= 0:
            raise GGUFError(f.path, "embedding_length and attention.head_count must be positive")
        head_dim = int(key("attention.key_length", n_embd // n_head, required=False))
        n_head_kv = int(key("attention.head_count_kv", n_head, required=False))
        if n_head_kv <= 0 or n_head % n_head_kv:
            raise GGUFError(f.path, f"head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
        vocab = f.get("tokenizer.ggml.tokens")
        emb = f.tensors.get("token_embd.weight")
        if emb is None:
            raise GGUFError(f.path, "missing tensor 'token_embd.weight'")
        n_vocab = int(key("vocab_size", len(vocab) if vocab else emb.ne[1], required=False))
        scaling = key("rope.scaling.type", "none", required=False)
        if scaling not in ("none", "linear"):
            raise UnsupportedError(f"{f.path}: rope scaling '{scaling}' is not supported")
        factor = float(key("rope.scaling.factor", 1.0, required=False)) if scaling == "linear" else 1.0
        args = cls(
            arch=arch,
            n_layer=int(key("block_count")),
            n_embd=n_embd,
            n_ff=int(key("feed_forward_length")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_rot=int(key("rope.dimension_count", head_dim, required=False)),
            n_vocab=n_vocab,
            n_ctx_train=int(key("context_length")),
            rope_freq_base=float(key("rope.freq_base", 10000.0, required=False)),
            rope_freq_scale=1.0 / factor,
            rms_eps=float(key("attention.layer_norm_rms_epsilon")),
            tied_embeddings="output.weight" not in f.tensors,
        )
        if args.n_layer <= 0 or args.n_layer > 1024:
            raise GGUFError(f.path, f"absurd block_count {args.n_layer}")
        return args


def arch_module(arch: str) -> ModuleType:
    mod = ARCHITECTURES.get(arch)
    if mod is None:
        raise UnsupportedError(f"unsupported architecture '{arch}' (kazeia runs: {', '.join(ARCHITECTURES)})")
    return importlib.import_module(mod)


def weight_tensors(f: GGUFFile) -> tuple[Buffer, dict[str, Tensor]]:
    """Every GGUF tensor as a Tensor over the memory-mapped file (zero-copy)."""
    buf = Buffer(f"weights:{f.path}", f.data, BufferUsage.WEIGHTS)
    out: dict[str, Tensor] = {}
    from kazeia.graph.tensor import make_tensor

    for name, info in f.tensors.items():
        layer = None
        if name.startswith("blk."):
            try:
                layer = int(name.split(".")[1])
            except ValueError:
                layer = None
        t = make_tensor(GGMLType(info.type), info.ne, name=name, flags=TFlag.WEIGHT, weight_name=name, layer=layer)
        t.buffer, t.offset = buf, info.offset
        out[name] = t
    return buf, out


def require_weights(f: GGUFFile, weights: dict[str, Tensor], names: list[str]) -> None:
    for n in names:
        if n not in weights:
            raise GGUFError(f.path, f"missing tensor '{n}'")
