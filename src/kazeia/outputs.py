"""Every file kazeia writes is written whole or not at all, and every output folder has one writer.

- `atomic_write(path)`: the content goes to a temporary file beside the target and is renamed over it once
  complete, so a full disk, a read-only folder or an interrupted run leaves the old file (or none), never half
  of one. Special files (/dev/null, a FIFO, a terminal, /dev/stdout) cannot be renamed over and are written in
  place.
- `claim_folder(path)`: an output folder (--dump DIR, investigate -o DIR) is locked for this process; a second
  process writing into it at the same time is refused in one line instead of overwriting the first one's files.

Every failure is an `OutputError`: one line naming the path and the system's reason, exit status 74 (EX_IOERR).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import IO

from kazeia.errors import KazeiaError


class OutputError(KazeiaError):
    """A file or folder kazeia cannot write (full disk, read-only, special file, another writer)."""

    exit_code = 74


def _name(path: str) -> str:
    return path if path.isprintable() and len(path) <= 200 else repr(path)[:60]


def _reason(e: OSError) -> str:
    return e.strerror or str(e)


def _special(path: str) -> bool:
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open `path` for writing, whole or not at all (see the module docstring); mode 'w' or 'wb'."""
    path = os.fspath(path)
    binary = "b" in mode
    if _special(path):
        try:
            f = open(path, mode, encoding=None if binary else encoding)
        except OSError as e:
            raise OutputError(f"{_name(path)}: cannot write: {_reason(e)}") from None
        try:
            with f:
                yield f
        except OSError as e:
            raise OutputError(f"{_name(path)}: cannot write: {_reason(e)}") from None
        return
    tmp = temporary_beside(path)
    try:
        with open(tmp, mode, encoding=None if binary else encoding) as f:
            yield f
    except OSError as e:
        discard(tmp)
        raise OutputError(f"{_name(path)}: cannot write: {_reason(e)}") from None
    except BaseException:
        discard(tmp)
        raise
    commit(tmp, path)


def write_text(path: str, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text)


def write_bytes(path: str, data: bytes) -> None:
    with atomic_write(path, "wb") as f:
        f.write(data)


def temporary_beside(path: str) -> str:
    """A fresh temporary file name beside `path` (for writers that open the file themselves, such as the GGUF
    writer), to be renamed over `path` with `commit` or removed with `discard`."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise OutputError(f"{_name(path)}: cannot write in {_name(folder)}: {_reason(e)}") from None
    os.close(fd)
    return tmp


def commit(tmp: str, path: str) -> None:
    try:
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise OutputError(f"{_name(path)}: cannot write: {_reason(e)}") from None


def discard(tmp: str) -> None:
    _remove(tmp)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_CLAIMS: dict[str, int] = {}  # folder -> the descriptor of its lock, held until the process ends
LOCK_NAME = ".kazeia-writer.lock"


def claim_folder(path: str) -> str:
    """Create `path` if needed and hold its writer lock for the rest of this process; refuse (one line) when
    another process holds it. The lock is flock(2) on a file inside the folder: it ends with its process, even
    a killed one, so a crashed run never leaves the folder locked."""
    path = os.path.abspath(path)
    if path in _CLAIMS:
        return path
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise OutputError(f"{_name(path)}: cannot write there: {_reason(e)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise OutputError(f"{_name(path)} is being written by another kazeia process (pid {holder}): give each run "
                          f"its own folder") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    if not _CLAIMS:
        atexit.register(release_folders)
    _CLAIMS[path] = fd
    return path


def release_folders() -> None:
    """At exit: remove each claimed folder's lock file, then release its lock (a process that opens the name
    afterwards makes a new file it can lock; one that opened it before could not lock it while we held it). A
    killed process leaves the file, which locks nothing once its holder is gone."""
    for path, fd in list(_CLAIMS.items()):
        _remove(os.path.join(path, LOCK_NAME))
        with contextlib.suppress(OSError):
            os.close(fd)
        del _CLAIMS[path]


class StreamedFile:
    """A file written over a whole run (a JSONL trace): lines go to a temporary file beside the target, which
    becomes the target when the run ends (`finish_streams`, called by the CLI's entry), whatever the run's
    outcome; a write that fails ends the run with one line and leaves no file."""

    def __init__(self, path: str):
        self.path = path
        self.tmp = None if _special(path) else temporary_beside(path)
        try:
            self._f = open(self.tmp or path, "w", encoding="utf-8")  # noqa: SIM115 - closed by finish()
        except OSError as e:
            raise OutputError(f"{_name(path)}: cannot write: {_reason(e)}") from None
        self.failed = False
        _STREAMS.append(self)

    def write(self, text: str) -> int:
        try:
            return self._f.write(text)
        except OSError as e:
            self.failed = True
            raise OutputError(f"{_name(self.path)}: cannot write: {_reason(e)}") from None

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self.finish()

    def finish(self) -> None:
        if self._f.closed:
            return
        try:
            self._f.close()
        except OSError as e:
            self.failed = True
            if self.tmp:
                _remove(self.tmp)
            raise OutputError(f"{_name(self.path)}: cannot write: {_reason(e)}") from None
        if self.tmp:
            if self.failed:
                _remove(self.tmp)
            else:
                commit(self.tmp, self.path)


_STREAMS: list[StreamedFile] = []


def finish_streams() -> None:
    """Close every StreamedFile of this process and put each complete one in place."""
    while _STREAMS:
        _STREAMS.pop(0).finish()


def ensure_folder(path: str, what: str) -> str:
    """Create the folder `path` (and its parents) for `what`, or refuse in one line (a file in the way, no
    permission, a full disk): a cache under an unwritable HOME or a KAZEIA_* switch naming a file."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{what}: {_name(path)} exists and is not a folder") from None
    except OSError as e:
        raise OutputError(f"{what}: cannot create {_name(path)}: {_reason(e)}") from None
    return path
