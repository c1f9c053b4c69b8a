"""Running one configuration for a forensic tool, in process or in a child process.

Every forensic tool needs "run this exact configuration and tell me what happened": an engine `RunSpec` says
what (engine/session.py builds it, the same way as `kazeia run`), `run` does it in this process with optional
hooks and returns a `RunResult` (logits, the device death if any, placements), and `run_child` does the same in a
fresh Python process (so a hang or a crash of the interpreter cannot take the caller down) with a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from kazeia.engine.context import Context
from kazeia.engine.prefix import PrefixScheduler, check_prefix_run
from kazeia.engine.session import RunSpec, build_context, check_generation, prompt_ids
from kazeia.errors import DeviceDeathError, DeviceOpError
from kazeia.limits import open_regular, read_json_object
from kazeia.native.threads import child_threads


@dataclass
class RunResult:
    ok: bool
    seconds: float = 0.0
    n_prompt: int = 0
    logits: np.ndarray | None = None  # last micro-batch's logits, rows per `all_logits` (None for a prefix run)
    stop_output: np.ndarray | None = None  # a prefix run: the stop node's output in the last micro-batch
    tokens: list[int] = field(default_factory=list)
    death: dict | None = None  # DeviceDeathError fields: message, code, last_enqueued, faulting, cause, kind
    error: str | None = None  # any other error (op status, bad input)
    error_detail: dict | None = None  # an op status: {status, faulting (the op that set it), aborted_in}
    placements: list[dict] = field(default_factory=list)
    dsp_log: list[str] = field(default_factory=list)
    killed: str | None = None  # the child died of something else than the run: 'killed by SIGKILL', 'out of memory'

    @property
    def output(self) -> np.ndarray | None:
        """What a judge compares: the stop node's output of a prefix run, else the logits."""
        return self.stop_output if self.stop_output is not None else self.logits

    @property
    def failed(self) -> bool:
        return not self.ok

    def signature(self) -> str:
        """What a person would see: the host error line, or 'ok'."""
        if self.death:
            return self.death["message"]
        return self.error or "ok"


def run(spec: RunSpec, hooks=(), all_logits: bool = False, ctx: Context | None = None) -> RunResult:
    """Prefill the prompt (and greedily decode n_predict tokens) in this process."""
    ctx = ctx or build_context(spec)
    for h in hooks:
        ctx.scheduler.add_hook(h)
    ids = prompt_ids(spec, ctx.model)
    check_prefix_run(spec.stop_after, spec.n_predict)
    check_generation(len(ids), spec.n_predict, ctx.n_ctx)
    res = RunResult(ok=False, n_prompt=len(ids))
    t0 = time.perf_counter()
    try:
        logits = ctx.decode(ids, all_logits=all_logits)
        if isinstance(ctx.scheduler, PrefixScheduler):
            res.stop_output, logits = ctx.scheduler.output, None
        res.logits = logits
        for _ in range(spec.n_predict):
            tid = int(np.argmax(logits[-1]))
            res.tokens.append(tid)
            logits = ctx.decode([tid])
        res.ok = True
    except DeviceDeathError as e:
        res.death = {**e.to_dict(), "batch": getattr(e, "batch_seq", None), "batch_ops": getattr(e, "batch_ops", None)}
    except DeviceOpError as e:
        res.error = str(e)
        res.error_detail = {k: getattr(e, k, None) for k in ("status", "faulting", "aborted_in")}
    finally:
        res.seconds = time.perf_counter() - t0
        for h in hooks:
            ctx.scheduler.remove_hook(h)
    res.placements = [asdict(p) for p in ctx.scheduler.placements]
    for b in ctx.scheduler.backends:
        if hasattr(b, "dsp_log"):
            res.dsp_log = b.dsp_log()
    return res


# signals that come from outside the program: the kernel's out-of-memory killer sends SIGKILL
EXTERNAL_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                              signal.SIGXCPU})


def external_kill(returncode: int | None, output: str = "") -> str | None:
    """Why a child died of something other than itself ('killed by SIGKILL', 'out of memory'), or None. A shell
    reports a child killed by signal N as exit status 128+N."""
    if returncode is not None and returncode != 0:
        n = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 160 else None
        if n is not None and n in {int(s) for s in EXTERNAL_SIGNALS}:
            return f"killed by {signal.Signals(n).name}"
    if "MemoryError" in output or "Cannot allocate memory" in output or "std::bad_alloc" in output:
        return "out of memory"
    return None


def run_child(spec: RunSpec, timeout: float = 600.0, all_logits: bool = False) -> RunResult:
    """`run` in a fresh Python process; a timeout or an interpreter crash becomes a failed RunResult."""
    with tempfile.TemporaryDirectory(prefix="kazeia-child-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        out_path = os.path.join(tmp, "result.json")
        with open(spec_path, "w") as f:
            json.dump({"spec": asdict(spec), "all_logits": all_logits, "out": out_path, "threads": child_threads()}, f)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "kazeia.debug.child", spec_path], capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return RunResult(ok=False, seconds=time.perf_counter() - t0,
                             error=f"child timed out after {timeout:.0f} s (hang)")
        if not os.path.exists(out_path):
            tail = (proc.stderr or "").strip().splitlines()[-3:]
            return RunResult(ok=False, seconds=time.perf_counter() - t0, killed=external_kill(proc.returncode,
                                                                                              proc.stderr or ""),
                             error=f"child exited with status {proc.returncode}: {' | '.join(tail)}")
        d = read_json_object(out_path, "child result", max_bytes=256 << 20)
        arrays = {k: load_array(path) if (path := d.pop(f"{k}_path", None)) else None
                  for k in ("logits", "stop_output")}
        return RunResult(**arrays, **d)


def load_array(path: str, what: str = "child array", max_bytes: int = 16 << 30) -> np.ndarray:
    """A .npy array kazeia wrote earlier (a child's result, a cached reference): opened as a regular file, no
    pickles."""
    with open_regular(path, what, max_bytes) as f:
        return np.load(f, allow_pickle=False)
