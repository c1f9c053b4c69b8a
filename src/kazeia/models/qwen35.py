"""Qwen3.5 (dense hybrid, `general.architecture = qwen35`): gated-delta-net (GDN) layers with a full-attention
layer every `full_attention_interval` layers, as llama.cpp's src/models/qwen35.cpp and delta-net-base.cpp build
them (fused GATED_DELTA_NET for decode and prefill; several sequences as split_equal groups them).

Layer il is full attention when (il + 1) % full_attention_interval != 0 is false, unless the per-layer array
`attention.recurrent_layers` says otherwise. Every layer: attn_norm -> {GDN | attention} -> + residual ->
post_attention_norm -> SwiGLU FFN -> + residual.
- Attention: `attn_q` gives query and gate per head ([D q | D gate] x H), q/k RMS norms, multi-section rope on the
  first n_rot dims in IMROPE mode (`rope.dimension_sections`, 4 position streams: t, h, w, e), flash attention
  over the KV cache, output * SIGMOID(gate), `attn_output`.
- GDN: `attn_qkv` (q|k|v channels) goes through the causal conv (conv state ++ new columns, SSM_CONV, SILU);
  q and k are L2-normalized; beta = SIGMOID(ssm_beta x), g = SOFTPLUS(ssm_alpha x + ssm_dt.bias) * ssm_a (the
  converter stores ssm_a = -exp(A_log)); the delta rule runs on the recurrent state; the output is RMS-normed
  with `ssm_norm`, gated by SILU(attn_gate x) and projected by `ssm_out`. Conv and SSM states are read from the
  recurrent cache (GET_ROWS) and written back (CPY).
V heads come in ggml's tiled order (the converter reorders them from Hugging Face's grouped order), so GDN
broadcasts q/k heads with h % H_k. Shapes: ggml order [ne0, ne1, ...]; T tokens, C = conv channels.
Node names, order and shapes are llama.cpp's (tests/test_llama_graph.py checks them against llama-eval-callback on
the converter's own file), build_rs's state nodes included, in the graph of the llama.cpp modeled: today's
(RMS_NORM + SCALE for the q/k L2 norm, #28068; the delta-net state as [S, S, H, n_seqs] with K an op param) or,
under the 2026-05 profile, May's (ggml_l2_norm; the state as [S*S*H, K, n_seqs]).
Qwen3.5-4B text: 32 layers (every 4th attention), hidden 2560, FFN 9216, 16 q / 4 KV heads x 256, rope on 64
dims, theta 1e7, sections [11, 11, 10, 0]; GDN 16 K heads / 32 V heads x 128, conv kernel 4; vocab 248320.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kazeia.errors import GGUFError
from kazeia.gguf.reader import GGUFFile
from kazeia.graph import builder as gb
from kazeia.graph.builder import ROPE_IMROPE, Graph
from kazeia.graph.tensor import GGMLType, Tensor, TFlag, make_tensor
from kazeia.models import transformer
from kazeia.models.base import ModelArgs
from kazeia.models.transformer import (
    GraphOptions,
    HybridInputs,
    Inputs,
    LayerCache,
    RecurrentLayerCache,
    _named,
    attend,
    attention_layers,  # noqa: F401 - the layers that keep KV, read through the module (engine/context.py)
    expand_inputs,
    ffn_swiglu,
    hybrid_inputs,
    norm,
    read_state,
    recurrent_layers,  # noqa: F401 - the same for the recurrent state
)

ARCH = "qwen35"
N_POS_STREAMS = 4  # GGML_MROPE_SECTIONS


@dataclass(frozen=True)
class Args(ModelArgs):
    ssm_d_conv: int = 4  # ssm.conv_kernel
    ssm_d_inner: int = 0  # ssm.inner_size = V heads x head_v_dim
    ssm_d_state: int = 0  # ssm.state_size = head_k_dim
    ssm_dt_rank: int = 0  # ssm.time_step_rank = V heads
    ssm_n_group: int = 0  # ssm.group_count = K heads
    rope_sections: tuple[int, int, int, int] = (0, 0, 0, 0)
    recurrent: tuple[bool, ...] = ()  # per layer: gated delta net (True) or full attention

    @property
    def conv_channels(self) -> int:
        return self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state

    @property
    def head_v_dim(self) -> int:
        return self.ssm_d_inner // self.ssm_dt_rank

    @property
    def n_embd_r(self) -> int:
        """Conv state per cell: the last d_conv - 1 inputs of every channel."""
        return (self.ssm_d_conv - 1) * self.conv_channels

    @property
    def n_embd_s(self) -> int:
        """Delta-rule state per cell: S_v x S_v per V head."""
        return self.ssm_d_state * self.ssm_d_inner

    def is_recurrent(self, il: int) -> bool:
        return self.recurrent[il]

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Args:
        base = super().from_gguf(f)

        def key(k: str, default=None):
            v = f.metadata.get(f"{ARCH}.{k}", default)
            if v is None:
                raise GGUFError(f.path, f"missing required key '{ARCH}.{k}'")
            return v

        def count(k: str, default=None) -> int:
            v = key(k, default)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise GGUFError(f.path, f"key '{ARCH}.{k}' must be a positive integer, not {str(v)[:40]!r}")
            return v

        n_all = base.n_layer  # block_count counts the MTP (nextn) blocks too; the main pass does not run them
        n_mtp = f.metadata.get(f"{ARCH}.nextn_predict_layers", 0)
        if isinstance(n_mtp, bool) or not isinstance(n_mtp, int) or n_mtp < 0:
            raise GGUFError(f.path, f"key '{ARCH}.nextn_predict_layers' has a bad value {str(n_mtp)[:40]!r}")
        n_layer = n_all - n_mtp
        sections = key("rope.dimension_sections")
        if not isinstance(sections, list) or not 3 <= len(sections) <= 4 or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sections) or not any(sections):
            raise GGUFError(f.path, f"key '{ARCH}.rope.dimension_sections' must hold 4 counts, not "
                                    f"{str(sections)[:40]!r}")
        recurrent = f.metadata.get(f"{ARCH}.attention.recurrent_layers")
        if recurrent is None:
            interval = count("full_attention_interval", 4)
            recurrent = [(i + 1) % interval != 0 for i in range(n_layer)]
        elif not isinstance(recurrent, list) or len(recurrent) < n_layer:
            raise GGUFError(f.path, f"key '{ARCH}.attention.recurrent_layers' must list the {n_layer} layers")
        a = replace(base, n_layer=n_layer, ssm_d_conv=count("ssm.conv_kernel"), ssm_d_inner=count("ssm.inner_size"),
                    ssm_d_state=count("ssm.state_size"), ssm_dt_rank=count("ssm.time_step_rank"),
                    ssm_n_group=count("ssm.group_count"), rope_sections=tuple(list(sections) + [0] * 4)[:4],
                    recurrent=tuple(bool(x) for x in recurrent[:n_layer]))
        if n_layer <= 0:
            raise GGUFError(f.path, f"block_count {n_all} leaves no layer besides the MTP ones")
        if a.ssm_d_inner % a.ssm_dt_rank or a.ssm_dt_rank % a.ssm_n_group or a.head_v_dim != a.ssm_d_state:
            raise GGUFError(f.path, f"ssm sizes do not fit: inner {a.ssm_d_inner}, V heads {a.ssm_dt_rank}, K heads "
                                    f"{a.ssm_n_group}, state {a.ssm_d_state} (need V head dim == state size and "
                                    f"V heads a multiple of K heads)")
        return a


def expected_shapes(a: Args) -> dict[str, tuple[int, ...]]:
    """ggml shapes (ne) of every tensor the graph may use, as llama_model_qwen35::load_arch_tensors creates them."""
    E, F, D = a.n_embd, a.n_ff, a.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (E, a.n_vocab), "output_norm.weight": (E,), "output.weight": (E, a.n_vocab)}
    for il in range(a.n_layer):
        p = f"blk.{il}."
        shapes.update({p + "attn_norm.weight": (E,), p + "post_attention_norm.weight": (E,),
                       p + "ffn_gate.weight": (E, F), p + "ffn_up.weight": (E, F), p + "ffn_down.weight": (F, E)})
        if a.is_recurrent(il):
            key_dim = a.ssm_d_state * a.ssm_n_group
            shapes.update({
                p + "attn_qkv.weight": (E, 2 * key_dim + a.ssm_d_inner),
                p + "attn_gate.weight": (E, a.ssm_d_inner),
                p + "ssm_conv1d.weight": (a.ssm_d_conv, a.conv_channels),
                p + "ssm_dt.bias": (a.ssm_dt_rank,),
                p + "ssm_a": (a.ssm_dt_rank,),
                p + "ssm_beta.weight": (E, a.ssm_dt_rank),
                p + "ssm_alpha.weight": (E, a.ssm_dt_rank),
                p + "ssm_norm.weight": (a.head_v_dim,),
                p + "ssm_out.weight": (a.ssm_d_inner, E),
            })
        else:
            shapes.update({
                p + "attn_q.weight": (E, 2 * D * a.n_head),
                p + "attn_k.weight": (E, a.n_embd_kv),
                p + "attn_v.weight": (E, a.n_embd_kv),
                p + "attn_output.weight": (D * a.n_head, E),
                p + "attn_q_norm.weight": (D,),
                p + "attn_k_norm.weight": (D,),
            })
    return shapes


def required_weights(a: Args) -> list[str]:
    return [n for n in expected_shapes(a) if n != "output.weight"]


def make_inputs(n_tokens: int, *args, n_seqs: int = 1, rs_fresh: bool = False, **kw) -> HybridInputs:
    """The dense inputs (transformer.make_inputs), with 4 position streams for the multi-section rope and the
    recurrent-state cell of each sequence."""
    base = transformer.make_inputs(n_tokens, *args, **kw)
    pos = make_tensor(GGMLType.I32, (N_POS_STREAMS * n_tokens,), name="inp_pos", flags=TFlag.INPUT)
    return hybrid_inputs(base, n_seqs, rs_fresh, pos=pos)


def full_attention(g: Graph, a: Args, w: dict[str, Tensor], il: int, cur: Tensor, inp: Inputs, cache: LayerCache,
                   n_kv: int, opts: GraphOptions) -> Tensor:
    """build_layer_attn: cur [E, T] -> [E, T]."""
    T, D, H, Hkv = cur.ne[1], a.head_dim, a.n_head, a.n_head_kv
    p = f"blk.{il}."
    q_full = _named(gb.mul_mat(w[p + "attn_q.weight"], cur), "Qcur_full", il)  # [2*D*H, T]: per head q then gate
    k = _named(gb.mul_mat(w[p + "attn_k.weight"], cur), "Kcur", il)  # [D*Hkv, T]
    v = _named(gb.mul_mat(w[p + "attn_v.weight"], cur), "Vcur", il)  # [D*Hkv, T]
    el = q_full.nb[0]
    q = gb.view_3d(q_full, D, H, T, 2 * D * el, 2 * D * H * el, name=f"Qcur_reshaped-{il}")  # [D, H, T] strided
    q = norm(q, w[p + "attn_q_norm.weight"], a.rms_eps, "Qcur_normed", il)
    k = norm(gb.reshape(k, D, Hkv, T), w[p + "attn_k_norm.weight"], a.rms_eps, "Kcur_normed", il)
    gate = gb.view_3d(q_full, D, H, T, 2 * D * el, 2 * D * H * el, D * el)  # `Qcur_full-il (view)`
    gate = _named(gb.cont_nd(gate, D * H, T), "gate_reshaped", il)  # [D*H, T]
    v = gb.reshape(v, D, Hkv, T, name=f"Vcur-{il}")
    rope = dict(n_dims=a.n_rot, sections=a.rope_sections, mode=ROPE_IMROPE, freq_base=a.rope_freq_base,
                freq_scale=a.rope_freq_scale, n_ctx_orig=a.n_ctx_train)
    q = _named(gb.rope_multi(q, inp.pos, **rope), "Qcur", il)
    k = _named(gb.rope_multi(k, inp.pos, **rope), "Kcur", il)
    o = _named(attend(g, a, il, q, k, v, inp, cache, n_kv, opts), "attn_pregate", il)  # [D*H, T]
    o = _named(gb.mul(o, _named(gb.sigmoid(gate), "gate_sigmoid", il)), "attn_gated", il)
    return _named(gb.mul_mat(w[p + "attn_output.weight"], o), "attn_output", il)  # [E, T]


def l2_norm(x: Tensor, eps: float, opts: GraphOptions) -> Tensor:
    """The q/k L2 norm: ggml_l2_norm in the May 2026 graph; today's llama.cpp (#28068, models.h build_gdn_l2_norm)
    builds RMS_NORM with eps/n then SCALE by 1/sqrt(n), the RMS_NORM unnamed."""
    if opts.kq_mask_cast:  # the May graph
        return gb.l2_norm(x, eps)
    n = x.ne[0]
    return gb.scale(gb.rms_norm(x, eps / n), 1.0 / n ** 0.5)


def gated_delta_net(g: Graph, a: Args, w: dict[str, Tensor], il: int, cur: Tensor, inp: HybridInputs,
                    cache: RecurrentLayerCache, opts: GraphOptions) -> Tensor:
    """build_layer_attn_linear (fused delta rule; sequence s in recurrent cell s): cur [E, n_seqs*T] -> [E, n_seqs*T],
    T tokens per sequence (llama.cpp's n_seq_tokens; split_equal gives every sequence as many)."""
    n_seqs = inp.s_copy.ne[0]
    T = cur.ne[1] // n_seqs
    S, Hk, Hv, C, dc = a.ssm_d_state, a.ssm_n_group, a.ssm_dt_rank, a.conv_channels, a.ssm_d_conv
    p = f"blk.{il}."
    # llama.cpp names the reshape after a projection (cb on the reshaped tensor): the MUL_MAT is node_<index>
    qkv = gb.mul_mat(w[p + "attn_qkv.weight"], cur)  # [C, T]
    z = _named(gb.mul_mat(w[p + "attn_gate.weight"], cur), "z", il)  # [Hv*S, T]
    beta = gb.reshape(gb.mul_mat(w[p + "ssm_beta.weight"], cur), 1, Hv, T, n_seqs, name=f"beta-{il}")
    beta = _named(gb.sigmoid(beta), "beta_sigmoid", il)  # [1, Hv, T, 1]
    alpha = gb.reshape(gb.mul_mat(w[p + "ssm_alpha.weight"], cur), Hv, T, n_seqs, name=f"alpha-{il}")  # [Hv, T]
    alpha = gb.add(alpha, w[p + "ssm_dt.bias"])
    gate = _named(gb.softplus(alpha), "a_softplus", il)
    gate = _named(gb.mul(gate, w[p + "ssm_a"]), "gate", il)  # -exp(A_log) * softplus: log-decay per head
    gate = gb.reshape(gate, 1, Hv, T, n_seqs)

    # conv state: the last dc-1 inputs of every channel, then this ubatch's columns; the new last dc-1 go back
    conv_states = read_state(g, cache.conv, inp, "conv_states", il)  # [(dc-1)*C, n_seqs]
    conv_states = gb.reshape(conv_states, dc - 1, C, n_seqs, name=f"conv_states_reshaped-{il}")
    qkv = gb.reshape(qkv, C, T, n_seqs, name=f"linear_attn_qkv_mixed-{il}")
    qkv_t = gb.transpose(qkv, name=f"qkv_mixed_transposed-{il}")  # [T, C, n_seqs]
    conv_input = _named(gb.concat(conv_states, qkv_t, 0), "conv_input", il)  # [dc-1+T, C, n_seqs]
    last = gb.view_3d(conv_input, dc - 1, C, n_seqs, conv_input.nb[1], conv_input.nb[2], T * conv_input.nb[0],
                      name=f"conv_state_last-{il}")
    update = gb.view_2d(cache.conv, a.n_embd_r, n_seqs, cache.conv.nb[1], name=f"conv_state_update-{il}")
    g.expand(gb.cpy(last, update))  # ggml's name: conv_state_update-il (copy of conv_state_last-il)

    state = read_state(g, cache.ssm, inp)  # [S*S*Hv, n_seqs]
    # the GATED_DELTA_NET state of the llama.cpp modeled: [S, S, Hv, n_seqs] (today's ggml), or ggml bb4dc86a's
    # [S*S*Hv, K = 1 snapshot, n_seqs] in the May graph
    state_ne = (S * S * Hv, 1, n_seqs) if opts.kq_mask_cast else (S, S, Hv, n_seqs)
    state = gb.reshape(state, *state_ne, name=f"state_predelta-{il}")

    conv = _named(gb.ssm_conv(conv_input, w[p + "ssm_conv1d.weight"]), "conv_output_raw", il)  # [C, T, n_seqs]
    conv = _named(gb.silu(conv), "conv_output_silu", il)
    row = conv.nb[1]
    el = conv.nb[0]
    q = gb.view_4d(conv, S, Hk, T, n_seqs, S * el, row, row * T, 0, name=f"q_conv-{il}")
    k = gb.view_4d(conv, S, Hk, T, n_seqs, S * el, row, row * T, S * Hk * el, name=f"k_conv-{il}")
    v = gb.view_4d(conv, S, Hv, T, n_seqs, S * el, row, row * T, 2 * S * Hk * el, name=f"v_conv_predelta-{il}")
    q = _named(l2_norm(q, a.rms_eps, opts), "q_conv_predelta", il)
    k = _named(l2_norm(k, a.rms_eps, opts), "k_conv_predelta", il)

    res = gb.gated_delta_net(q, k, v, gate, beta, state)  # [S*Hv, T*n + S*n]
    el = res.nb[0]
    out = gb.view_4d(res, S, Hv, T, n_seqs, S * el, S * Hv * el, S * Hv * T * el, 0, name=f"attn_output-{il}")
    new_state = gb.view_4d(res, S, S, Hv, n_seqs, S * el, S * S * el, S * S * Hv * el, S * Hv * T * n_seqs * el,
                           name=f"new_state-{il}")
    dst = gb.view_2d(cache.ssm, a.n_embd_s, n_seqs, cache.ssm.nb[1], name=f"{cache.ssm.name} (view)")
    g.expand(gb.cpy(new_state, dst))  # cache_s_lN (view) (copy of new_state-il)

    # gated RMS norm per V head: ssm_norm(o) * silu(z), then the output projection
    # (build_norm_gated: llama.cpp names only its RMS_NORM, norm-il; the MULs and the SILU stay node_<index>)
    o = gb.mul(_named(gb.rms_norm(out, a.rms_eps), "norm", il), w[p + "ssm_norm.weight"])  # [S, Hv, T, n_seqs]
    zs = gb.silu(gb.reshape(z, S, Hv, T, n_seqs, name=f"z-{il} (reshaped)"))
    o = gb.mul(o, zs)
    o = gb.reshape(o, S * Hv, T, n_seqs, name=f"final_output-{il}")  # [S*Hv, T, n_seqs]
    # the projection sees the sequences as a third dimension (a broadcast src1: what May's HTP refuses, #26094)
    out = _named(gb.mul_mat(w[p + "ssm_out.weight"], o), "linear_attn_out", il)  # [E, T, n_seqs]
    return gb.reshape(out, out.ne[0], T * n_seqs)  # [E, n_seqs*T]: `linear_attn_out-il (reshaped)`


def build(a: Args, w: dict[str, Tensor], inp: HybridInputs, caches: list, n_kv: int,
          opts: GraphOptions) -> tuple[Graph, Tensor]:
    """The forward graph of one micro-batch; caches[il] is the layer's LayerCache (attention) or
    RecurrentLayerCache (GDN). Returns (graph, logits [n_vocab, n_out])."""
    g = Graph()
    x = _named(gb.get_rows(w["token_embd.weight"], inp.tokens), "model.input_embed")  # [E, T]
    for il in range(a.n_layer):
        p = f"blk.{il}."
        h = g.expand(norm(x, w[p + "attn_norm.weight"], a.rms_eps, "attn_norm", il))
        if a.is_recurrent(il):
            h = gated_delta_net(g, a, w, il, h, inp, caches[il], opts)
        else:
            h = full_attention(g, a, w, il, h, inp, caches[il], n_kv, opts)
        res = _named(gb.add(h, x), "attn_residual", il)
        h = norm(res, w[p + "post_attention_norm.weight"], a.rms_eps, "attn_post_norm", il)
        h = _named(ffn_swiglu(a, w, il, h), "ffn_out", il)
        x = _named(gb.add(h, res), "l_out", il)
    x = norm(x, w["output_norm.weight"], a.rms_eps, "h_nextn", None)
    x = _named(gb.get_rows(x, inp.out_ids), "result_norm")  # [E, n_out]
    logits = _named(gb.mul_mat(w.get("output.weight", w["token_embd.weight"]), x), "result_output")
    logits.flags |= TFlag.OUTPUT
    g.expand(logits)
    expand_inputs(g, inp)
    return g, logits
