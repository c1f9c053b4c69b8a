"""Chat templates render under a time, step and output-size budget enforced inside the render
(engine/template_sandbox/), and real templates render exactly as an unbudgeted jinja2 sandbox renders them.

The issue's cases (a nested loop with and without output, a huge power, a huge repetition, a template that
renders nothing) each get a test of their one-line message; a hypothesis property test builds random templates
from adversarial pieces (loops, powers, repetitions, padding, replace, join, format widths, doubling through
a namespace, recursion) and checks that no render exceeds the time, output or memory budget and that every
refusal is one line naming the template.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import tracemalloc
from datetime import datetime

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kazeia.engine.chat import ChatSession, _tojson, render_chat
from kazeia.engine.template_sandbox import CHARS_PER_TOKEN, Budget, TemplateBudgetError
from kazeia.engine.tokenizer import GGUFTokenizer
from kazeia.errors import KazeiaError
from kazeia.gguf.reader import load_gguf
from kazeia.gguf.synth_tokenizer import CHATML_TEMPLATE

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tok(tiny_qwen3) -> GGUFTokenizer:
    return GGUFTokenizer.from_gguf(load_gguf(tiny_qwen3))


def _refusal(template: str, tok: GGUFTokenizer, **kw) -> str:
    with pytest.raises(KazeiaError) as ei:
        render_chat(template, MSG, tok, name="tmpl.gguf: tokenizer.chat_template", **kw)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("tmpl.gguf: tokenizer.chat_template: "), msg
    return msg


# ---------------------------------------------------------------------------------------------------
# the cases


def test_nested_loop_with_output_stops_at_the_output_budget(tok):
    t = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    msg = _refusal(t, tok, n_ctx=4096)
    assert f"output exceeds the budget of {4096 * CHARS_PER_TOKEN} characters (the context of 4096 tokens" in msg


def test_nested_loop_without_output_stops_at_the_step_budget(tok):
    t = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    msg = _refusal(t, tok, budget=Budget(1000, seconds=60, max_steps=300_000))
    assert "stopped after 300000 steps" in msg


def test_exponential_macro_calls_stop_at_the_step_budget(tok):
    t = "{% macro m(n) %}{% if n < 40 %}{{ m(n + 1) }}{{ m(n + 1) }}{% endif %}{% endmacro %}{{ m(0) }}"
    assert "stopped after 100000 steps" in _refusal(t, tok, budget=Budget(1000, seconds=60, max_steps=100_000))


def test_nested_loop_without_output_stops_at_the_time_budget(tok):
    t = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    t0 = time.monotonic()
    msg = _refusal(t, tok, budget=Budget(1000, seconds=0.3, max_steps=10**12))
    assert "stopped after 0.3 s (the template time budget)" in msg
    assert time.monotonic() - t0 < 10  # without the budget: ~10^10 iterations, hours


def test_huge_integer_power_is_refused_before_it_runs(tok):
    msg = _refusal("{{ 10 ** (10**8) }}", tok)
    assert "refused 10 ** 100000000: the result would have about 332192809 bits (limit 4096)" in msg


def test_huge_string_repetition_is_refused_before_it_allocates(tok):
    tracemalloc.start()
    try:
        msg = _refusal("{{ 'x' * 10**8 }}", tok, n_ctx=4096)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "refused 'x' * 100000000: 100000000 characters or items, over the budget of 65536 characters" in msg
    assert peak < 32 << 20


def test_a_template_that_renders_nothing_is_named(tiny_qwen3):
    from kazeia.backends.cpu import CpuBackend
    from kazeia.engine.context import Context, Model
    from kazeia.engine.scheduler import Scheduler

    m = Model.load(tiny_qwen3)
    tok = dataclasses.replace(GGUFTokenizer.from_gguf(m.file), chat_template="{% if false %}x{% endif %}  \n")
    chat = ChatSession(Context(m, Scheduler([CpuBackend()]), n_ctx=64), tok)
    with pytest.raises(KazeiaError) as ei:
        chat.prompt_tokens_for("hi")
    assert str(ei.value) == (f"{tiny_qwen3}: tokenizer.chat_template: the chat template rendered nothing for "
                             f"this conversation")


def test_the_output_budget_follows_the_context(tok):
    t = "{% for i in range(3000) %}xy{% endfor %}"
    assert len(render_chat(t, MSG, tok, n_ctx=4096)) == 6000
    assert "the budget of 4096 characters (the context of 256 tokens" in _refusal(t, tok, n_ctx=256)


@pytest.mark.parametrize("template, says", [
    ("{% set ns = namespace(s='a') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
     "refused a '~' concatenation"),
    ("{% set ns = namespace(s='a') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
     "refused a '+' of"),
    ("{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x }}",
     "bits (limit 4096)"),
    ("{{ 'x'.ljust(10**9) }}", "refused str.ljust() width of 1000000000"),
    ("{{ '{:>1000000000}'.format(1) }}", "refused a format width of 1000000000"),
    ("{{ '{:>{w}}'.format(1, w=10**9) }}", "refused a format width of 1000000000"),
    ("{{ '%1000000000d' % 1 }}", "refused a format width of 1000000000"),
    ("{{ '%*d' % (10**9, 1) }}", "refused a '*' format width of 1000000000"),
    ("{{ '%*d'|format(10**9, 1) }}", "refused a '*' format width of 1000000000"),
    ("{{ 'x'|center(1000000000) }}", "refused a filter width of 1000000000"),
    ("{{ ('a' * 60000)|indent(60000) }}", "the result of the indent filter"),
    ("{{ ('a' * 1000).replace('a', 'a' * 1000) }}", "the result of str.replace()"),
    ("{{ ('a' * 1000)|replace('a', 'a' * 1000) }}", "the result of the replace filter"),
    ("{{ ('a' * 60000).join(['b'] * 60000) }}", "the result of str.join()"),
    ("{{ (['b' * 60000] * 60000)|join('a') }}", "refused a '*' result: a value of 120001 characters and items"),
    ("{{ ['b' * 60000, 'c']|join('a' * 60000) }}", "the result of the join filter"),
    ("{% set ns = namespace(l=[1]) %}{% for i in range(30) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}"
     "{{ ns.l|tojson }}", "refused a list, tuple or dict literal: a value of 98303 characters and items"),
    ("{% set ns = namespace(d={'a': 1}) %}{% for i in range(30) %}{% set ns.d = {'a': ns.d, 'b': ns.d} %}"
     "{% endfor %}{{ ns.d }}", "refused a list, tuple or dict literal"),
    ("{% set ns = namespace(l=1) %}{% for i in range(40) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
     "a value nested more than 32 deep"),
    ("{{ ('\t' * 60000).expandtabs(60000) }}", "the result of str.expandtabs(): 3600060000"),
    ("{{ ('a ' * 30000)|wordwrap(1) }}", "the result of the wordwrap filter"),
    ("{{ messages|tojson(indent=60000) }}", "the result of the tojson filter"),
    ("{{ (range(60000)|list) * 60000 }}", "refused list * 60000"),
    ("{{ range(10**9)|list }}", "refused range(1000000000): 1000000000 items, over the template step budget"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursion too deep"),
    ("{{ lipsum(100000) }}", "refused lipsum() words"),
    ("{% for i in range(100000) recursive %}{{ loop([1, 2]) }}{% endfor %}", "recursion too deep"),
])
def test_amplifiers_are_refused_with_one_line(tok, template, says):
    assert says in _refusal(template, tok, n_ctx=4096)


def test_huge_template_source_is_refused(tok):
    assert "the template is 2097152 characters long (limit 1048576)" in _refusal("x" * (2 << 20), tok)


# ---------------------------------------------------------------------------------------------------
# real templates render exactly as before


def _plain_render(template: str, messages: list[dict], tok: GGUFTokenizer, add_generation_prompt: bool = True,
                  enable_thinking: bool | None = None) -> str:
    """The environment render_chat used before the budget (transformers' settings, no metering)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(ValueError(m))
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    kw = dict(messages=messages, add_generation_prompt=add_generation_prompt,
              bos_token=tok.vocab[tok.bos_id] if tok.bos_id is not None else "",
              eos_token=tok.vocab[tok.eos_id] if tok.eos_id is not None else "")
    if enable_thinking is not None:
        kw["enable_thinking"] = enable_thinking
    return env.from_string(template).render(**kw)


def _qwen3_template() -> str:
    from kazeia.gguf.hf_vocab import qwen3_tokenizer_dir

    try:
        d = qwen3_tokenizer_dir()
    except KazeiaError as e:
        pytest.skip(str(e))
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        return json.load(f)["chat_template"]


def _smollm2_template() -> str:
    from kazeia.engine.default_model import default_model_path

    try:
        return GGUFTokenizer.from_gguf(load_gguf(default_model_path())).chat_template
    except KazeiaError as e:
        pytest.skip(str(e))


CONVERSATIONS = [
    [{"role": "user", "content": "Capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Capital of France?"},
     {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\nParis."},
     {"role": "user", "content": "And of Italy? <b>&</b> «ü» {{ not jinja }}"}],
    [{"role": "user", "content": "x" * 3000}, {"role": "assistant", "content": "y\n" * 500},
     {"role": "user", "content": "more"}],
]


@pytest.mark.parametrize("which", ["smollm2", "qwen3", "hybrid"])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("thinking", [None, True, False])
def test_real_templates_render_identically(tok, which, conv, thinking):
    template = {"smollm2": _smollm2_template, "qwen3": _qwen3_template, "hybrid": lambda: CHATML_TEMPLATE}[which]()
    msgs = CONVERSATIONS[conv]
    for gen in (True, False):
        want = _plain_render(template, msgs, tok, gen, thinking)
        assert render_chat(template, msgs, tok, gen, thinking) == want
        assert render_chat(template, msgs, tok, gen, thinking, n_ctx=len(want) // CHARS_PER_TOKEN + 1) == want


# ---------------------------------------------------------------------------------------------------
# the property: random and adversarial templates never exceed the budgets

_NUMBERS = st.sampled_from(["0", "1", "7", "100", "5000", "100000", "10**6", "10**9", "10**(10**8)", "-3"])
_STRINGS = st.sampled_from(["'x'", "'ab'", "''", "messages[0].content", "'%*d'", "'{:>{w}}'", "'a\\nb'"])


def _expr(depth: int):
    leaf = st.one_of(_NUMBERS, _STRINGS, st.just("range(1000)|list"), st.just("[1, 2, 3]"), st.just("ns.v"))
    if depth == 0:
        return leaf
    sub = _expr(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(sub, st.sampled_from(["*", "**", "+", "~", "%", "//"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(sub, st.sampled_from(["center", "indent", "join", "string", "list", "sum", "length", "replace('a', "
                                        "'aaaa')", "format(10**9, 1)", "batch(3)|list", "map('string')|list"]))
        .map(lambda t: f"({t[0]})|{t[1]}" if t[1] in ("center", "indent") else f"({t[0]})|{t[1]}"),
        st.tuples(sub, sub).map(lambda t: f"({t[0]})|center({t[1]})"),
        st.tuples(_STRINGS | sub, st.sampled_from(["ljust", "zfill", "center", "expandtabs"]), _NUMBERS | sub)
        .map(lambda t: f"({t[0]}).{t[1]}({t[2]})"),
        st.tuples(_STRINGS | sub, sub).map(lambda t: f"({t[0]}).join({t[1]})"),
        st.tuples(_STRINGS | sub, _STRINGS | sub).map(lambda t: f"({t[0]}).replace('x', {t[1]})"),
        st.tuples(_STRINGS, sub).map(lambda t: f"{t[0]}.format(1, w={t[1]})"),
        st.tuples(sub).map(lambda t: f"lipsum({t[0]})"),
    )


def _stmt(depth: int):
    out = st.one_of(_expr(2).map(lambda e: "{{ " + e + " }}"), st.just("text" * 50), st.just("{{ ns.v }}"),
                    _expr(2).map(lambda e: "{% set ns.v = " + e + " %}"))
    if depth == 0:
        return out
    body = st.lists(_stmt(depth - 1), min_size=1, max_size=3).map("".join)
    return st.one_of(
        out,
        st.tuples(_NUMBERS, body).map(lambda t: "{% for i in range(" + t[0] + ") %}" + t[1] + "{% endfor %}"),
        st.tuples(_expr(1), body).map(lambda t: "{% for i in " + t[0] + " %}" + t[1] + "{% endfor %}"),
        body.map(lambda b: "{% macro m(n) %}" + b + "{{ m(n) }}{% endmacro %}{{ m(1) }}"),
        body.map(lambda b: "{% set blk %}" + b + "{% endset %}{{ blk ~ blk }}"),
    )


TEMPLATES = st.lists(_stmt(3), min_size=1, max_size=4).map(lambda parts: "{% set ns = namespace(v='a') %}" +
                                                            "".join(parts))
BUDGET = Budget(4096, seconds=1.0, max_steps=200_000, what="the test budget")


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(template=TEMPLATES)
@example(template="{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}")
@example(template="{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
@example(template="{{ 10 ** (10**8) }}")
@example(template="{{ 'x' * 10**8 }}")
@example(template="{% set ns = namespace(s='a') %}{% for i in range(99) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
def test_no_template_exceeds_the_budget(tok, template):
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        out = render_chat(template, MSG, tok, budget=BUDGET, name="fuzz")
    except TemplateBudgetError as e:
        out = None
        assert "\n" not in str(e) and str(e).startswith("fuzz: ")
    except KazeiaError as e:  # a template error (undefined, type error, recursion): one line, named
        out = None
        assert "\n" not in str(e) and str(e).startswith("fuzz: ")
    finally:
        elapsed = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert out is None or len(out) <= BUDGET.max_chars
    assert peak < 64 << 20, f"peak {peak >> 20} MiB"
    assert elapsed < BUDGET.seconds + 5, f"{elapsed:.1f} s"  # the budget plus the check interval's slack


# ---------------------------------------------------------------------------------------------------
# issue 36: every filter and method that builds a sequence or a string weighs it from its inputs first

BUILT_BEFORE_WEIGHED = [
    ("{{ ('ab' * 30000)|join('-' * 50000) }}", "the result of the join filter"),          # join over a str
    ("{{ range(50000)|join('=' * 40000) }}", "the result of the join filter"),            # over a range
    ("{{ range(5000000)|map('string')|join }}", "the items of the join filter"),           # over a lazy map
    ("{{ 'z'.join(range(5000000)|map('string')) }}", "the items of str.join()"),
    ("{{ ['a']|batch(200000000, 'f')|list|length }}", "the batch filter's linecount"),
    ("{{ [0, 1]|slice(40000000)|list|length }}", "the slice filter's count"),
    ("{{ range(5000000)|select|list|length }}", "the items of a filter"),
    ("{{ range(5000000)|map('int')|unique|list|length }}", "the items of a filter"),
    ("{{ range(4000000)|sum(start=[]) }}", "the items of the sum filter"),
]


@pytest.mark.parametrize("template,what", BUILT_BEFORE_WEIGHED)
def test_results_are_weighed_before_they_are_built(tok, template, what):
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        msg = _refusal(template, tok, n_ctx=4096)
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert what in msg and "over the budget" in msg, msg
    assert peak < 64 << 20, f"{template}: {peak >> 20} MiB allocated before the refusal"
    assert seconds < 5, seconds


def test_bounded_filters_keep_their_results(tok):
    """The checks change no result the budget allows (compared with an unbudgeted sandbox)."""
    env = ImmutableSandboxedEnvironment()
    for t in ("{{ range(10)|batch(3, 'x')|list }}", "{{ range(10)|slice(3)|list }}", "{{ 'abc'|join('-') }}",
              "{{ range(5)|map('string')|join(',') }}", "{{ [[1], [2, 3]]|sum(start=[]) }}",
              "{{ {'b': 1, 'a': 2}|dictsort }}", "{{ [3, 1, 3]|unique|list }}", "{{ range(4)|reverse|list }}",
              "{{ (range(6)|map('int'))|first }}", "{{ messages|map(attribute='content')|join('|') }}"):
        assert render_chat(t, MSG, tok, n_ctx=4096) == env.from_string(t).render(messages=MSG), t


def test_a_filter_the_sandbox_does_not_know_is_refused(tok):
    from kazeia.engine.template_sandbox import BudgetedEnvironment, Meter

    meter = Meter(Budget.for_context(4096), "t")
    env = BudgetedEnvironment(meter)
    env.filters["explode"] = env.metered_filter("explode", lambda s: s * 10)
    with pytest.raises(TemplateBudgetError, match="the explode filter is not one the template sandbox knows"):
        env.from_string("{{ 'a'|explode }}").render()
