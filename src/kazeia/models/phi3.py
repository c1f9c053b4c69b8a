"""Phi-3 / Phi-4-mini (`general.architecture = phi3`), as llama.cpp's src/models/phi3.cpp builds it.

- Fused projections: `attn_qkv` (one MUL_MAT `wqkv`, then Q, K, V as strided views; build_qkv's fused path) and
  `ffn_up` holding gate and up ([E, 2F]: one MUL_MAT `ffn_up`, then ggml_swiglu on its two halves, build_ffn's
  LLM_FFN_SWIGLU + LLM_FFN_SEQ). A file with separate q/k/v weights takes build_qkv's other path.
- NEOX rope on the first `rope.dimension_count` dims (partial rotary: Phi-4-mini turns 96 of 128), with LongRoPE:
  the per-pair frequency factors `rope_factors_long` or `rope_factors_short` (ROPE's third source), long when the
  context per sequence exceeds `rope.scaling.original_context_length` (llama_model::get_rope_factors), and
  `rope.scaling.attn_factor` scaling cos and sin (cparams.yarn_attn_factor *= hparams.rope_attn_factor).
- Q is scaled by 1/sqrt(head_dim) before attention (a SCALE named Qcur), attention then uses kq_scale 1.
- The residual ADDs are unnamed (node_<index>) but the layer's last one (`l_out`).
- A sliding window in the file is ignored, as llama.cpp does ("Phi SWA is currently disabled", #13676).
Phi-4-mini: 32 layers, hidden 3072, 24 q / 8 KV heads x 128, rope on 96 dims, FFN 8192, vocabulary 200064, tied,
original context 4096 of 131072.
"""

from __future__ import annotations

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
    norm,
    out_rows,
    output_head,
    qkv,
    token_embeddings,
)

ARCH = "phi3"
ROPE_LONG, ROPE_SHORT = "rope_factors_long.weight", "rope_factors_short.weight"


@dataclass(frozen=True)
class Args(ModelArgs):
    fused_qkv: bool = True  # attn_qkv.weight (the converter's layout) or separate q/k/v
    rope_factors: bool = False  # the file carries LongRoPE factors
    rope_attn_factor: float = 1.0  # rope.scaling.attn_factor
    n_ctx_orig_yarn: int = 0  # rope.scaling.original_context_length (default: the training context)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Args:
        a = super().from_gguf(f)
        attn_factor = f.metadata.get(f"{ARCH}.rope.scaling.attn_factor", 1.0)
        orig = f.metadata.get(f"{ARCH}.rope.scaling.original_context_length", a.n_ctx_train)
        if isinstance(attn_factor, bool) or not isinstance(attn_factor, (int, float)) or not 0 < attn_factor < 1e3:
            raise GGUFError(f.path, f"key '{ARCH}.rope.scaling.attn_factor' has a bad value {str(attn_factor)[:40]!r}")
        if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0:
            raise GGUFError(f.path, f"key '{ARCH}.rope.scaling.original_context_length' has a bad value "
                                    f"{str(orig)[:40]!r}")
        factors = ROPE_LONG in f.tensors or ROPE_SHORT in f.tensors
        if factors and not (ROPE_LONG in f.tensors and ROPE_SHORT in f.tensors):
            raise GGUFError(f.path, f"the file has only one of '{ROPE_LONG}' and '{ROPE_SHORT}'")
        return replace(a, fused_qkv="blk.0.attn_qkv.weight" in f.tensors, rope_factors=factors,
                       rope_attn_factor=float(attn_factor), n_ctx_orig_yarn=orig)


