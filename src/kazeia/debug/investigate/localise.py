"""Which op died: one-op batches make the failing batch hold exactly that op; and which op the logs of the
default batching and of the team's OPBATCH=1 setting would have blamed instead."""

from __future__ import annotations

from kazeia.debug.investigate.common import SYNC_ENV, sync_spec
from kazeia.debug.investigate.table import Context, StepDef
from kazeia.debug.runner import run


def _batching(spec) -> str:
    s = spec.htp_settings()
    return f"OPBATCH={s.opbatch}, OPQUEUE={s.opqueue}" if s is not None else "no HTP batching"


def localise(cx: Context) -> tuple[str, str]:
    """OPBATCH=1, OPQUEUE=1: the failing batch holds exactly one op, so the host knows which op died."""
    f, spec = cx.findings, sync_spec(cx)
    r = run(spec)
    if not r.death:
        f.sync_reproduces = False
        return (f"with one-op batches ({', '.join(f'{k}={v}' for k, v in SYNC_ENV.items())}) the run did NOT die "
                f"(the fault needs batching: context-dependent)"), spec.command()
    f.sync_reproduces = True
    ops = r.death.get("batch_ops") or []
    f.faulting = ops[0] if len(ops) == 1 else None
    f.last_enqueued_sync = r.death["last_enqueued"]
    f.death = r.death
    f.faulting_facts = f.facts.ops.get(f.faulting) if f.faulting else None
    cx.fact("faulting op (one-op batches)", f.faulting)
    cx.fact("last op enqueued when the host saw the error (one-op batches)", r.death["last_enqueued"])
    if f.faulting_facts is not None and f.faulting_facts.m is not None:
        cx.fact("faulting op", f"{f.faulting}: {f.faulting_facts.shape()}")
    return (f"the failing batch held {len(ops)} op(s): {', '.join(ops)}; the host was enqueueing "
            f"{r.death['last_enqueued']} when it read the error"), spec.command()


def misattribution(cx: Context) -> tuple[str, str]:
    """What the default configuration and the team's OPBATCH=1 setting would have pointed at."""
    f = cx.findings
    f.last_enqueued_default = f.first.death["last_enqueued"]
    team = cx.spec.with_(env={**cx.spec.env, "GGML_HEXAGON_OPBATCH": "1"})
    r = run(team)
    f.last_enqueued_team = r.death["last_enqueued"] if r.death else None
    f.team_opqueue = team.htp_settings().opqueue
    order = [p["node"] for p in r.placements] if r.placements else f.facts.order
    if f.last_enqueued_team in order and f.faulting in order:
        f.team_distance = order.index(f.last_enqueued_team) - order.index(f.faulting)
    cx.fact(f"last op enqueued at the error, this configuration ({_batching(cx.spec)})", f.last_enqueued_default)
    cx.fact(f"last op enqueued at the error, the team's setting ({_batching(team)})", f.last_enqueued_team)
    why = (f" ({f.team_distance} ops after the faulting one: with up to OPQUEUE={f.team_opqueue} one-op batches in "
           f"flight, the host reads the failed response only when the queue is full or at the next "
           f"synchronization)" if f.team_distance else "")

    def blame(who: str, name: str | None) -> str:
        return f"{who} blames {name}" + (", the faulting op" if name == f.faulting else ", not the faulting op")

    return f"{blame('this configuration', f.last_enqueued_default)}; {blame('OPBATCH=1', f.last_enqueued_team)}{why}", \
        team.command()


LOCALISE = StepDef("localise with one-op batches (sync)", localise, needs=("facts",),
                   gives=("sync_reproduces", "faulting", "last_enqueued_sync", "death", "faulting_facts"))
MISATTRIBUTION = StepDef("what the logs would have blamed", misattribution, needs=("first", "facts"),
                         gives=("last_enqueued_default", "last_enqueued_team", "team_distance", "team_opqueue"))
