"""Chat templates (jinja2, sandboxed: a template from a file never runs code) and chat sessions."""

from __future__ import annotations

import json
from datetime import datetime

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kazeia.engine.context import Context
from kazeia.engine.tokenizer import GGUFTokenizer
from kazeia.errors import KazeiaError

CHATML_FALLBACK = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _raise(msg: str):
    raise TemplateError(msg)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' tojson: plain JSON, no HTML escaping (jinja2's own filter turns '<' into \\u003c)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render_chat(template: str | None, messages: list[dict], tok: GGUFTokenizer, add_generation_prompt: bool = True,
                enable_thinking: bool | None = None) -> str:
    # the environment transformers' apply_chat_template uses: {% break %}/{% continue %} and its tojson
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        tpl = env.from_string(template or CHATML_FALLBACK)
        kw = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                  bos_token=tok.vocab[tok.bos_id] if tok.bos_id is not None else "",
                  eos_token=tok.vocab[tok.eos_id] if tok.eos_id is not None else "")
        if enable_thinking is not None:
            kw["enable_thinking"] = enable_thinking
        return tpl.render(**kw)
    except TemplateError as e:
        raise KazeiaError(f"chat template error: {e}") from None
    except Exception as e:  # the sandbox raises SecurityError and friends for unsafe templates
        raise KazeiaError(f"chat template refused: {type(e).__name__}: {e}") from None


class ChatSession:
    """Keeps the conversation and the tokens already in the KV cache; feeds only what is new."""

    def __init__(self, ctx: Context, tok: GGUFTokenizer, system: str | None = None,
                 enable_thinking: bool | None = None) -> None:
        self.ctx, self.tok = ctx, tok
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []
        self.enable_thinking = enable_thinking
        self.cached: list[int] = []

    def prompt_tokens_for(self, user_text: str) -> list[int]:
        """Append the user's message; return the tokens still to feed (the cache keeps the common prefix)."""
        self.messages.append({"role": "user", "content": user_text})
        text = render_chat(self.tok.chat_template, self.messages, self.tok, True, self.enable_thinking)
        ids = self.tok.encode(text, add_bos=self.tok.add_bos)
        common = 0
        for a, b in zip(ids, self.cached):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # always feed at least one token to get logits
        common = self.ctx.rewind(common)  # cells past it are masked out and overwritten (a recurrent state restarts)
        self.cached = ids[:common]
        return ids[common:]

    def add_reply(self, fed: list[int], reply_ids: list[int], reply_text: str) -> None:
        self.cached += fed + reply_ids
        self.cached = self.cached[: self.ctx.n_past]
        self.messages.append({"role": "assistant", "content": reply_text})
