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

import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import wraps
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import generate_lorem_ipsum
from markupsafe import Markup

from kazeia.errors import KazeiaError

CHARS_PER_TOKEN = 16  # the output budget is the context length in tokens times this (a token is rarely longer)
DEFAULT_SECONDS = 3.0
DEFAULT_STEPS = 5_000_000  # loop iterations + calls + lookups + output pieces (~2 s of pure-Python looping)
MAX_INT_BITS = 4096  # integers a chat template may compute (Python prints at most 4300 digits anyway)
MAX_VALUE_DEPTH = 32  # lists, tuples and dicts inside one another (a chat's messages with tool schemas: ~8)
MAX_SOURCE_CHARS = 1 << 20  # real chat templates are a few KB (the largest with tool schemas ~40 KB)


class TemplateBudgetError(KazeiaError):
    """A chat template exceeded its budget (time, steps, output size) or asked for a too large value."""


@dataclass(frozen=True)
class Budget:
    """What one render may spend; `what` says where max_chars comes from (for the messages)."""

    max_chars: int
    seconds: float = DEFAULT_SECONDS
    max_steps: int = DEFAULT_STEPS
    what: str = ""

    @classmethod
    def for_context(cls, n_ctx: int, seconds: float = DEFAULT_SECONDS, max_steps: int = DEFAULT_STEPS) -> Budget:
        n_ctx = max(int(n_ctx), 1)
        return cls(n_ctx * CHARS_PER_TOKEN, seconds, max_steps,
                   f"the context of {n_ctx} tokens x {CHARS_PER_TOKEN} characters")


class Meter:
    """Counts one render's steps and output characters against its budget."""

    def __init__(self, budget: Budget, name: str) -> None:
        self.budget, self.name = budget, name
        self.steps = 0
        self.chars = 0
        self.counting = True  # off while compiling: constants folded then are output (and counted) when rendering
        self._weights: dict[int, tuple[Any, int, int]] = {}  # id -> (container, size, depth), see weigh
        self.deadline = time.monotonic() + budget.seconds

    def refuse(self, what: str) -> TemplateBudgetError:
        return TemplateBudgetError(f"{self.name}: {what}")

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.budget.max_steps:
            raise self.refuse(f"rendering stopped after {self.budget.max_steps} steps (loop iterations, calls, "
                              f"lookups and output pieces: the template step budget)")
        if not self.steps & 255 and time.monotonic() > self.deadline:
            raise self.refuse(f"rendering stopped after {self.budget.seconds:g} s (the template time budget)")

    def size_limit(self) -> str:
        what = f" ({self.budget.what})" if self.budget.what else ""
        return f"the budget of {self.budget.max_chars} characters{what}"

    def check_size(self, n: int, what: str) -> None:
        if n > self.budget.max_chars:
            raise self.refuse(f"refused {what}: {n} characters or items, over {self.size_limit()}")

    def check_int(self, n: int, what: str) -> None:
        """An integer that decides how much is allocated (a width, a count)."""
        if abs(n) > self.budget.max_chars:
            raise self.refuse(f"refused {what} of {n}, over {self.size_limit()}")

    def weigh(self, value: Any, what: str) -> Any:
        """Refuse a value built during the render whose logical size (characters and items, every nested
        container counted each time it appears) is over the budget, or which is nested deeper than
        MAX_VALUE_DEPTH. Sizes are remembered per container, so `[l, l]` built 30 times costs 30 small steps to
        judge, not the 2^30 its printing, tojson or join would have walked."""
        size, depth = self._weight(value, 0, what)
        if depth > MAX_VALUE_DEPTH:
            raise self.refuse(f"refused {what}: a value nested more than {MAX_VALUE_DEPTH} deep")
        if size > self.budget.max_chars:
            raise self.refuse(f"refused {what}: a value of {size} characters and items, over {self.size_limit()}")
        return value

    def _weight(self, v: Any, level: int, what: str) -> tuple[int, int]:
        if isinstance(v, str):
            return len(v), 0
        if not isinstance(v, (list, tuple, dict, set, frozenset)):
            return 1, 0
        known = self._weights.get(id(v))
        if known is not None and known[0] is v:
            return known[1], known[2]
        if level >= MAX_VALUE_DEPTH:
            raise self.refuse(f"refused {what}: a value nested more than {MAX_VALUE_DEPTH} deep")
        size, depth = 1, 0
        for c in (x for kv in v.items() for x in kv) if isinstance(v, dict) else v:
            cs, cd = self._weight(c, level + 1, what)
            size, depth = size + cs, max(depth, cd + 1)
            if size > self.budget.max_chars:
                break
        self._weights[id(v)] = (v, size, depth)  # v kept alive: its id cannot be reused by another object
        return size, depth

    def output(self, text: str) -> str:
        self.step()
        if not self.counting:
            return text
        self.chars += len(text)
        if self.chars > self.budget.max_chars:
            raise self.refuse(f"rendering stopped: the output exceeds {self.size_limit()}")
        return text


