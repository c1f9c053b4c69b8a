"""Recovery tells a transient death from a persistent one (issue 20): two deaths in a row at one op are confirmed
by running the op alone on a fresh session before its class is re-routed, and the warning names the evidence."""

from __future__ import annotations

import numpy as np

from kazeia.engine.recovery import DeathInjector
from test_recovery import greedy, session


class AtOp(DeathInjector):
    """Kills the device the first `times` times the op named `name` starts (inside its micro-batch or alone)."""

    def __init__(self, name: str, times: int) -> None:
        super().__init__()
        self.name, self.times = name, times

    def tick(self, op_name: str | None = None) -> str | None:
        self.ops += 1
        if op_name == self.name and self.deaths < self.times:
            self.deaths += 1
            return f"injected death {self.deaths} at {op_name}"
        return None


def _recovering(model: str, injector: DeathInjector):
    s = session("-m", model, "-dev", "HTP0", "--recover")
    for b in s.scheduler.backends:
        b.set_death_injector(injector)
    warned: list[str] = []
    s.ctx.recovery.warn = warned.append
    return s, warned


def test_two_transient_deaths_in_a_row_at_one_op_reroute_nothing(tiny_qwen3_q4):
    """Four deaths at ffn_out-0 (twice batched, twice one op per batch), then it completes alone: read as transient,
    no rule, the run bitwise the run without deaths."""
    ids = list(range(7, 47))
    base_t, base_l = greedy(session("-m", tiny_qwen3_q4, "-dev", "HTP0"), ids, 3)
    s, warned = _recovering(tiny_qwen3_q4, AtOp("ffn_out-0", 4))
    t, lg = greedy(s, ids, 3)
    assert s.ctx.recovery.deaths == 4 and not s.ctx.recovery.rules_added
    assert any("completed alone on a fresh session" in w and "transient" in w for w in warned), warned
    assert t == base_t and np.array_equal(lg, base_l)


def test_a_death_that_repeats_alone_is_rerouted_with_that_evidence(tiny_qwen3_q4):
    ids = list(range(7, 47))
    s, warned = _recovering(tiny_qwen3_q4, AtOp("ffn_out-0", 10 ** 6))
    greedy(s, ids, 1)
    (rule, *_) = s.ctx.recovery.rules_added
    assert "again alone on a fresh session" in rule.why
    assert any(rule.name in w and "again alone on a fresh session" in w for w in warned), warned
