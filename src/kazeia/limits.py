"""Input boundaries: every file, stream and value kazeia reads passes through a reader with explicit limits, and
every refusal is one line naming the file, the line and the limit.

A device log, an op stream, a crash record or a policy is text a user pastes: it can be a 3 GB file, one 1 MB
line, a number of 5,000 digits or a shape of 2^40 elements. The readers here bound all of that before anything
is allocated from it: `read_text` (total bytes), `numbered_lines` (line count and length), `parse_int` (digits
and range), `parse_dims` (rank, each extent and the element count). Size arithmetic that leads to an
allocation asks `kazeia.memory.check_fits` (the machine's memory, refused with the figure).
"""

from __future__ import annotations

import codecs
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from kazeia.errors import KazeiaError

try:  # the parser re.compile itself uses (renamed in 3.11; the old name still works, with a warning)
    import re._parser as _sre_parser
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_parse as _sre_parser

MAX_DIGITS = 20  # digits of an integer field (2^64 has 20); Python's own limit is 4300 and slow near it
MAX_DIM = 1 << 31  # one extent of a ggml tensor (int64 in ggml, but no model has an extent past 2^31)
MAX_ELEMENTS = 1 << 34  # elements of one tensor named in a log (16 Gi: 4x the largest matrix of a 70B model)


class InputLimitError(KazeiaError):
    """An input past one of its limits, or malformed: the message is `FILE:LINE: what (the limit)`."""


@dataclass(frozen=True)
class TextLimits:
    """What a text input may hold. `what` names the kind of input in messages (e.g. 'eval-callback log')."""

    what: str
    max_bytes: int = 64 << 20
    max_line: int = 64 << 10
    max_lines: int = 4_000_000


def at(path: str, line_no: int | None = None) -> str:
    """The `FILE:LINE` prefix of a message (FILE alone when the problem is the whole file)."""
    name = path if path.isprintable() and len(path) <= 200 else repr(path)[:60]
    return f"{name}:{line_no}" if line_no is not None else name


