"""Chat templates (jinja2, sandboxed and budgeted: a template from a file never runs code, hangs or exhausts
memory; engine/template_sandbox/) and chat sessions."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING

from kazeia.engine.context import Context
from kazeia.engine.tokenizer import GGUFTokenizer
from kazeia.errors import KazeiaError

if TYPE_CHECKING:
    from kazeia.engine.template_sandbox import Budget

# jinja2 and the sandbox are imported by the first render (0.1 s of start-up that `kazeia run -p` never needs)

DEFAULT_N_CTX = 4096  # the output budget of a render that names no context (kazeia run's default -c)

CHATML_FALLBACK = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _raise(msg: str):
    from jinja2 import TemplateError

    raise TemplateError(msg)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' tojson: plain JSON, no HTML escaping (jinja2's own filter turns '<' into \\u003c)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def template_name(tok: GGUFTokenizer, template: str | None) -> str:
    """How errors name the template: the GGUF key it came from, or the built-in fallback."""
    if template is None:
        return "the built-in ChatML chat template"
    if template == tok.chat_template and tok.source:
        return f"{tok.source}: tokenizer.chat_template"
    return "the chat template"


def render_chat(template: str | None, messages: list[dict], tok: GGUFTokenizer, add_generation_prompt: bool = True,
                enable_thinking: bool | None = None, n_ctx: int | None = None, budget: Budget | None = None,
                name: str | None = None) -> str:
    """Render the conversation with the template (None: ChatML) under `budget` (default: the output budget of
    an `n_ctx`-token context, a few seconds); every problem is a one-line KazeiaError naming the template."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols

    from kazeia.engine.template_sandbox import Budget, BudgetedEnvironment, Meter, TemplateBudgetError, source_check

    name = name or template_name(tok, template)
    meter = Meter(budget or Budget.for_context(n_ctx or DEFAULT_N_CTX), name)
    source = template if template is not None else CHATML_FALLBACK
    try:
        source_check(meter, source)
        # the environment transformers' apply_chat_template uses: {% break %}/{% continue %} and its tojson
        env = BudgetedEnvironment(meter, trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = env.metered_filter("tojson", _tojson)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        meter.counting = False
        tpl = env.from_string(source)
        meter.counting = True
        kw = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                  bos_token=tok.vocab[tok.bos_id] if tok.bos_id is not None else "",
                  eos_token=tok.vocab[tok.eos_id] if tok.eos_id is not None else "")
        if enable_thinking is not None:
            kw["enable_thinking"] = enable_thinking
        return tpl.render(**kw)
    except TemplateBudgetError:
        raise
    except TemplateError as e:
        raise KazeiaError(f"{name}: template error: {_one_line(e)}") from None
    except MemoryError:
        raise KazeiaError(f"{name}: refused: out of memory while rendering") from None
    except RecursionError:
        raise KazeiaError(f"{name}: refused: recursion too deep") from None
    except Exception as e:  # the sandbox raises SecurityError and friends for unsafe templates
        raise KazeiaError(f"{name}: refused: {type(e).__name__}: {_one_line(e)}") from None


def _one_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def chat_prompt_ids(tok: GGUFTokenizer, user_text: str, enable_thinking: bool | None = None,
                    system: str | None = None, n_ctx: int | None = None) -> list[int]:
    """The token ids of a one-turn chat (`kazeia run -cnv -st`'s first turn): the model's template rendered with
    the generation prompt, then encoded."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user_text}]
    return conversation_ids(tok, messages, enable_thinking, n_ctx)


def conversation_ids(tok: GGUFTokenizer, messages: list[dict], enable_thinking: bool | None = None,
                     n_ctx: int | None = None) -> list[int]:
    """The conversation rendered with the model's template and the generation prompt, then encoded."""
    template = tok.chat_template
    text = render_chat(template, messages, tok, True, enable_thinking, n_ctx=n_ctx)
    if not text.strip():
        raise KazeiaError(f"{template_name(tok, template)}: the chat template rendered nothing for this "
                          f"conversation")
    return tok.encode(text, add_bos=tok.add_bos)


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
        ids = conversation_ids(self.tok, self.messages, self.enable_thinking, self.ctx.n_ctx)
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
