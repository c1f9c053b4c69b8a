"""User-facing errors: each one becomes a one-line message and exit status 2 in the CLI.

Each error also names the outcome class of the run it stops (`outcome`: one of OUTCOMES, the names every tool
gives a run: debug/outcome.py classifies a finished run with the same names, `kazeia run`'s exit status follows
the same classes).
"""

from __future__ import annotations

COMPLETES, WRONG, DEATH, HANG, OP_ERROR, ERROR = "completes", "wrong numbers", "device death", "hang", "op error", \
    "error"
OUTCOMES = (COMPLETES, WRONG, DEATH, HANG, OP_ERROR, ERROR)


class KazeiaError(Exception):
    """An error the user can act on (bad file, bad flag, unsupported model). Printed without a traceback."""

    exit_code = 2
    outcome = ERROR


class GGUFError(KazeiaError):
    """A GGUF file that cannot be read: the message names the file and the problem."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class UnsupportedError(KazeiaError):
    """An architecture, tensor type, op or device that kazeia does not handle."""


class ContextOverflowError(KazeiaError):
    """The prompt (plus generation) does not fit in the context."""


class DumpFileError(KazeiaError):
    """A dump file that is corrupt, foreign or from an unknown format version."""


class DeviceDeathError(KazeiaError):
    """The (emulated) device session died; raised on the host at its next blocking read.

    `code` is the host-visible error (0x2e = AEE_EINTERRUPTED); `message` is what the host printed.
    The host cannot know which op died; `last_enqueued` is what it had logged last. The emulator
    additionally records `faulting` (ground truth) for forensics and tests.
    """

    exit_code = 3
    outcome = DEATH

    def __init__(self, message: str, code: int, last_enqueued: str | None = None, faulting: str | None = None,
                 cause: str | None = None):
        super().__init__(message)
        self.code = code
        self.last_enqueued = last_enqueued
        self.faulting = faulting
        self.cause = cause

    def to_dict(self) -> dict:
        """The death as a JSON-ready dict; `kind` is the fault class where the emulator set one."""
        return {"message": str(self), "code": self.code, "last_enqueued": self.last_enqueued,
                "faulting": self.faulting, "cause": self.cause, "kind": getattr(self, "kind", None),
                "detail": getattr(self, "detail", None), "crash_record": getattr(self, "crash_record", None)}


class DeviceHangError(DeviceDeathError):
    """The (emulated) device never answers: an op on the DSP cannot finish (the process lives, the host's
    dspqueue_read would block forever). A death for every tool that survives deaths: the session is unusable."""

    outcome = HANG


class DeviceOpError(KazeiaError):
    """An op on the device returned a non-OK status that the host chose to surface (robust profile)."""

    exit_code = 3
    outcome = OP_ERROR


class HostAbortError(KazeiaError):
    """The host backend aborted the process on a limit it checks itself (GGML_ABORT: 2026-10's op that does not
    fit an empty batch). Nothing reached the device; exit status 3, as a device failure."""

    exit_code = 3
