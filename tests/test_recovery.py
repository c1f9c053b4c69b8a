"""Recovery from device deaths (issue 11): transient deaths re-run the micro-batch on a new session with nothing
lost, duplicated or changed; a persistent death at one op adds a rule routing its class away."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kazeia.cli.common import open_session
from kazeia.cli.main import build_parser
from kazeia.errors import DeviceDeathError

HYBRID = os.path.join(os.path.dirname(__file__), "data", "qwen35_tiny_converted.gguf")


def session(*argv: str):
    return open_session(build_parser("run").parse_args(["run", *argv]))


def greedy(s, ids, n: int):
    """Tokens and every logits row (prefill's last, then each decode's), greedy."""
    rows = [np.array(s.ctx.decode(ids)[-1])]
    toks = []
    for _ in range(n):
        toks.append(int(np.argmax(rows[-1])))
        rows.append(np.array(s.ctx.decode([toks[-1]])[-1]))
    return toks, np.stack(rows)


def device_ops(model: str, ids, n: int, *flags: str) -> int:
    """How many ops the device starts in this run (an injector that never fires counts them)."""
    s = session("-m", model, "-dev", "HTP0", "--inject-death-at", str(10 ** 9), *flags)
    greedy(s, ids, n)
    return s.injector.ops


@pytest.mark.parametrize("where", [0.0, 0.3, 0.97])
def test_one_injected_death_changes_nothing(tiny_qwen3_q4, where):
    """A transient death in the prefill or in a decode step: the run completes with the tokens and logits of the
    run without it, bitwise, after exactly one re-run."""
    ids = list(range(7, 47))
    base_t, base_l = greedy(session("-m", tiny_qwen3_q4, "-dev", "HTP0"), ids, 6)
    at = int(where * device_ops(tiny_qwen3_q4, ids, 6))
    s = session("-m", tiny_qwen3_q4, "-dev", "HTP0", "--recover", "--inject-death-at", str(at))
    t, lg = greedy(s, ids, 6)
    assert s.injector.deaths == 1 and s.ctx.recovery.deaths == 1 and not s.ctx.recovery.rules_added
    assert t == base_t and np.array_equal(lg, base_l)
    assert s.ctx.n_past == len(ids) + 6  # no token lost or duplicated in the cache


def test_without_recovery_an_injected_death_ends_the_run(tiny_qwen3_q4):
    s = session("-m", tiny_qwen3_q4, "-dev", "HTP0", "--inject-death-at", "5")
    with pytest.raises(DeviceDeathError, match="0x0000002e"):
        greedy(s, list(range(7, 20)), 1)


@pytest.mark.slow  # many recovered runs (2.5 s)
def test_random_deaths_are_bitwise_invisible(tiny_qwen3_q4):
    ids = list(range(3, 40))
    base_t, base_l = greedy(session("-m", tiny_qwen3_q4, "-dev", "HTP0"), ids, 32)
    s = session("-m", tiny_qwen3_q4, "-dev", "HTP0", "--recover", "--inject-death-rate", "0.02",
                "--inject-seed", "7", "--inject-deaths", "12")
    t, lg = greedy(s, ids, 32)
    assert s.injector.deaths == 12
    assert t == base_t and np.array_equal(lg, base_l)


def test_recurrent_state_survives_deaths():
    """The hybrid's conv and delta-rule states are updated in place by the graph: a re-run starts from the state
    before the micro-batch, so the logits are bitwise those of the run without deaths."""
    ids = list(range(3, 40))
    base_t, base_l = greedy(session("-m", HYBRID, "-dev", "HTP0"), ids, 6)
    n_ops = device_ops(HYBRID, ids, 6)
    for at in (n_ops // 5, n_ops // 2, n_ops - 3):
        s = session("-m", HYBRID, "-dev", "HTP0", "--recover", "--inject-death-at", str(at))
        t, lg = greedy(s, ids, 6)
        assert s.injector.deaths == 1
        assert t == base_t and np.array_equal(lg, base_l)


def test_deaths_are_bounded(tiny_qwen3_q4):
    s = session("-m", tiny_qwen3_q4, "-dev", "HTP0", "--recover", "--max-deaths", "3", "--inject-death-rate", "1")
    with pytest.raises(DeviceDeathError, match="died 3 times.*giving up"):
        greedy(s, list(range(7, 20)), 1)


@pytest.mark.slow
def test_a_persistent_death_adds_a_rule_for_its_class(q4b2):
    """2026-05, 38 tokens: ffn_down's HMX plan overflows and the DSP dies at it every time; recovery finds the op
    with one-op batches, routes its class (K=9728, N=2560, the M range with the same plan) away, and completes with
    the tokens of a run where that class was on HVX from the start."""
    ids = list(range(100, 138))
    s = session("-m", q4b2, "-dev", "HTP0", "--htp-profile", "2026-05", "--recover", "-ub", "64")
    warned = []
    s.ctx.recovery.warn = warned.append
    t, lg = greedy(s, ids, 2)
    (rule,) = s.ctx.recovery.rules_added
    assert (rule.op, rule.k, rule.n, rule.m, rule.action) == ("MUL_MAT", (9728, 9728), (2560, 2560), (33, 64),
                                                          "split-op")
    assert any("ffn_out-0" in w and rule.name in w for w in warned)
    ref = session("-m", q4b2, "-dev", "HTP0", "--htp-profile", "2026-05", "--gate", "weight=ffn_down,m=33-64")
    ref.scheduler.router.gates.clear()
    from kazeia.engine.policy import Policy, PolicyGate

    ref.scheduler.router.gates.append(PolicyGate(Policy([rule])))
    rt, rl = greedy(ref, ids, 2)
    assert t == rt and np.array_equal(lg, rl)


@pytest.mark.slow
def test_twenty_random_deaths_on_the_default_model(default_model):
    """Issue 11's acceptance: 20 seeded random transient deaths during a 64-token generation on the default model
    on HTP0: the run completes with the tokens and logits of the run without them, bitwise."""
    prompt = ("-p", "The history of the printing press begins")
    base = session("-m", default_model, "-dev", "HTP0", *prompt)
    ids = base.tok.encode("The history of the printing press begins")
    base_t, base_l = greedy(base, ids, 64)
    s = session("-m", default_model, "-dev", "HTP0", *prompt, "--recover", "--inject-death-rate", "0.001",
                "--inject-seed", "11", "--inject-deaths", "20")
    s.ctx.recovery.warn = lambda line: None
    t, lg = greedy(s, ids, 64)
    assert s.injector.deaths == 20 and s.ctx.recovery.deaths == 20
    assert t == base_t and np.array_equal(lg, base_l)
