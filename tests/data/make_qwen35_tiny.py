"""Writes tests/data/qwen35_tiny_hf/: the tiny random Qwen3_5ForCausalLM whose llama.cpp conversion is
tests/data/qwen35_tiny_converted.gguf (see README.md for the conversion command). Run with the project venv:
    .venv/bin/python tests/data/make_qwen35_tiny.py tests/data/qwen35_tiny_hf
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

from hf_qwen35 import random_qwen35  # noqa: E402
from kazeia.gguf.synth_tokenizer import CHATML_TEMPLATE, CONTROL_TOKENS, USER_TOKENS, make_vocab  # noqa: E402

CONFIG = dict(seed=35, n_layer=4, n_embd=32, n_ff=64, n_head=2, n_head_kv=1, head_dim=16, k_heads=2, v_heads=4,
              ssm_dim=8, n_vocab=272, sections=(1, 1, 0), rope_theta=1e6,
              layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])


def write_tokenizer(d: str, n_vocab: int) -> None:
    """kazeia's synthetic byte-level BPE vocabulary as a Hugging Face fast tokenizer (the converter reads it)."""
    v = make_vocab(n_vocab)
    base = [t for t in v.tokens if t not in CONTROL_TOKENS + USER_TOKENS]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(base)},
                              merges=[tuple(m.split(" ", 1)) for m in v.merges]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True) for t in CONTROL_TOKENS])
    tk.add_tokens([AddedToken(t, special=False) for t in USER_TOKENS])
    tk.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "bos_token": None,
                   "chat_template": CHATML_TEMPLATE, "model_max_length": 512}, f, indent=1)


def main(out: str) -> None:
    m = random_qwen35(**CONFIG)
    m.save_pretrained(out)
    write_tokenizer(out, CONFIG["n_vocab"])


if __name__ == "__main__":
    main(sys.argv[1])
