"""The GGUF tokenizer and chat templates.

Tokenizer: our tokenizer (built from tokenizer.ggml.*) against transformers' tokenizer loaded from the
same GGUF file, on varied text (unicode, digits, whitespace runs, newlines, special tokens) and on
hypothesis-generated text, for SmolLM2 (the default model) and a synthetic qwen3; decoding round-trips;
streaming decode never splits a character.
Chat templates: rendered like transformers' apply_chat_template; hostile templates are refused by the
jinja2 sandbox with a KazeiaError and run no code.
"""

from __future__ import annotations

import copy
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kazeia.engine.chat import render_chat
from kazeia.engine.tokenizer import GGUFTokenizer, StreamDecoder
from kazeia.errors import KazeiaError
from kazeia.gguf.reader import load_gguf
from kazeia.gguf.synth_tokenizer import byte_alphabet

BYTE_SYMBOLS = byte_alphabet()

TEXTS = [
    "The capital of France is",
    "Hello, world! 12345 678.9 -42 3.14159 1e10 2048x4096",
    "  leading and   multiple   spaces  ",
    "line1\nline2\n\n\nline3\r\nwindows\r\n",
    "tabs\tand\t\ttabs \t \n\t mixed",
    "unicode: café naïve 日本語 中文 한국어 Ωμέγα Привет",
    "emoji 😀🎉 👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_end|>b<|endoftext|>c",
    "don't won't I'm you'll he'd they've WE'RE It'S",
    "code: def f(x):\n    return x**2  # square\n\n",
    "e\u0301te\u0301 \u212b \ufb01 \u00a0nbsp\u2003emsp\u3000ideo x\u0085y a\u2028b",
    "<think>\nreasoning\n</think>\n\nanswer",
    "",
    " ",
    "\n",
    "0",
]


def _hf_tokenizer(path: str):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    d, name = os.path.split(path)
    return transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)


def _with_smollm_pretokenizer(hf):
    """transformers' GGUF converter ignores tokenizer.ggml.pre = 'smollm' and uses the plain GPT-2 split.
    SmolLM2's own tokenizer.json, and llama.cpp for 'smollm', first isolate every digit (\\p{N}), then apply
    the GPT-2 split; they differ on e.g. ' \\n0'. The reference for random text is therefore transformers'
    tokenizer (its vocabulary, merges, special tokens and decoder, all read from the GGUF) with the
    pre-tokenizer SmolLM2 was trained with."""
    from tokenizers import pre_tokenizers

    ref = copy.deepcopy(hf)
    ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return ref


@pytest.fixture(scope="module")
def smollm2(default_model):
    hf = _hf_tokenizer(default_model)
    return GGUFTokenizer.from_gguf(load_gguf(default_model)), hf, _with_smollm_pretokenizer(hf)


@pytest.fixture(scope="module")
def synth_qwen3(tiny_qwen3):
    hf = _hf_tokenizer(tiny_qwen3)
    return GGUFTokenizer.from_gguf(load_gguf(tiny_qwen3)), hf, hf


@pytest.fixture(params=["smollm2", "synth_qwen3"])
def triple(request):
    """(ours, transformers' tokenizer from the GGUF, reference for random text)"""
    return request.getfixturevalue(request.param)


@pytest.fixture
def pair(triple):
    return triple[0], triple[1]


@pytest.fixture(scope="module")
def synth_ours(tiny_qwen3):
    """Our tokenizer alone (for tests that need no transformers)."""
    return GGUFTokenizer.from_gguf(load_gguf(tiny_qwen3))


@pytest.fixture(params=["default_model", "tiny_qwen3"])
def ours_only(request):
    return GGUFTokenizer.from_gguf(load_gguf(request.getfixturevalue(request.param)))


@pytest.mark.slow
@pytest.mark.oracle
def test_smollm_reference_differs_from_transformers_only_by_the_digit_split(smollm2):
    """Documents the one known way transformers' GGUF tokenizer deviates for SmolLM2 (see above)."""
    ours, hf, ref = smollm2
    assert hf.encode(" \n0", add_special_tokens=False) != ref.encode(" \n0", add_special_tokens=False)
    assert ours.encode(" \n0", add_bos=False) == ref.encode(" \n0", add_special_tokens=False)


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_encode_matches_transformers(pair, text):
    ours, hf = pair
    assert ours.encode(text, add_bos=False) == hf.encode(text, add_special_tokens=False)


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_decode_round_trip(pair, text):
    ours, hf = pair
    ids = ours.encode(text, add_bos=False)
    assert ours.decode(ids) == text
    assert ours.decode(ids) == hf.decode(ids)


