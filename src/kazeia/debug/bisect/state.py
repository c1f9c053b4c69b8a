"""Resumable searches: every finished step memoized by a key that names the run exactly, the JSON state file
rewritten after each one; and how steps are shown."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import MISSING, asdict, fields

from kazeia.debug.bisect.judges import INCONCLUSIVE, Outcome
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError
from kazeia.limits import read_json_object

STATE_VERSION = 1


class BisectInterrupted(KazeiaError):
    """The step budget (--max-steps) ran out; the state file holds every finished step."""

    exit_code = 4


class StepInconclusive(BisectInterrupted):
    """A step's child was killed from outside twice (a kill, the out-of-memory killer): the search cannot decide
    it and stops, saying so (never counting it as a failure); the step is not memoized, so a rerun retries it."""


class SearchState:
    """Finished steps of one search, memoized by key and rewritten to `path` (JSON) after every step."""

    def __init__(self, path: str | None, kind: str, config: dict, max_new_steps: int | None = None) -> None:
        self.path = path
        self.kind = kind
        self.config = config
        self.max_new_steps = max_new_steps
        self.steps: list[dict] = []
        self.new_steps = 0
        self.resumed = 0
        self.result: dict | None = None
        self.extra: dict = {}
        if path and os.path.exists(path):
            self._load(path)

    def _load(self, path: str) -> None:
        d = read_json_object(path, "bisect state file")
        if d.get("version") != STATE_VERSION or d.get("kind") != self.kind:
            raise KazeiaError(f"{path}: state of a '{d.get('kind')}' search (version {d.get('version')}), "
                              f"not of this '{self.kind}' search: use another --state file")
        if d.get("config") != _jsonable(self.config):
            raise KazeiaError(f"{path}: the state was written for a different configuration (model, device, "
                              f"check or regex differ): use another --state file or delete it")
        self.steps = d.get("steps", [])
        self.extra = d.get("extra", {})
        self.resumed = len(self.steps)

    @property
    def memo(self) -> dict[str, dict]:
        return {s["key"]: s for s in self.steps if s["outcome"] != INCONCLUSIVE}  # inconclusive: run again

    def probe(self, key: str, judge: Callable[[], Outcome], **info) -> dict:
        """The step for `key`: from the memo if finished before, else judged now and saved."""
        done = self.memo.get(key)
        if done is not None:
            return {**done, "resumed": True}  # a copy: the saved step stays as it was
        if self.max_new_steps is not None and self.new_steps >= self.max_new_steps:
            self.save()
            raise BisectInterrupted(f"stopped after {self.new_steps} new step(s) (--max-steps); "
                                    f"resume with the same --state {self.path or '(none)'}")
        v = judge()
        step = {"step": len(self.steps) + 1, "key": key, **info, "outcome": v.outcome, "detail": v.detail,
                "seconds": round(v.seconds, 3)}
        self.steps.append(step)
        self.new_steps += 1
        self.save()
        if v.outcome == INCONCLUSIVE:
            again = f" --state {self.path}" if self.path else ""
            raise StepInconclusive(f"inconclusive: step {step['step']} ({key}): {v.detail}; the search stopped "
                                   f"without a verdict: rerun the same command{again} to retry that step")
        return step

    def save(self) -> None:
        if not self.path:
            return
        d = {"version": STATE_VERSION, "kind": self.kind, "config": _jsonable(self.config), "steps": self.steps,
             "extra": self.extra, "result": self.result}
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(d, f, indent=1)
        os.replace(tmp, self.path)  # atomic: an interrupted write never leaves a half state


def _jsonable(x):
    return json.loads(json.dumps(x))


def spec_config(spec: RunSpec) -> dict:
    """The spec's non-default fields: a field added to RunSpec later (with a default) keeps old states valid."""
    defaults = {f.name: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
                for f in fields(RunSpec)}
    return {k: v for k, v in asdict(spec).items() if k not in defaults or v != defaults[k]}


def step_line(step: dict) -> str:
    done = " (from the state file)" if step.get("resumed") else ""
    return f"step {step['step']}: {step['key']} -> {step['outcome']} ({step['detail']}){done}"


def table(head: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in r] for r in [head, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head) - 1)]
    out = []
    for r in cells:
        out.append("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1])
    return "\n".join(out)
