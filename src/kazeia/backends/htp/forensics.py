# ruff: noqa: F401  (the TYPE_CHECKING block re-exports every name of the face for readers; __all__ is built below)
"""The forensic face of the emulated NPU: the internals the forensic tools read (debug/: crash records, VTCM
layouts and accesses, HMX deep loads and tiles, the device state, the ops' scratch layouts), kept apart from the
face the engine and the commands use (htp/__init__.py). Names load lazily, as there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kazeia.backends.htp import lazy_face

_FACE = {
    "kazeia.backends.htp.msg": ("DeviceState",),
    "kazeia.backends.htp.host.crash_record": ("VTCM_VA", "ParsedCrash", "crash_record", "parse_crash"),
    "kazeia.backends.htp.vtcm.arena": ("HMX_SCALES_BYTES", "HMX_TILE_BYTES", "Vtcm", "VtcmAccessError", "span_box"),
    "kazeia.backends.htp.hmx.deep_loads": ("BANK_BYTES", "DeepLoad", "bank_crossings", "hmx_deep_loads"),
    "kazeia.backends.htp.hmx.tiles": ("hmx_matmul_weight", "weight_from_tiles"),
    "kazeia.backends.htp.kernels.rounding": ("shuffled_fp16",),
    "kazeia.backends.htp.vtcm.scratch": ("op_scratch",),
}

if TYPE_CHECKING:  # what readers and IDEs see (never imported at run time)
    from kazeia.backends.htp.hmx.deep_loads import BANK_BYTES, DeepLoad, bank_crossings, hmx_deep_loads
    from kazeia.backends.htp.hmx.tiles import hmx_matmul_weight, weight_from_tiles
    from kazeia.backends.htp.host.crash_record import VTCM_VA, ParsedCrash, crash_record, parse_crash
    from kazeia.backends.htp.kernels.rounding import shuffled_fp16
    from kazeia.backends.htp.msg import DeviceState
    from kazeia.backends.htp.vtcm.arena import HMX_SCALES_BYTES, HMX_TILE_BYTES, Vtcm, VtcmAccessError, span_box
    from kazeia.backends.htp.vtcm.scratch import op_scratch

__all__, __getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
