"""A valid byte-level BPE vocabulary of any size >= 262, for synthetic models.

The 256 byte symbols come first (so any text encodes), then a few control tokens, then merges learned by
the `tokenizers` BPE trainer from a small built-in English text, then, if the vocabulary is still short,
merges of pairs of existing tokens in a fixed order. The result is deterministic for a given size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

CORPUS = """
The capital of France is Paris. The capital of Italy is Rome. The capital of Japan is Tokyo.
Once upon a time there was a small model that ran on a phone. It read its weights from a file and
wrote one word after another. The people who built it wanted to know why it stopped when the prompt
was longer than thirty two tokens, so they logged every operation, compared the numbers with a slower
but exact computation, and searched for the first place where the two disagreed.
One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, fourteen, fifteen.
Hello! How are you today? I am fine, thank you. What is your name? My name is Kazeia.
def main(): return 0  # numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 2048 4096 8192 65504
The matrix unit multiplies tiles of thirty two by thirty two half precision values; the vector unit
works on one hundred and twenty eight bytes at a time. Memory close to the processor is small and fast.
"""

CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_TOKENS = ["<think>", "</think>"]
MIN_VOCAB = 256 + len(CONTROL_TOKENS) + len(USER_TOKENS) + 1


@dataclass
class SynthVocab:
    tokens: list[str]
    token_types: list[int]  # 1 normal, 3 control, 4 user-defined
    merges: list[str]
    eos_id: int
    bos_id: int


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def make_vocab(n_vocab: int) -> SynthVocab:
    if n_vocab < MIN_VOCAB:
        raise ValueError(f"vocabulary must have at least {MIN_VOCAB} tokens")
    base = byte_alphabet()
    n_special = len(CONTROL_TOKENS) + len(USER_TOKENS)
    n_merges = n_vocab - 256 - n_special
    merges = _trained_merges(256 + n_merges)
    merges = merges[:n_merges]
    tokens = base[:]
    seen = set(tokens)
    for a, b in merges:
        tokens.append(a + b)
        seen.add(a + b)
    # fill: (byte, short token) merges in a fixed order until the vocabulary is full; tokens stay short
    j = 0
    while len(merges) < n_merges:
        b = tokens[j]
        j += 1
        if len(b) >= 6:
            continue
        for a in base:
            if len(merges) >= n_merges:
                break
            if a + b not in seen:
                merges.append((a, b))
                tokens.append(a + b)
                seen.add(a + b)
    types = [1] * len(tokens) + [3] * len(CONTROL_TOKENS) + [4] * len(USER_TOKENS)
    tokens = tokens + CONTROL_TOKENS + USER_TOKENS
    eos = tokens.index("<|endoftext|>")
    return SynthVocab(tokens, types, [f"{a} {b}" for a, b in merges], eos_id=eos, bos_id=eos)


def _trained_merges(vocab_size: int) -> list[tuple[str, str]]:
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tk.train_from_iterator([CORPUS] * 4, trainer)
    model = json.loads(tk.to_str())["model"]
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]


CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
