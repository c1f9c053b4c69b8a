"""Writes a tiny random Hugging Face model (Qwen2ForCausalLM, LlamaForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM
or Lfm2ForCausalLM) with kazeia's synthetic tokenizer, for llama.cpp's converter (tests/data/README.md says how each
converted file was made). Run with the project venv:
    .venv/bin/python tests/data/make_dense_tiny.py qwen2 /tmp/qwen2_tiny_hf
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from make_qwen35_tiny import write_tokenizer  # noqa: E402

# 4 layers (the last layer's output-row selection is not layer 1's), 2 query heads per KV head, untied output
CONFIGS = {
    "qwen2": dict(seed=2, n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=272, rope_theta=1e6),
    "llama": dict(seed=1, n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=272, rope_theta=1e4),
    # 6 layers: the converter writes no sliding-window pattern for Gemma3, so llama.cpp takes its default (every 6th
    # layer global); layers 0-4 slide over 8 tokens, layer 5 is global. head_dim 32 is not n_embd / n_head, and the
    # query scale is head_dim's (llama.cpp ignores query_pre_attn_scalar: it uses 1/sqrt(key_length))
    "gemma3": dict(seed=3, n_layer=6, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=272, rope_theta=1e6,
                   head_dim=32, rope_local_theta=1e4, sliding_window=8,
                   layer_types=["sliding_attention"] * 5 + ["full_attention"]),
    # Phi-4-mini's rope: partial (0.75 of 16 = 12 dims), longrope factors (6 each) for a 256 -> 1024 context
    "phi3": dict(seed=4, n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=272, rope_theta=1e4,
                 partial_rotary_factor=0.75, n_ctx=1024, n_ctx_orig=256),
    # LFM2-1.2B's layout: short-conv (kernel 3, no bias) and attention layers; intermediate_size 192 auto-adjusted
    # (2/3, multiple of 32) to the FFN width 128
    "lfm2": dict(seed=5, n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=272, rope_theta=1e6,
                 layer_types=["conv", "full_attention", "conv", "full_attention"], conv_L_cache=3),
}


def random_dense(arch: str, seed: int, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                 n_vocab: int, rope_theta: float, **extra):
    """Seeded random weights at scales that exercise every path: projections N(0, 1/fan_in), biases N(0, 0.25),
    (1 + w) norm weights with w ~ U(-0.3, 0.3) (Gemma3 stores w itself), embeddings N(0, 16/n_embd) (Gemma3's
    divided by sqrt(n_embd), which it multiplies back), short-conv kernels N(0, 1/kernel); Phi3's longrope factors
    U(1, 4), rounded to 4 decimals."""
    import transformers

    common = dict(vocab_size=n_vocab, hidden_size=n_embd, intermediate_size=n_ff, num_hidden_layers=n_layer,
                  num_attention_heads=n_head, num_key_value_heads=n_head_kv, max_position_embeddings=512,
                  rope_theta=rope_theta, rms_norm_eps=1e-6, tie_word_embeddings=False)
    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=None)
    g = torch.Generator().manual_seed(seed)
    if arch == "qwen2":
        m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    elif arch == "llama":
        m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif arch == "gemma3":
        del common["rope_theta"]
        hd = extra["head_dim"]
        m = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            **common, **ids, head_dim=hd, query_pre_attn_scalar=hd, sliding_window=extra["sliding_window"],
            layer_types=extra["layer_types"], final_logit_softcapping=None, attn_logit_softcapping=None,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": rope_theta},
                             "sliding_attention": {"rope_type": "default", "rope_theta": extra["rope_local_theta"]}}))
    elif arch == "phi3":
        del common["rope_theta"]
        rot = int(n_embd // n_head * extra["partial_rotary_factor"])
        short, long = ([round(1 + 3 * float(u), 4) for u in torch.rand(rot // 2, generator=g)] for _ in range(2))
        common.update(max_position_embeddings=extra["n_ctx"], rms_norm_eps=1e-5)
        m = transformers.Phi3ForCausalLM(transformers.Phi3Config(
            **common, **ids, original_max_position_embeddings=extra["n_ctx_orig"],
            rope_parameters={"rope_type": "longrope", "rope_theta": rope_theta,
                             "partial_rotary_factor": extra["partial_rotary_factor"],
                             "short_factor": short, "long_factor": long,
                             "original_max_position_embeddings": extra["n_ctx_orig"]}))
    elif arch == "lfm2":
        del common["rms_norm_eps"]
        common["intermediate_size"] = n_ff * 3 // 2
        m = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
            **common, **ids, norm_eps=1e-5, layer_types=extra["layer_types"], conv_L_cache=extra["conv_L_cache"],
            conv_bias=False, block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0, block_multiple_of=32))
    else:
        raise ValueError(arch)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_((0 if arch == "gemma3" else 1) + 0.3 * (torch.rand(p.shape, generator=g) * 2 - 1))
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "embed_tokens" in name:
                scale = 4 / p.shape[1] ** 0.5 / (p.shape[1] ** 0.5 if arch == "gemma3" else 1)
                p.copy_(torch.randn(p.shape, generator=g) * scale)
            elif name.endswith("conv.conv.weight"):  # depthwise (channels, 1, kernel)
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[2] ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return m.eval()


def main(arch: str, out: str) -> None:
    cfg = dict(CONFIGS[arch])
    m = random_dense(arch, **cfg)
    m.save_pretrained(out)
    write_tokenizer(out, cfg["n_vocab"])
    if arch == "phi3":  # Phi-4's tokenizer class: the Phi3 converter reads a GPT-2 vocabulary only for it
        path = os.path.join(out, "tokenizer_config.json")
        with open(path) as f:
            tc = json.load(f)
        tc["tokenizer_class"] = "GPT2Tokenizer"
        with open(path, "w") as f:
            json.dump(tc, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
