"""The decoder-only transformer skeleton that llama.cpp's llama and qwen3 graphs share.

Architecture files choose the differences (rope mode, q/k norm, whether the attention output is named) and call
`build`. The graph is llama.cpp's, node for node (src/models/llama.cpp, qwen3.cpp; llama-graph.cpp: build_norm,
build_qkv, build_attn, build_attn_mha, build_ffn, build_inp_*), checked against llama-eval-callback's list
(tests/data/eval_callback_*.txt): the same names, ops, shapes and order.
- Names are llama.cpp's callback names with the layer suffix: `embd`, `norm-0` (build_norm's RMS_NORM) then
  `attn_norm-0` (its MUL), `Qcur-0` for the MUL_MAT, the RESHAPE and the ROPE, `ffn_out-0` for ffn_down's MUL_MAT,
  `norm` then `result_norm` at the end. Nodes llama.cpp leaves unnamed get ggml's `node_<index>` (the flash
  attention, qwen3's attention output MUL_MAT, the last layer's GET_ROWS). Where llama.cpp repeats a name, the
  graph keeps the first occurrence as is and calls the later ones `name#1`, `name#2`, ... (builder.Graph), so a
  name picks one node and a regex on the plain name still finds them all.
- Order: build_attn expands Qcur, then Vcur, then Kcur; the K and V cache stores; the views; the attention.
- Output rows: the last layer applies `out_ids` (GET_ROWS) right after attention, to the attention output and to
  the residual, so its FFN sees only the rows whose logits are wanted (M = 1 for generation).
- The KQ mask, with flash attention: an F16 input (`attn_inp_kq_mask`), as llama.cpp builds it since #23764
  (2026-05-28), the graph of the `2026-10` profile and of the CPU; `GraphOptions.kq_mask_cast=True` gives the
  graph the original team ran on 2026-05-27 (the `2026-05` profile): an F32 input and its F16 cast
  (a CPY, `attn_inp_kq_mask (copy)`), one more node, so ggml's `node_<index>` names after it are one higher.
Where kazeia differs, on purpose: without flash attention llama.cpp stores V transposed in the cache (per-element
SET_ROWS) and attends through that layout; kazeia keeps one V layout for both paths (kq, kq_soft_max, kqv, kqv_out
follow llama.cpp's names, not its V views).
Shapes in comments are ggml order: [ne0, ne1, ...]; T = tokens in the micro-batch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from kazeia.graph import builder as gb
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import GGMLType, Tensor, TFlag, make_tensor, row_size
from kazeia.models.base import ModelArgs


@dataclass
class Inputs:
    tokens: Tensor  # I32 [T]
    pos: Tensor  # I32 [T]
    kv_idx: Tensor  # I64 [T]: cache rows the new K go to (attn_inp_k_idxs)
    mask: Tensor  # F32 [n_kv, T] (attn_inp_kq_mask; F16 when flash attention without the cast)
    out_ids: Tensor  # I32 [n_out]: rows whose logits we want
    v_idx: Tensor | None = None  # I64 [T]: cache rows the new V go to (attn_inp_v_idxs); None: kv_idx
    mask_cnv: Tensor | None = None  # what attention reads: the F16 cast of the mask for flash attention; None: mask
    embd: Tensor | None = None  # F32 [n_embd, T]: llama.cpp's unselected embedding input (inp_embd), a leaf
    swa: Inputs | None = None  # the sliding-window layers' own cache rows and mask (build_attn_inp_kv_iswa)

    def for_layer(self, sliding: bool) -> Inputs:
        """What a layer's attention reads: the sliding-window inputs for an SWA layer, else these."""
        return self.swa if sliding and self.swa is not None else self


