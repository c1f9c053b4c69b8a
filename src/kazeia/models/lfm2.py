"""LFM2 (`general.architecture = lfm2`), as llama.cpp's src/models/lfm2.cpp builds it: short-convolution layers
beside attention layers, every layer followed by a SwiGLU FFN.

- A layer is a short-conv layer when its `attention.head_count_kv` entry is 0 (load_arch_hparams).
- Short conv (build_shortconv_block): `shortconv.in_proj` gives B, C and x (three views of one MUL_MAT); B*x is
  transposed and appended to the conv state (the last L-1 inputs of every channel, `shortconv.l_cache` = L), the
  new last L-1 columns go back to the state (CPY), SSM_CONV with the [L, E] kernel (no activation), times C, then
  `shortconv.out_proj`. The state is read as build_rs reads it, node for node: the zeroing SCALE of a fresh cell
  (a zero-sized view once the cell holds a state), the GET_ROWS of the sequences' cells, and the GET_ROWS + CPY of
  the cells beyond them (zero rows here: every micro-batch holds all its sequences).
- Attention: q/k RMS norms per head, NEOX rope (llama_model_rope_type), attention
  scaled by 1/sqrt(head_dim); a sliding window, when the file has one, applies to every attention layer.
- Names are llama.cpp's, `{}` included (`model.layers.{}.operator_norm-0`: lfm2.cpp's cb names are format strings
  it never formats); the FFN norm's MUL is renamed `model.layers.{}.ffn_out-il` by a cb on it, so the FFN's down
  projection stays node_<index>. The final norm is `token_embd_norm`.
LFM2-1.2B: 16 layers (6 attention: 2, 5, 8, 10, 12, 14), hidden 2048, 32 q / 8 KV heads x 64, FFN 8192, L = 3,
vocabulary 65536, tied.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kazeia.errors import GGUFError
from kazeia.gguf.reader import GGUFFile
from kazeia.graph import builder as gb
from kazeia.graph.builder import ROPE_NEOX, Graph
from kazeia.graph.tensor import Tensor
from kazeia.models import transformer
from kazeia.models.base import ModelArgs, layer_head_counts
from kazeia.models.transformer import (
    GraphOptions,
    HybridInputs,
    LayerCache,
    RecurrentLayerCache,
    _named,
    attend,
    attention_layers,
    ffn_swiglu,
    hybrid_inputs,
    norm,
    out_rows,
    output_head,
    read_state,
    recurrent_layers,  # noqa: F401 - the layers that keep a recurrent state, read through the module
    token_embeddings,
)

ARCH = "lfm2"
OUTPUT_NORM = "token_embd_norm.weight"  # LLM_TENSOR_OUTPUT_NORM_LFM2
LAYER = "model.layers.{}."  # the literal prefix of lfm2.cpp's callback names


@dataclass(frozen=True)
class Args(ModelArgs):
    l_cache: int = 3  # shortconv.l_cache: the conv kernel length L
    recurrent: tuple[bool, ...] = ()  # per layer: short conv (True) or attention
    n_swa: int = 0

    @property
    def d_conv(self) -> int:
        return self.l_cache - 1

    @property
    def n_embd_r(self) -> int:
        """Conv state per cell: the last L - 1 inputs of every channel."""
        return self.d_conv * self.n_embd

    @property
    def n_embd_s(self) -> int:
        return 0  # no SSM state

    def is_recurrent(self, il: int) -> bool:
        return self.recurrent[il]

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Args:
        kv_key = f"{ARCH}.attention.head_count_kv"
        if isinstance(f.metadata.get(kv_key), list) and not any(layer_head_counts(f, kv_key)):
            raise GGUFError(f.path, f"key '{kv_key}' gives no layer attention heads: an LFM2 without attention layers "
                                    "(llama.cpp cannot load one either)")
        a = super().from_gguf(f)
        l_cache = f.metadata.get(f"{ARCH}.shortconv.l_cache")
        if isinstance(l_cache, bool) or not isinstance(l_cache, int) or not 1 < l_cache <= 64:
            raise GGUFError(f.path, f"key '{ARCH}.shortconv.l_cache' must be an integer in [2, 64], not "
                                    f"{str(l_cache)[:40]!r}")
        counts = (layer_head_counts(f, kv_key) if isinstance(f.metadata.get(kv_key), list)
                  else [a.n_head_kv] * a.n_layer)
        if any(c not in (0, a.n_head_kv) for c in counts):
            raise GGUFError(f.path, f"key '{kv_key}': attention layers with different KV head counts are not "
                                    "supported")
        n_swa = f.metadata.get(f"{ARCH}.attention.sliding_window", 0)
        if isinstance(n_swa, bool) or not isinstance(n_swa, int) or n_swa < 0:
            raise GGUFError(f.path, f"key '{ARCH}.attention.sliding_window' has a bad value {str(n_swa)[:40]!r}")
        return replace(a, l_cache=l_cache, recurrent=tuple(c == 0 for c in counts), n_swa=n_swa)


def swa_layers(a: Args) -> list[int]:
    """With a sliding window, every attention layer slides (load_arch_hparams)."""
    return attention_layers(a) if a.n_swa > 0 else []


def expected_shapes(a: Args) -> dict[str, tuple[int, ...]]:
    """llama_model_lfm2::load_arch_tensors (dense FFN in every layer)."""
    E, F, D = a.n_embd, a.n_ff, a.head_dim
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (E, a.n_vocab), OUTPUT_NORM: (E,),
                                          "output.weight": (E, a.n_vocab)}
    for il in range(a.n_layer):
        p = f"blk.{il}."
        shapes.update({p + "attn_norm.weight": (E,), p + "ffn_norm.weight": (E,), p + "ffn_gate.weight": (E, F),
                       p + "ffn_up.weight": (E, F), p + "ffn_down.weight": (F, E)})
        if a.is_recurrent(il):
            shapes.update({p + "shortconv.conv.weight": (a.l_cache, E), p + "shortconv.in_proj.weight": (E, 3 * E),
                           p + "shortconv.out_proj.weight": (E, E)})
        else:
            shapes.update({p + "attn_q.weight": (E, a.n_embd_q), p + "attn_k.weight": (E, a.n_embd_kv),
                           p + "attn_v.weight": (E, a.n_embd_kv), p + "attn_output.weight": (a.n_embd_q, E),
                           p + "attn_q_norm.weight": (D,), p + "attn_k_norm.weight": (D,)})
    return shapes


def required_weights(a: Args) -> list[str]:
    return [n for n in expected_shapes(a) if n != "output.weight"]


def make_inputs(n_tokens: int, n_kv: int, n_out: int, flash_attn: bool, kq_mask_cast: bool = False,
                n_seqs: int = 1, rs_fresh: bool = False, n_kv_swa: int = 0) -> HybridInputs:
    """The dense inputs and the recurrent-state cells (rs_s_copy); `rs_fresh`: the cells hold no state yet."""
    base = transformer.make_inputs(n_tokens, n_kv, n_out, flash_attn, kq_mask_cast, n_kv_swa=n_kv_swa)
    return hybrid_inputs(base, n_seqs, rs_fresh)


def short_conv(g: Graph, a: Args, w: dict[str, Tensor], il: int, cur: Tensor, inp: HybridInputs,
               cache: RecurrentLayerCache) -> Tensor:
    """build_shortconv_block: cur [E, n_seqs*T] -> [E, n_seqs*T] (sequence s in recurrent cell s)."""
    n_seqs = inp.s_copy.ne[0]
    E, T, dc = a.n_embd, cur.ne[1] // n_seqs, a.d_conv
    p = f"blk.{il}."
    cur = gb.reshape(cur, E, T, n_seqs)
    bcx = _named(gb.mul_mat(w[p + "shortconv.in_proj.weight"], cur), LAYER + "conv.in_proj", il)  # [3E, T, n]
    el = bcx.nb[0]
    b, c, x = (gb.view_3d(bcx, E, T, n_seqs, bcx.nb[1], bcx.nb[2], i * E * el) for i in range(3))
    bx = gb.transpose(gb.mul(b, x))  # [T, E, n_seqs]
    conv = gb.reshape(read_state(g, cache.conv, inp), dc, E, n_seqs)  # [L-1, E, n_seqs]
    bx = gb.concat(conv, bx, 0)  # [L-1+T, E, n_seqs]
    last = gb.view_3d(bx, dc, E, n_seqs, bx.nb[1], bx.nb[2], (bx.ne[0] - dc) * bx.nb[0])
    g.expand(gb.cpy(last, gb.view_2d(cache.conv, dc * E, n_seqs, cache.conv.nb[1])))
    conv_out = _named(gb.ssm_conv(bx, w[p + "shortconv.conv.weight"]), LAYER + "conv.conv", il)  # [E, T, n]
    y = gb.mul_mat(w[p + "shortconv.out_proj.weight"], gb.mul(c, conv_out))
    y = _named(y, LAYER + "conv.out_proj", il)  # [E, T, n_seqs]
    return gb.reshape(y, E, T * n_seqs)


def attention(g: Graph, a: Args, w: dict[str, Tensor], il: int, cur: Tensor, inp: HybridInputs,
              cache: LayerCache, n_kv: int, opts: GraphOptions) -> Tensor:
    """build_attn_block: cur [E, T] -> [E, T]."""
    p, sliding = f"blk.{il}.", a.n_swa > 0
    q, k, v = transformer.qkv(a, w, il, cur)
    q = norm(q, w[p + "attn_q_norm.weight"], a.rms_eps, LAYER + "self_attn.q_layernorm", il)
    k = norm(k, w[p + "attn_k_norm.weight"], a.rms_eps, LAYER + "self_attn.k_layernorm", il)
    rope = dict(n_dims=a.n_rot, mode=ROPE_NEOX, freq_base=a.rope_freq_base, freq_scale=a.rope_freq_scale,
                n_ctx_orig=a.n_ctx_train)
    q, k = gb.rope_ext(q, inp.pos, **rope), gb.rope_ext(k, inp.pos, **rope)  # unnamed
    layer_inp = inp.for_layer(sliding)
    o = attend(g, a, il, q, k, v, layer_inp, cache, layer_inp.mask.ne[0], opts, iswa=sliding)
    o = _named(o, "kqv_out", il)  # [D*H, T]
    return _named(gb.mul_mat(w[p + "attn_output.weight"], o), LAYER + "self_attn.out_proj", il)


def build(a: Args, w: dict[str, Tensor], inp: HybridInputs, caches: list, n_kv: int,
          opts: GraphOptions) -> tuple[Graph, Tensor]:
    g = Graph()
    x = token_embeddings(g, w, inp, "model.embed_tokens")  # [E, T]
    for il in range(a.n_layer):
        p = f"blk.{il}."
        h = norm(x, w[p + "attn_norm.weight"], a.rms_eps, LAYER + "operator_norm", il)
        if a.is_recurrent(il):
            h = short_conv(g, a, w, il, h, inp, caches[il])
        else:
            h = attention(g, a, w, il, h, inp, caches[il], n_kv, opts)
        h, x = out_rows(a, il, inp, h, x)
        x = gb.add(x, h)  # unnamed
        h = norm(x, w[p + "ffn_norm.weight"], a.rms_eps, LAYER + "ffn_out", il)
        x = _named(gb.add(x, ffn_swiglu(a, w, il, h, out_name="")), "l_out", il)
    return g, output_head(g, a, w, x, OUTPUT_NORM)
