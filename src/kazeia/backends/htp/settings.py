"""HTP switches, read once (tinygrad's habit): upstream env names first, kazeia's own second.

Upstream names keep their upstream meaning and defaults (GGML_HEXAGON_OPBATCH=1024, OPQUEUE=16, USE_HMX=1,
NHVX=0 meaning "all HVX contexts", OPFILTER a case-insensitive full-match regex on the op description,
VERBOSE>0 logs each op when it is added to a batch). The original team's own switches (oplog.py):
GGML_HEXAGON_OPLOG (1: their log line, 2: with their NaN fix) and GGML_HEXAGON_DUMP (a regex). kazeia adds
KAZEIA_HTP_PROFILE, KAZEIA_HTP_VTCM, KAZEIA_HTP_FAULTS (comma list), KAZEIA_HTP_RACE_SEED (pins the host/DSP
timing, timing.py, and the injected races), KAZEIA_HTP_DUMP_DIR / KAZEIA_HTP_DUMP_LIMIT (where and how many
GGML_HEXAGON_DUMP files) and GGML_HEXAGON_FARF (show the DSP-side log, which a real device only shows to root).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kazeia.errors import KazeiaError
from kazeia.limits import safe_regex

DEFAULT_VTCM = 8 * 1024 * 1024  # what v79/v81 phones report; main.c: vtcm_alloc falls back to 8 MiB too
MAX_HVX_THREADS = 10  # htp-ctx.h: HTP_MAX_NTHREADS
DEFAULT_HVX_THREADS = 6  # assumption: the HVX contexts of the v73..v81 parts the original team used (GGML_HEXAGON_NHVX)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw, 0)
    except ValueError:
        raise KazeiaError(f"{name}={raw!r} is not an integer") from None


@dataclass(frozen=True)
class HtpSettings:
    opbatch: int = 1024
    opqueue: int = 16
    opfilter: re.Pattern | None = None
    verbose: int = 0
    nhvx: int = DEFAULT_HVX_THREADS
    use_hmx: bool = True
    arch: int = 79
    vtcm_bytes: int = DEFAULT_VTCM
    profile: str = "robust"
    faults: tuple[str, ...] = ()
    farf: bool = False
    fp32_quantize_group: int = 128
    race_seed: int | None = None  # KAZEIA_HTP_RACE_SEED: pins the host/DSP timing and injected races
    oplog: int = 0  # GGML_HEXAGON_OPLOG: the team's enqueue-time log (1: first format, 2: after their NaN fix)
    dump: re.Pattern | None = None  # GGML_HEXAGON_DUMP: dump the activation of ops whose description matches
    dump_dir: str = "."  # KAZEIA_HTP_DUMP_DIR
    dump_limit: int = 16  # KAZEIA_HTP_DUMP_LIMIT

    @classmethod
    def from_options(cls, opts) -> HtpSettings:
        """Settings of a device built from `opts` (kazeia.backends.devices.DeviceOptions): env plus its overrides."""
        return cls.from_env(profile=opts.htp_profile, vtcm_bytes=opts.vtcm_bytes, faults=opts.fault,
                            overrides=opts.htp_env)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, profile: str | None = None, vtcm_bytes: int | None = None,
                 faults: list[str] | None = None, overrides: Mapping[str, str] | None = None) -> HtpSettings:
        """Settings from `env` (default os.environ) with explicit arguments and `overrides` taking precedence."""
        merged = dict(os.environ if env is None else env)
        merged.update(overrides or {})
        filt = merged.get("GGML_HEXAGON_OPFILTER")
        pattern = re.compile(safe_regex(filt, "GGML_HEXAGON_OPFILTER").pattern, re.IGNORECASE) if filt else None
        nhvx = _int(merged, "GGML_HEXAGON_NHVX", 0)
        nhvx = DEFAULT_HVX_THREADS if nhvx <= 0 else min(nhvx, MAX_HVX_THREADS)
        vtcm = vtcm_bytes if vtcm_bytes is not None else _int(merged, "KAZEIA_HTP_VTCM", DEFAULT_VTCM)
        if vtcm < 64 * 1024 or vtcm > 1 << 30:
            raise KazeiaError(f"VTCM size {vtcm} B is out of range (64 KiB .. 1 GiB)")
        fault_list = list(faults or [])
        fault_list += [f.strip() for f in merged.get("KAZEIA_HTP_FAULTS", "").split(",") if f.strip()]
        opbatch = _int(merged, "GGML_HEXAGON_OPBATCH", 1024)
        opqueue = _int(merged, "GGML_HEXAGON_OPQUEUE", 16)
        if opbatch < 1 or opqueue < 1:
            raise KazeiaError("GGML_HEXAGON_OPBATCH and GGML_HEXAGON_OPQUEUE must be >= 1")
        dump = merged.get("GGML_HEXAGON_DUMP")
        dump_pattern = safe_regex(dump, "GGML_HEXAGON_DUMP") if dump else None
        oplog = _int(merged, "GGML_HEXAGON_OPLOG", 0)
        if oplog not in (0, 1, 2):
            raise KazeiaError(f"GGML_HEXAGON_OPLOG={oplog} must be 0, 1 (the first log) or 2 (with the NaN fix)")
        dump_limit = _int(merged, "KAZEIA_HTP_DUMP_LIMIT", 16)
        if dump_limit < 1:
            raise KazeiaError("KAZEIA_HTP_DUMP_LIMIT must be >= 1")
        race_seed = _int(merged, "KAZEIA_HTP_RACE_SEED", 0) if merged.get("KAZEIA_HTP_RACE_SEED") else None
        if race_seed is not None and not 0 <= race_seed < 1 << 64:
            raise KazeiaError(f"KAZEIA_HTP_RACE_SEED={race_seed} must be an integer in 0 .. 2**64-1")
        arch_raw = merged.get("GGML_HEXAGON_ARCH", "79").lstrip("vV")
        try:
            arch = int(arch_raw)
        except ValueError:
            raise KazeiaError(f"GGML_HEXAGON_ARCH={arch_raw!r} is not an arch number like v79") from None
        return cls(
            opbatch=opbatch,
            opqueue=opqueue,
            opfilter=pattern,
            verbose=_int(merged, "GGML_HEXAGON_VERBOSE", 0),
            nhvx=nhvx,
            use_hmx=_int(merged, "GGML_HEXAGON_USE_HMX", 1) != 0,
            arch=arch,
            vtcm_bytes=vtcm,
            profile=profile or merged.get("KAZEIA_HTP_PROFILE") or "robust",
            faults=tuple(dict.fromkeys(fault_list)),
            farf=_int(merged, "GGML_HEXAGON_FARF", 0) != 0,
            race_seed=race_seed,
            oplog=oplog,
            dump=dump_pattern,
            dump_dir=merged.get("KAZEIA_HTP_DUMP_DIR") or ".",
            dump_limit=dump_limit,
        )
