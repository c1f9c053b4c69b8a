"""kazeia's process switches, read once into one frozen object (tinygrad's habit; backends/htp/settings.py does the
same for the GGML_HEXAGON_* switches of one HTP session).

| variable | meaning | default |
| --- | --- | --- |
| KAZEIA_SIMD | 0: the portable kernels (numba, numpy) instead of the native AVX2 ones | 1 |
| KAZEIA_CACHE_DIR | where compiled native kernels are kept | ~/.cache/kazeia/native |
| KAZEIA_WEIGHT_CACHE_MB | MiB of float64 weights the REF oracle keeps | 768 |
| KAZEIA_GATE_CACHE | where `gate --auto` keeps validated policies | ~/.cache/kazeia/gates |
| KAZEIA_CPU_NODE_RANGE | default of --cpu-node-range (set by `bisect ops` for its --check commands) | none |
| KAZEIA_NO_BIND | 1: every "bind once, replay" layer runs its general path (the oracle of the bound ones) | 0 |
| KAZEIA_ISA | what the native kernels are compiled for: `native` (the host's) or `avx2` (AVX-512 off) | native |
| KAZEIA_PACK_DIR | where the CPU keeps packed copies of GEMV weights (`off`: none) | ~/.cache/kazeia/packed |

A bad value is one line naming the variable. `get()` reads the environment on first use (inside the command's
error handling, so a bad value never becomes a traceback) and keeps it; `reload()` reads it again (tests).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from kazeia.errors import KazeiaError


@dataclass(frozen=True)
class Settings:
    simd: bool = True
    cache_dir: str | None = None
    weight_cache_mb: float = 768.0
    gate_cache: str | None = None
    cpu_node_range: str | None = None
    no_bind: bool = False
    isa: str = "native"
    pack_dir: str | None = None  # None: the default place; "off": no packed copies

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(simd=_flag(env, "KAZEIA_SIMD", True), cache_dir=env.get("KAZEIA_CACHE_DIR") or None,
                   weight_cache_mb=_mib(env, "KAZEIA_WEIGHT_CACHE_MB", 768.0),
                   gate_cache=env.get("KAZEIA_GATE_CACHE") or None,
                   cpu_node_range=env.get("KAZEIA_CPU_NODE_RANGE") or None,
                   no_bind=_flag(env, "KAZEIA_NO_BIND", False), isa=_choice(env, "KAZEIA_ISA", ISAS),
                   pack_dir=env.get("KAZEIA_PACK_DIR") or None)


ISAS = ("native", "avx2")  # the first: the default


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name, "").strip()
    if raw == "":
        return choices[0]
    if raw not in choices:
        raise KazeiaError(f"{name}={raw[:40]!r} must be one of {', '.join(choices)}")
    return raw


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    if raw not in ("0", "1"):
        raise KazeiaError(f"{name}={raw[:40]!r} must be 0 or 1")
    return raw == "1"


def _mib(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    try:
        v = float(raw[:40])
    except ValueError:
        raise KazeiaError(f"{name}={raw[:40]!r} is not a number of MiB") from None
    if not 0 <= v <= 1 << 30:
        raise KazeiaError(f"{name}={raw[:40]!r} must be 0 .. {1 << 30} MiB")
    return v


_SETTINGS: Settings | None = None


def get() -> Settings:
    """The process's switches (read once)."""
    global _SETTINGS
    if _SETTINGS is None:
        _SETTINGS = Settings.from_env()
    return _SETTINGS


def reload() -> Settings:
    """Read the environment again (tests that change it)."""
    global _SETTINGS
    _SETTINGS = None
    return get()
