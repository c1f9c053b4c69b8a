"""The size checks that run before an operator, method or filter that could allocate without bound: printf and
format widths, the string methods and filters whose result size comes from an argument or from an iterable of any
length, and the source's own size. Every filter check weighs the result from its inputs and refuses before the
filter builds anything; an iterable whose length is not known (a map, a select, a generator) is drawn into a list
of at most the budget's size first, and refused past it. The filters are a whitelist: SAFE_FILTERS (results no
larger than a small multiple of their inputs) and _FILTER_CHECKS; any other filter is refused."""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import islice
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


def _replaced_len(s: str, old: str, new: str, count: int = -1) -> int:
    n = len(s) + 1 if old == "" else s.count(old)
    if count is not None and _is_int(count) and count >= 0:
        n = min(n, count)
    return len(s) + n * (len(new) - len(old))


def _joined_len(sep: Any, items: Any) -> int:
    items = list(items)
    return sum(len(x) if isinstance(x, str) else len(str(x)) for x in items) + len(str(sep)) * max(len(items) - 1, 0)


def bounded_items(m: Meter, value: Any, what: str) -> Any:
    """`value` as something whose size is known: a str, list, tuple, dict, set or range as it is (refused when it
    holds more items than the budget), any other iterable drawn into a list of at most budget + 1 items (a step
    each) and refused past the budget -- so `range(n)|map(...)` is never materialised beyond what the render may
    output."""
    if isinstance(value, (str, list, tuple, dict, set, frozenset, range)):
        m.check_size(len(value), what)
        return value
    try:
        it = iter(value)
    except TypeError:
        return value  # not iterable: the filter raises its own error
    limit = m.budget.max_chars
    items = []
    for x in islice(it, limit + 1):
        m.step()
        items.append(x)
    m.check_size(len(items), what)
    return items


def _item_len(x: Any, attribute: Any = None) -> int:
    if attribute is not None:
        x = x.get(attribute, "") if isinstance(x, dict) else getattr(x, str(attribute), "")
    return len(x) if isinstance(x, str) else len(str(x)) if isinstance(x, (int, float)) else _sized(x) or 8


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    """A filter's argument by keyword, else by position `i` (the value is position 0), else `default`."""
    return kwargs.get(name, args[i] if len(args) > i else default)


def _check_replace(m: Meter, args: tuple, kwargs: dict) -> None:
    if len(args) >= 3:
        s, old, new = (str(a) for a in args[:3])
        m.check_size(_replaced_len(s, old, new, _arg(args, kwargs, 3, "count", -1)),
                     "the result of the replace filter")


def _check_width(m: Meter, args: tuple, kwargs: dict) -> None:
    for a in (*args[1:], *kwargs.values()):
        if _is_int(a):
            m.check_int(a, "a filter width")


def _check_indent(m: Meter, args: tuple, kwargs: dict) -> None:
    if not args:
        return
    width = _arg(args, kwargs, 1, "width", 4)
    pad = len(width) if isinstance(width, str) else width if _is_int(width) else 0
    text = str(args[0])
    m.check_size(len(text) + pad * (text.count("\n") + 1), "the result of the indent filter")


def _check_format(m: Meter, args: tuple, kwargs: dict) -> None:
    if args and isinstance(args[0], str):
        _printf_widths(m, args[0], args[1:])


def _bounding(what: str) -> Callable:
    """A check of a filter that walks its value: the value bounded first (bounded_items, its size named `what`),
    then `check(m, items, args, kwargs)` weighs the result; the filter then gets the bounded items."""
    def deco(check: Callable[[Meter, Any, tuple, dict], None]) -> Callable[[Meter, tuple, dict], tuple]:
        def run(m: Meter, args: tuple, kwargs: dict) -> tuple:
            if not args:
                return args
            items = bounded_items(m, args[0], what)
            check(m, items, args, kwargs)
            return (items, *args[1:])
        return run
    return deco


@_bounding("the items of the join filter")
def _check_join(m: Meter, items: Any, args: tuple, kwargs: dict) -> None:
    """join(value, d='', attribute=None): the items' lengths plus one separator between each two."""
    sep, attribute = str(_arg(args, kwargs, 1, "d", "")), _arg(args, kwargs, 2, "attribute")
    m.check_size(sum(_item_len(x, attribute) for x in items) + len(sep) * max(len(items) - 1, 0),
                 "the result of the join filter")


