"""Command-line values checked when argparse reads them: `type=` functions for every kind of flag value.

Each function takes the flag's text and returns the value (or raises argparse.ArgumentTypeError, which argparse
prints as one line, `kazeia run: error: argument --temp: ...`, exit status 2). Where llama.cpp gives a value a
meaning, it has the same meaning here (common/arg.cpp): `-s -1` is a random seed, `-n -1` infinity and `-n -2`
until the context is filled, a negative `--temp` is 0 (greedy), `-t 0` or less the machine's core count,
`-c 0` the model's training context, `--top-k 0` disabled. Integers are C `int`s as std::stoi reads them.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable

from kazeia.cli.validate_paths import (  # noqa: F401  (re-exported: callers use V.regular_file and the like)
    STREAMS,
    _bad,
    _path,
    _show,
    existing_path,
    file_or_auto,
    optional_file,
    output_dir,
    output_file,
    readable_stream,
    regular_file,
)
from kazeia.errors import KazeiaError

INT_MAX = (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1
RANDOM_SEED = -1  # llama.cpp's LLAMA_DEFAULT_SEED (0xFFFFFFFF): draw a seed, and print it
MAX_THREADS = 512  # GGML_MAX_N_THREADS
MIN_VTCM, MAX_VTCM = 64 * 1024, 1 << 30  # the HTP model's range (HtpSettings.from_env)

Parse = Callable[[str], object]


def _int(text: str) -> int:
    t = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", t):
        raise _bad(f"expected an integer, got {_show(text)}")
    if len(t.lstrip("+-0")) > 20:  # beyond any int64 (and Python's 4300-digit int() limit)
        raise _bad(f"{t[:24]}... is out of range")
    return int(t)


def integer(lo: int | None = None, hi: int | None = INT_MAX, what: str = "") -> Parse:
    """An integer in [lo, hi] (hi defaults to C's INT_MAX, as llama.cpp's std::stoi)."""

    def parse(text: str) -> int:
        v = _int(text)
        if lo is not None and v < lo or hi is not None and v > hi:
            rng = f"{lo if lo is not None else -INT_MAX - 1} .. {hi}" if hi is not None else f">= {lo}"
            raise _bad(f"{v} is out of range ({what + ': ' if what else ''}{rng})")
        return v

    parse.__name__ = "integer"
    return parse


def positive(hi: int = INT_MAX) -> Parse:
    return integer(1, hi)


def real(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Parse:
    """A finite float in [lo, hi] (or (lo, hi] with lo_open): NaN and infinities are refused."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise _bad(f"expected a number, got {_show(text)}") from None
        if not math.isfinite(v):
            raise _bad(f"{_show(text)} is not a finite number")
        if lo is not None and (v < lo or lo_open and v == lo) or hi is not None and v > hi:
            left = "(" if lo_open else "["
            raise _bad(f"{v:g} is out of range ({left}{'' if lo is None else f'{lo:g}'}, "
                       f"{'' if hi is None else f'{hi:g}'}])")
        return v

    parse.__name__ = "number"
    return parse


def probability(text: str) -> float:
    """0 .. 1 (top-p: 1 = disabled, 0 keeps the most likely token; min-p: 0 = disabled)."""
    return real(0.0, 1.0)(text)


def temperature(text: str) -> float:
    """llama.cpp's --temp: a finite number, negative values taken as 0 (greedy)."""
    return max(real()(text), 0.0)


def seconds(text: str) -> float:
    """A timeout: a finite number of seconds above 0."""
    return real(0.0, 1e9, lo_open=True)(text)


def seed(text: str) -> int:
    """llama.cpp's -s: 0 .. 4294967295, where -1 (or 4294967295, LLAMA_DEFAULT_SEED) is a random seed."""
    v = _int(text)
    if v in (-1, UINT32_MAX):
        return RANDOM_SEED
    if not 0 <= v < UINT32_MAX:
        raise _bad(f"{v} is not a seed (0 .. {UINT32_MAX - 1}, or -1 for a random one)")
    return v


def resolve_seed(value: int | None, default: int = 0) -> tuple[int, bool]:
    """(the seed to use, whether it was drawn): -1 draws one from the OS, as llama.cpp does."""
    if value is None:
        return default, False
    if value == RANDOM_SEED:
        return int.from_bytes(os.urandom(4), "little") % UINT32_MAX, True
    return value, False


