"""A jinja2 sandbox with a budget: a chat template from a file can neither run code nor hang nor exhaust memory.

jinja2's ImmutableSandboxedEnvironment refuses file access, attribute escapes and mutation, but a template can
still loop for hours (`range(100000)` inside `range(100000)`), compute `10 ** 10**8`, or build `'x' * 10**8`.
`BudgetedEnvironment` enforces the budget INSIDE the render, where the work happens, so no thread has to watch
a render it cannot stop:
- every loop iteration, call, attribute lookup and piece of output is a step; the render stops after
  `max_steps` steps or `seconds` of wall-clock time (checked every 256 steps);
- every piece of output (literal text and `{{ ... }}` values, in any buffer: macros, `{% set %}` blocks) is
  counted, and the render stops when `max_chars` characters have been produced;
- operators that can allocate without bound are checked before they run: `**` and `*` on integers (the
  result's bits), `*` and `+` on strings and lists (the result's length), `~` (the joined length), `%` and
  `str.format` widths, and the string methods and filters whose size comes from an argument (ljust, center,
  replace, join, indent, ...); `range()` is bounded by the step budget.
Every refusal is a `TemplateBudgetError`: one line naming the template and the limit.
"""
from __future__ import annotations

from kazeia.engine.template_sandbox.budget import (
    CHARS_PER_TOKEN,
    DEFAULT_SECONDS,
    DEFAULT_STEPS,
    MAX_INT_BITS,
    MAX_SOURCE_CHARS,
    MAX_VALUE_DEPTH,
    Budget,
    Meter,
    TemplateBudgetError,
)
from kazeia.engine.template_sandbox.checks import source_check
from kazeia.engine.template_sandbox.environment import BudgetedEnvironment

__all__ = ["CHARS_PER_TOKEN", "DEFAULT_SECONDS", "DEFAULT_STEPS", "MAX_INT_BITS", "MAX_SOURCE_CHARS", "MAX_VALUE_DEPTH",
           "Budget", "BudgetedEnvironment", "Meter", "TemplateBudgetError", "source_check"]
