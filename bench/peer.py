"""Finding llama.cpp's tools for the benchmarks: never a fixed machine path.

`find_tool("llama-bench")` looks at, in order: $KAZEIA_LLAMA_BENCH (or $LLAMA_BENCH; for another tool
$KAZEIA_<NAME> with dashes as underscores, e.g. $KAZEIA_LLAMA_QUANTIZE), the PATH, then the build tree named
by $LLAMA_CPP_BUILD (its bin/ directory, or the directory itself). Without one the benchmarks print
"peer: not available" and only kazeia's numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess


def _env_names(name: str) -> list[str]:
    key = name.upper().replace("-", "_")
    names = [f"KAZEIA_{key}"]
    if name == "llama-bench":
        names.append("LLAMA_BENCH")
    if name == "llama-quantize":
        names.append("LLAMA_QUANTIZE")
    return names


def find_tool(name: str) -> str | None:
    cands = [os.environ.get(e) for e in _env_names(name)] + [shutil.which(name)]
    build = os.environ.get("LLAMA_CPP_BUILD")
    if build:
        cands += [os.path.join(build, "bin", name), os.path.join(build, name)]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def llama_bench(exe: str, model: str, pp: list[int], tg: list[int], threads: int, reps: int,
                timeout: float = 3600) -> dict[str, list[float]]:
    """{"pp128": [t/s per repetition], "tg16": [...]} from `llama-bench -o json` on `model`."""
    cmd = [exe, "-m", model, "-p", ",".join(map(str, pp)) or "0", "-n", ",".join(map(str, tg)) or "0",
           "-t", str(threads), "-r", str(reps), "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    out = {}
    for rec in json.loads(r.stdout):
        name = f"pp{rec['n_prompt']}" if rec["n_gen"] == 0 else f"tg{rec['n_gen']}"
        out[name] = [float(x) for x in rec["samples_ts"]]
    return out
