"""Writes a tiny random dense Hugging Face model (Qwen2ForCausalLM or LlamaForCausalLM) with kazeia's synthetic
tokenizer, for llama.cpp's converter (tests/data/README.md says how each converted file was made). Run with the
project venv:
    .venv/bin/python tests/data/make_dense_tiny.py qwen2 /tmp/qwen2_tiny_hf
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from make_qwen35_tiny import write_tokenizer  # noqa: E402

# 4 layers (the last layer's output-row selection is not layer 1's), 2 query heads per KV head, untied output
CONFIGS = {
    "qwen2": dict(seed=2, n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=272, rope_theta=1e6),
    "llama": dict(seed=1, n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=272, rope_theta=1e4),
}


def random_dense(arch: str, seed: int, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                 n_vocab: int, rope_theta: float):
    """Seeded random weights at scales that exercise every path: projections N(0, 1/fan_in), biases N(0, 0.25),
    (1 + w) norm weights with w ~ U(-0.3, 0.3), embeddings N(0, 16/n_embd)."""
    import transformers

    common = dict(vocab_size=n_vocab, hidden_size=n_embd, intermediate_size=n_ff, num_hidden_layers=n_layer,
                  num_attention_heads=n_head, num_key_value_heads=n_head_kv, max_position_embeddings=512,
                  rope_theta=rope_theta, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if arch == "qwen2":
        m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    else:
        m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * (torch.rand(p.shape, generator=g) * 2 - 1))
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (4 / p.shape[1] ** 0.5))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return m.eval()


def main(arch: str, out: str) -> None:
    cfg = dict(CONFIGS[arch])
    m = random_dense(arch, **cfg)
    m.save_pretrained(out)
    write_tokenizer(out, cfg["n_vocab"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
