"""Child-process entry point for runner.run_child: `python -m kazeia.debug.child SPEC.json`."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

import numpy as np

from kazeia.debug.runner import run
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError
from kazeia.limits import read_json_object
from kazeia.native.threads import apply_threads


def main(argv: list[str]) -> int:
    job = read_json_object(argv[0], "child job")
    apply_threads(job)
    spec = RunSpec(**job["spec"])
    try:
        res = run(spec, all_logits=job.get("all_logits", False))
    except KazeiaError as e:
        from kazeia.debug.runner import RunResult

        res = RunResult(ok=False, error=str(e))
    except MemoryError:  # not the failure under search: the parent retries, then says "inconclusive"
        from kazeia.debug.runner import RunResult

        res = RunResult(ok=False, error="the run ran out of memory (MemoryError)", killed="out of memory")
    d = asdict(res)
    for key in ("logits", "stop_output"):  # arrays go beside the JSON
        a = d.pop(key)
        d[f"{key}_path"] = None
        if a is not None:
            d[f"{key}_path"] = os.path.join(os.path.dirname(job["out"]), f"{key}.npy")
            np.save(d[f"{key}_path"], np.asarray(a))
    with open(job["out"], "w") as f:
        json.dump(d, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
