"""The seeded random weights of each architecture, in llama.cpp's GGUF names and layouts, and each
architecture's own metadata keys (as llama.cpp's converter writes them)."""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFWriter

from kazeia.gguf.writer.config import SynthConfig
from kazeia.gguf.writer.encode import RowBlocks


class Shape:
    """A matrix or vector known by its shape only (make-model --header-only: no values are drawn)."""

    def __init__(self, *shape: int) -> None:
        self.shape = tuple(shape)


def _weights(cfg: SynthConfig, shapes_only: bool = False):
    """Yield (name, float32 array in numpy order (rows, cols), is_matrix); `shapes_only`: the big arrays as Shape
    (the few small vectors some layers draw directly stay arrays)."""
    rng = np.random.default_rng(cfg.seed)
    E = cfg.n_embd

    def lin(n_out, n_in):
        if shapes_only:
            return Shape(n_out, n_in)
        return (rng.standard_normal((n_out, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in)))

    def norm_w(n):
        if shapes_only:
            return Shape(n)
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    # embeddings ~N(0, 16/E): tied logits then have a std of a few units, like trained models. Made (and encoded)
    # in blocks of rows: the same numbers as one draw, without a float copy of a 151936-row matrix
    def emb_rows(n):
        return rng.standard_normal((n, E), dtype=np.float32) * np.float32(4 / np.sqrt(E))

    yield "token_embd.weight", Shape(cfg.n_vocab, E) if shapes_only else RowBlocks(cfg.n_vocab, emb_rows), True
    layers = {"qwen35": _hybrid_layers, "gemma3": _gemma3_layers, "phi3": _phi3_layers, "lfm2": _lfm2_layers}
    yield from layers.get(cfg.arch, _dense_layers)(cfg, lin, norm_w, rng)
    yield "token_embd_norm.weight" if cfg.arch == "lfm2" else "output_norm.weight", norm_w(E), False
    if not cfg.tied:
        yield "output.weight", lin(cfg.n_vocab, E), True


def _attention(cfg: SynthConfig, p: str, lin, norm_w, rng, biases: bool = False, qk_norm: bool = False):
    """One layer's separate q, k, v projections, their biases (F32 vectors, as the converter keeps Qwen2's), the
    per-head q/k norms, the output projection: drawn in that order."""
    E, Dq, Dkv = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    yield p + "attn_q.weight", lin(Dq, E), True
    yield p + "attn_k.weight", lin(Dkv, E), True
    yield p + "attn_v.weight", lin(Dkv, E), True
    if biases:
        for c, n in (("q", Dq), ("k", Dkv), ("v", Dkv)):
            yield p + f"attn_{c}.bias", (0.5 * rng.standard_normal(n, dtype=np.float32)), False
    if qk_norm:
        yield p + "attn_q_norm.weight", norm_w(cfg.head_dim), False
        yield p + "attn_k_norm.weight", norm_w(cfg.head_dim), False
    yield p + "attn_output.weight", lin(E, Dq), True


def _swiglu_ffn(cfg: SynthConfig, p: str, lin, norm_w):
    """One layer's FFN norm and SwiGLU projections (gate, up, down), drawn in that order."""
    E, F = cfg.n_embd, cfg.n_ff
    yield p + "ffn_norm.weight", norm_w(E), False
    yield p + "ffn_gate.weight", lin(F, E), True
    yield p + "ffn_up.weight", lin(F, E), True
    yield p + "ffn_down.weight", lin(E, F), True


def _dense_layers(cfg: SynthConfig, lin, norm_w, rng):
    E = cfg.n_embd
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", norm_w(E), False
        yield from _attention(cfg, p, lin, norm_w, rng, biases=cfg.arch == "qwen2", qk_norm=cfg.arch == "qwen3")
        yield from _swiglu_ffn(cfg, p, lin, norm_w)


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


def _qwen35_keys(w: GGUFWriter, cfg: SynthConfig) -> None:
    """The qwen35 keys llama.cpp's converter writes (Qwen3_5TextModel), in its terms."""
    w.add_rope_dimension_sections(list(cfg.rope_sections))
    w.add_ssm_conv_kernel(cfg.ssm_conv_kernel)
    w.add_ssm_state_size(cfg.ssm_head_dim)
    w.add_ssm_group_count(cfg.ssm_k_heads)
    w.add_ssm_time_step_rank(cfg.ssm_v_heads)
    w.add_ssm_inner_size(cfg.ssm_head_dim * cfg.ssm_v_heads)
    w.add_array(f"{cfg.arch}.attention.recurrent_layers", cfg.recurrent_layers)
    w.add_uint32(f"{cfg.arch}.full_attention_interval", cfg.full_attention_interval)


