"""Tiny random Hugging Face Qwen3.5 models, and their export to GGUF with kazeia's writer.

transformers has Qwen3_5ForCausalLM but no GGUF loader for it, so the tests build a small random model in
transformers and write its weights with `kazeia.gguf.writer`, mapping names and layouts exactly as llama.cpp's
convert_hf_to_gguf.py does (conversion/qwen.py: Qwen3NextModel, _LinearAttentionVReorderBase):
- norm weights of the (1 + w) RMS norms get + 1 (not linear_attn.norm, a plain w * x norm);
- A_log -> ssm_a = -exp(A_log); dt_bias -> ssm_dt.bias; conv1d [C, 1, K] -> ssm_conv1d [C, K] (ggml [K, C]);
- with fewer K than V heads, V heads go from grouped order (by K head) to ggml's tiled order in in_proj_qkv's V
  rows, in_proj_z, in_proj_a/b, A_log, dt_bias, the conv's V channels and out_proj's columns;
- q_proj (query and gate per head, interleaved) is kept as is; partial rotary -> rope.dimension_count;
  mrope_section -> rope.dimension_sections (padded to 4); layer_types -> attention.recurrent_layers.
"""

from __future__ import annotations

import numpy as np
import torch

from kazeia.gguf.writer import SynthConfig, write_model


def random_qwen35(seed: int = 0, n_layer: int = 4, n_embd: int = 64, n_ff: int = 96, n_head: int = 4,
                  n_head_kv: int = 2, head_dim: int = 32, k_heads: int = 2, v_heads: int = 4, ssm_dim: int = 16,
                  n_vocab: int = 300, layer_types: list[str] | None = None, interval: int = 4,
                  partial_rotary: float = 0.25, sections=(2, 1, 1), tied: bool = False, rope_theta: float = 1e4):
    """A Qwen3_5ForCausalLM with seeded random weights at scales that exercise every path: projections
    N(0, 1/fan_in), (1 + w) norms with w ~ U(-0.3, 0.3), decays exp(A_log) in [0.4, 2.7], dt biases N(0, 0.5)."""
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    if layer_types is None:
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layer)]
    cfg = Qwen3_5TextConfig(
        vocab_size=n_vocab, hidden_size=n_embd, intermediate_size=n_ff, num_hidden_layers=n_layer,
        num_attention_heads=n_head, num_key_value_heads=n_head_kv, head_dim=head_dim, linear_num_key_heads=k_heads,
        linear_num_value_heads=v_heads, linear_key_head_dim=ssm_dim, linear_value_head_dim=ssm_dim,
        linear_conv_kernel_dim=4, max_position_embeddings=512, layer_types=layer_types, tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta, "partial_rotary_factor": partial_rotary,
                         "mrope_section": list(sections), "mrope_interleaved": True})
    torch.manual_seed(seed)
    m = Qwen3_5ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2 - 1)
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.3 * (torch.rand(p.shape, generator=g) * 2 - 1))
            elif p.ndim == 1:  # the (1 + w) norms
                p.copy_(0.3 * (torch.rand(p.shape, generator=g) * 2 - 1))
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1])
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (4 / p.shape[1] ** 0.5))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return m


def _tiled(x: np.ndarray, axis: int, k_heads: int, per_k: int, head_dim: int) -> np.ndarray:
    """V heads from grouped ([K0: v0..v(r-1)], [K1: ...]) to tiled order ([v0 of K0, v0 of K1, ...], ...)."""
    shape = list(x.shape)
    y = x.reshape(shape[:axis] + [k_heads, per_k, head_dim] + shape[axis + 1:])
    return np.swapaxes(y, axis, axis + 1).reshape(shape)


