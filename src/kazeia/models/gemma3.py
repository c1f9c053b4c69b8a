"""Gemma 3 (text, `general.architecture = gemma3`), as llama.cpp's src/models/gemma3.cpp builds it.

- Embeddings scaled by sqrt(n_embd) (a SCALE named `inp_scaled`).
- Four RMS norms per block: attn_norm, then after attention `attn_post_norm`, ffn_norm, then after the FFN
  `ffn_post_norm` (whose RMS_NORM llama.cpp names plain `norm`, build_norm with il = -1). The converter stores
  Gemma's (1 + w) norm weights already shifted, so every norm is RMS_NORM then MUL.
- Q/K RMS norms per head (`Qcur_normed`, `Kcur_normed`), NEOX rope, then Q scaled by 1/sqrt(head_dim) (by
  1/sqrt(n_embd / n_head) for the 62-layer 27B: hparams.f_attention_scale) in an unnamed SCALE; attention with
  kq_scale 1.
- FFN: GELU (tanh approximation) GLU with a parallel gate: ffn_up, ffn_gate, GEGLU (split), ffn_down.
- Sliding window (`attention.sliding_window` > 0): layer il is a sliding-window layer per the array
  `attention.sliding_window_pattern`, else il % n < n - 1 with n that key's count or 6 (load_swa_pattern). SWA
  layers read the SWA KV cache (engine/kv.py) and its mask, and rope with `rope.freq_base_swa` (default 10000)
  and scale 1; the others the base cache, `rope.freq_base` and the file's rope scaling (Gemma-3-4B: linear 8).
- `final_logit_softcapping`, when the file has it: logits = cap * tanh(logits / cap).
Gemma-3-1B: 26 layers, hidden 1152, 4 q / 1 KV heads x 256, FFN 6912, window 512, vocabulary 262144, tied.
Gemma-3-4B (text): 34 layers, hidden 2560, 8 q / 4 KV heads x 256, FFN 10240, window 1024, rope linear 8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kazeia.errors import GGUFError
from kazeia.gguf.reader import GGUFFile
from kazeia.graph import builder as gb
from kazeia.graph.builder import ROPE_NEOX, Graph
from kazeia.graph.tensor import Tensor
from kazeia.models import base
from kazeia.models.base import ModelArgs
from kazeia.models.transformer import (
    GraphOptions,
    Inputs,
    LayerCache,
    _named,
    attend,
    expand_inputs,
    norm,
    out_rows,
    output_head,
    qkv,
    token_embeddings,
)

ARCH = "gemma3"
DEFAULT_SWA_PATTERN = 6  # llama_model_gemma3::load_arch_hparams: load_swa_pattern(ml, 6)
DEFAULT_FREQ_BASE_SWA = 10000.0  # llama_hparams::rope_freq_base_train_swa


@dataclass(frozen=True)
class Args(ModelArgs):
    n_swa: int = 0  # attention.sliding_window (0: no sliding window)
    sliding: tuple[bool, ...] = ()  # per layer
    rope_freq_base_swa: float = DEFAULT_FREQ_BASE_SWA
    final_logit_softcapping: float = 0.0

    @property
    def attention_scale(self) -> float:
        """hparams.f_attention_scale: 1/sqrt(n_embd / n_head) for the 27B (62 layers), else 1/sqrt(head_dim)."""
        return 1.0 / math.sqrt(self.n_embd // self.n_head if self.n_layer == 62 else self.head_dim)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Args:
        a = super().from_gguf(f)

        def number(k: str, default, kind=float):
            v = f.metadata.get(f"{ARCH}.{k}", default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (
                    kind is int and not float(v).is_integer()):
                raise GGUFError(f.path, f"key '{ARCH}.{k}' has a bad value {str(v)[:40]!r}")
            return kind(v)

        n_swa = number("attention.sliding_window", 0, int)
        sliding = (False,) * a.n_layer
        if n_swa > 0:
            sliding = _swa_pattern(f, a.n_layer)
        base_swa = number("rope.freq_base_swa", DEFAULT_FREQ_BASE_SWA)
        if base_swa <= 0:
            raise GGUFError(f.path, f"key '{ARCH}.rope.freq_base_swa' must be positive")
        return replace(a, n_swa=n_swa, sliding=sliding, rope_freq_base_swa=base_swa,
                       final_logit_softcapping=number("final_logit_softcapping", 0.0))


def _swa_pattern(f: GGUFFile, n_layer: int) -> tuple[bool, ...]:
    """load_swa_pattern: the per-layer array, else the period n (il % n < n - 1 slides; 0: every layer)."""
    key = f"{ARCH}.attention.sliding_window_pattern"
    v = f.metadata.get(key, DEFAULT_SWA_PATTERN)
    if isinstance(v, list):
        if len(v) < n_layer or not all(isinstance(x, (bool, int)) for x in v[:n_layer]):
            raise GGUFError(f.path, f"key '{key}' must list the {n_layer} layers")
        return tuple(bool(x) for x in v[:n_layer])
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise GGUFError(f.path, f"key '{key}' has a bad value {str(v)[:40]!r}")
    return tuple(v == 0 or il % v < v - 1 for il in range(n_layer))


def swa_layers(a: Args) -> list[int]:
    """The layers that attend through the sliding-window cache."""
    return [il for il, s in enumerate(a.sliding) if s]


def expected_shapes(a: Args) -> dict[str, tuple[int, ...]]:
    """llama_model_gemma3::load_arch_tensors: the dense shapes with q/k norms and the two post norms."""
    shapes = base.expected_shapes(a)
    for il in range(a.n_layer):
        p = f"blk.{il}."
        shapes[p + "post_attention_norm.weight"] = shapes[p + "post_ffw_norm.weight"] = (a.n_embd,)
    return shapes


def required_weights(a: Args) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    for il in range(a.n_layer):
        names += [f"blk.{il}.{n}.weight" for n in (
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
            "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")]
    return names


def attention(g: Graph, a: Args, w: dict[str, Tensor], il: int, cur: Tensor, inp: Inputs, cache: LayerCache,
              n_kv: int, opts: GraphOptions) -> Tensor:
    """cur [E, T] -> [E, T]; a sliding-window layer reads its own cache, mask and rope base."""
    p, sliding = f"blk.{il}.", a.sliding[il]
    rope = dict(n_dims=a.n_rot, mode=ROPE_NEOX, n_ctx_orig=a.n_ctx_train,
                freq_base=a.rope_freq_base_swa if sliding else a.rope_freq_base,
                freq_scale=1.0 if sliding else a.rope_freq_scale)
    q, k, v = qkv(a, w, il, cur)
    q = norm(q, w[p + "attn_q_norm.weight"], a.rms_eps, "Qcur_normed", il)
    q = _named(gb.rope_ext(q, inp.pos, **rope), "Qcur", il)
    k = norm(k, w[p + "attn_k_norm.weight"], a.rms_eps, "Kcur_normed", il)
    k = _named(gb.rope_ext(k, inp.pos, **rope), "Kcur", il)
    q = gb.scale(q, a.attention_scale)  # unnamed in llama.cpp
    layer_inp = inp.for_layer(sliding)
    n_kv = layer_inp.mask.ne[0]
    o = attend(g, a, il, q, k, v, layer_inp, cache, n_kv, opts, kq_scale=1.0, iswa=a.n_swa > 0)
    o = _named(o, "kqv_out", il)  # [D*H, T]
    return gb.mul_mat(w[p + "attn_output.weight"], o)  # [E, T], unnamed


def ffn_geglu(w: dict[str, Tensor], il: int, cur: Tensor) -> Tensor:
    """build_ffn(LLM_FFN_GELU, LLM_FFN_PAR): up, gate, GEGLU (split), down -> [E, T]."""
    p = f"blk.{il}."
    up = _named(gb.mul_mat(w[p + "ffn_up.weight"], cur), "ffn_up", il)  # [F, T]
    gate = _named(gb.mul_mat(w[p + "ffn_gate.weight"], cur), "ffn_gate", il)  # [F, T]
    x = _named(gb.geglu_split(gate, up), "ffn_geglu", il)
    return _named(gb.mul_mat(w[p + "ffn_down.weight"], x), "ffn_out", il)  # [E, T]


def build(a: Args, w: dict[str, Tensor], inp: Inputs, caches: list[LayerCache], n_kv: int,
          opts: GraphOptions) -> tuple[Graph, Tensor]:
    g = Graph()
    x = token_embeddings(g, w, inp)  # [E, T]
    x = _named(gb.scale(x, math.sqrt(a.n_embd)), "inp_scaled")
    for il in range(a.n_layer):
        p = f"blk.{il}."
        h = norm(x, w[p + "attn_norm.weight"], a.rms_eps, "attn_norm", il)
        h = attention(g, a, w, il, h, inp, caches[il], n_kv, opts)
        h, x = out_rows(a, il, inp, h, x)
        h = norm(h, w[p + "post_attention_norm.weight"], a.rms_eps, "attn_post_norm", il)
        sa_out = _named(gb.add(h, x), "sa_out", il)
        h = norm(sa_out, w[p + "ffn_norm.weight"], a.rms_eps, "ffn_norm", il)
        h = ffn_geglu(w, il, h)
        h = _named(gb.mul(_named(gb.rms_norm(h, a.rms_eps), "norm"), w[p + "post_ffw_norm.weight"]),
                   "ffn_post_norm", il)
        x = _named(gb.add(h, sa_out), "l_out", il)
    logits = output_head(g, a, w, x, softcap=a.final_logit_softcapping)
    expand_inputs(g, inp)  # the base cache's inputs even when every layer slides
    return g, logits
