"""The budget of a chat template render (template_sandbox's unit): its limits, the meter that counts steps, time and
output against them, and the value helpers the size checks share."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

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

