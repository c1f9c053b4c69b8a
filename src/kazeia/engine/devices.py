"""Device names (`-dev`) to backend lists. The engine never asks "is this the NPU": a device is a list of
backends in priority order, and the scheduler places each node on the first that supports it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kazeia.backends.base import Backend
from kazeia.backends.cpu import CpuBackend
from kazeia.backends.ref import RefBackend
from kazeia.backends.weights import WeightCache
from kazeia.errors import KazeiaError

DEVICES = ("CPU", "REF", "HTP0")


@dataclass
class DeviceOptions:
    """Device settings from the command line; HTP-specific ones are passed through to the HTP backend."""

    htp_profile: str | None = None
    vtcm_bytes: int | None = None
    htp_env: dict[str, str] = field(default_factory=dict)  # GGML_HEXAGON_* overrides (else os.environ)
    fault: list[str] = field(default_factory=list)  # HTP fault injections


def make_backends(device: str, opts: DeviceOptions | None = None, cache: WeightCache | None = None) -> list[Backend]:
    opts = opts or DeviceOptions()
    dev = device.upper()
    if dev == "CPU":
        return [CpuBackend(cache)]
    if dev == "REF":
        return [RefBackend(cache)]
    if dev in ("HTP0", "HTP"):
        try:
            from kazeia.backends.htp.backend import HtpBackend
        except ImportError as e:  # pragma: no cover - only while the HTP model is missing
            raise KazeiaError(f"device HTP0 is not available: {e}") from None
        cpu = CpuBackend(cache)
        return [HtpBackend.from_options(opts, cpu_fallback=cpu), cpu]
    raise KazeiaError(f"unknown device '{device}' (available: {', '.join(DEVICES)})")
