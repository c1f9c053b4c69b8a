"""The `kazeia` command: one module per subcommand, errors as one line and an exit status."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import traceback

from kazeia import __version__
from kazeia.errors import DeviceDeathError, KazeiaError

SUBCOMMANDS = ["run", "make_model", "bench", "htp", "trace", "replay", "compare", "bisect", "determinism",
               "oracle", "investigate", "crashlog", "gate", "upgrade", "check"]


class Parser(argparse.ArgumentParser):
    """argparse with a bad value reported on one line (the usage is a --help away), exit status 2."""

    def error(self, message: str):
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)  # one line, whatever was typed
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or only of `command` when it names one (importing all of them costs
    ~0.6 s of start-up: the forensic tools pull in most of the package). Subcommand parsers are Parsers too."""
    p = Parser(prog="kazeia", description=__doc__)
    p.add_argument("--version", action="version", version=f"kazeia {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    wanted = command.replace("-", "_") if command else None
    for name in SUBCOMMANDS if wanted not in SUBCOMMANDS else [wanted]:
        try:
            mod = importlib.import_module(f"kazeia.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"kazeia.cli.{name}":
                continue  # a command that is not built yet
            raise
        mod.add_parser(sub)
    return p


def death_attribution(e: DeviceDeathError) -> str:
    """What the host can say about a device death: the last op it enqueued and, when the failed batch held a
    single op (one-op batches), which op died. It never knows more than that."""
    ops = getattr(e, "batch_ops", None) or []
    line = f"kazeia: last op enqueued when the error was read: {e.last_enqueued}"
    if len(ops) == 1:
        return line + f"; faulting op: {ops[0]} (the failed batch held only that op)"
    return (line + f"; the failed batch held {len(ops)} ops ({ops[0]} .. {ops[-1]}): rerun with --sync "
                   f"(GGML_HEXAGON_OPBATCH=1 GGML_HEXAGON_OPQUEUE=1) to attribute the death to one op"
            if ops else line)


def _rerun_hint(e: KazeiaError, words: list[str]) -> str:
    """'; see it with: kazeia ... FLAG' for errors that name a flag showing more (e.rerun_with)."""
    flag = getattr(e, "rerun_with", None)
    if not flag or flag in words:
        return ""
    return f"; see it with: {shlex.join(['kazeia', *words, flag])}"


INTERNAL_ERROR = 70  # EX_SOFTWARE: a bug of kazeia's, not the user's input
OUTPUT_ERROR = 74  # EX_IOERR: standard output cannot take what kazeia writes
BROKEN_PIPE = 128 + 13  # what a shell shows for a command ended by SIGPIPE (`kazeia run ... | head -1`)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def internal_error(e: BaseException, verbose: bool) -> int:
    """The last resort: an exception no layer turned into a message is one line, never a traceback (-v shows it)."""
    print(f"kazeia: internal error: {type(e).__name__}: {_one_line(e)} (rerun with -v for the traceback)",
          file=sys.stderr)
    if verbose:
        traceback.print_exc()
    return INTERNAL_ERROR


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    verbose = "-v" in words or "--verbose" in words
    try:
        return _main(words, argv)
    except _StdoutGone as e:
        return e.code
    except Exception as e:  # noqa: BLE001 - the last resort, by design
        return internal_error(e, verbose)


def _main(words: list[str], argv: list[str] | None) -> int:
    try:
        parser = build_parser(words[0] if words and not words[0].startswith("-") else None)
    except KazeiaError as e:  # a bad process switch (kazeia/settings.py), read for a flag's default
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a bad value (2, its line printed), --help or --version (0): a status, as below
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except DeviceDeathError as e:
        print(str(e), file=sys.stderr)
        print(death_attribution(e), file=sys.stderr)
        record = getattr(e, "crash_record", None)
        if record:  # on a device this is in logcat (adb logcat -s adsprpc), not on the terminal
            print("kazeia: the cDSP crash record a device writes to logcat (adb logcat -s adsprpc):", file=sys.stderr)
            print("\n".join(record), file=sys.stderr)
        if getattr(args, "verbose", False):
            traceback.print_exc()
        return e.exit_code
    except KazeiaError as e:
        print(f"error: {_one_line(e, 2000)}{_rerun_hint(e, words)}", file=sys.stderr)
        if getattr(args, "verbose", False):
            traceback.print_exc()
        return e.exit_code
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


class _StdoutGone(Exception):
    """Standard output refused a write: a reader that went away (quiet, as `cat` is) or a full or bad file."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class GuardedStdout:
    """sys.stdout as kazeia writes it: a write or flush that fails ends the command with one line (a full disk,
    a bad descriptor) or quietly (a closed pipe), instead of a traceback or an 'Exception ignored' at exit."""

    def __init__(self, stream):
        self._stream = stream

    def _guard(self, fn, *a):
        try:
            return fn(*a)
        except BrokenPipeError:
            _silence_stdout()
            raise _StdoutGone(BROKEN_PIPE) from None
        except (OSError, ValueError) as e:  # ValueError: a write to a closed file
            _silence_stdout()
            print(f"error: cannot write to standard output: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
            raise _StdoutGone(OUTPUT_ERROR) from None

    def write(self, text: str) -> int:
        return self._guard(self._stream.write, text)

    def flush(self) -> None:
        return self._guard(self._stream.flush)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null so the interpreter's own flush at exit has nowhere to fail (Python's recipe for
    SIGPIPE), and drop what the buffer still held."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
    sys.stdout = open(os.devnull, "w")


def _stdout_usable() -> bool:
    if sys.stdout is None:  # the interpreter found fd 1 closed at start-up
        return False
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # not a file (a test's capture): nothing to check
        return True
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def entry(argv: list[str] | None = None) -> int:
    """The `kazeia` console script: main, with standard output guarded and flushed here, so that every way a
    write can fail is a status (74 with one line, or 141 quietly for a closed pipe)."""
    if not _stdout_usable():
        print("error: standard output is closed (kazeia writes its results there: redirect it to a file or "
              "/dev/null)", file=sys.stderr)
        return OUTPUT_ERROR
    if not isinstance(sys.stdout, GuardedStdout):
        sys.stdout = GuardedStdout(sys.stdout)
    code = main(argv)
    try:
        from kazeia.outputs import finish_streams

        finish_streams()
    except KazeiaError as e:
        print(f"error: {e}", file=sys.stderr)
        code = code or e.exit_code
    try:
        sys.stdout.flush()
    except _StdoutGone as e:
        return e.code
    return code


if __name__ == "__main__":
    raise SystemExit(entry())
