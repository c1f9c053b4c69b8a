"""Memory checks before big allocations: a clear one-line error instead of an out-of-memory kill later."""

from __future__ import annotations

import os

from kazeia.errors import KazeiaError

GIB = float(1 << 30)


def available_bytes() -> int | None:
    """Memory this process can still take: MemAvailable, capped by a cgroup v2 limit; None if unknown."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            room = max(0, int(limit) - used)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    room = _address_space_room()
    if room is not None:
        avail = room if avail is None else min(avail, room)
    return avail


def _address_space_room() -> int | None:
    """What an address-space limit (ulimit -v, RLIMIT_AS) leaves this process; None if there is none."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
    return max(0, soft - used)


def check_fits(what: str, nbytes: int, hint: str = "") -> None:
    """Raise KazeiaError if `nbytes` more would not fit in the memory available now."""
    avail = available_bytes()
    if avail is not None and nbytes > avail:
        raise KazeiaError(f"{what} needs {nbytes / GIB:.2f} GiB but only {avail / GIB:.2f} GiB of memory is "
                          f"available{hint}")