def gguf_tensors(m) -> list[tuple[str, np.ndarray, bool]]:
    """(GGUF name, float32 array in numpy order, is_matrix) for every weight, as the converter writes them."""
    c = m.config
    hk, hv, d = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_value_head_dim
    r = hv // hk
    sd = {k: v.detach().float().numpy() for k, v in m.state_dict().items()}
    neg_a = {k: (-torch.exp(v.detach().float())).numpy() for k, v in m.state_dict().items() if k.endswith("A_log")}
    out = [("token_embd.weight", sd["model.embed_tokens.weight"], True)]
    for il, kind in enumerate(c.layer_types):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        out.append((b + "attn_norm.weight", sd[p + "input_layernorm.weight"] + 1, False))
        if kind == "linear_attention":
            a = p + "linear_attn."
            qkv = sd[a + "in_proj_qkv.weight"].copy()
            kd = c.linear_key_head_dim * hk
            qkv[2 * kd:] = _tiled(qkv[2 * kd:], 0, hk, r, d)
            conv = sd[a + "conv1d.weight"][:, 0, :].copy()
            conv[2 * kd:] = _tiled(conv[2 * kd:], 0, hk, r, d)
            out += [(b + "attn_qkv.weight", qkv, True),
                    (b + "attn_gate.weight", _tiled(sd[a + "in_proj_z.weight"], 0, hk, r, d), True),
                    (b + "ssm_conv1d.weight", conv, False),
                    (b + "ssm_dt.bias", _tiled(sd[a + "dt_bias"], 0, hk, r, 1), False),
                    (b + "ssm_a", _tiled(neg_a[a + "A_log"], 0, hk, r, 1), False),  # -exp as torch rounds it
                    (b + "ssm_beta.weight", _tiled(sd[a + "in_proj_b.weight"], 0, hk, r, 1), True),
                    (b + "ssm_alpha.weight", _tiled(sd[a + "in_proj_a.weight"], 0, hk, r, 1), True),
                    (b + "ssm_norm.weight", sd[a + "norm.weight"], False),
                    (b + "ssm_out.weight", _tiled(sd[a + "out_proj.weight"], 1, hk, r, d), True)]
        else:
            a = p + "self_attn."
            out += [(b + "attn_q.weight", sd[a + "q_proj.weight"], True),
                    (b + "attn_k.weight", sd[a + "k_proj.weight"], True),
                    (b + "attn_v.weight", sd[a + "v_proj.weight"], True),
                    (b + "attn_output.weight", sd[a + "o_proj.weight"], True),
                    (b + "attn_q_norm.weight", sd[a + "q_norm.weight"] + 1, False),
                    (b + "attn_k_norm.weight", sd[a + "k_norm.weight"] + 1, False)]
        out += [(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"], True),
                (b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"], True),
                (b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"], True),
                (b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"] + 1, False)]
    out.append(("output_norm.weight", sd["model.norm.weight"] + 1, False))
    if not c.tie_word_embeddings:
        out.append(("output.weight", sd["lm_head.weight"], True))
    return [(n, np.ascontiguousarray(x, dtype=np.float32), mat) for n, x, mat in out]


def synth_config(m, wtype: str = "f32") -> SynthConfig:
    """The GGUF header the converter writes for this model, as kazeia's writer takes it."""
    c = m.config
    rp = c.rope_parameters
    return SynthConfig(
        arch="qwen35", n_layer=c.num_hidden_layers, n_embd=c.hidden_size, n_ff=c.intermediate_size,
        n_head=c.num_attention_heads, n_head_kv=c.num_key_value_heads, head_dim=c.head_dim,
        n_vocab=c.vocab_size, n_ctx=c.max_position_embeddings, rope_base=rp["rope_theta"], rms_eps=c.rms_norm_eps,
        wtype=wtype, tied=c.tie_word_embeddings, n_rot=int(c.head_dim * rp.get("partial_rotary_factor", 0.25)),
        rope_sections=tuple(list(rp.get("mrope_section", [11, 11, 10])) + [0]),
        ssm_conv_kernel=c.linear_conv_kernel_dim,
        ssm_head_dim=c.linear_key_head_dim, ssm_k_heads=c.linear_num_key_heads, ssm_v_heads=c.linear_num_value_heads,
        layer_pattern=tuple(t == "linear_attention" for t in c.layer_types))


def export(m, path: str, wtype: str = "f32") -> str:
    write_model(synth_config(m, wtype), path, tensors=gguf_tensors(m))
    return path