def n_predict(text: str) -> int:
    """llama.cpp's -n: N >= 0 tokens, -1 = infinity (until EOS; here also the context's end, there is no context
    shift), -2 = until the context is filled; any other negative value is an error."""
    v = integer(None)(text)
    if v < -2:
        raise _bad(f"{v}: use N >= 0, -1 (infinity) or -2 (until the context is filled)")
    return v


def ctx_size(text: str) -> int:
    """llama.cpp's -c: tokens, 0 = the model's training context."""
    return integer(0)(text)


def threads(text: str) -> int:
    """llama.cpp's -t: N threads; 0 or less means the machine's core count (returned as 0)."""
    v = integer(None)(text)
    if v > MAX_THREADS:
        raise _bad(f"{v} threads is more than ggml's {MAX_THREADS} (GGML_MAX_N_THREADS)")
    return max(v, 0)


def gpu_layers(text: str) -> int | None:
    """llama.cpp's -ngl: an exact number of layers, 'auto' (-1) or 'all' (-2); both mean all of them here (one
    device, nothing else competes for its memory). Returns None for all."""
    t = text.strip().lower()
    if t in ("auto", "all"):
        return None
    v = integer(None)(t)
    if v in (-1, -2):
        return None
    if v < 0:
        raise _bad(f"{v}: use N >= 0, 'auto' (-1) or 'all' (-2)")
    return v


def vtcm_bytes(text: str) -> int:
    """HTP VTCM size in bytes, 64 KiB .. 1 GiB."""
    return integer(MIN_VTCM, MAX_VTCM, "VTCM bytes, 64 KiB .. 1 GiB")(text)


def hex_mask(text: str) -> str:
    """llama.cpp's --cpu-mask (common.cpp parse_cpu_mask): hex digits after an optional lowercase "0x", one bit per
    CPU, at most GGML_MAX_N_THREADS bits (llama.cpp reads the first 128 digits and drops the rest unread; kazeia
    refuses them). A mask that names none of this machine's CPUs is refused too (llama.cpp only warns that it
    could not set the affinity, and runs unpinned)."""
    t = text.strip()
    digits = t[2:] if t.startswith("0x") else t
    if not re.fullmatch(r"[0-9a-fA-F]+", digits):
        raise _bad(f"{_show(text)} is not a hex CPU mask (e.g. 0x3; llama.cpp takes a lowercase 0x only)")
    if len(digits) > MAX_THREADS // 4:
        raise _bad(f"a CPU mask of {len(digits)} hex digits names CPUs past ggml's {MAX_THREADS} "
                   f"(GGML_MAX_N_THREADS: {MAX_THREADS // 4} digits at most)")
    mask = int(digits, 16)
    cpus = _machine_cpus()
    if not any(mask >> c & 1 for c in cpus):
        raise _bad(f"CPU mask {_show(text)} names none of this machine's CPUs ({_cpu_list(cpus)})")
    return t


def _machine_cpus() -> list[int]:
    """The CPUs this process may run on (sched_getaffinity where the OS has it, else 0 .. cpu_count-1)."""
    import os

    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _cpu_list(cpus: list[int]) -> str:
    return f"{cpus[0]}-{cpus[-1]}" if cpus == list(range(cpus[0], cpus[-1] + 1)) else ",".join(map(str, cpus))


def regex(text: str) -> str:
    """A Python regular expression, compiled now so that a bad one is a clear error; returned as text."""
    from kazeia.limits import safe_regex

    try:
        safe_regex(text, _show(text))
    except KazeiaError as e:
        raise _bad(str(e)) from None
    return text


def known_op_names() -> list[str]:
    """ggml op names a kazeia graph can hold, with the unary/GLU sub-op names ggml_op_desc prints (SILU, SWIGLU)."""
    from kazeia.backends.numpy_ops import KERNELS, UNARY_FUNCS

    return sorted({*KERNELS, *UNARY_FUNCS, "SWIGLU"})  # SWIGLU: the one GLU variant the GLU kernel runs


def op_names(text: str) -> str:
    """A comma list of op names (case-insensitive), each one an op kazeia runs; returned upper-cased."""
    names = [n.strip().upper() for n in text.split(",") if n.strip()]
    if not names:
        raise _bad("no op name given")
    known = known_op_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise _bad(f"unknown op {', '.join(unknown)} (known: {', '.join(known)})")
    return ",".join(names)