@dataclass
class HybridInputs(Inputs):
    """The inputs of a model with recurrent layers: the dense ones and the recurrent-state cell of each sequence."""

    s_copy: Tensor | None = None  # I32 [n_seqs]: the recurrent-state cell each sequence reads (rs_s_copy)
    rs_fresh: bool = False  # the cells are fresh (llama.cpp's rs_z >= 0: build_rs zeroes one in the graph)
    s_copy_main: Tensor | None = None  # views of s_copy: the ubatch's sequences' cells, and the cells beyond
    s_copy_extra: Tensor | None = None


@dataclass
class LayerCache:
    k: Tensor  # [n_embd_kv, kv_size]
    v: Tensor  # [n_embd_kv, kv_size]


@dataclass
class RecurrentLayerCache:
    """The recurrent state of a gated-delta-net layer (llama.cpp's cache_r_l / cache_s_l), one row per cell."""

    conv: Tensor  # F32 [(d_conv - 1) * conv_channels, n_cells]: the last d_conv - 1 inputs of the conv
    ssm: Tensor | None  # F32 [S_v * S_v * H_v, n_cells]: the delta-rule state (None: a short conv has none)


@dataclass
class GraphOptions:
    flash_attn: bool = True
    # the May 2026 graph (the 2026-05 profile's llama.cpp): with flash attention an F32 mask + its F16 CPY (before
    # #23764), else an F16 mask; Qwen3.5's q/k L2 norm as ggml_l2_norm (before #28068)
    kq_mask_cast: bool = False
    n_ctx_seq: int = 0  # cells of context per sequence (llama.cpp's cparams.n_ctx_seq; Phi-3 picks its rope factors)


def _input(t: GGMLType, ne: tuple[int, ...], name: str) -> Tensor:
    return make_tensor(t, ne, name=name, flags=TFlag.INPUT)


def _kv_inputs(n_tokens: int, n_kv: int, flash_attn: bool, kq_mask_cast: bool) -> dict[str, Tensor]:
    """One KV cache's inputs: the rows the new K and V go to and the KQ mask (F16 for flash attention since #23764,
    else F32, cast to F16 for flash attention in the May graph)."""
    f16_mask = flash_attn and not kq_mask_cast
    mask = _input(GGMLType.F16 if f16_mask else GGMLType.F32, (n_kv, n_tokens), "attn_inp_kq_mask")
    return dict(kv_idx=_input(GGMLType.I64, (n_tokens,), "attn_inp_k_idxs"),
                v_idx=_input(GGMLType.I64, (n_tokens,), "attn_inp_v_idxs"), mask=mask,
                mask_cnv=gb.cast(mask, GGMLType.F16) if flash_attn and not f16_mask else mask)


def make_inputs(n_tokens: int, n_kv: int, n_out: int, flash_attn: bool, kq_mask_cast: bool = False,
                n_embd: int = 0, n_kv_swa: int = 0) -> Inputs:
    """llama.cpp's graph inputs (build_inp_embd, build_inp_pos, build_attn_inp_kv, build_inp_out_ids); `n_embd` > 0
    adds the embedding input leaf (inp_embd) llama.cpp allocates beside the token path; `n_kv_swa` > 0 adds the
    sliding-window cache's own inputs (build_attn_inp_kv_iswa: the base cache's, then the SWA cache's)."""
    tokens = _input(GGMLType.I32, (n_tokens,), "inp_tokens")
    pos = _input(GGMLType.I32, (n_tokens,), "inp_pos")
    kv = _kv_inputs(n_tokens, n_kv, flash_attn, kq_mask_cast)
    out_ids = _input(GGMLType.I32, (n_out,), "out_ids")
    swa = None
    if n_kv_swa > 0:
        swa = Inputs(tokens=tokens, pos=pos, out_ids=out_ids, **_kv_inputs(n_tokens, n_kv_swa, flash_attn,
                                                                             kq_mask_cast))
    return Inputs(tokens=tokens, pos=pos, out_ids=out_ids, **kv, swa=swa,
                  embd=_input(GGMLType.F32, (n_embd, n_tokens), "inp_embd") if n_embd > 0 else None)


