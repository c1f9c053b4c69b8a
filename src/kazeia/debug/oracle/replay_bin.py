"""Replaying a raw activation capture (the team's kz_act.bin) through one op, test-backend-ops style.

The original team injected the o_proj's captured activation into the isolated matmul of test-backend-ops, with a
random q4_0 weight: "HTP0=NaN en sortie (vs random→fini), MAIS pas de crash en isolation". `kazeia oracle
--replay FILE` does the same: FILE holds raw float32 values (ggml_nbytes bytes from a tensor's data pointer, as
GGML_HEXAGON_DUMP writes them); the shape comes from the one-line description beside it (`FILE` with .txt:
the dumped tensor's ne and the op's src0 type and ne) or from the flags. The values become src1 (test-backend-ops'
`b`) of a MUL_MAT case of that shape, the weight is seeded random, and the case runs on the backend under test
and on REF like any other case; the same case with random activations runs beside it for contrast.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from kazeia.debug.oracle.backends import BackendSpec
from kazeia.debug.oracle.cases import Case
from kazeia.debug.oracle.mul_mat import mul_mat_case
from kazeia.debug.oracle.run import run_case
from kazeia.debug.oracle.verdicts import CaseResult
from kazeia.errors import KazeiaError
from kazeia.limits import InputLimitError, TextLimits, open_regular, read_text
from kazeia.memory import check_fits

_DUMPED = re.compile(r"dumped: \S+ (\w+)\[(\d{1,12}),(\d{1,12}),(\d{1,12}),(\d{1,12})\]")
_SRC0 = re.compile(r"src0=\S+ (\w+)\[(\d{1,12}),(\d{1,12}),(\d{1,12}),(\d{1,12})\]")


@dataclass
class Capture:
    path: str
    values: np.ndarray  # float32, every value of the file
    ne: tuple[int, int] | None  # (K, M) of the dumped tensor, from the description
    weight: tuple[str, int] | None  # (type, rows N) of the op's src0, from the description
    description: str | None

    def summary(self) -> str:
        v = self.values
        return (f"{v.size} values: {int((v == 0).sum())} zeros, {int(np.isneginf(v).sum())} -inf, "
                f"{int(np.isposinf(v).sum())} +inf, {int(np.isnan(v).sum())} NaN")


MAX_CAPTURE_BYTES = 256 << 20  # one dumped activation (Qwen3-4B's largest, 9728 x 512 float32, is 19 MiB)


def load_capture(path: str) -> Capture:
    try:
        with open_regular(path, "dumped activation (a file of float32)", MAX_CAPTURE_BYTES) as f:
            size = os.fstat(f.fileno()).st_size
            check_fits(f"--replay {path}", size * 4)  # the values, and the case's float64 reference of them
            raw = np.fromfile(f, dtype=np.uint8, count=size)
    except InputLimitError as e:
        raise KazeiaError(f"--replay {e}") from None
    except OSError as e:
        raise KazeiaError(f"--replay {path}: {e.strerror}") from None
    if raw.size == 0 or raw.size % 4:
        raise KazeiaError(f"--replay {path}: {raw.size} bytes is not a whole number of float32 values")
    desc, ne, weight = None, None, None
    side = os.path.splitext(path)[0] + ".txt"
    if os.path.exists(side):  # (a FIFO or a device there is one line, not a read that never returns)
        text = read_text(side, TextLimits("dump description", max_bytes=1 << 20, max_line=4096))
        desc = text.splitlines()[0].strip() if text.strip() else None
    if desc:
        m = _DUMPED.search(desc)
        if m and m.group(1) == "f32" and int(m.group(4)) == int(m.group(5)) == 1:
            ne = (int(m.group(2)), int(m.group(3)))
        w = _SRC0.search(desc)
        if w:
            weight = (w.group(1), int(w.group(3)))
    return Capture(path, raw.view(np.float32), ne, weight, desc)


def replay_case(cap: Capture, op: str = "MUL_MAT", k: int | None = None, n: int | None = None,
                m: int | None = None, type_a: str | None = None) -> Case:
    """The MUL_MAT case the capture is src1 of: k x n activations (from the description, or the flags), m weight
    rows of type_a (default: the op's own src0, else 2560 rows of q4_0, the o_proj of Qwen3-4B)."""
    if op != "MUL_MAT":
        raise KazeiaError(f"--replay runs MUL_MAT cases (the team's replay), not {op}")
    k = k or (cap.ne[0] if cap.ne else None)
    n = n or (cap.ne[1] if cap.ne else None)
    if k is None or n is None:
        raise KazeiaError(f"--replay {cap.path}: no description beside it gives its shape; pass --replay-shape K,N")
    if k * n > cap.values.size:
        raise KazeiaError(f"--replay {cap.path}: {cap.values.size} values are fewer than {k} x {n}")
    wtype, rows = cap.weight or ("q4_0", 2560)
    return mul_mat_case(type_a or wtype, m or rows, n, k)


@dataclass
class Replay:
    capture: Capture
    case: Case
    captured: CaseResult  # the case with the captured activation
    random: CaseResult  # the same case with random activations

    def lines(self) -> list[str]:
        c = self.captured
        out = [f"Replaying {self.capture.path} ({self.capture.summary()}) as src1 of", f"  {self.case.name}",
               f"  with a random {self.case['type_a']} weight (seed {c.seed}) on {c.backend} against REF (float64)"]
        for label, r in (("captured activation", self.captured), ("random activation", self.random)):
            outs = "; ".join(f"{b} output: {_fin(o)}" for b, o in r.outputs.items())
            crash = "device death" if r.death else "no crash in isolation"
            out.append(f"  {label}: {r.status}{' ' + r.reason if r.reason and r.status != 'OK' else ''}")
            out.append(f"      {outs or 'no output'}; {crash}")
        return out


def _fin(o: dict) -> str:
    if not o["nan"] and not o["inf"]:
        return f"finite (amax {o['amax']:.4g})"
    return f"{o['nan']} NaN, {o['inf']} inf of {o['n']}"


def replay_capture(cap: Capture, case: Case, spec: BackendSpec, seed: int) -> Replay:
    k, n = case["k"], case["n"]
    b = cap.values[:k * n].reshape(1, 1, n, k)  # numpy order of ne [k, n]
    return Replay(cap, case, run_case(case, spec, seed, values={"b": b}), run_case(case, spec, seed))
