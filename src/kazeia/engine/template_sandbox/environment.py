"""The budgeted jinja2 environment: formatters and generated code that meter every step and piece of output, and
the sandbox that checks each operator and call before it runs."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import generate_lorem_ipsum
from markupsafe import Markup

from kazeia.engine.template_sandbox.budget import MAX_INT_BITS, Meter, _is_int, _short, _sized
from kazeia.engine.template_sandbox.checks import (
    _FILTER_CHECKS,
    _WIDTH_METHODS,
    SAFE_FILTERS,
    _joined_len,
    _printf_widths,
    _replaced_len,
    _spec_widths,
    bounded_items,
)


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
                items = bounded_items(m, args[0], "the items of str.join()")
                m.check_size(_joined_len(owner, items), "the result of str.join()")
                args = (items, *args[1:])
        elif obj is generate_lorem_ipsum:
            for a in (*args, *kwargs.values()):
                if _is_int(a):
                    m.check_int(a * 100, "lipsum() words")
        return args

    def metered_filter(self, name: str, f: Callable) -> Callable:
        """`f` as a filter of this environment: a step, the size checks of its kind (which may bound its value,
        checks.bounded_items), its result's size. A filter outside the whitelist (checks.SAFE_FILTERS and
        _FILTER_CHECKS) is refused when called."""
        check = _FILTER_CHECKS.get(name)
        known = check is not None or name in SAFE_FILTERS
        skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0  # the context/environment jinja passes

        @wraps(f)  # keeps jinja's pass_context / pass_eval_context / pass_environment marker
        def metered(*args: Any, **kwargs: Any) -> Any:
            self.meter.step()
            if not known:
                raise self.meter.refuse(f"the {name} filter is not one the template sandbox knows the size of")
            if check is not None:
                checked = check(self.meter, args[skip:], kwargs)
                if checked is not None:
                    args = (*args[:skip], *checked)
            return self._checked_result(f(*args, **kwargs), f"the result of the {name} filter")

        return metered