def hybrid_inputs(base: Inputs, n_seqs: int, rs_fresh: bool, **fields) -> HybridInputs:
    """`base` with the recurrent-state inputs (build_rs_inp_impl): `rs_s_copy`, the cell of each of the n_rs cells
    the ubatch touches (here n_rs = n_seqs: every micro-batch holds all its sequences), and its two views, the
    sequences' cells and the cells beyond them (empty here). `fields` replace base's (a hybrid's position streams)."""
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)} | fields
    s_copy = values["s_copy"] = _input(GGMLType.I32, (n_seqs,), "rs_s_copy")
    el = s_copy.nb[0]
    return HybridInputs(**values, rs_fresh=rs_fresh,
                        s_copy_main=gb.view(s_copy, (n_seqs,), (el,), name="rs_s_copy (view)"),
                        s_copy_extra=gb.view(s_copy, (0,), (el,), n_seqs * el, name="rs_s_copy (view)"))


def read_state(g: Graph, cache: Tensor, inp: HybridInputs, name: str = "", il: int | None = None) -> Tensor:
    """build_rs: [state, n_cells] -> the sequences' rows [state, n_seqs] (named `name`, else node_<index>), with its
    side effects expanded in llama.cpp's order: the SCALE by 0 of a fresh cell (a zero-sized view once the cell
    holds a state), the GET_ROWS of the sequences' cells, the GET_ROWS + CPY of the cells beyond them (none)."""
    size, n_seqs = cache.ne[0], inp.s_copy.ne[0]
    states = gb.reshape(cache, size, cache.ne[1])
    g.expand(gb.scale_inplace(gb.view(states, (size if inp.rs_fresh else 0,), (states.nb[0],)), 0.0))
    rows = gb.get_rows(states, inp.s_copy_main)
    g.expand(_named(rows, name, il) if name else rows)  # [state, n_seqs]
    rest = gb.view_2d(cache, size, inp.s_copy_extra.ne[0], cache.nb[1], n_seqs * cache.nb[1])
    g.expand(gb.cpy(gb.get_rows(states, inp.s_copy_extra), rest))
    return rows


def expand_inputs(g: Graph, inp: Inputs) -> None:
    """Every input leaf in the graph, the sliding-window cache's too, even one no layer reads (a hybrid cut with no
    attention layer, a Gemma 3 cut whose every layer slides): the context writes all of them."""
    for f in dataclasses.fields(inp):
        t = getattr(inp, f.name)
        if isinstance(t, Tensor) and t.op == "NONE":
            g.expand(t)
    if inp.swa is not None:
        expand_inputs(g, inp.swa)


def attention_layers(a: ModelArgs) -> list[int]:
    """The layers of a hybrid (an `is_recurrent` per layer) that keep a KV cache."""
    return [il for il in range(a.n_layer) if not a.is_recurrent(il)]


def recurrent_layers(a: ModelArgs) -> list[int]:
    """The layers of a hybrid that keep a recurrent state."""
    return [il for il in range(a.n_layer) if a.is_recurrent(il)]


def position_streams(pos: np.ndarray, n_streams: int) -> np.ndarray:
    """inp_pos for rope with `n_streams` position streams (4 for the multi-section modes): a text token's
    position in the first three streams (t, h, w) and 0 in the fourth, as llama.cpp fills it."""
    if n_streams == 1:
        return pos
    return np.concatenate([pos, pos, pos, np.zeros_like(pos)])


def _named(t: Tensor, name: str, il: int | None = None) -> Tensor:
    """llama.cpp's cb(t, name, il): `name-il` (or `name` for il None/-1)."""
    t.name = f"{name}-{il}" if il is not None and il >= 0 else name
    t.layer = il if il is not None and il >= 0 else None
    return t


