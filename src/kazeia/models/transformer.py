"""The decoder-only transformer skeleton that llama.cpp's llama and qwen3 graphs share.

Architecture files choose the differences (rope mode, q/k norm) and call `build`. Node names follow
llama.cpp's callback names with the layer suffix (`attn_norm-0`, `Qcur-0`, `ffn_down-0`, `l_out-0`); where
llama.cpp reuses a name we make it unique (`attn_rms-0` for the RMS_NORM under `attn_norm-0`), so a name
always picks one node. Weight-consuming nodes also carry the GGUF weight name through their src[0].
Shapes in comments are ggml order: [ne0, ne1, ...]; T = tokens in the micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kazeia.graph import builder as gb
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import GGMLType, Tensor, TFlag, make_tensor
from kazeia.models.base import ModelArgs


@dataclass
class Inputs:
    tokens: Tensor  # I32 [T]
    pos: Tensor  # I32 [T]
    kv_idx: Tensor  # I64 [T]: cache rows the new K/V go to
    mask: Tensor  # F16 [n_kv, T] (flash attention) or F32
    out_ids: Tensor  # I32 [n_out]: rows whose logits we want


@dataclass
class LayerCache:
    k: Tensor  # [n_embd_kv, kv_size]
    v: Tensor  # [n_embd_kv, kv_size]


@dataclass
class RecurrentLayerCache:
    """The recurrent state of a gated-delta-net layer (llama.cpp's cache_r_l / cache_s_l), one row per cell."""

    conv: Tensor  # F32 [(d_conv - 1) * conv_channels, n_cells]: the last d_conv - 1 inputs of the conv
    ssm: Tensor  # F32 [S_v * S_v * H_v, n_cells]: the delta-rule state


@dataclass
class GraphOptions:
    flash_attn: bool = True


def make_inputs(n_tokens: int, n_kv: int, n_out: int, flash_attn: bool) -> Inputs:
    def inp(t, ne, name):
        return make_tensor(t, ne, name=name, flags=TFlag.INPUT)

    mask_type = GGMLType.F16 if flash_attn else GGMLType.F32
    return Inputs(
        tokens=inp(GGMLType.I32, (n_tokens,), "inp_tokens"),
        pos=inp(GGMLType.I32, (n_tokens,), "inp_pos"),
        kv_idx=inp(GGMLType.I64, (n_tokens,), "inp_kv_idxs"),
        mask=inp(mask_type, (n_kv, n_tokens), "attn_inp_kq_mask"),
        out_ids=inp(GGMLType.I32, (n_out,), "inp_out_ids"),
    )


def position_streams(pos: np.ndarray, n_streams: int) -> np.ndarray:
    """inp_pos for rope with `n_streams` position streams (4 for the multi-section modes): a text token's
    position in the first three streams (t, h, w) and 0 in the fourth, as llama.cpp fills it."""
    if n_streams == 1:
        return pos
    return np.concatenate([pos, pos, pos, np.zeros_like(pos)])


def _named(t: Tensor, name: str, il: int | None = None) -> Tensor:
    t.name = f"{name}-{il}" if il is not None else name
    t.layer = il
    return t


def norm(x: Tensor, weight: Tensor, eps: float, name: str, il: int | None) -> Tensor:
    """RMS_NORM then MUL by the norm weight; the RMS_NORM node is `<name>_rms`."""
    r = _named(gb.rms_norm(x, eps), f"{name}_rms", il)
    return _named(gb.mul(r, weight), name, il)


def attention(g: Graph, a: ModelArgs, w: dict[str, Tensor], il: int, cur: Tensor, inp: Inputs,
              cache: LayerCache, n_kv: int, rope_mode: int, qk_norm: bool, opts: GraphOptions) -> Tensor:
    T = cur.ne[1]
    D, H, Hkv = a.head_dim, a.n_head, a.n_head_kv
    p = f"blk.{il}."
    rope = dict(n_dims=a.n_rot, mode=rope_mode, freq_base=a.rope_freq_base, freq_scale=a.rope_freq_scale,
                n_ctx_orig=a.n_ctx_train)

    q = _named(gb.mul_mat(w[p + "attn_q.weight"], cur), "Qcur", il)  # [D*H, T]
    if p + "attn_q.bias" in w:
        q = _named(gb.add(q, w[p + "attn_q.bias"]), "Qcur_b", il)
    k = _named(gb.mul_mat(w[p + "attn_k.weight"], cur), "Kcur", il)  # [D*Hkv, T]
    if p + "attn_k.bias" in w:
        k = _named(gb.add(k, w[p + "attn_k.bias"]), "Kcur_b", il)
    v = _named(gb.mul_mat(w[p + "attn_v.weight"], cur), "Vcur", il)  # [D*Hkv, T]
    if p + "attn_v.bias" in w:
        v = _named(gb.add(v, w[p + "attn_v.bias"]), "Vcur_b", il)
    q = gb.reshape(q, D, H, T)  # [D, H, T]
    k = gb.reshape(k, D, Hkv, T)
    v = gb.reshape(v, D, Hkv, T)
    if qk_norm:  # Qwen3: per-head RMS norm before rope
        q = norm(q, w[p + "attn_q_norm.weight"], a.rms_eps, "Qcur_normed", il)
    q = _named(gb.rope_ext(q, inp.pos, **rope), "Qcur_rope", il)
    if qk_norm:
        k = norm(k, w[p + "attn_k_norm.weight"], a.rms_eps, "Kcur_normed", il)
    k = _named(gb.rope_ext(k, inp.pos, **rope), "Kcur_rope", il)
    o = attend(g, a, il, q, k, v, inp, cache, n_kv, opts)  # [D*H, T]
    out = _named(gb.mul_mat(w[p + "attn_output.weight"], o), "attn_out", il)  # [n_embd, T]
    if p + "attn_output.bias" in w:
        out = _named(gb.add(out, w[p + "attn_output.bias"]), "attn_out_b", il)
    return out


def attend(g: Graph, a: ModelArgs, il: int, q: Tensor, k: Tensor, v: Tensor, inp: Inputs, cache: LayerCache,
           n_kv: int, opts: GraphOptions) -> Tensor:
    """llama.cpp's build_attn with a KV cache: q [D, H, T] and k, v [D, Hkv, T] (roped) -> [D*H, T]. Expands q, k,
    v first, then the cache stores, then attention over the first n_kv cells."""
    D, H, Hkv, T = a.head_dim, a.n_head, a.n_head_kv, q.ne[2]
    g.expand(q)
    g.expand(k)
    g.expand(v)

    k2 = gb.view_2d(k, D * Hkv, T, k.nb[2])  # [D*Hkv, T]
    v2 = gb.view_2d(v, D * Hkv, T, v.nb[2])
    g.expand(_named(gb.set_rows(cache.k, k2, inp.kv_idx), "k_cache_store", il))
    g.expand(_named(gb.set_rows(cache.v, v2, inp.kv_idx), "v_cache_store", il))

    ck, cv = cache.k, cache.v
    row = ck.nb[1]
    kv_k = gb.view_3d(ck, D, Hkv, n_kv, ck.nb[0] * D, row, name=f"cache_k_l{il} (view)")  # [D, Hkv, n_kv]
    kv_v = gb.view_3d(cv, D, Hkv, n_kv, cv.nb[0] * D, cv.nb[1], name=f"cache_v_l{il} (view)")
    qp = gb.permute(q, 0, 2, 1, 3)  # [D, T, H]
    kp = gb.permute(kv_k, 0, 2, 1, 3)  # [D, n_kv, Hkv]
    vp = gb.permute(kv_v, 0, 2, 1, 3)  # [D, n_kv, Hkv]
    scale = 1.0 / math.sqrt(D)
    if opts.flash_attn:
        o = _named(gb.flash_attn_ext(qp, kp, vp, inp.mask, scale), "fattn", il)  # [D, H, T]
        o = gb.reshape(o, D * H, T)
    else:
        kq = _named(gb.mul_mat(kp, qp), "kq", il)  # [n_kv, T, H]
        kq = _named(gb.soft_max_ext(kq, inp.mask, scale), "kq_soft_max", il)
        vt = gb.permute(vp, 1, 0, 2, 3)  # [n_kv, D, Hkv]
        kqv = _named(gb.mul_mat(vt, kq), "kqv", il)  # [D, T, H]
        kqv = gb.permute(kqv, 0, 2, 1, 3)  # [D, H, T]
        o = _named(gb.cont(kqv), "kqv_merged_cont", il)  # [D, H, T] contiguous
        o = gb.reshape(o, D * H, T)
    return o


def ffn_swiglu(a: ModelArgs, w: dict[str, Tensor], il: int, cur: Tensor) -> Tensor:
    p = f"blk.{il}."
    up = _named(gb.mul_mat(w[p + "ffn_up.weight"], cur), "ffn_up", il)  # [n_ff, T]
    gate = _named(gb.mul_mat(w[p + "ffn_gate.weight"], cur), "ffn_gate", il)  # [n_ff, T]
    x = _named(gb.swiglu_split(gate, up), "ffn_swiglu", il)
    return _named(gb.mul_mat(w[p + "ffn_down.weight"], x), "ffn_down", il)  # [n_embd, T]


def build(a: ModelArgs, w: dict[str, Tensor], inp: Inputs, caches: list[LayerCache], n_kv: int,
          rope_mode: int, qk_norm: bool, opts: GraphOptions) -> tuple[Graph, Tensor]:
    """The whole forward graph of one micro-batch; returns (graph, logits [n_vocab, n_out])."""
    g = Graph()
    x = _named(gb.get_rows(w["token_embd.weight"], inp.tokens), "inp_embd")  # [n_embd, T]
    for il in range(a.n_layer):
        p = f"blk.{il}."
        h = norm(x, w[p + "attn_norm.weight"], a.rms_eps, "attn_norm", il)
        h = attention(g, a, w, il, h, inp, caches[il], n_kv, rope_mode, qk_norm, opts)
        ffn_inp = _named(gb.add(h, x), "ffn_inp", il)
        h = norm(ffn_inp, w[p + "ffn_norm.weight"], a.rms_eps, "ffn_norm", il)
        h = ffn_swiglu(a, w, il, h)
        x = _named(gb.add(h, ffn_inp), "l_out", il)
        g.expand(x)
    # Keep only the rows whose logits are wanted. llama.cpp does this inside the last layer; we do it after
    # it, so every layer (and the first layer of a 1-layer model) sees all T rows.
    x = _named(gb.get_rows(x, inp.out_ids), "result_rows")  # [n_embd, n_out]
    x = norm(x, w["output_norm.weight"], a.rms_eps, "result_norm", None)
    head = w.get("output.weight", w["token_embd.weight"])
    logits = _named(gb.mul_mat(head, x), "result_output")  # [n_vocab, n_out]
    logits.flags |= TFlag.OUTPUT
    g.expand(logits)
    return g, logits


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
