"""Command-line values that name files: `type=` functions that check a path before anything opens it, and
how an error names a value or a path (one line, control characters escaped). validate.py re-exports them.

A FIFO, socket or device given where a file is read would block or never end; a FIFO nobody reads would block
the open of a file to write; so both are refused with a message that says what the path is.
"""

from __future__ import annotations

import argparse
import os
import stat


def _bad(msg: str) -> argparse.ArgumentTypeError:
    """The error, kept on one line: a control character from the value is written as its escape."""
    return argparse.ArgumentTypeError("".join(c if c.isprintable() else repr(c)[1:-1] for c in msg))


def _show(text: str) -> str:
    """The value as an error quotes it: repr, cut to 60 characters."""
    r = repr(text)
    return r if len(r) <= 60 else r[:57] + "..."


def _path(path: str) -> str:
    """A path as an error names it: as is, or repr when it holds control or unprintable characters."""
    return path if path and path.isprintable() and len(path) <= 200 else _show(path)


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # ValueError: an embedded NUL byte
        raise _bad(f"{_path(path)}: {getattr(e, 'strerror', None) or e}") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def regular_file(path: str) -> str:
    """An existing, readable regular file (a FIFO, socket or device would block or never end)."""
    st = _stat(path)
    if st is None:
        raise _bad(f"{_path(path)}: no such file")
    if not stat.S_ISREG(st.st_mode):
        raise _bad(f"{_path(path)} is {_kind(st.st_mode)}, not a regular file")
    if not os.access(path, os.R_OK):
        raise _bad(f"{_path(path)}: permission denied")
    return path


STREAMS = ("/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/self/fd/")  # this process's own pipes


def readable_stream(path: str) -> str:
    """A file to read text from once: a regular file, a terminal, or this process's own pipe (-f /dev/stdin,
    -f <(cmd)); a named FIFO is refused (opening it blocks until some writer comes), as are directories."""
    st = _stat(path)
    if st is None:
        raise _bad(f"{_path(path)}: no such file")
    own = path.startswith(STREAMS)
    if stat.S_ISDIR(st.st_mode) or stat.S_ISSOCK(st.st_mode) or stat.S_ISBLK(st.st_mode) or \
            stat.S_ISFIFO(st.st_mode) and not own:
        hint = " (pipe the text in with -f /dev/stdin)" if stat.S_ISFIFO(st.st_mode) else ""
        raise _bad(f"{_path(path)} is {_kind(st.st_mode)}, not a file{hint}")
    return path


_READERS_SEEN: list[int] = []  # write ends kept open so the FIFO's reader sees no end of file before we write


def _fifo_has_reader(path: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: nobody has it open for reading, opening it would block
        return False
    _READERS_SEEN.append(fd)
    return True


def output_file(path: str) -> str:
    """A file to write: not an existing directory, in a directory that exists; a pipe, a FIFO that some process
    reads, /dev/null are fine (a FIFO nobody reads would block the open forever)."""
    if not path:
        raise _bad("empty file name")
    st = _stat(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise _bad(f"{_path(path)} is a directory, not a file")
    if st is not None and stat.S_ISFIFO(st.st_mode) and not path.startswith(STREAMS) and not _fifo_has_reader(path):
        raise _bad(f"{_path(path)} is a FIFO that no process reads (writing to it would block)")
    if st is None:
        parent = os.path.dirname(path) or "."
        pst = _stat(parent)
        if pst is None or not stat.S_ISDIR(pst.st_mode):
            raise _bad(f"{_path(path)}: directory {_path(parent)} does not exist")
    return path


def output_dir(path: str) -> str:
    """A directory to write into: an existing directory or a path that can be created (not an existing file)."""
    if not path:
        raise _bad("empty directory name")
    st = _stat(path)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise _bad(f"{_path(path)} exists and is not a directory")
    if st is None:
        _probe_dir(path)
    return path


def _probe_dir(path: str) -> None:
    """Refuse now, not after the work, a directory that cannot be made (a read-only or pseudo file system, a file
    in the way, no permission): make it and its missing parents, then remove what was made."""
    made, head = [], os.path.abspath(path)
    while head and not os.path.exists(head):
        made.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    try:
        os.makedirs(path)
    except FileExistsError:
        return  # made meanwhile by someone else: a directory to write into all the same
    except OSError as e:
        raise _bad(f"cannot create {_path(path)}: {e.strerror or e}") from None
    for d in made:  # deepest first
        try:
            os.rmdir(d)
        except OSError:
            break


def existing_path(path: str) -> str:
    """A file or directory that exists (loaders check what is inside)."""
    if _stat(path) is None:
        raise _bad(f"{_path(path)}: no such file or directory")
    return path


def file_or_auto(text: str) -> str:
    """--gates FILE|auto: 'auto', or a regular file to read."""
    return text if text == "auto" else regular_file(text)


def optional_file(text: str) -> str:
    """nargs='?' FILE flags: '' (the flag given alone; argparse passes its const through the type) or a regular
    file."""
    return text if text == "" else regular_file(text)
