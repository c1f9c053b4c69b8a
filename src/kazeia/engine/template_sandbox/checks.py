"""The size checks that run before an operator, method or filter that could allocate without bound: printf and
format widths, the string methods and filters whose result size comes from an argument, and the source's own size."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kazeia.engine.template_sandbox.budget import MAX_SOURCE_CHARS, Meter, _is_int, _sized

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


_WIDTH_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})


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