def _gemma3_layers(cfg: SynthConfig, lin, norm_w, rng):
    """Gemma 3's blocks: q/k norms and the two post norms (norm weights as the converter stores them, 1 + w)."""
    E = cfg.n_embd
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", norm_w(E), False
        yield from _attention(cfg, p, lin, norm_w, rng, qk_norm=True)
        yield p + "post_attention_norm.weight", norm_w(E), False
        yield from _swiglu_ffn(cfg, p, lin, norm_w)
        yield p + "post_ffw_norm.weight", norm_w(E), False


def _phi3_layers(cfg: SynthConfig, lin, norm_w, rng):
    """Phi-3's blocks, fused as the converter keeps them: attn_qkv (q | k | v rows) and ffn_up (gate | up rows);
    then the LongRoPE factors (one pair for every layer), drawn in [1, 4]."""
    E, F, Dq, Dkv = cfg.n_embd, cfg.n_ff, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", norm_w(E), False
        yield p + "attn_qkv.weight", lin(Dq + 2 * Dkv, E), True
        yield p + "attn_output.weight", lin(E, Dq), True
        yield p + "ffn_norm.weight", norm_w(E), False
        yield p + "ffn_up.weight", lin(2 * F, E), True
        yield p + "ffn_down.weight", lin(E, F), True
    if cfg.rope_factors:
        n = (cfg.n_rot or cfg.head_dim) // 2
        for which in ("long", "short"):
            yield f"rope_factors_{which}.weight", rng.uniform(1, 4, n).astype(np.float32), False


def _lfm2_layers(cfg: SynthConfig, lin, norm_w, rng):
    """LFM2's blocks: a short conv (in_proj to B | C | x, the [L, E] kernel, F32 as llama.cpp keeps it, out_proj) or
    attention with q/k norms; a SwiGLU FFN in every layer."""
    E = cfg.n_embd
    for il, conv in enumerate(cfg.recurrent_layers):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", norm_w(E), False
        if conv:
            kernel = rng.standard_normal((E, cfg.l_cache), dtype=np.float32) / np.float32(cfg.l_cache)
            yield p + "shortconv.conv.weight", kernel, False
            yield p + "shortconv.in_proj.weight", lin(3 * E, E), True
            yield p + "shortconv.out_proj.weight", lin(E, E), True
        else:
            yield from _attention(cfg, p, lin, norm_w, rng, qk_norm=True)
        yield from _swiglu_ffn(cfg, p, lin, norm_w)


def head_count_kv(cfg: SynthConfig) -> int | list[int]:
    """attention.head_count_kv: LFM2's is per layer, 0 for a short-conv layer."""
    if cfg.arch == "lfm2":
        return [0 if conv else cfg.n_head_kv for conv in cfg.recurrent_layers]
    return cfg.n_head_kv


def arch_keys(w: GGUFWriter, cfg: SynthConfig) -> None:
    """The keys an architecture adds to the common ones, as llama.cpp's converter writes them."""
    if cfg.arch == "qwen35":
        _qwen35_keys(w, cfg)
    elif cfg.arch == "gemma3":
        if cfg.n_swa:
            w.add_sliding_window(cfg.n_swa)
        w.add_float32(f"{cfg.arch}.rope.freq_base_swa", cfg.rope_base_swa)
        if cfg.rope_linear:
            w.add_string(f"{cfg.arch}.rope.scaling.type", "linear")
            w.add_float32(f"{cfg.arch}.rope.scaling.factor", cfg.rope_linear)
    elif cfg.arch == "phi3":
        w.add_sliding_window(0)
        if cfg.rope_factors:  # Phi3MiniModel: the attention factor of LongRoPE
            orig = cfg.n_ctx_orig or cfg.n_ctx
            w.add_rope_scaling_orig_ctx_len(orig)
            scale = cfg.n_ctx / orig
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)
    elif cfg.arch == "lfm2":
        w.add_uint32(f"{cfg.arch}.shortconv.l_cache", cfg.l_cache)
