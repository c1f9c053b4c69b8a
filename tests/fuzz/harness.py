"""The fuzz harness: run `kazeia` command lines on hostile inputs and classify what each one did.

A case is a command line plus the files, environment, stdin and stdout it runs with. Each case runs in its own
process, forked from a parent that has imported kazeia already (a case costs a fork, not an interpreter start),
or as a real `python -m kazeia` process where the interpreter's own start-up matters (a closed stdout, a
broken pipe). The child is its own process group, so a hang is killed with everything it started.

Outcomes, judged from the exit status, stderr, wall time and the child's peak RSS:
- ok: exit 0 and no traceback; finding: a non-zero status with no error line (a tool that found a fault, a
  device death: the result, on stdout, not a refusal);
- refused: non-zero exit, no traceback, and the error is one line (the last line of stderr);
- traceback / last-resort / hang / memory / multi-line / silent (a case marked `bad` that exited 0) are failures.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

HANG_SECONDS = 60.0
RSS_LIMIT = 2 << 30  # the 2 GB
AS_LIMIT = 12 << 30  # a hard cap so a runaway allocation cannot take the machine down with it
FAILURES = ("traceback", "last-resort", "hang", "memory", "multi-line", "silent")
LAST_RESORT = "kazeia: internal error:"
ERROR_LINE = re.compile(r"(kazeia(?: [\w-]+)?: )?error:")  # ours, and argparse's "kazeia run: error: ..."
REFUSAL_RSS_LIMIT = 512 << 20  # issue 36: no refusal may take more than this


@dataclass
class Case:
    """One command line on one input. argv/env values may hold {dir} (the case's folder) and {tiny} (a small
    model). files: name -> bytes, or a callable writing the file at its path (large or sparse inputs)."""

    cls: str
    name: str
    argv: list[str]
    files: dict[str, bytes | Callable[[str], None]] = field(default_factory=dict)
    env: dict[str, str | None] = field(default_factory=dict)
    stdin: bytes = b""
    stdout: str = "file"  # file | full (/dev/full) | closed | broken (read one line, then close: `| head -1`)
    bad: bool = False  # the input is wrong: exit 0 is a silent failure
    process: bool = False  # run as a real interpreter (stdout closed/broken need one)


@dataclass
class Result:
    case: Case
    outcome: str
    code: int | None
    seconds: float
    rss: int
    stderr: str

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES or self.outcome == "harness"



def _subst(text: str, where: dict[str, str]) -> str:
    for k, v in where.items():
        text = text.replace("{" + k + "}", v)
    return text


def _write_files(case: Case, d: str, where: dict[str, str]) -> None:
    for name, content in case.files.items():
        path = os.path.join(d, _subst(name, where))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if callable(content):
            content(path)
        else:
            with open(path, "wb") as f:
                f.write(content)


def _build_in_child(case: Case, d: str, where: dict[str, str]) -> str:
    """Write the case's files in a child process, so that the memory a large input takes to build never
    becomes part of the parent, whose pages every forked case would then count as its own RSS."""
    if not case.files:
        return ""
    err = os.path.join(d, ".build-error")
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _write_files(case, d, where)
        except BaseException as e:  # noqa: BLE001 - reported to the parent through the file
            with open(err, "w") as f:
                f.write(f"{type(e).__name__}: {e}")
            code = 1
        finally:
            os._exit(code)
    os.waitpid(pid, 0)
    return _read(err) if os.path.exists(err) else ""


def _env(case: Case, where: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in case.env.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = _subst(v, where)
    return env


def classify(case: Case, code: int | None, seconds: float, rss: int, stderr: str) -> str:
    if code is None:
        return "hang"
    if rss > RSS_LIMIT:
        return "memory"
    if "Traceback (most recent call last)" in stderr or "Exception ignored" in stderr:
        return "traceback"
    if LAST_RESORT in stderr:
        return "last-resort"
    if code == 0:
        return "silent" if case.bad else "ok"
    if code < 0:  # killed by a signal: SIGPIPE on a broken pipe is how `cmd | head -1` ends quietly
        return "ok" if case.stdout == "broken" and -code == signal.SIGPIPE else "traceback"
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [i for i, ln in enumerate(lines) if ERROR_LINE.match(ln)]
    if not errors:  # a finding (1: the tool found a fault; 3: the device died), reported on stdout
        return "finding"
    if errors != [len(lines) - 1]:
        return "multi-line"
    return "memory" if rss > REFUSAL_RSS_LIMIT else "refused"


def _limit_child() -> None:
    os.setpgid(0, 0)
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _run_forked(case: Case, argv: list[str], env: dict[str, str], d: str) -> tuple[int | None, float, int, str]:
    """fork; the child points fds 0/1/2 at the case's stdin, stdout and a stderr file, then calls kazeia's entry."""
    from kazeia.cli.main import entry

    err_path, in_path = os.path.join(d, ".stderr"), os.path.join(d, ".stdin")
    with open(in_path, "wb") as f:
        f.write(case.stdin)
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 70
        try:
            _limit_child()
            os.chdir(d)
            os.environ.clear()
            os.environ.update(env)
            fd_in = os.open(in_path, os.O_RDONLY)
            fd_out = os.open("/dev/full" if case.stdout == "full" else os.path.join(d, ".stdout"),
                             os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            fd_err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            for fd, target in ((fd_in, 0), (fd_out, 1), (fd_err, 2)):
                os.dup2(fd, target)
            sys.stdin = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
            sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
            sys.argv = ["kazeia", *argv]
            code = entry(argv)
        except BaseException:  # the harness's own failure must still end the child
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code if isinstance(code, int) else 70)
    return _wait(pid, t0, err_path)


def _wait(pid: int, t0: float, err_path: str) -> tuple[int | None, float, int, str]:
    deadline = t0 + HANG_SECONDS
    while True:
        wpid, status, ru = os.wait4(pid, os.WNOHANG)
        if wpid:
            break
        if time.perf_counter() > deadline:
            os.killpg(pid, signal.SIGKILL)
            _, status, ru = os.wait4(pid, 0)
            return None, time.perf_counter() - t0, ru.ru_maxrss * 1024, _read(err_path)
        time.sleep(0.005)
    try:
        os.killpg(pid, signal.SIGKILL)  # anything the case left behind
    except ProcessLookupError:
        pass
    code = os.waitstatus_to_exitcode(status)
    return code, time.perf_counter() - t0, ru.ru_maxrss * 1024, _read(err_path)


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return ""


def _run_process(case: Case, argv: list[str], env: dict[str, str], d: str) -> tuple[int | None, float, int, str]:
    """A real interpreter, for what a fork cannot show (stdout closed before start-up, a reader that goes away)."""
    cmd = [sys.executable, "-m", "kazeia", *argv]
    out_path = {"file": os.path.join(d, ".stdout"), "full": "/dev/full"}.get(case.stdout)
    stdout = open(out_path, "wb") if out_path else subprocess.PIPE

    def prepare() -> None:
        _limit_child()
        if case.stdout == "closed":
            os.close(1)

    t0 = time.perf_counter()
    with open(os.path.join(d, ".stderr"), "wb") as err:
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=stdout, stderr=err, env=env, cwd=d,
                             preexec_fn=prepare)
        try:
            p.stdin.write(case.stdin)
            p.stdin.close()
        except BrokenPipeError:
            pass
        if case.stdout == "broken":
            p.stdout.readline()
            p.stdout.close()
        result = _wait(p.pid, t0, os.path.join(d, ".stderr"))
    p.returncode = result[0]  # waited for above: keep Popen from waiting again
    if out_path:
        stdout.close()
    elif case.stdout != "broken":
        p.stdout.close()
    return result


def run_case(case: Case, workdir: str, shared: dict[str, str]) -> Result:
    d = tempfile.mkdtemp(prefix=f"{case.cls}-", dir=workdir)
    where = {**shared, "dir": d}
    problem = _build_in_child(case, d, where)
    if problem:
        return Result(case, "harness", None, 0.0, 0, f"building the input failed: {problem}")
    argv = [_subst(a, where) for a in case.argv]
    env = _env(case, where)
    runner = _run_process if case.process or case.stdout in ("closed", "broken") else _run_forked
    try:
        code, seconds, rss, stderr = runner(case, argv, env, d)
    except Exception as e:  # noqa: BLE001 - the harness could not start the case: its own failure, reported
        return Result(case, "harness", None, 0.0, 0, f"starting the case failed: {type(e).__name__}: {e}")
    return Result(case, classify(case, code, seconds, rss, stderr), code, seconds, rss, stderr)
