"""HTP switches, read once (tinygrad's habit): upstream env names first, kazeia's own second.

Upstream names keep their upstream meaning and defaults (GGML_HEXAGON_OPBATCH=1024, OPQUEUE=16, USE_HMX=1,
NHVX=0 meaning "all HVX contexts", OPFILTER a case-insensitive full-match regex on the op description,
VERBOSE>0 logs each op when it is added to a batch). The original team's own switches (oplog.py):
GGML_HEXAGON_OPLOG (1: their log line, 2: with their NaN fix) and GGML_HEXAGON_DUMP (a regex). kazeia adds
KAZEIA_HTP_PROFILE, KAZEIA_HTP_VTCM, KAZEIA_HTP_FAULTS (comma list), KAZEIA_HTP_RACE_SEED (pins the host/DSP
timing, timing.py, and the injected races), KAZEIA_HTP_BUILD_SEED / KAZEIA_HTP_NARROWED (the bad build of fault
hmx-queue-narrowing: its layout seed, or the HMX queue workers it skips, build_layout.py), KAZEIA_HTP_DUMP_DIR /
KAZEIA_HTP_DUMP_LIMIT (where and how many
GGML_HEXAGON_DUMP files) and GGML_HEXAGON_FARF (show the DSP-side log, which a real device only shows to root).

The switches depend on the profile's code generation (ggml-hexagon.cpp env parsing, 0c1e57098bba): under `2026-10`
OPBATCH defaults to 1280 and OPQUEUE to 32; NHMX (0: no HMX), MM_SELECT / FA_SELECT / GDN_SELECT (2: HMX -> HVX ->
CPU, 1: HVX -> CPU, 0: CPU), OPFUSION (0 off, 1 all, else a bitmask: 2 ALLREDUCE+ADD, 4 RMS_NORM+MUL, 8 MUL_MAT+ADD,
16 MUL_MAT_NX, 32 MUL_MAT_ID_NX, 64 GDN+CPY) and DEVICES (a count, or a bracketed list) apply, and USE_HMX and
OPSTAGE no longer exist: upstream ignores them, kazeia says so once (`ignored`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from kazeia.errors import KazeiaError
from kazeia.limits import safe_regex

DEFAULT_VTCM = 8 * 1024 * 1024  # what v79/v81 phones report; main.c: vtcm_alloc falls back to 8 MiB too
MAX_HVX_THREADS = 10  # htp-ctx.h: HTP_MAX_NTHREADS
DEFAULT_HVX_THREADS = 6  # assumption: the HVX contexts of the v73..v81 parts the original team used (GGML_HEXAGON_NHVX)


MAX_SESSIONS = 16  # GGML_HEXAGON_MAX_SESSIONS
FUSION_FLAGS = {"ALLREDUCE+ADD": 2, "RMS_NORM+MUL": 4, "MUL_MAT+ADD": 8, "MUL_MAT_NX": 16, "MUL_MAT_ID_NX": 32,
                "GDN+CPY": 64}  # ggml_hexagon_fusion_flags
GONE_IN_2026_10 = ("GGML_HEXAGON_USE_HMX", "GGML_HEXAGON_OPSTAGE")


MiB = 1 << 20


def _mib(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    """A MiB count (GGML_HEXAGON_VMEM, _MBUF: upstream reads them with strtoul * MiB): 1 .. 65536. VMEM=0 asks
    the device to measure its address space, which kazeia, with no device, cannot do: one line."""
    raw = env.get(name)
    if raw in (None, ""):
        return default
    v = _int(env, name, 0)
    if not 1 <= v <= 65536:
        what = " (0 asks a device to measure its address space; kazeia has none: give MiB)" if v == 0 else ""
        raise KazeiaError(f"{name}={raw!r} must be a size in MiB, 1 .. 65536{what}")
    return v

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
    profile: str = "2026-10"
    faults: tuple[str, ...] = ()
    farf: bool = False
    fp32_quantize_group: int = 128
    race_seed: int | None = None  # KAZEIA_HTP_RACE_SEED: pins the host/DSP timing and injected races
    oplog: int = 0  # GGML_HEXAGON_OPLOG: the team's enqueue-time log (1: first format, 2: after their NaN fix)
    dump: re.Pattern | None = None  # GGML_HEXAGON_DUMP: dump the activation of ops whose description matches
    dump_dir: str = "."  # KAZEIA_HTP_DUMP_DIR
    dump_limit: int = 16  # KAZEIA_HTP_DUMP_LIMIT
    nhmx: int = 1  # GGML_HEXAGON_NHMX (2026-10): 0 turns HMX off
    mm_select: int = 2  # GGML_HEXAGON_MM_SELECT (2026-10)
    fa_select: int = 2  # GGML_HEXAGON_FA_SELECT (2026-10)
    gdn_select: int = 2  # GGML_HEXAGON_GDN_SELECT (2026-10)
    opfusion: int = 1  # GGML_HEXAGON_OPFUSION (2026-10; 2026-05 fuses nothing in this model)
    devices: int = 1  # GGML_HEXAGON_DEVICES (or the deprecated NDEV): sessions the host would open
    vtcm_grant: int | None = None  # KAZEIA_HTP_VTCM_GRANT: VTCM the DSP is granted (None: the session's size)
    ignored: tuple[str, ...] = ()  # switches the profile's upstream no longer reads, set by the user
    vmem_mib: int | None = None  # GGML_HEXAGON_VMEM: the DSP address space for mappings (None: the arch's)
    mbuf_mib: int = 1024  # GGML_HEXAGON_MBUF: the largest weight buffer (get_max_size)
    # fault hmx-queue-narrowing (build_layout.py): the bad build's layout seed, or its skipped workers named outright
    build_seed: int | None = None  # KAZEIA_HTP_BUILD_SEED
    narrowed: tuple[str, ...] | None = None  # KAZEIA_HTP_NARROWED

    @property
    def hmx_enabled(self) -> bool:
        """Does the host let MUL_MAT use HMX at all? 2026-05: USE_HMX; 2026-10: NHMX != 0 and MM_SELECT >= 2."""
        if self.caps.env_selects:
            return self.nhmx != 0 and self.mm_select >= 2
        return self.use_hmx

    @property
    def fa_hmx_enabled(self) -> bool:
        """May be FLASH_ATTN_EXT use HMX? 2026-05: USE_HMX; 2026-10: NHMX != 0 and FA_SELECT >= 2
        (ggml_hexagon_precompute_flash_attn_params' HMX gate)."""
        if self.caps.env_selects:
            return self.nhmx != 0 and self.fa_select >= 2
        return self.use_hmx

    @cached_property  # read per op: kept in the instance's __dict__ (frozen fields are untouched)
    def caps(self):
        """The profile's capabilities (profiles.Capabilities): what its upstream code does."""
        from kazeia.backends.htp.profiles import get_profile

        return get_profile(self.profile).caps

    @property
    def profile_generation(self) -> str:
        """The upstream snapshot's name, for display and the arch tables."""
        return self.caps.generation

    def fusion_enabled(self, name: str) -> bool:
        """ggml_hexagon_is_fusion_enabled for a fusion by its upstream name (FUSION_FLAGS)."""
        if not self.caps.op_fusion or self.opfusion <= 0:
            return False
        return self.opfusion == 1 or bool(self.opfusion & FUSION_FLAGS[name])

    @cached_property
    def arch_profile(self):
        """The device's arch under this version's code (archs.py: skels, HMX, fp32 adds, VMEM, mappings)."""
        from kazeia.backends.htp.archs import arch_profile

        return arch_profile(self.arch, self.profile_generation)

    @cached_property
    def max_vmem(self) -> int:
        """The host's VMEM budget per batch (ggml_hexagon_session::allocate): GGML_HEXAGON_VMEM or the arch's
        opt_vmem; 2026-10 subtracts its op queue's pinned shared memory (shm_size)."""
        from kazeia.backends.htp.archs import host_vmem_budget

        vmem = self.vmem_mib * MiB if self.vmem_mib is not None else self.arch_profile.vmem_bytes
        return host_vmem_budget(vmem, self.profile_generation, self.opbatch, self.opqueue)

    @cached_property
    def dsp_vtcm_bytes(self) -> int:
        """The VTCM the DSP works in (main.c: vtcm_alloc's grant); the 2026-10 host plans against `vtcm_bytes`.
        Under 2026-05 the DSP plans every op itself against what it has, so there the grant is simply the session's
        VTCM (--vtcm) and this knob does not apply."""
        if not self.caps.host_solves_plans:
            return self.vtcm_bytes
        if self.vtcm_grant is not None:
            return self.vtcm_grant
        from kazeia.backends.htp.profiles import VTCM_GRANT_SHORT

        if VTCM_GRANT_SHORT.name in self.faults:
            return max(64 * 1024, self.vtcm_bytes - 1024 * 1024)
        return self.vtcm_bytes

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
        from kazeia.backends.htp.profiles import DEFAULT, get_profile

        prof = get_profile(profile or merged.get("KAZEIA_HTP_PROFILE") or DEFAULT)
        opbatch = _int(merged, "GGML_HEXAGON_OPBATCH", prof.default_opbatch)
        opqueue = _int(merged, "GGML_HEXAGON_OPQUEUE", prof.default_opqueue)
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
        from kazeia.backends.htp.archs import DEFAULT_ARCH, parse_arch

        arch_raw = merged.get("GGML_HEXAGON_ARCH")
        arch = parse_arch(arch_raw) if arch_raw not in (None, "") else DEFAULT_ARCH
        october = prof.caps.env_selects  # (the October env: NHMX, *_SELECT, OPFUSION; USE_HMX gone)
        selects = {k: _int(merged, f"GGML_HEXAGON_{k.upper()}", 2) for k in ("mm_select", "fa_select", "gdn_select")}
        for k, v in selects.items():
            if v not in (0, 1, 2):
                raise KazeiaError(f"GGML_HEXAGON_{k.upper()}={v} must be 0 (CPU), 1 (HVX) or 2 (HMX, then HVX)")
        nhmx = _int(merged, "GGML_HEXAGON_NHMX", 1)
        if nhmx < 0 or nhmx > 16:
            raise KazeiaError(f"GGML_HEXAGON_NHMX={nhmx} must be 0 (HVX only) or a count of HMX units (1..16)")
        opfusion = _int(merged, "GGML_HEXAGON_OPFUSION", 1)
        if not 0 <= opfusion <= 127:
            raise KazeiaError(f"GGML_HEXAGON_OPFUSION={opfusion} must be 0 (off), 1 (all) or a bitmask of "
                              f"{', '.join(f'{v} {k}' for k, v in FUSION_FLAGS.items())}")
        grant = merged.get("KAZEIA_HTP_VTCM_GRANT")
        vtcm_grant = _int(merged, "KAZEIA_HTP_VTCM_GRANT", 0) if grant else None
        if vtcm_grant is not None and not 4096 <= vtcm_grant <= vtcm:
            raise KazeiaError(f"KAZEIA_HTP_VTCM_GRANT={vtcm_grant} must be between 4096 and the session's VTCM "
                              f"({vtcm} B)")
        ignored = tuple(n for n in GONE_IN_2026_10 if october and merged.get(n) not in (None, ""))
        build_seed = _int(merged, "KAZEIA_HTP_BUILD_SEED", 0) if merged.get("KAZEIA_HTP_BUILD_SEED") else None
        if build_seed is not None and not 0 <= build_seed < 1 << 63:
            raise KazeiaError(f"KAZEIA_HTP_BUILD_SEED={build_seed} must be an integer in 0 .. 2**63-1")
        from kazeia.backends.htp.build_layout import parse_narrowed

        raw_narrowed = merged.get("KAZEIA_HTP_NARROWED")
        narrowed = parse_narrowed(raw_narrowed[:256]) if raw_narrowed else None
        return cls(
            opbatch=opbatch,
            opqueue=opqueue,
            opfilter=pattern,
            verbose=_int(merged, "GGML_HEXAGON_VERBOSE", 0),
            nhvx=nhvx,
            use_hmx=_int(merged, "GGML_HEXAGON_USE_HMX", 1) != 0,
            arch=arch,
            vtcm_bytes=vtcm,
            profile=prof.name,
            faults=tuple(dict.fromkeys(fault_list)),
            farf=_int(merged, "GGML_HEXAGON_FARF", 0) != 0,
            race_seed=race_seed,
            oplog=oplog,
            dump=dump_pattern,
            dump_dir=merged.get("KAZEIA_HTP_DUMP_DIR") or ".",
            dump_limit=dump_limit,
            nhmx=nhmx,
            opfusion=opfusion,
            devices=_devices(merged),
            vtcm_grant=vtcm_grant,
            ignored=ignored,
            vmem_mib=_mib(merged, "GGML_HEXAGON_VMEM", None),
            mbuf_mib=_mib(merged, "GGML_HEXAGON_MBUF", 1024),
            build_seed=build_seed,
            narrowed=narrowed,
            **selects,
        )

    def ignored_warning(self) -> str | None:
        """One line for switches a user set that this profile's upstream no longer reads (their workaround stops
        working without a word upstream)."""
        if not self.ignored:
            return None
        return (f"kazeia: warning: {', '.join(self.ignored)} no longer exist{'s' if len(self.ignored) == 1 else ''} "
                f"in ggml-hexagon {self.profile} (ignored upstream); use GGML_HEXAGON_NHMX=0 or MM_SELECT=1 to keep "
                f"MUL_MAT off HMX")


def _devices(env: Mapping[str, str]) -> int:
    """GGML_HEXAGON_DEVICES (or the deprecated NDEV): a count (clamped to 1..16, as upstream) or a list of device
    groups like "[0,1],2"; returns how many sessions it names."""
    raw = env.get("GGML_HEXAGON_DEVICES") or env.get("GGML_HEXAGON_NDEV") or ""
    raw = raw.strip()
    if not raw:
        return 1
    if raw.isdigit():
        return max(1, min(int(raw[:4]), MAX_SESSIONS))
    if len(raw) > 256 or not re.fullmatch(r"[0-9\[\],\s]+", raw) or raw.count("[") != raw.count("]"):
        raise KazeiaError(f"GGML_HEXAGON_DEVICES={raw[:40]!r} must be a count or a list like \"[0,1],2\"")
    depth, items = 0, 1
    for ch in raw:
        depth += ch == "["
        depth -= ch == "]"
        if depth < 0 or depth > 1:
            raise KazeiaError(f"GGML_HEXAGON_DEVICES={raw[:40]!r}: brackets must pair and not nest")
        items += ch == "," and depth == 0
    if items > MAX_SESSIONS:
        raise KazeiaError(f"GGML_HEXAGON_DEVICES names {items} devices (at most {MAX_SESSIONS})")
    return items
