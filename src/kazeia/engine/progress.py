"""Progress lines for work that can run longer than a few seconds: a ticker thread that says, every few seconds
after the first few, that the work is still going and how far it got (a status callable), on stderr.

It reads the status only (a counter the work updates), so it never touches the computation: the bits of a run
with or without it are the same."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

AFTER_S = 3.0  # quiet for work that ends sooner
EVERY_S = 5.0


@contextlib.contextmanager
def ticking(label: str, status: Callable[[], str] | None = None, after: float = AFTER_S,
            every: float = EVERY_S) -> Iterator[None]:
    """While the block runs: `kazeia: LABEL: STATUS (N s)` on stderr after `after` s, then every `every` s."""
    done = threading.Event()
    t0 = time.monotonic()

    def tick() -> None:
        wait = after
        while not done.wait(wait):
            try:
                what = status() if status is not None else "running"
            except Exception:  # noqa: BLE001 - a status that cannot be read is not the work's failure
                what = "running"
            print(f"kazeia: {label}: {what} ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
            wait = every

    thread = threading.Thread(target=tick, name=f"progress-{label}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