def int_list(lo: int = 0, hi: int = INT_MAX) -> Parse:
    """A comma list of integers in [lo, hi] (llama-bench's -p/-n/-d); returned as the text."""
    item = integer(lo, hi)

    def parse(text: str) -> str:
        parts = [p for p in text.split(",") if p.strip()]
        if not parts:
            raise _bad(f"expected a comma list of integers, got {_show(text)}")
        for p in parts:
            item(p)
        return text

    parse.__name__ = "list"
    return parse


def node_ranges(text: str) -> str:
    """--cpu-node-range 'A:B,C,D:' (graph node indices)."""
    from kazeia.engine.scheduler import parse_node_ranges
    from kazeia.errors import KazeiaError

    try:
        parse_node_ranges(text)
    except KazeiaError as e:
        raise _bad(str(e)) from None
    return text


def gate(text: str) -> str:
    """--gate 'vtcm-plan' or 'weight=REGEX,m=LO-HI', parsed now (the HTP settings are applied later)."""
    from kazeia.engine.gates import parse_gate
    from kazeia.errors import KazeiaError

    try:
        parse_gate(text)
    except KazeiaError as e:
        raise _bad(str(e).removeprefix(f"bad --gate {text!r}: ")) from None
    return text


def htp_profile(text: str) -> str:
    from kazeia.backends.htp import PROFILES

    if text not in PROFILES:
        raise _bad(f"unknown HTP profile {_show(text)} (available: {', '.join(PROFILES)})")
    return text


def htp_arch(text: str) -> str:
    """--htp-arch: a Hexagon arch kazeia models (v68 .. v81), given as GGML_HEXAGON_ARCH spells it."""
    from kazeia.backends.htp import parse_arch

    try:
        return f"v{parse_arch(text, '--htp-arch')}"
    except KazeiaError as e:
        raise _bad(str(e)) from None


def fault(allow_none: bool = False) -> Parse:
    """One --fault NAME (or 'none' where it clears the recorded ones)."""

    def parse(text: str) -> str:
        from kazeia.backends.htp import FAULTS

        if text in FAULTS or allow_none and text.lower() == "none":
            return text
        raise _bad(f"unknown HTP fault {_show(text)} (have: {', '.join(FAULTS)}{', none' if allow_none else ''})")

    parse.__name__ = "fault"
    return parse


def device(text: str) -> str:
    """-dev: a device of the registry (backends/devices.py: CPU, HTP0, REF), any case."""
    from kazeia.backends.devices import DEVICES, find_device

    if find_device(text) is None:
        raise _bad(f"unknown device {_show(text)} (available: {', '.join(DEVICES)})")
    return text.strip()


def devices(text: str) -> str:
    """A comma list of devices (kazeia bench benchmarks each)."""
    names = [d for d in text.split(",") if d.strip()]
    if not names:
        raise _bad("no device given")
    for d in names:
        device(d)
    return text


def retype(p: argparse.ArgumentParser, types: dict[str, Parse]) -> None:
    """Give the flags `types` (dest -> type function) their validator; string defaults are checked too, which
    argparse does itself when it applies a type to a default given as text (an environment variable)."""
    for a in p._actions:
        if a.dest in types:
            a.type = types[a.dest]


class RegexAndDir(argparse.Action):
    """--dump REGEX DIR: a valid regex and a directory to write into."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        pattern, directory = values
        try:
            values = [regex(pattern), output_dir(directory)]
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentError(self, str(e)) from None
        setattr(namespace, self.dest, values)


def m_range(text: str) -> tuple[int, int]:
    """LO:HI, prompt lengths 1 <= LO <= HI."""
    parts = text.split(":")
    if len(parts) != 2:
        raise _bad(f"expected LO:HI, got {_show(text)}")
    lo, hi = (positive()(x) for x in parts)
    if lo > hi:
        raise _bad(f"{_show(text)}: LO is above HI")
    return lo, hi


def dims(n_min: int, n_max: int, hi: int = INT_MAX) -> Parse:
    """A comma list of n_min..n_max positive integers (a shape such as K,N or K,N,M); returned as a list."""

    def parse(text: str) -> list[int]:
        parts = text.split(",")
        if not n_min <= len(parts) <= n_max:
            raise _bad(f"expected {n_min} to {n_max} comma-separated positive integers, got {_show(text)}")
        return [positive(hi)(x) for x in parts]

    parse.__name__ = "dims"
    return parse
