"""Tokenizer from GGUF metadata, built with Hugging Face's `tokenizers` library (byte-level BPE).

The vocabulary and merges come from `tokenizer.ggml.*`; the pre-tokenizer regex from `tokenizer.ggml.pre`
(the same per-model choices llama.cpp makes); control and user-defined tokens become special tokens, so
chat-template markers like `<|im_start|>` encode to one id; user-defined tokens (`<think>`) are matched too but
are ordinary text for decoding.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from kazeia.errors import GGUFError, UnsupportedError
from kazeia.gguf.reader import GGUFFile

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
QWEN2_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                  r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # qwen2's, letters with marks
LLAMA3_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
                  r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TOKEN_TYPE_NORMAL, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED = 1, 3, 4


def _pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("smollm", "starcoder", "refact"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    pattern = {"qwen2": QWEN2_PATTERN, "qwen3": QWEN2_PATTERN, "qwen35": QWEN35_PATTERN, "llama-bpe": LLAMA3_PATTERN,
               "llama3": LLAMA3_PATTERN}.get(pre, GPT2_PATTERN)
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"), byte_level])


@dataclass
class GGUFTokenizer:
    tok: Tokenizer
    vocab: list[str]
    token_types: list[int]
    bos_id: int | None
    eos_id: int | None
    eot_ids: set[int]
    add_bos: bool
    chat_template: str | None
    source: str = ""  # the GGUF file it came from (named in chat template errors)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> GGUFTokenizer:
        kind = f.get("tokenizer.ggml.model")
        if kind is None:
            raise GGUFError(f.path, "missing required key 'tokenizer.ggml.model'")
        if kind != "gpt2":
            raise UnsupportedError(f"{f.path}: tokenizer model '{kind}' is not supported (gpt2 BPE only)")
        vocab = _list_of(f, "tokenizer.ggml.tokens", str, f.require("tokenizer.ggml.tokens"))
        if not vocab:
            raise GGUFError(f.path, "tokenizer.ggml.tokens is empty")
        merges = _list_of(f, "tokenizer.ggml.merges", str, f.get("tokenizer.ggml.merges", []))
        types = _list_of(f, "tokenizer.ggml.token_type", int,
                         f.get("tokenizer.ggml.token_type", [TOKEN_TYPE_NORMAL] * len(vocab)))
        if len(types) != len(vocab):
            raise GGUFError(f.path, "tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")
        vocab_map = {t: i for i, t in enumerate(vocab)}
        pairs = []
        for m in merges:
            a, sep, b = m.partition(" ")
            if not sep:
                raise GGUFError(f.path, f"malformed merge rule {m!r}")
            pairs.append((a, b))
        try:
            bpe = models.BPE(vocab=vocab_map, merges=pairs, ignore_merges=False)
        except Exception as e:
            raise GGUFError(f.path, f"invalid BPE vocabulary ({e})") from None
        tok = Tokenizer(bpe)
        tok.pre_tokenizer = _pre_tokenizer(_scalar(f, "tokenizer.ggml.pre", str, "default"))
        tok.decoder = decoders.ByteLevel()
        # control tokens are special (skipped by decode(skip_special), plain text when parse_special is off);
        # user-defined ones (<think>) are always matched and always printed, as in llama.cpp and transformers
        special = [AddedToken(vocab[i], special=True, normalized=False) for i, ty in enumerate(types)
                   if ty == TOKEN_TYPE_CONTROL]
        user = [AddedToken(vocab[i], special=False, normalized=False) for i, ty in enumerate(types)
                if ty == TOKEN_TYPE_USER_DEFINED]
        if special:
            tok.add_special_tokens(special)
        if user:
            tok.add_tokens(user)
        bos, eos, eot_key = (_token_id(f, f"tokenizer.ggml.{k}_token_id", len(vocab)) for k in ("bos", "eos", "eot"))
        eot = {eos} if eos is not None else set()
        for name in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"):
            if name in vocab_map and types[vocab_map[name]] == TOKEN_TYPE_CONTROL:
                eot.add(vocab_map[name])
        if eot_key is not None:
            eot.add(eot_key)
        return cls(tok, vocab, types, bos, eos, eot, _scalar(f, "tokenizer.ggml.add_bos_token", bool, False),
                   _scalar(f, "tokenizer.chat_template", str, None), f.path)

    @property
    def n_vocab(self) -> int:
        return len(self.vocab)

    @functools.cached_property
    def longest_token_bytes(self) -> int:
        """An upper bound of the UTF-8 bytes one token stands for: its vocabulary string's characters (one per
        byte in byte-level BPE) times 4, the longest UTF-8 character."""
        return 4 * max(map(len, self.vocab), default=1)

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids if parse_special else self._encode_plain(text)
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        # no special-token matching: encode as if no token were special
        saved = self.tok.encode_special_tokens
        self.tok.encode_special_tokens = True
        try:
            return self.tok.encode(text, add_special_tokens=False).ids
        finally:
            self.tok.encode_special_tokens = saved

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    def is_control(self, tid: int) -> bool:
        return 0 <= tid < len(self.token_types) and self.token_types[tid] == TOKEN_TYPE_CONTROL

    def is_eog(self, tid: int) -> bool:
        return tid in self.eot_ids


def _list_of(f: GGUFFile, key: str, kind: type, v) -> list:
    """A GGUF array of strings or integers, checked (a damaged file may hold anything under any key)."""
    # exact types (a bool is not an integer here), checked by one C-level pass: 3 ms for 150k elements
    if not isinstance(v, list) or not set(map(type, v)) <= {kind}:
        raise GGUFError(f.path, f"{key} is not an array of {'strings' if kind is str else 'integers'}")
    return v


def _scalar(f: GGUFFile, key: str, kind: type, default):
    v = f.get(key, default)
    if v is not default and not isinstance(v, kind):
        raise GGUFError(f.path, f"{key} has a bad value {str(v)[:40]!r}")
    return v


def _token_id(f: GGUFFile, key: str, n_vocab: int) -> int | None:
    v = f.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise GGUFError(f.path, f"{key} has a bad value {str(v)[:40]!r}")
    return v if 0 <= v < n_vocab else None  # llama.cpp ignores an out-of-range special id (with a warning)


class StreamDecoder:
    """Turns a growing list of ids into text pieces without splitting multi-byte characters; `flush` gives what
    is still held back at the end (an incomplete UTF-8 sequence becomes U+FFFD, as llama.cpp prints it)."""

    def __init__(self, tok: GGUFTokenizer) -> None:
        self.tok = tok
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, tid: int) -> str:
        self.ids.append(tid)
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):  # incomplete UTF-8 sequence: wait for the next token
            return ""
        piece = text[len(self.emitted):]
        self.emitted = text
        return piece

    def flush(self) -> str:
        """The text not emitted yet (held back waiting for the rest of a character): call once at the end."""
        text = self.tok.decode(self.ids)
        piece = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return piece
