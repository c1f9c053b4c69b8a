"""The device registry (`-dev`): every device kazeia can run a model on, by the name the user types, each made as
a list of backends in priority order (the scheduler places each node on the first that supports it). The engine
never asks "is this the NPU"; the command line, the oracle and the sessions read this one table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kazeia.backends.base import Backend
from kazeia.errors import KazeiaError


@dataclass
class DeviceOptions:
    """Device settings from the command line; HTP-specific ones are passed through to the HTP backend."""

    htp_profile: str | None = None
    vtcm_bytes: int | None = None
    htp_env: dict[str, str] = field(default_factory=dict)  # GGML_HEXAGON_* overrides (else os.environ)
    fault: list[str] = field(default_factory=list)  # HTP fault injections


@dataclass(frozen=True)
class Device:
    name: str
    about: str
    make: Callable[[DeviceOptions, object], list[Backend]]  # (options, REF weight cache) -> backends
    aliases: tuple[str, ...] = ()
    # the device's own settings read from the options as its backend reads them (HTP: HtpSettings), for the tools
    settings: Callable[[DeviceOptions], object] | None = None


def _cpu(opts: DeviceOptions, cache) -> list[Backend]:
    from kazeia.backends.cpu import CpuBackend

    return [CpuBackend()]


def _ref(opts: DeviceOptions, cache) -> list[Backend]:
    from kazeia.backends.ref import RefBackend

    return [RefBackend(cache)]


def _htp(opts: DeviceOptions, cache) -> list[Backend]:
    from kazeia.backends.cpu import CpuBackend
    from kazeia.backends.htp import HtpBackend

    return [HtpBackend.from_options(opts), CpuBackend()]


def _htp_settings(opts: DeviceOptions):
    from kazeia.backends.htp import HtpSettings

    return HtpSettings.from_options(opts)


DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("CPU", "float32: native AVX2 kernels (or numba/numpy), weights read from their quantized bytes", _cpu),
    Device("HTP0", "the emulated Hexagon NPU (ggml-hexagon); the ops it refuses run on the CPU", _htp, ("HTP",),
           _htp_settings),
    Device("REF", "float64 oracle", _ref),
)}


def find_device(name: str) -> Device | None:
    """The device `name` (any case, or an alias) names, or None."""
    key = name.strip().upper()
    return next((d for d in DEVICES.values() if key == d.name or key in d.aliases), None)


def device_settings(device: str, opts: DeviceOptions) -> object | None:
    """The device's own settings under these options (HtpSettings for HTP0), or None for a device without any."""
    d = find_device(device)
    return d.settings(opts) if d is not None and d.settings is not None else None


def llama_graph(opts: DeviceOptions) -> str:
    """Which llama.cpp graph a run with these options builds: the one the users of the named HTP profile run
    (profiles.Profile.llama_graph: "2026-05" for May's, "2026-10" otherwise), whatever the device, so that a
    reference run (CPU, REF) of an HTP run names its nodes alike."""
    from kazeia.backends.htp import get_profile

    return get_profile(_htp_settings(opts).profile).llama_graph


def device_name(name: str) -> str:
    """The registry's name of the device `name` names ("htp" -> "HTP0"), or `name` upper-cased when it names none
    (the caller's own refusal then quotes it)."""
    d = find_device(name)
    return d.name if d is not None else name.strip().upper()


def make_backends(device: str, opts: DeviceOptions | None = None, cache=None) -> list[Backend]:
    d = find_device(device)
    if d is None:
        raise KazeiaError(f"unknown device '{device}' (available: {', '.join(DEVICES)})")
    return d.make(opts or DeviceOptions(), cache)