def open_regular(path: str | os.PathLike, what: str, max_bytes: int | None = None):
    """The file opened for binary reading, once it is known to be a regular file: opened without blocking
    (O_NONBLOCK: a FIFO with no writer, a socket or a device would block open() itself, or never end), then
    checked with fstat on that descriptor (what is read is what was checked), then set back to blocking. With
    `max_bytes`, a larger file is refused before any read. The one way kazeia opens a file it reads."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputLimitError(f"{at(path)}: cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO, socket or device"
            raise InputLimitError(f"{at(path)}: not a regular file ({kind}; a {what} is read from a file)")
        if max_bytes is not None and st.st_size > max_bytes:
            raise InputLimitError(f"{at(path)}: {st.st_size} bytes, more than a {what} may hold ({max_bytes} bytes)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The file's bytes (open_regular), refused when it holds more than max_bytes, even if it grows while read."""
    with open_regular(path, what, max_bytes) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise InputLimitError(f"{at(os.fspath(path))}: cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:  # grew while we read it
        raise InputLimitError(f"{at(os.fspath(path))}: more than a {what} may hold ({max_bytes} bytes)")
    return data


def read_text(path: str, limits: TextLimits) -> str:
    """The file's text, refused before reading when it is larger than limits.max_bytes; bytes that are not UTF-8
    become U+FFFD (a device log is what the device wrote, not kazeia's to reject for its encoding)."""
    return read_bytes(path, limits.what, limits.max_bytes).decode("utf-8", "replace")


def numbered_lines(text: str, path: str, limits: TextLimits) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of `text`, refusing a line longer than limits.max_line or more lines than
    limits.max_lines before the caller sees it."""
    for n, line in enumerate(text.splitlines(), 1):
        if n > limits.max_lines:
            raise InputLimitError(f"{at(path, n)}: more than {limits.max_lines} lines (the {limits.what} limit)")
        if len(line) > limits.max_line:
            raise InputLimitError(f"{at(path, n)}: a line of {len(line)} characters, longer than a {limits.what} "
                                  f"line may be ({limits.max_line})")
        yield n, line


def parse_int(text: str, where: str, what: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer field: ASCII digits with an optional sign, at most MAX_DIGITS of them, within [lo, hi]."""
    s = text.strip()
    body = s[1:] if s[:1] in "+-" else s
    if not body or not body.isascii() or not body.isdigit():
        raise InputLimitError(f"{where}: {what} {_quote(s)} is not an integer")
    if len(body) > MAX_DIGITS:
        raise InputLimitError(f"{where}: {what} has {len(body)} digits (at most {MAX_DIGITS})")
    v = int(s)
    if lo is not None and v < lo or hi is not None and v > hi:
        raise InputLimitError(f"{where}: {what} {v} is outside {lo if lo is not None else '..'}.."
                              f"{hi if hi is not None else ''}")
    return v


def parse_dims(items: list[str], where: str, what: str, max_rank: int = 4,
               max_elements: int = MAX_ELEMENTS, min_extent: int = 1) -> tuple[int, ...]:
    """A tensor shape from its fields: 1..max_rank extents, each min_extent..MAX_DIM (0 where a format has empty
    tensors), at most max_elements in all."""
    if not 1 <= len(items) <= max_rank:
        raise InputLimitError(f"{where}: {what} has {len(items)} dimensions (1 to {max_rank})")
    dims = tuple(parse_int(x, where, f"{what} extent", min_extent, MAX_DIM) for x in items)
    n = 1
    for d in dims:
        n *= d
    if n > max_elements:
        raise InputLimitError(f"{where}: {what} {list(dims)} has {n} elements (at most {max_elements})")
    return dims


def _quote(s: str) -> str:
    r = repr(s)
    return r if len(r) <= 40 else r[:37] + "..."


MAX_PATTERN = 256  # characters of a user's regular expression (node names are at most 63 bytes)
MAX_OPEN_REPEATS = 3  # unbounded repetitions in one pattern: n^3 steps on a 63-byte name at worst


def safe_regex(pattern: str, where: str) -> re.Pattern:
    """Compile a user's regular expression (a node regex in a policy, --cpu-nodes, --dump), refusing what
    Python's backtracking engine could spend exponential or high-polynomial time on: a pattern longer than
    MAX_PATTERN, a repetition inside a repetition (`(a+)+`), an alternation inside a repetition (`(x|xy)*`),
    or more than MAX_OPEN_REPEATS unbounded repetitions (`.*.*.*.*x`). What is left costs at most n^3 steps
    on the names it sees, which are at most 63 bytes."""
    if len(pattern) > MAX_PATTERN:
        raise InputLimitError(f"{where}: a regular expression of {len(pattern)} characters (at most {MAX_PATTERN})")
    try:
        tree = _sre_parser.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise InputLimitError(f"{where}: {_quote(pattern)} is not a valid regular expression: {e}") from None
    problem = _backtracking_risk(tree)
    if problem:
        raise InputLimitError(f"{where}: {_quote(pattern)} {problem}, which can take exponential time on "
                              f"a backtracking engine: write it without that")
    return compiled


_REPEATS = {"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"}


def _backtracking_risk(tree) -> str:
    found = {"open": 0}

    def walk(items, under_repeat: bool) -> str:
        for op, av in items:
            name = str(op)
            if name in _REPEATS:
                lo, hi, sub = av
                if hi != lo:
                    if under_repeat:
                        return "repeats a repetition (like (a+)+)"
                    found["open"] += 1
                    if found["open"] > MAX_OPEN_REPEATS:
                        return f"has more than {MAX_OPEN_REPEATS} unbounded repetitions"
                bad = walk(sub, under_repeat or hi != lo)
            elif name == "SUBPATTERN":
                bad = walk(av[-1], under_repeat)
            elif name == "BRANCH":
                if under_repeat:
                    return "repeats an alternation (like (x|xy)*)"
                bad = next((b for b in (walk(x, under_repeat) for x in av[1]) if b), "")
            elif name in ("ASSERT", "ASSERT_NOT"):
                bad = walk(av[1], under_repeat)
            else:
                bad = ""
            if bad:
                return bad
        return ""
    return walk(tree, False)


def check_nesting(text: str, path: str, limit: int) -> None:
    """Refuse brackets or braces nested deeper than `limit` (outside quoted strings) before a recursive parser
    (tomllib, json) sees the text: 1,000 nested lists ended in a RecursionError traceback."""
    depth, quote, line = 0, "", 1
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            if quote in ('"', "'"):  # a one-line string ends here (a parse error the parser will name)
                quote = ""
        elif quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j - 1
        elif c in "[{":
            depth += 1
            if depth > limit:
                raise InputLimitError(f"{at(path, line)}: brackets nested more than {limit} deep")
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1


def _one_per_byte(e: UnicodeDecodeError) -> tuple[str, int]:
    """llama.cpp's rule (unicode_cpts_from_utf8): each byte that does not start a valid sequence becomes one
    U+FFFD and decoding goes on at the next byte."""
    return "\ufffd", e.start + 1


codecs.register_error("kazeia-llama-utf8", _one_per_byte)


def decode_text(data: bytes | str) -> tuple[str, int]:
    """User text (a prompt from argv, a file or stdin) as valid Unicode, decoded as llama-cli decodes it: every
    byte that is not part of valid UTF-8 becomes U+FFFD. A str from argv carries such bytes as lone surrogates
    (Python's surrogateescape); other lone surrogates are replaced the same way. Returns (text, bytes replaced)."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
            return data, 0
        except UnicodeEncodeError:
            try:
                data = data.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                data = data.encode("utf-8", "surrogatepass")
    text = data.decode("utf-8", "kazeia-llama-utf8")
    return text, text.count("\ufffd") - data.count("\ufffd".encode())


def read_json_object(path: str, what: str, max_bytes: int = 16 << 20) -> dict:
    """A JSON object from a file kazeia wrote earlier and a user may have edited or damaged (a bisect state, a
    cache memo, a dump index): bounded in size, nesting checked before the recursive parser, and anything that
    is not an object refused in one line."""
    text = read_text(path, TextLimits(what, max_bytes=max_bytes, max_line=max_bytes))
    check_nesting(text, path, 64)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InputLimitError(f"{at(path)}: not a readable {what} ({str(e)[:80]})") from None
    if not isinstance(obj, dict):
        raise InputLimitError(f"{at(path)}: not a readable {what} (a JSON object was expected)")
    return obj