@pytest.mark.slow
@pytest.mark.oracle
def test_special_tokens_are_single_ids(pair):
    ours, hf = pair
    for name in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        tid = ours.vocab.index(name)
        assert ours.encode(name, add_bos=False) == [tid]
        assert hf.convert_tokens_to_ids(name) == tid
        # without special-token parsing the marker is plain text
        plain = ours.encode(name, add_bos=False, parse_special=False)
        assert tid not in plain and ours.decode(plain) == name
        assert plain == hf(name, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def test_user_defined_tokens_are_text_not_control(synth_qwen3):
    """<think> (token type 4, user-defined): one id even without special parsing, kept by skip_special decode."""
    ours, hf, _ = synth_qwen3
    text = "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nok<|im_end|>"
    ids = ours.encode(text, add_bos=False)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert ours.decode(ids, skip_special=True) == hf.decode(ids, skip_special_tokens=True)
    assert "<think>" in ours.decode(ids, skip_special=True)
    for name in ("<think>", "</think>"):
        assert ours.encode(name, add_bos=False, parse_special=False) == \
            hf(name, add_special_tokens=False, split_special_tokens=True)["input_ids"] == [ours.vocab.index(name)]


def test_bos_and_end_of_generation(smollm2):
    ours, hf, _ = smollm2
    assert ours.bos_id == hf.convert_tokens_to_ids(hf.bos_token)
    assert ours.eos_id == hf.convert_tokens_to_ids(hf.eos_token)
    assert ours.encode("hi", add_bos=True)[0] == ours.bos_id
    assert ours.encode("hi")[0] != ours.bos_id  # SmolLM2: tokenizer.ggml.add_bos_token is false
    assert ours.is_eog(ours.vocab.index("<|im_end|>")) and ours.is_eog(ours.eos_id)
    assert not ours.is_eog(ours.encode("Paris", add_bos=False)[0])


_special = st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"])
_chars = st.characters(codec="utf-8", exclude_categories=["Cs"])
_pieces = st.one_of(st.text(_chars, max_size=12), st.text(st.sampled_from(" \t\n\r0123456789'"), max_size=8),
                    st.text(st.sampled_from("abcXYZé日😀 "), max_size=8), _special)
TEXT = st.lists(_pieces, max_size=8).map("".join)


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.slow
@pytest.mark.oracle
@given(text=TEXT)
def test_random_text_matches_transformers(triple, text):
    ours, _, ref = triple
    ids = ours.encode(text, add_bos=False)
    assert ids == ref.encode(text, add_special_tokens=False)
    # SmolLM2's vocabulary lacks a few byte symbols (0xF1, 0xC0, ...): text using them cannot round-trip
    vocab = set(ours.vocab)
    if all(BYTE_SYMBOLS[b] in vocab for b in text.encode()):
        assert ours.decode(ids) == text


@pytest.mark.parametrize("text", ["日本語のテキスト 😀🎉 naïve", "a" * 5 + "€" * 3 + "\U0001f9ea x"])
def test_stream_decoder_never_splits_characters(ours_only, text):
    ours = ours_only
    dec = StreamDecoder(ours)
    pieces = [dec.push(t) for t in ours.encode(text, add_bos=False)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


# ---------------------------------------------------------------------------------------------------
# chat templates

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy? <b>&</b> «ü»"},
]


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("gen_prompt", [True, False])
@pytest.mark.parametrize("messages", [CONVERSATION, CONVERSATION[1:2]], ids=["with_system", "user_only"])
def test_chat_template_renders_like_transformers(pair, gen_prompt, messages):
    ours, hf = pair
    assert ours.chat_template
    want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen_prompt)
    assert render_chat(ours.chat_template, messages, ours, gen_prompt) == want


def test_chat_template_enable_thinking(synth_qwen3):
    ours, hf, _ = synth_qwen3
    msgs = CONVERSATION[1:2]
    for flag in (True, False):
        want = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=flag)
        assert render_chat(ours.chat_template, msgs, ours, True, enable_thinking=flag) == want
    assert "<think>" in render_chat(ours.chat_template, msgs, ours, True, enable_thinking=False)


EXTRA_FEATURES = (
    "{%- for m in messages %}{%- if loop.index > 2 %}{% break %}{% endif %}"
    "{%- if m.role == 'system' %}{% continue %}{% endif %}"
    "[{{ m.role }}]{{ m.content | tojson }}{{ raise_exception('never') if false }}\n{%- endfor %}"
    "{%- set ns = namespace(n=0) %}{%- for m in messages %}{%- set ns.n = ns.n + 1 %}{%- endfor %}{{ ns.n }}"
)


def test_template_features_used_by_real_models(synth_qwen3):
    """loop controls, tojson without HTML escaping, namespace: as transformers renders them."""
    ours, hf, _ = synth_qwen3
    want = hf.apply_chat_template(CONVERSATION, chat_template=EXTRA_FEATURES, tokenize=False)
    assert render_chat(EXTRA_FEATURES, CONVERSATION, ours, False) == want


def test_raise_exception_in_template_is_a_clear_error(synth_ours):
    ours = synth_ours
    with pytest.raises(KazeiaError, match="roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", CONVERSATION, ours)


HOSTILE = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('touch {marker}') }}",
    "{{ joiner.__init__.__globals__['os'].popen('touch {marker}').read() }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch {marker}') }}",
    "{{ lipsum.__globals__['os'].system('touch {marker}') }}",
    "{% set x = namespace.__init__.__globals__ %}{{ x.os.system('touch {marker}') }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ ''.format.__self__.__class__ }}{{ (''|attr('__class__')).__mro__ }}",
    "{{ '{0.__class__.__mro__}'.format('') }}",
    "{% for i in range(10**9) %}{% endfor %}",
    "{% set d = messages[0] %}{{ d.update({'role': 'x'}) }}",
    "{{ messages.append(1) }}",
]


@pytest.mark.parametrize("template", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_template_is_refused(synth_ours, tmp_path, template):
    ours = synth_ours
    marker = tmp_path / "pwned"
    msgs = [dict(m) for m in CONVERSATION]
    with pytest.raises(KazeiaError, match=r"chat template.*(unsafe|over the template step budget)"):
        render_chat(template.replace("{marker}", str(marker)), msgs, ours)
    assert not marker.exists()
    assert msgs == CONVERSATION  # the immutable sandbox did not let the template mutate its inputs
