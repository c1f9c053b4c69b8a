"""Judging one bisect step: pass, fail, or "other" (failed, but not with the pinned signature).

`OracleJudge`: the run must not die and its logits must pass kazeia.debug.judge against the CPU's (the
whole-model NMSE threshold);
`CommandJudge`: a shell command, exit status 0 = pass, like Polygraphy's `--check`. Runs happen in child
processes by default, so a crash or a hang in one step becomes a failed step, not a dead search.

A child that something else killed (SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGXCPU: an external kill, the
out-of-memory killer) or that ran out of memory (MemoryError) tells nothing about the failure under search: the
step is run once more, and if that child is killed too the step is INCONCLUSIVE (the search stops and says
so; never a failure). A crash of the program itself (SIGSEGV, SIGABRT, SIGBUS, ...), an error exit and a hang
are failures, and so is a killed child whose output carries the pinned --fail-regex signature.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

from kazeia.backends.ref import WeightCache
from kazeia.debug.judge import WHOLE_MODEL_NMSE, judge
from kazeia.debug.runner import RunResult, external_kill, load_array, run, run_child
from kazeia.engine.session import RunSpec, build_context
from kazeia.errors import KazeiaError
from kazeia.limits import safe_regex

PASS, FAIL, OTHER, INCONCLUSIVE = "pass", "fail", "other", "inconclusive"


@dataclass
class Outcome:
    """What one bisect step came to."""

    outcome: str  # PASS, FAIL or OTHER (failed, but not with the pinned signature)
    detail: str = ""
    seconds: float = 0.0


def numeric_failure_samples(op: str = "logits") -> tuple[str, ...]:
    """What the judge says of wrong numbers (a NaN, an unmatched inf, an NMSE over the threshold), from the judge
    itself: a --fail-regex that matches none of these cannot pin a numeric failure, so runs that complete need
    no reference run."""
    ref = np.array([1.0, 2.0])
    bad = (np.array([np.nan, 2.0]), np.array([np.inf, 2.0]), np.array([-np.inf, 2.0]), np.array([9.0, 2.0]))
    return tuple(judge(a, b, 1e-3, op=op).reason for a in bad for b in (ref, np.array([np.inf, 2.0])))


def could_be_numeric(fail_regex: re.Pattern | None, op: str = "logits") -> bool:
    return fail_regex is None or any(fail_regex.search(s) for s in numeric_failure_samples(op))


class Judge(Protocol):
    def __call__(self, spec: RunSpec) -> Outcome: ...

    def describe(self) -> dict: ...


def killed_twice(first: str, second: str, seconds: float) -> Outcome:
    return Outcome(INCONCLUSIVE, f"the child was {first}, and {second} on the retry: an external kill or the "
                                 f"out-of-memory killer, not the failure under search", seconds)


def classify(text: str, fail_regex: re.Pattern | None) -> str:
    """A failed step is FAIL if it carries the pinned signature (or none is pinned), else OTHER."""
    if fail_regex is None or fail_regex.search(text):
        return FAIL
    return OTHER


def first_line(text: str, limit: int = 160) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def failure_text(res: RunResult) -> str:
    """Everything a person could see of a failed run: the host error line, the error, the DSP's FARF log."""
    parts = []
    if res.death:
        parts.append(res.death.get("message") or "")
    if res.error:
        parts.append(res.error)
    parts += res.dsp_log
    return "\n".join(p for p in parts if p)


class OracleJudge:
    """Built-in check: the run must not die, and its logits must match the reference device (CPU) within
    `threshold` NMSE (NaN on the device side fails; NaN in the reference is an error: it cannot judge)."""

    def __init__(self, reference: str = "CPU", threshold: float = WHOLE_MODEL_NMSE, fail_regex: str | None = None,
                 timeout: float = 600.0, isolate: bool = True, cache_dir: str | None = None) -> None:
        self.reference = reference
        self.threshold = threshold
        self.fail_regex = safe_regex(fail_regex, "--fail-regex") if fail_regex else None
        self.timeout = timeout
        self.isolate = isolate
        self.cache_dir = cache_dir  # reference logits are kept here (resumed searches do not redo them)
        self._refs: dict[str, np.ndarray] = {}
        self._weights = WeightCache()
        self.runs = 0  # every run made, reference runs included
        self.reference_runs = 0

    def describe(self) -> dict:
        return {"judge": "oracle", "reference": self.reference, "threshold": self.threshold,
                "fail_regex": self.fail_regex.pattern if self.fail_regex else None}

    @property
    def needs_reference(self) -> bool:
        return could_be_numeric(self.fail_regex)

    def _run(self, spec: RunSpec) -> RunResult:
        self.runs += 1
        if self.isolate:
            return run_child(spec, timeout=self.timeout)
        try:
            # in process, the CPU's dequantized weights (read-only) are shared between runs; device state is not
            return run(spec, ctx=build_context(spec, cache=self._weights))
        except Exception as e:  # noqa: BLE001 - in-process mode: any exception is this step's failure
            return RunResult(ok=False, error=f"{type(e).__name__}: {e}")

    def __call__(self, spec: RunSpec) -> Outcome:
        t0 = time.perf_counter()
        res = self._run(spec)
        if res.killed and not (self.fail_regex and self.fail_regex.search(failure_text(res))):
            again = self._run(spec)  # once more: a second kill means the step cannot be judged
            if again.killed and not (self.fail_regex and self.fail_regex.search(failure_text(again))):
                return killed_twice(res.killed, again.killed, time.perf_counter() - t0)
            res = again
        if not res.ok:
            text = failure_text(res) or "failed"
            return Outcome(classify(text, self.fail_regex), first_line(text), time.perf_counter() - t0)
        got = res.output  # a prefix run: its stop node's output
        if not self.needs_reference or got is None:
            return Outcome(PASS, "ok (death check only: the fail regex cannot match a numeric failure)",
                           time.perf_counter() - t0)
        v = judge(got, self.reference_logits(spec), self.threshold, op=spec.stop_after or "logits", name_a=spec.device)
        if v.ok:
            return Outcome(PASS, f"ok ({v.reason})", time.perf_counter() - t0)
        return Outcome(classify(v.reason, self.fail_regex), v.reason, time.perf_counter() - t0)

    def reference_spec(self, spec: RunSpec) -> RunSpec:
        return RunSpec(model=spec.model, prompt=spec.prompt, n_prompt=spec.n_prompt, tokens=spec.tokens,
                       device=self.reference, ubatch=spec.ubatch, ctx=spec.ctx, flash_attn=spec.flash_attn,
                       n_predict=spec.n_predict, stop_after=spec.stop_after, type_k=spec.type_k,
                       type_v=spec.type_v)

    def reference_logits(self, spec: RunSpec) -> np.ndarray:
        """The reference run's logits (a prefix run's: its stop node's output), run once per configuration."""
        rspec = self.reference_spec(spec)
        key = hashlib.blake2b(json.dumps(asdict(rspec), sort_keys=True).encode(), digest_size=8).hexdigest()
        if key in self._refs:
            return self._refs[key]
        path = os.path.join(self.cache_dir, f"ref-{key}.npy") if self.cache_dir else None
        if path and os.path.exists(path):
            self._refs[key] = load_array(path, "cached reference logits", 1 << 30)
            return self._refs[key]
        self.reference_runs += 1
        res = self._run(rspec)
        if not res.ok or res.output is None:
            raise KazeiaError(f"the reference run on {self.reference} failed ({res.signature()}): cannot judge; "
                              f"reproduce with: {rspec.command()}")
        if np.isnan(res.output).any():
            raise KazeiaError(f"reference invalid: the {self.reference} logits hold NaN; reproduce with: "
                              f"{rspec.command()}")
        self._refs[key] = np.asarray(res.output)
        if path:
            os.makedirs(self.cache_dir, exist_ok=True)
            np.save(path, self._refs[key])
        return self._refs[key]