def _sized(x: Any) -> int | None:
    return len(x) if isinstance(x, (str, list, tuple, dict, set, frozenset, bytes)) else None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _short(x: Any) -> str:
    r = repr(x) if isinstance(x, (str, int, float)) else type(x).__name__
    return r if len(r) <= 24 else r[:21] + "..."


_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d+)?(?:\.(\*|\d+))?")


def _printf_widths(meter: Meter, fmt: str, args: Any) -> None:
    """Widths and precisions of a printf-style format (`'%0*d' % (n, 1)`, `|format`)."""
    star = False
    for m in _PRINTF.finditer(fmt):
        for g in m.groups():
            if g == "*":
                star = True
            elif g:
                meter.check_int(int(g), "a format width")
    if star:
        for a in args if isinstance(args, (tuple, list)) else (args,):
            if _is_int(a):
                meter.check_int(a, "a '*' format width")


def _spec_widths(meter: Meter, spec: str) -> None:
    for d in re.findall(r"\d+", spec):
        meter.check_int(int(d), "a format width")


class _BudgetFormatter(SandboxedFormatter):
    """str.format / format_map: every field's final spec (nested fields resolved) is checked before formatting."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        _spec_widths(self._env.meter, format_spec)
        return super().format_field(value, format_spec)


class _BudgetEscapeFormatter(_BudgetFormatter, SandboxedEscapeFormatter):
    pass


class _CodeGenerator(CodeGenerator):
    """jinja2's code generator with four hooks into the meter: literal output goes through
    `environment.kz_text`, `~` through `environment.kz_concat`, every for-loop's iterable through
    `environment.kz_iter` (so a loop that outputs nothing still counts its iterations), and every list, tuple
    and dict literal through `environment.kz_built` (its size and depth weighed as it is built)."""

    def _built(self, visit: Callable, node: nodes.Node, frame: Frame) -> None:
        if getattr(node, "ctx", "load") != "load":  # a for or set target, not a value
            visit(node, frame)
            return
        self.write("environment.kz_built(")
        visit(node, frame)
        self.write(")")

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self._built(super().visit_List, node, frame)

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        self._built(super().visit_Tuple, node, frame)

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self._built(super().visit_Dict, node, frame)

    _loop_iters: set[int]

    def _output_const_repr(self, group: Iterable[Any]) -> str:
        return f"environment.kz_text({super()._output_const_repr(group)})"

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.kz_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        if not hasattr(self, "_loop_iters"):
            self._loop_iters = set()
        self._loop_iters.add(id(node.iter))
        super().visit_For(node, frame)

    def visit(self, node: nodes.Node, *args: Any, **kwargs: Any) -> Any:
        if id(node) in getattr(self, "_loop_iters", ()):
            self.write("environment.kz_iter(")
            out = super().visit(node, *args, **kwargs)
            self.write(")")
            return out
        return super().visit(node, *args, **kwargs)


# str methods whose result size comes from an integer argument
_WIDTH_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})


class BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment that meters one render (see the module docstring)."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"**", "*", "+", "%", "//", "/", "-"})

    def __init__(self, meter: Meter, **kw: Any) -> None:
        super().__init__(finalize=self._finalize, **kw)
        self.meter = meter
        self.globals["range"] = self._range
        self.filters = {name: self.metered_filter(name, f) for name, f in self.filters.items()}

    # --- hooks called by the generated code ---
    def kz_text(self, text: str) -> str:
        return self.meter.output(text)

    def _finalize(self, value: Any) -> str:
        if not isinstance(value, str):
            self.meter.weigh(value, "a printed value")
        return self.meter.output(value if isinstance(value, str) else str(value))

    def kz_built(self, value: Any) -> Any:
        self.meter.step()
        return self.meter.weigh(value, "a list, tuple or dict literal")

    def kz_concat(self, parts: tuple) -> str:
        strs = [p if isinstance(p, str) else str(p) for p in parts]
        self.meter.step()
        self.meter.check_size(sum(map(len, strs)), "a '~' concatenation")
        return "".join(strs)

    def kz_iter(self, iterable: Any) -> Iterator[Any]:
        step = self.meter.step
        for x in iterable:
            step()
            yield x

    def _range(self, *args: int) -> range:
        self.meter.step()
        r = range(*args)
        if len(r) > self.meter.budget.max_steps:
            raise self.meter.refuse(f"refused range({', '.join(map(str, args))}): {len(r)} items, over the "
                                    f"template step budget of {self.meter.budget.max_steps}")
        return r

    # --- the sandbox's interception points ---
    def getattr(self, obj: Any, attribute: str) -> Any:
        self.meter.step()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.meter.step()
        return super().getitem(obj, argument)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.meter.step()
        self._check_binop(operator, left, right)
        return self._checked_result(super().call_binop(context, operator, left, right), f"a '{operator}' result")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - as jinja2's
        __self.meter.step()
        args = __self._check_call(__obj, args, kwargs)
        name = getattr(__obj, "__name__", "a call")
        return __self._checked_result(super().call(__context, __obj, *args, **kwargs), f"the result of {name}()")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """jinja2's str.format sandboxing, with a formatter that checks every field's width first."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        s: str = value.__self__
        formatter = _BudgetEscapeFormatter(self, escape=s.escape) if isinstance(s, Markup) else _BudgetFormatter(self)
        is_map = value.__name__ == "format_map"

        def fmt(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                args, kwargs = (), args[0]
            return self._checked_result(type(s)(formatter.vformat(s, args, kwargs)), "a str.format result")

        return fmt

    # --- the checks ---
    def _checked_result(self, result: Any, what: str) -> Any:
        n = _sized(result)
        if n is not None:
            self.meter.check_size(n, what)
            if not isinstance(result, str):
                self.meter.weigh(result, what)
        return result

    def _check_binop(self, op: str, left: Any, right: Any) -> None:
        m = self.meter
        if op == "**" and _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
            bits = right * math.log2(abs(left))
            if bits > MAX_INT_BITS:
                raise m.refuse(f"refused {_short(left)} ** {_short(right)}: the result would have about "
                               f"{bits:.0f} bits (limit {MAX_INT_BITS})")
        elif op == "*":
            if _is_int(left) and _is_int(right):
                if left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
                    raise m.refuse(f"refused {_short(left)} * {_short(right)}: the result would have about "
                                   f"{left.bit_length() + right.bit_length()} bits (limit {MAX_INT_BITS})")
            for seq, n in ((left, right), (right, left)):
                if _sized(seq) is not None and _is_int(n):
                    m.check_size(len(seq) * max(n, 0), f"{_short(seq)} * {_short(n)}")
        elif op == "+" and _sized(left) is not None and _sized(right) is not None:
            m.check_size(len(left) + len(right), f"a '+' of {_short(left)} and {_short(right)}")
        elif op == "%" and isinstance(left, str):
            _printf_widths(m, left, right)

    def _check_call(self, obj: Any, args: tuple, kwargs: dict) -> tuple:
        """Refuse a call whose result would be too large before it runs; returns the (maybe listed) arguments."""
        m = self.meter
        owner = getattr(obj, "__self__", None)
        name = getattr(obj, "__name__", "")
        if isinstance(owner, str):
            if name in _WIDTH_METHODS:
                for a in (*args, *kwargs.values()):
                    if _is_int(a):
                        m.check_int(a, f"str.{name}() width")
                        if name == "expandtabs":  # every tab may become `a` spaces
                            m.check_size(len(owner) + owner.count("\t") * max(a, 0), "the result of str.expandtabs()")
            elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
                m.check_size(_replaced_len(owner, args[0], args[1], args[2] if len(args) > 2 else -1),
                             "the result of str.replace()")
            elif name == "join" and args:
                items = list(args[0]) if not isinstance(args[0], (list, tuple)) else args[0]
                m.check_size(_joined_len(owner, items), "the result of str.join()")
                args = (items, *args[1:])
        elif obj is generate_lorem_ipsum:
            for a in (*args, *kwargs.values()):
                if _is_int(a):
                    m.check_int(a * 100, "lipsum() words")
        return args

    def metered_filter(self, name: str, f: Callable) -> Callable:
        """`f` as a filter of this environment: a step, the size checks of its kind, its result's size."""
        check = _FILTER_CHECKS.get(name)

        @wraps(f)  # keeps jinja's pass_context / pass_eval_context / pass_environment marker
        def metered(*args: Any, **kwargs: Any) -> Any:
            self.meter.step()
            if check is not None:
                check(self.meter, _filter_args(f, args), kwargs)
            return self._checked_result(f(*args, **kwargs), f"the result of the {name} filter")

        return metered


def _filter_args(f: Callable, args: tuple) -> tuple:
    """The filter's own arguments (value first), without the context/environment jinja passes before them."""
    return args[1:] if getattr(f, "jinja_pass_arg", None) is not None else args


def _replaced_len(s: str, old: str, new: str, count: int = -1) -> int:
    n = len(s) + 1 if old == "" else s.count(old)
    if count is not None and _is_int(count) and count >= 0:
        n = min(n, count)
    return len(s) + n * (len(new) - len(old))


def _joined_len(sep: Any, items: Any) -> int:
    items = list(items)
    return sum(len(x) if isinstance(x, str) else len(str(x)) for x in items) + len(str(sep)) * max(len(items) - 1, 0)


def _check_replace(m: Meter, args: tuple, kwargs: dict) -> None:
    if len(args) >= 3:
        s, old, new = (str(a) for a in args[:3])
        m.check_size(_replaced_len(s, old, new, kwargs.get("count", args[3] if len(args) > 3 else -1)),
                     "the result of the replace filter")


def _check_width(m: Meter, args: tuple, kwargs: dict) -> None:
    for a in (*args[1:], *kwargs.values()):
        if _is_int(a):
            m.check_int(a, "a filter width")


def _check_indent(m: Meter, args: tuple, kwargs: dict) -> None:
    if not args:
        return
    width = kwargs.get("width", args[1] if len(args) > 1 else 4)
    pad = len(width) if isinstance(width, str) else width if _is_int(width) else 0
    text = str(args[0])
    m.check_size(len(text) + pad * (text.count("\n") + 1), "the result of the indent filter")


def _check_format(m: Meter, args: tuple, kwargs: dict) -> None:
    if args and isinstance(args[0], str):
        _printf_widths(m, args[0], args[1:])


def _check_join(m: Meter, args: tuple, kwargs: dict) -> None:
    if args and isinstance(args[0], (list, tuple)):
        m.check_size(_joined_len(kwargs.get("d", args[1] if len(args) > 1 else ""), args[0]),
                     "the result of the join filter")


def _check_sum(m: Meter, args: tuple, kwargs: dict) -> None:
    if args and isinstance(args[0], (list, tuple)):
        m.check_size(sum(_sized(x) or 0 for x in args[0]), "the result of the sum filter")


def _check_wordwrap(m: Meter, args: tuple, kwargs: dict) -> None:
    """wordwrap(s, width=79, break_long_words=True, wrapstring=None): at most one wrapstring per `width`
    characters is added."""
    if not args:
        return
    text = str(args[0])
    width = kwargs.get("width", args[1] if len(args) > 1 else 79)
    wrap = kwargs.get("wrapstring", args[3] if len(args) > 3 else None)
    if _is_int(width):
        pieces = len(text) // max(width, 1) + text.count(" ") + 1
        m.check_size(len(text) + pieces * len(str(wrap or "\n")), "the result of the wordwrap filter")


def _check_tojson(m: Meter, args: tuple, kwargs: dict) -> None:
    """tojson(value, indent=None): each character may become a 6-character escape, and each item gets a line of
    `indent` spaces per level."""
    if not args:
        return
    size, depth = m._weight(args[0], 0, "the tojson filter's value")
    indent = kwargs.get("indent", args[1] if len(args) > 1 else None)
    per_item = 4 + (indent * (depth + 1) if _is_int(indent) and indent > 0 else len(indent) * (depth + 1)
                    if isinstance(indent, str) else 0)
    m.check_size(6 * size + size * per_item, "the result of the tojson filter")


_FILTER_CHECKS: dict[str, Callable[[Meter, tuple, dict], None]] = {
    "center": _check_width, "indent": _check_indent, "wordwrap": _check_wordwrap, "tojson": _check_tojson,
    "replace": _check_replace, "format": _check_format, "join": _check_join, "sum": _check_sum,
}


def source_check(meter: Meter, source: str) -> None:
    if len(source) > MAX_SOURCE_CHARS:
        raise meter.refuse(f"the template is {len(source)} characters long (limit {MAX_SOURCE_CHARS})")