def norm(x: Tensor, weight: Tensor, eps: float, name: str, il: int | None) -> Tensor:
    """build_norm (LLM_NORM_RMS) then cb(name): RMS_NORM `norm-il`, MUL by the weight `name-il`."""
    r = _named(gb.rms_norm(x, eps), "norm", il)
    return _named(gb.mul(r, weight), name, il)


def qkv(a: ModelArgs, w: dict[str, Tensor], il: int, cur: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """build_qkv: separate weights give MUL_MAT (+ bias) then RESHAPE, each named Qcur/Kcur/Vcur; a fused
    `attn_qkv.weight` gives one MUL_MAT `wqkv` (+ `wqkv_b`) and three strided views of it -> [D, heads, T]."""
    p, T, D = f"blk.{il}.", cur.ne[1], a.head_dim
    if p + "attn_qkv.weight" in w:
        return _fused_qkv(a, w, il, cur)
    out = []
    for c, heads in (("q", a.n_head), ("k", a.n_head_kv), ("v", a.n_head_kv)):
        name = f"{c.upper()}cur"
        t = _named(gb.mul_mat(w[p + f"attn_{c}.weight"], cur), name, il)  # [D*heads, T]
        if p + f"attn_{c}.bias" in w:
            t = _named(gb.add(t, w[p + f"attn_{c}.bias"]), name, il)
        out.append(_named(gb.reshape(t, D, heads, T), name, il))
    return out[0], out[1], out[2]


def _fused_qkv(a: ModelArgs, w: dict[str, Tensor], il: int, cur: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """build_qkv's fused path (Phi-3): [D*(H + 2 Hkv), T] viewed as Q, K, V heads, no copy."""
    p, T, D = f"blk.{il}.", cur.ne[1], a.head_dim
    x = _named(gb.mul_mat(w[p + "attn_qkv.weight"], cur), "wqkv", il)  # [D*(H + 2 Hkv), T]
    if p + "attn_qkv.bias" in w:
        x = _named(gb.add(x, w[p + "attn_qkv.bias"]), "wqkv_b", il)
    el, offs = x.nb[0], (0, a.n_embd_q, a.n_embd_q + a.n_embd_kv)
    views = [gb.view_3d(x, D, heads, T, D * el, x.nb[1], off * el)
             for heads, off in zip((a.n_head, a.n_head_kv, a.n_head_kv), offs)]
    return tuple(_named(v, name, il) for v, name in zip(views, ("Qcur", "Kcur", "Vcur")))  # type: ignore[return-value]


def attention(g: Graph, a: ModelArgs, w: dict[str, Tensor], il: int, cur: Tensor, inp: Inputs,
              cache: LayerCache, n_kv: int, rope_mode: int, qk_norm: bool, opts: GraphOptions,
              out_name: str | None = None) -> Tensor:
    """The self-attention block of llama.cpp's llama/qwen3 graphs: cur [n_embd, T] -> [n_embd, T]. `out_name`:
    the name the architecture gives the output projection (llama: attn_out; qwen3 leaves it unnamed)."""
    p = f"blk.{il}."
    rope = dict(n_dims=a.n_rot, mode=rope_mode, freq_base=a.rope_freq_base, freq_scale=a.rope_freq_scale,
                n_ctx_orig=a.n_ctx_train)
    q, k, v = qkv(a, w, il, cur)
    if qk_norm:  # Qwen3: per-head RMS norm before rope
        q = norm(q, w[p + "attn_q_norm.weight"], a.rms_eps, "Qcur_normed", il)
    q = _named(gb.rope_ext(q, inp.pos, **rope), "Qcur", il)
    if qk_norm:
        k = norm(k, w[p + "attn_k_norm.weight"], a.rms_eps, "Kcur_normed", il)
    k = _named(gb.rope_ext(k, inp.pos, **rope), "Kcur", il)
    o = _named(attend(g, a, il, q, k, v, inp, cache, n_kv, opts), "kqv_out", il)  # [D*H, T]
    out = gb.mul_mat(w[p + "attn_output.weight"], o)  # [n_embd, T]
    if out_name:
        _named(out, out_name, il)
    if p + "attn_output.bias" in w:
        out = gb.add(out, w[p + "attn_output.bias"])
    return out


def attend(g: Graph, a: ModelArgs, il: int, q: Tensor, k: Tensor, v: Tensor, inp: Inputs, cache: LayerCache,
           n_kv: int, opts: GraphOptions, kq_scale: float | None = None, iswa: bool = False) -> Tensor:
    """llama.cpp's build_attn with a KV cache: q [D, H, T] and k, v [D, Hkv, T] (roped) -> [D*H, T]. Expands q, v,
    k (in that order; q, k, v for a model with a sliding-window cache, whose build_attn takes
    llm_graph_input_attn_kv_iswa), then the cache stores (cpy_k, cpy_v), then attention over the first n_kv cells
    (build_attn_mha), scaled by `kq_scale` (default 1/sqrt(D); 1.0 where the architecture scaled q itself)."""
    D, H, Hkv, T = a.head_dim, a.n_head, a.n_head_kv, q.ne[2]
    for t in (q, k, v) if iswa else (q, v, k):
        g.expand(t)

    k2 = gb.view_2d(k, D * Hkv, T, k.nb[2])  # [D*Hkv, T]
    g.expand(gb.set_rows(cache.k, k2, inp.kv_idx))
    v2 = gb.view_2d(v, D * Hkv, T, v.nb[2])
    g.expand(gb.set_rows(cache.v, v2, inp.v_idx if inp.v_idx is not None else inp.kv_idx))

    ck, cv = cache.k, cache.v
    kv_k = gb.view_4d(ck, D, Hkv, n_kv, 1, row_size(ck.type, D), ck.nb[1], ck.nb[1] * ck.ne[1])  # [D, Hkv, n_kv]
    kv_v = gb.view_4d(cv, D, Hkv, n_kv, 1, row_size(cv.type, D), cv.nb[1], cv.nb[1] * cv.ne[1])
    qv = gb.view_4d(q, D, H, T, 1, q.nb[1], q.nb[2], q.nb[2] * T)  # the (single) stream's queries
    qp = gb.permute(qv, 0, 2, 1, 3)  # [D, T, H]
    kp = gb.permute(kv_k, 0, 2, 1, 3)  # [D, n_kv, Hkv]
    vp = gb.permute(kv_v, 0, 2, 1, 3)  # [D, n_kv, Hkv]
    mask = inp.mask_cnv if inp.mask_cnv is not None else inp.mask
    scale = 1.0 / math.sqrt(D) if kq_scale is None else kq_scale
    if opts.flash_attn:
        o = gb.flash_attn_ext(qp, kp, vp, mask, scale)  # [D, H, T] (unnamed in llama.cpp: node_<index>)
        return g.expand(gb.reshape(o, D * H, T))  # build_attn_mha expands its output
    kq = _named(gb.mul_mat(kp, qp), "kq", il)  # [n_kv, T, H]
    kq = _named(gb.soft_max_ext(kq, mask, scale), "kq_soft_max", il)
    vt = gb.permute(vp, 1, 0, 2, 3)  # [n_kv, D, Hkv]
    kqv = _named(gb.mul_mat(vt, kq), "kqv", il)  # [D, T, H]
    kqv = gb.permute(kqv, 0, 2, 1, 3)  # [D, H, T]
    return g.expand(gb.cont_nd(kqv, D * H, T))  # [D*H, T] contiguous


def ffn_swiglu(a: ModelArgs, w: dict[str, Tensor], il: int, cur: Tensor, out_name: str = "ffn_out") -> Tensor:
    """build_ffn (SILU, parallel gate) then cb(ffn_out): up, gate, SWIGLU, down -> [n_embd, T] (the down
    projection named `out_name`; "" leaves it node_<index>)."""
    p = f"blk.{il}."
    up = _named(gb.mul_mat(w[p + "ffn_up.weight"], cur), "ffn_up", il)  # [n_ff, T]
    gate = _named(gb.mul_mat(w[p + "ffn_gate.weight"], cur), "ffn_gate", il)  # [n_ff, T]
    x = _named(gb.swiglu_split(gate, up), "ffn_swiglu", il)
    down = gb.mul_mat(w[p + "ffn_down.weight"], x)  # [n_embd, T]
    return _named(down, out_name, il) if out_name else down


def token_embeddings(g: Graph, w: dict[str, Tensor], inp: Inputs, name: str = "embd") -> Tensor:
    """build_inp_embd: the token rows (GET_ROWS, named `name`) -> [n_embd, T], expanded; the embedding-input leaf
    first when the inputs have one (ggml_build_forward_select keeps that branch in the graph, unused)."""
    x = _named(gb.get_rows(w["token_embd.weight"], inp.tokens), name)
    if inp.embd is not None:
        g.expand(inp.embd)
    return g.expand(x)


def output_head(g: Graph, a: ModelArgs, w: dict[str, Tensor], x: Tensor, norm_weight: str = "output_norm.weight",
                softcap: float = 0.0) -> Tensor:
    """The final norm (`norm`, then `result_norm`), the lm_head (output.weight, else the tied token embeddings) and,
    with `softcap`, cap * tanh(logits / cap), named `result_output`: [n_vocab, n_out], expanded, an output."""
    x = norm(x, w[norm_weight], a.rms_eps, "result_norm", None)
    logits = gb.mul_mat(w.get("output.weight", w["token_embd.weight"]), x)  # [n_vocab, n_out]
    if softcap:
        logits = gb.scale(gb.tanh(gb.scale(logits, 1.0 / softcap)), softcap)
    logits = _named(logits, "result_output")
    logits.flags |= TFlag.OUTPUT
    return g.expand(logits)


def out_rows(a, il: int, inp: Inputs, h: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
    """The layer output h and its residual, cut to the rows whose logits are wanted after the last layer
    (llama.cpp's `if (il == n_layer - 1 && inp_out_ids)`: h's GET_ROWS, then the residual's); as they are before."""
    if il != a.n_layer - 1:
        return h, residual
    return gb.get_rows(h, inp.out_ids), gb.get_rows(residual, inp.out_ids)  # [n_embd, n_out]


def build(a: ModelArgs, w: dict[str, Tensor], inp: Inputs, caches: list[LayerCache], n_kv: int,
          rope_mode: int, qk_norm: bool, opts: GraphOptions, attn_out_name: str | None = None) -> tuple[Graph, Tensor]:
    """The whole forward graph of one micro-batch; returns (graph, logits [n_vocab, n_out])."""
    g = Graph()
    x = token_embeddings(g, w, inp)  # [n_embd, T]
    for il in range(a.n_layer):
        p = f"blk.{il}."
        inp_sa = x
        h = norm(x, w[p + "attn_norm.weight"], a.rms_eps, "attn_norm", il)
        h = attention(g, a, w, il, h, inp, caches[il], n_kv, rope_mode, qk_norm, opts, attn_out_name)
        h, inp_sa = out_rows(a, il, inp, h, inp_sa)
        ffn_inp = _named(gb.add(h, inp_sa), "ffn_inp", il)
        h = norm(ffn_inp, w[p + "ffn_norm.weight"], a.rms_eps, "ffn_norm", il)
        h = ffn_swiglu(a, w, il, h)
        x = _named(gb.add(h, ffn_inp), "l_out", il)
    return g, output_head(g, a, w, x)


def required_weights(a: ModelArgs, qk_norm: bool) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    for il in range(a.n_layer):
        p = f"blk.{il}."
        names += [p + n for n in ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                  "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                                  "ffn_down.weight")]
        if qk_norm:
            names += [p + "attn_q_norm.weight", p + "attn_k_norm.weight"]
    return names
