"""The backend under test (HTP0 with its profile, VTCM size, faults and GGML_HEXAGON_* overrides, CPU or REF), and
what a worker process keeps between cases: weight buffers and the backends' derived weight forms."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kazeia.backends.base import Backend
from kazeia.backends.cpu import CpuBackend
from kazeia.backends.devices import DEVICES, find_device
from kazeia.backends.ref import RefBackend, WeightCache
from kazeia.errors import KazeiaError
from kazeia.graph.tensor import Buffer, BufferUsage

BACKENDS = tuple(DEVICES)


class Caches:
    """What a worker keeps between cases: weight buffers (LRU by bytes) and the dequantized/repacked forms the
    backends derive from them. Buffers have unique addresses, so derived caches never confuse two weights."""

    # cases of one weight run back to back on a worker, so a few weights' worth is enough (Qwen3-4B ffn_down:
    # 25M values, 200 MB dequantized in float64); two workers stay well under 5 GB
    def __init__(self, weight_bytes: int = 384 << 20, derived_bytes: int = 768 << 20) -> None:
        self.weight_budget = weight_bytes
        self.weights: OrderedDict[tuple, Buffer] = OrderedDict()
        self.ref = WeightCache(derived_bytes)
        self.htp = None  # kazeia.backends.htp.matmul.WeightStore, made on first HTP use
        self.derived_bytes = derived_bytes

    def weight_buffer(self, key: tuple, make: Callable[[], np.ndarray]) -> Buffer:
        buf = self.weights.get(key)
        if buf is not None:
            self.weights.move_to_end(key)
            return buf
        data = np.ascontiguousarray(make()).view(np.uint8).reshape(-1)
        buf = Buffer(f"weights:{key}", data.copy(), BufferUsage.WEIGHTS)
        self.weights[key] = buf
        while len(self.weights) > 1 and sum(b.size for b in self.weights.values()) > self.weight_budget:
            self.weights.popitem(last=False)
        return buf

    def htp_store(self):
        if self.htp is None:
            from kazeia.backends.htp import WeightStore

            self.htp = WeightStore(self.derived_bytes)
        return self.htp


@dataclass(frozen=True)
class BackendSpec:
    """The backend under test: HTP0 (with its profile, VTCM size, faults, GGML_HEXAGON_* overrides), CPU or REF."""

    name: str = "HTP0"
    profile: str | None = None
    vtcm: int | None = None
    faults: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        device = find_device(self.name)
        if device is None:
            raise KazeiaError(f"unknown backend '{self.name}' (available: {', '.join(BACKENDS)})")
        object.__setattr__(self, "name", device.name)
        object.__setattr__(self, "faults", tuple(self.faults))

    def htp_settings(self):
        from kazeia.backends.htp import HtpSettings

        return HtpSettings.from_env(profile=self.profile, vtcm_bytes=self.vtcm, faults=list(self.faults),
                                    overrides=dict(self.env))

    def make(self, caches: Caches, log: Callable[[str], None] | None = None) -> Backend:
        if self.name == "CPU":
            return CpuBackend()
        if self.name == "REF":
            return RefBackend(caches.ref)
        from kazeia.backends.htp import HtpBackend

        # the REPACK buffer outlives one case, as on a device, within the worker's budget
        return HtpBackend(self.htp_settings(), log=log or (lambda s: None), weight_store=caches.htp_store())

    def describe(self) -> str:
        if self.name != "HTP0":
            return {"CPU": "numpy float32", "REF": "numpy float64 (oracle)"}[self.name]
        s = self.htp_settings()
        d = f"emulated Hexagon NPU, profile {s.profile}, VTCM {s.vtcm_bytes} B, arch v{s.arch}"
        if s.faults:
            d += f", faults {','.join(s.faults)}"
        if not s.hmx_enabled:
            d += ", HMX off"
        return d

    def validate(self) -> None:
        """Raise KazeiaError now (in the parent) for a bad profile, fault or env switch."""
        if self.name == "HTP0":
            from kazeia.backends.htp import check_faults, get_profile

            s = self.htp_settings()
            get_profile(s.profile)
            check_faults(s.faults)