@_bounding("the items of the sum filter")
def _check_sum(m: Meter, items: Any, args: tuple, kwargs: dict) -> None:
    """sum(iterable, attribute=None, start=0): a sum of lists is their concatenation."""
    start = _arg(args, kwargs, 2, "start", 0)
    m.check_size(sum(_sized(x) or 0 for x in items) + (_sized(start) or 0), "the result of the sum filter")


@_bounding("the items of the batch filter")
def _check_batch(m: Meter, items: Any, args: tuple, kwargs: dict) -> None:
    """batch(value, linecount, fill_with=None): lists of `linecount` items; with fill_with the last one is padded
    to linecount, so [1]|batch(n, 0) is n items."""
    count = _arg(args, kwargs, 1, "linecount")
    if _is_int(count):
        m.check_int(count, "the batch filter's linecount")
        groups = -(-len(items) // max(count, 1))
        filled = _arg(args, kwargs, 2, "fill_with") is not None
        m.check_size(groups * max(count, 1) if filled else len(items) + groups, "the result of the batch filter")


@_bounding("the items of the slice filter")
def _check_slice(m: Meter, items: Any, args: tuple, kwargs: dict) -> None:
    """slice(value, slices, fill_with=None): `slices` lists (each padded by one fill item at most)."""
    slices = _arg(args, kwargs, 1, "slices")
    if _is_int(slices):
        m.check_int(slices, "the slice filter's count")
        m.check_size(len(items) + 2 * max(slices, 0), "the result of the slice filter")


@_bounding("the items of a filter")
def _check_collect(m: Meter, items: Any, args: tuple, kwargs: dict) -> None:
    """list, sort, unique, dictsort, groupby, reverse: they build a result as large as their input, which is bounded
    (drawn into a list when its length is not known) before the filter builds it; nothing more to weigh. (first,
    last, min, max, length build nothing: they keep jinja's own behaviour, errors included.)"""


def _check_wordwrap(m: Meter, args: tuple, kwargs: dict) -> None:
    """wordwrap(s, width=79, break_long_words=True, wrapstring=None): at most one wrapstring per `width`
    characters is added."""
    if not args:
        return
    text = str(args[0])
    width = _arg(args, kwargs, 1, "width", 79)
    wrap = _arg(args, kwargs, 3, "wrapstring")
    if _is_int(width):
        pieces = len(text) // max(width, 1) + text.count(" ") + 1
        m.check_size(len(text) + pieces * len(str(wrap or "\n")), "the result of the wordwrap filter")


def _check_tojson(m: Meter, args: tuple, kwargs: dict) -> None:
    """tojson(value, indent=None): each character may become a 6-character escape, and each item gets a line of
    `indent` spaces per level."""
    if not args:
        return
    size, depth = m._weight(args[0], 0, "the tojson filter's value")
    indent = _arg(args, kwargs, 1, "indent")
    per_item = 4 + (indent * (depth + 1) if _is_int(indent) and indent > 0 else len(indent) * (depth + 1)
                    if isinstance(indent, str) else 0)
    m.check_size(6 * size + size * per_item, "the result of the tojson filter")


# a check returns None (arguments unchanged) or the filter's arguments with its value bounded (bounded_items)
_FILTER_CHECKS: dict[str, Callable[[Meter, tuple, dict], tuple | None]] = {
    "center": _check_width, "indent": _check_indent, "wordwrap": _check_wordwrap, "tojson": _check_tojson,
    "replace": _check_replace, "format": _check_format, "join": _check_join, "sum": _check_sum,
    "batch": _check_batch, "slice": _check_slice,
    **{name: _check_collect for name in ("list", "sort", "unique", "dictsort", "groupby", "reverse")},
}

# filters whose result is no larger than a small multiple of their input (or lazy: map, select, ...), checked
# afterwards by the result's size; with _FILTER_CHECKS, the whitelist (any other filter is refused)
SAFE_FILTERS = frozenset({
    "abs", "attr", "capitalize", "d", "default", "e", "escape", "filesizeformat", "float", "forceescape", "int",
    "items", "lower", "map", "pprint", "random", "reject", "rejectattr", "round", "safe", "select", "selectattr",
    "string", "striptags", "title", "trim", "truncate", "upper", "urlencode", "urlize", "wordcount", "xmlattr",
    "first", "last", "min", "max", "length", "count",
})


def source_check(meter: Meter, source: str) -> None:
    if len(source) > MAX_SOURCE_CHARS:
        raise meter.refuse(f"the template is {len(source)} characters long (limit {MAX_SOURCE_CHARS})")