class CommandJudge:
    """`--check CMD`: a shell command per step, exit status 0 = pass. The step's configuration reaches it as
    placeholders `{cpu_node_range}`, `{m}`, `{run}` (the step's full `kazeia run` command) and as environment
    variables KAZEIA_CPU_NODE_RANGE (which `kazeia run` also reads as its --cpu-node-range default),
    KAZEIA_BISECT_M and KAZEIA_RUN_CMD. A timeout kills the command's whole process group."""

    def __init__(self, command: str, fail_regex: str | None = None, timeout: float = 600.0) -> None:
        self.command = command
        self.fail_regex = safe_regex(fail_regex, "--fail-regex") if fail_regex else None
        self.timeout = timeout
        self.runs = 0
        self.reference_runs = 0

    def describe(self) -> dict:
        return {"judge": "command", "command": self.command,
                "fail_regex": self.fail_regex.pattern if self.fail_regex else None}

    def step_env(self, spec: RunSpec) -> dict[str, str]:
        return {"KAZEIA_CPU_NODE_RANGE": spec.cpu_node_range or "",
                "KAZEIA_BISECT_M": "" if spec.n_prompt is None else str(spec.n_prompt),
                "KAZEIA_RUN_CMD": spec.command()}

    def __call__(self, spec: RunSpec) -> Outcome:
        t0 = time.perf_counter()
        v, killed = self._once(spec)
        if killed:
            v, again = self._once(spec)  # once more: a second kill means the step cannot be judged
            if again:
                return killed_twice(killed, again, time.perf_counter() - t0)
        v.seconds = time.perf_counter() - t0
        return v

    def _once(self, spec: RunSpec) -> tuple[Outcome, str | None]:
        """One run of the command: its outcome, and why it was killed from outside (None if it was not, or if
        its output carries the pinned signature anyway)."""
        env = self.step_env(spec)
        cmd = (self.command.replace("{cpu_node_range}", env["KAZEIA_CPU_NODE_RANGE"])
               .replace("{m}", env["KAZEIA_BISECT_M"]).replace("{run}", env["KAZEIA_RUN_CMD"]))
        self.runs += 1
        t0 = time.perf_counter()
        # own session: on a timeout the whole group (the shell and what it started) is killed, not just the shell
        proc = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **env}, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=self.timeout)
            status = _exit_status(proc.returncode)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, _ = proc.communicate()
            status = f"timed out after {self.timeout:g} s (hang)"
        except BaseException:  # Ctrl-C: its own session does not get the SIGINT, so end it before leaving
            _kill_group(proc.pid)
            proc.wait()
            raise
        seconds = time.perf_counter() - t0
        if proc.returncode == 0 and not status.startswith("timed out"):
            return Outcome(PASS, "exit status 0", seconds), None
        text = f"{status}\n{out or ''}"
        tail = [x for x in (out or "").strip().splitlines() if x.strip()][-1:]
        detail = status + (f": {tail[0].strip()[:140]}" if tail else "")
        killed = None if status.startswith("timed out") else external_kill(proc.returncode, out or "")
        if killed and self.fail_regex is not None and self.fail_regex.search(out or ""):
            killed = None  # it printed the signature under search before it was killed
        return Outcome(classify(text, self.fail_regex), detail, seconds), killed


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _exit_status(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    if rc > 128:  # a shell reports a child killed by signal N as 128+N
        try:
            return f"exit status {rc} ({signal.Signals(rc - 128).name})"
        except ValueError:
            pass
    return f"exit status {rc}"
