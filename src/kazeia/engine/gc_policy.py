"""The cyclic garbage collector while a session runs.

A decode step of the device model makes a few thousand short-lived container objects, and the collector's young
generation fills every 700 of them (CPython's default). Each of its full passes then walks every object the process
holds, the model's tokenizer tables and graph included: on the 36-layer Qwen3-4B, the HTP0 decode of 64 tokens paid
147 ms in collections (three full passes of 35-40 ms). While a session is open, what is alive when it opens is frozen
(one full collection first, so no garbage is frozen; then gc.freeze: never walked again, still freed by its reference
counts) and the young generation holds YOUNG_THRESHOLD objects: ~8 ms for the same 64 tokens. When the last open
session closes, the frozen objects are handed back to the collector and the thresholds restored, so what a closed
session leaves in cycles is collected (a process that opens sessions one after another does not keep them).
"""

from __future__ import annotations

import gc
import threading

YOUNG_THRESHOLD = 10_000  # container allocations between two young collections while a session is open

_lock = threading.Lock()
_held = 0
_saved: tuple[int, int, int] | None = None


def hold() -> None:
    """A session opens: collect, freeze what is left and raise the young threshold (nested holds count)."""
    global _held, _saved
    with _lock:
        if _held == 0:
            _saved = gc.get_threshold()
            gc.collect()  # only what is alive is frozen: garbage made before the session would stay until release
            gc.freeze()
            gc.set_threshold(max(YOUNG_THRESHOLD, _saved[0]), *_saved[1:])
        _held += 1


def release() -> None:
    """A session closes: the last one to close unfreezes and restores the thresholds (a release without a hold
    does nothing)."""
    global _held
    with _lock:
        if _held == 0:
            return
        _held -= 1
        if _held == 0 and _saved is not None:
            gc.unfreeze()
            gc.set_threshold(*_saved)


def held() -> int:
    """Open holds (for tests)."""
    return _held
