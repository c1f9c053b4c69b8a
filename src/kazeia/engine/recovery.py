"""Recovery from a device death in the middle of a generation, and injected deaths to test it.

When the device session dies while a micro-batch runs (the host learns at its next blocking read, as 0x2e):
1. a new session is opened (the old one's buffers are gone; the weights are mapped again) and the micro-batch is
   run again on the same paths: a transient death costs one re-run and nothing else;
2. if it dies again at the same place (same batch, same ops), the micro-batch runs in a synchronous session
   (one op per batch, waited on: the host then knows the op, as the team's GGML_HEXAGON_OPBATCH=1
   GGML_HEXAGON_OPQUEUE=1 runs showed); a death there names the op. A second death at that same op is
   confirmed before anything is re-routed: the op runs alone on a fresh session. If it dies there too (or, having
   completed alone, dies a third time in its micro-batch: a fault that needs the state earlier ops leave), a
   rule routing its class away is added to the policy, and the warning names that evidence; if it completes
   alone, the deaths are read as transient and the micro-batch runs again unchanged. The rule goes to the
   cheapest alternative by the device's modeled time that has not died yet (hvx, cpu, or for a matmul
   split-op: only that op cut along M around the range that dies);
   the micro-batch runs again (a synchronous run that completes stands: it computed the same);
3. after `max_attempts` deaths in one micro-batch a clear error names the op.
The context re-writes the micro-batch's inputs and restores the recurrent state before every re-run, and only
moves n_past once a run completed, so the KV cache and the recurrent state stay consistent and no token is lost
or duplicated. Every step prints one warning line.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kazeia.engine.policy import Policy, PolicyGate, Rule, node_m
from kazeia.engine.scheduler import Scheduler
from kazeia.errors import DeviceDeathError, KazeiaError
from kazeia.graph.builder import Graph
from kazeia.graph.rowsplit import split_path
from kazeia.graph.tensor import Tensor, type_name


class DeathInjector:
    """Transient deaths for testing: at the `at`-th op the device starts (0-based, counted over the whole run,
    re-runs included), once; and/or at each started op with probability `rate`, drawn from a generator seeded
    by `seed`, at most `limit` times. The device calls `tick()` before every op it starts."""

    def __init__(self, at: int | None = None, rate: float = 0.0, seed: int = 0, limit: int | None = None) -> None:
        if at is not None and at < 0:
            raise KazeiaError(f"--inject-death-at {at}: the op index must be >= 0")
        if not 0.0 <= rate <= 1.0:
            raise KazeiaError(f"--inject-death-rate {rate}: a probability in [0, 1]")
        self.at, self.rate, self.limit = at, rate, limit
        self.rng = np.random.default_rng(seed)
        self.ops = 0
        self.deaths = 0

    def tick(self, op_name: str | None = None) -> str | None:
        """Before the device starts an op (`op_name`, for injectors that aim at one op): a message to die with,
        or None."""
        i = self.ops
        self.ops += 1
        if self.limit is not None and self.deaths >= self.limit:
            return None
        if i == self.at or (self.rate > 0 and self.rng.random() < self.rate):
            self.deaths += 1
            return f"injected transient death at device op {i} (death {self.deaths})"
        return None


@dataclass
class Recovery:
    scheduler: Scheduler
    policy: Policy = field(default_factory=lambda: Policy(path="recovery"))
    max_attempts: int = 12
    warn: Callable[[str], None] = lambda s: print(f"kazeia: warning: {s}", file=sys.stderr, flush=True)
    deaths: int = 0  # over the whole run
    recoveries: int = 0  # micro-batches that needed at least one re-run
    rules_added: list[Rule] = field(default_factory=list)

    def __post_init__(self) -> None:
        # the rules recovery adds come first: they exist because the device died on what came before
        self.scheduler.router.gates.insert(0, PolicyGate(self.policy))

    def compute(self, graph: Graph, output: Tensor, prepare: Callable[[], None], label: str = "micro-batch") -> None:
        """Run `graph` and read its `output` (llama_decode's logits read), surviving device deaths; `prepare()` puts
        its inputs and state back before a re-run."""
        died, last_place, sync_op, tried, in_context, confirmed = 0, None, None, {}, 0, set()
        while True:
            try:
                self.scheduler.compute(graph)
                # (2026-10: a death or a sticky error surfaces at this read, not at graph end)
                self.scheduler.read_output(output)
                if sync_op is not None or self._synchronous():
                    self.warn(f"{label}: completed with one op per batch; back to a batched session")
                    self._reopen(self._device(), sync=False)
                return
            except DeviceDeathError as e:
                died += 1
                self.deaths += 1
                self.recoveries += died == 1
                dead = self._dead_backend()
                if dead is None:
                    raise
                ops = tuple(getattr(e, "batch_ops", None) or ())
                if died >= self.max_attempts:
                    where = (f"at op {ops[-1]}" if self._synchronous(dead) and ops else
                             f"in batch {getattr(e, 'batch_seq', '?')}, last enqueued {e.last_enqueued}")
                    raise DeviceDeathError(
                        f"{label}: the device died {died} times (the last {where}); giving up after --max-deaths "
                        f"{self.max_attempts}: {e}", e.code, e.last_enqueued, e.faulting, e.cause) from None
                if self._synchronous(dead) and ops:
                    if ops[-1] != sync_op:  # the op is known: once more, to tell a transient death from its op
                        sync_op, in_context = ops[-1], 1
                        self.warn(f"{label}: device died in a one-op batch at {sync_op}: new session, once more")
                        self._reopen(dead, sync=True)
                    else:
                        node = next((n for n in graph.nodes if n.name == sync_op), None)
                        if node is None:
                            raise
                        in_context += 1
                        evidence = self._confirm(node, dead, graph, label, in_context, confirmed)
                        if evidence is None:  # not reproduced alone: transient so far, run it again unchanged
                            self._reopen(dead, sync=True)
                        else:
                            self._add_rule(node, dead, label, tried, evidence)
                            last_place = sync_op = None
                            self._reopen(dead, sync=False)
                else:
                    place = (getattr(e, "batch_seq", None), ops)
                    if place != last_place:
                        last_place = place
                        self.warn(f"{label}: device died ({e}) in batch {place[0]} (last enqueued "
                                  f"{e.last_enqueued}): new session, running the {label} again")
                        self._reopen(dead)
                    else:
                        self.warn(f"{label}: died again at the same place: running it with one op per batch "
                                  f"to find the op")
                        self._reopen(dead, sync=True)
                prepare()

    def _confirm(self, node: Tensor, dead, graph: Graph, label: str, in_context: int, confirmed: set) -> str | None:
        """Whether two deaths in a row at `node` are its own fault, and the evidence that decided: the op alone on
        a fresh session (with the inputs its sources hold now) dies too, or, when it ran alone, a third death in
        its micro-batch (a fault that needs the state earlier ops leave). None: transient so far."""
        if node.name in confirmed or in_context >= 3:
            return (f"died {in_context} times in a row in its micro-batch, though it completed alone on a fresh "
                    f"session: a fault that depends on what earlier ops leave" if node.name in confirmed else
                    f"died {in_context} times in a row in its micro-batch")
        alone = self._run_alone(node, dead, graph)
        if alone is True:
            return "died twice in a row in a one-op batch, and again alone on a fresh session"
        if alone is None:
            return "died twice in a row in a one-op batch (the backend cannot run it alone)"
        confirmed.add(node.name)
        self.warn(f"{label}: {node.name} ({node.desc()}) died twice in a row but completed alone on a fresh "
                  f"session: read as transient, running the {label} again on the same paths")
        return None

    def _run_alone(self, node: Tensor, dead, graph: Graph) -> bool | None:
        """Run `node` alone on a fresh one-op-per-batch session without hooks (no trace or dump sees this
        check). True: it died; False: it completed; None: the backend cannot start a session."""
        if not hasattr(dead, "new_session"):
            return None
        fresh = dead.new_session(sync=True)
        fresh.hooks = []
        try:
            fresh.begin_graph(graph)
            fresh.compute(node)
            fresh.synchronize()
            return False
        except DeviceDeathError:
            return True
        finally:
            fresh.close()

    def _dead_backend(self):
        return next((b for b in self.scheduler.backends if getattr(b, "dead", None) is not None), None)

    def _device(self):
        return self.scheduler.backends[0]

    def _synchronous(self, backend=None) -> bool:
        return bool(getattr(backend or self._device(), "synchronous", False))

    def _reopen(self, dead, sync: bool = False):
        new = dead.new_session(sync=sync)
        self.scheduler.replace_backend(dead, new)
        return new

    def _add_rule(self, node: Tensor, device, label: str, tried: dict, evidence: str) -> None:
        key = _class_key(node)
        done = tried.setdefault(key, set())
        lo, hi = device.same_plan_m_range(node) if hasattr(device, "same_plan_m_range") else (node_m(node),) * 2
        paths = {"hvx": "hvx", "cpu": "cpu"}
        if node.op == "MUL_MAT" and lo >= 2:  # only this matmul cut along M, around the range that dies
            paths["split-op"] = split_path(lo, hi)
        if node.route_path is not None:  # what a rule already put it on died too
            done.update(a for a, p in paths.items() if p == node.route_path)
        options = [a for a in paths if a not in done]
        if not options:
            raise DeviceDeathError(f"{label}: {node.name} ({node.desc()}) kills the device on every path "
                                   f"({', '.join(sorted(done))}); no alternative left", 0x2E, None, node.name)
        cost = getattr(device, "path_seconds", None)
        if cost is not None:
            options.sort(key=lambda a: cost(node, paths[a]))
        action = options[0]
        done.add(action)
        w = node.src[0] if node.src else None
        weighted = w is not None and w.weight_name is not None
        name = f"recovered-{node.op.lower()}-{len(self.rules_added) + 1}"
        rule = Rule(name, action, op=node.op, type=type_name(w.type).lower() if weighted else None,
                    k=(w.ne[0], w.ne[0]) if weighted else None, n=(w.ne[1], w.ne[1]) if weighted else None,
                    m=(lo, hi), node=None if weighted else f"^{re.escape(node.name)}$",
                    why=f"added by recovery: {node.name} killed the device at M={node_m(node)}: {evidence}",
                    evidence=[f"{label}: {node.name} ({node.desc()}) {evidence}"])
        self.policy.rules.insert(0, rule)
        self.rules_added.append(rule)
        self.warn(f"{label}: {node.name} ({node.desc()}) kills the device ({evidence}): added rule {name} routing "
                  f"{node.op} {rule.type or ''} K={rule.k[0] if rule.k else '*'} N={rule.n[0] if rule.n else '*'} "
                  f"M={lo}..{hi} to {action}; running the {label} again")


def _node_named(graph: Graph, name: str) -> Tensor | None:
    return next((n for n in graph.nodes if n.name == name), None)


def _class_key(node: Tensor) -> tuple:
    w = node.src[0] if node.src else None
    return (node.desc(), w.type if w is not None else None, w.ne[:2] if w is not None else None)
