"""Routing flags of the commands that run a model: gate policies (--gates FILE|auto), recovery from a device death
(--recover) and injected deaths to test it; and installing them on a session."""

from __future__ import annotations

import argparse
import sys

from kazeia.cli import validate as V
from kazeia.engine.policy import Policy
from kazeia.engine.recovery import DeathInjector
from kazeia.engine.session import apply_policy
from kazeia.errors import KazeiaError


def add_routing_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("routing policy and recovery")
    g.add_argument("--gates", type=V.file_or_auto, default=None, metavar="FILE|auto",
                   help="gate policy: a TOML file of rules (docs/gate_policy.md), or 'auto': the policy `kazeia gate "
                        "--auto` validates for this model and device settings (cached; built on first use)")
    g.add_argument("--recover", action="store_true",
                   help="survive a device death: new session, the micro-batch again; twice at the same op: a rule "
                        "routing its class away (printed as a warning), then on")
    g.add_argument("--max-deaths", type=V.positive(), default=12, metavar="N",
                   help="with --recover: deaths tolerated in one micro-batch before giving up (default 12; a "
                        "death confirmed at one op costs 4)")
    g.add_argument("--inject-death-at", type=V.integer(0), default=None, metavar="OP_INDEX",
                   help="testing: a transient device death at the OP_INDEX-th op the device starts (0-based, whole "
                        "run), once")
    g.add_argument("--inject-death-rate", type=V.probability, default=0.0, metavar="P",
                   help="testing: a transient death at each device op with probability P (seeded by --inject-seed)")
    g.add_argument("--inject-seed", type=V.integer(0, V.UINT32_MAX), default=0, metavar="S",
                   help="seed of --inject-death-rate (default 0)")
    g.add_argument("--inject-deaths", type=V.integer(0), default=None, metavar="N",
                   help="testing: at most N injected deaths in the run")


def install_routing(args: argparse.Namespace, session, model_path: str) -> None:
    """What the session's spec cannot hold, on an open session (engine/session.py Session): the policy of
    `--gates auto` (validated on this device, or cached) and injected deaths. A --gates FILE and --recover are
    the spec's (spec_from_args)."""
    if getattr(args, "gates", None) == "auto":
        apply_policy(session.ctx, auto_gates(args, session.scheduler, model_path))
    at, rate = getattr(args, "inject_death_at", None), getattr(args, "inject_death_rate", 0.0)
    if at is not None or rate:
        inj = DeathInjector(at, rate, args.inject_seed, args.inject_deaths)
        if not any(b.set_death_injector(inj) for b in session.scheduler.backends):
            raise KazeiaError("--inject-death-*: the device has no session to kill (use -dev HTP0)")
        session.injector = inj


def auto_gates(args: argparse.Namespace, sched, model_path: str) -> Policy:
    """The `gate --auto` policy for the session's HTP settings, from the cache or validated now (progress bar)."""
    from kazeia.debug.gate.auto import auto_policy

    settings = next((getattr(b, "settings", None) for b in sched.backends if hasattr(b, "new_session")
                     and getattr(b, "settings", None) is not None), None)
    if settings is None:
        raise KazeiaError("--gates auto: validates for a device (-dev HTP0)")
    res = auto_policy(model_path, settings, args.ubatch_size, progress=progress_bar)
    print(gate_summary(res), file=sys.stderr, flush=True)
    return res.policy


def gate_summary(res) -> str:
    if res.cached:
        return (f"gates: cached policy {res.cache_path} ({len(res.policy.rules)} rule(s)); validation work: "
                f"0 child runs, 0 cases ({res.seconds:.2f} s)")
    return (f"gates: validated {res.classes} op classes in {res.child_runs} child runs ({res.cases} cases, "
            f"{res.seconds:.1f} s): {len(res.failing)} failing, {len(res.policy.rules)} rule(s) -> {res.cache_path}")


def progress_bar(done: int, total: int, what: str, width: int = 24) -> None:
    filled = width * done // max(total, 1)
    end = "\n" if done >= total else ""
    sys.stderr.write(f"\rgates: validating [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what[:60]:60s}"
                     + end)
    sys.stderr.flush()