def expected_shapes(a: Args) -> dict[str, tuple[int, ...]]:
    """llama_model_phi3::load_arch_tensors: the dense shapes, with ffn_up [E, 2F], attn_qkv and the rope factors."""
    shapes = base.expected_shapes(a)
    for il in range(a.n_layer):
        p = f"blk.{il}."
        shapes[p + "attn_qkv.weight"] = (a.n_embd, a.n_embd_q + 2 * a.n_embd_kv)
        shapes[p + "attn_qkv.bias"] = (a.n_embd_q + 2 * a.n_embd_kv,)
        shapes[p + "ffn_up.weight"] = (a.n_embd, 2 * a.n_ff)
        del shapes[p + "ffn_gate.weight"]
    shapes[ROPE_LONG] = shapes[ROPE_SHORT] = (a.n_rot // 2,)
    return shapes


def required_weights(a: Args) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"] + ([ROPE_LONG, ROPE_SHORT] if a.rope_factors else [])
    proj = ("attn_qkv",) if a.fused_qkv else ("attn_q", "attn_k", "attn_v")
    for il in range(a.n_layer):
        names += [f"blk.{il}.{n}.weight" for n in ("attn_norm", *proj, "attn_output", "ffn_norm", "ffn_up",
                                                   "ffn_down")]
    return names


def rope_factors(a: Args, w: dict[str, Tensor], opts: GraphOptions) -> Tensor | None:
    """llama_model::get_rope_factors: the long factors when the context per sequence exceeds the original one."""
    if not a.rope_factors:
        return None
    return w[ROPE_LONG] if opts.n_ctx_seq > a.n_ctx_orig_yarn else w[ROPE_SHORT]


def attention(g: Graph, a: Args, w: dict[str, Tensor], il: int, cur: Tensor, inp: Inputs, cache: LayerCache,
              n_kv: int, opts: GraphOptions) -> Tensor:
    """cur [E, T] -> [E, T]: fused QKV, rope with the factors, Q scaled, attention, output projection."""
    rope = dict(n_dims=a.n_rot, mode=ROPE_NEOX, freq_base=a.rope_freq_base, freq_scale=a.rope_freq_scale,
                n_ctx_orig=a.n_ctx_orig_yarn, attn_factor=a.rope_attn_factor, freq_factors=rope_factors(a, w, opts))
    q, k, v = qkv(a, w, il, cur)
    q = _named(gb.rope_ext(q, inp.pos, **rope), "Qcur", il)
    k = _named(gb.rope_ext(k, inp.pos, **rope), "Kcur", il)
    q = _named(gb.scale(q, 1.0 / a.head_dim ** 0.5), "Qcur", il)
    o = _named(attend(g, a, il, q, k, v, inp, cache, n_kv, opts, kq_scale=1.0), "kqv_out", il)  # [D*H, T]
    return gb.mul_mat(w[f"blk.{il}.attn_output.weight"], o)  # [E, T], unnamed (node_<index>)


def ffn(w: dict[str, Tensor], il: int, cur: Tensor) -> Tensor:
    """build_ffn(ffn_up, LLM_FFN_SWIGLU, LLM_FFN_SEQ): gate and up in one MUL_MAT, SWIGLU of its halves, down."""
    p = f"blk.{il}."
    x = _named(gb.mul_mat(w[p + "ffn_up.weight"], cur), "ffn_up", il)  # [2F, T]
    x = _named(gb.swiglu(x), "ffn_swiglu", il)  # [F, T]
    return _named(gb.mul_mat(w[p + "ffn_down.weight"], x), "ffn_out", il)  # [E, T]


def build(a: Args, w: dict[str, Tensor], inp: Inputs, caches: list[LayerCache], n_kv: int,
          opts: GraphOptions) -> tuple[Graph, Tensor]:
    g = Graph()
    x = token_embeddings(g, w, inp)  # [E, T]
    for il in range(a.n_layer):
        p = f"blk.{il}."
        residual = x
        h = norm(x, w[p + "attn_norm.weight"], a.rms_eps, "attn_norm", il)
        h = attention(g, a, w, il, h, inp, caches[il], n_kv, opts)
        h, residual = out_rows(a, il, inp, h, residual)
        residual = gb.add(h, residual)  # unnamed
        h = norm(residual, w[p + "ffn_norm.weight"], a.rms_eps, "ffn_norm", il)
        h = ffn(w, il, h)
        x = _named(gb.add(residual, h), "l_out", il)
    return g, output_head(g, a, w, x)
