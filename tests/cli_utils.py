"""The kazeia command line as the HTP tests run it: a child process that sees none of the caller's GGML_HEXAGON_* or
KAZEIA_HTP_* switches, only those the test gives it."""

from __future__ import annotations

import os
import subprocess
import sys


def kazeia_clean(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m kazeia ARGS` with the HTP switches of this process removed and `env` added."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_HEXAGON_", "KAZEIA_HTP_"))}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "kazeia", *args], capture_output=True, text=True, timeout=timeout,
                          env=full)


def tiny_model(path: str, arch: str) -> str:
    """`kazeia make-model --preset tiny --arch ARCH -o PATH` (the CLI's own file, as a user makes it)."""
    r = kazeia_clean("make-model", "--preset", "tiny", "--arch", arch, "-o", path, "--quiet")
    assert r.returncode == 0, r.stderr[-500:]
    return path
