"""kazeia oracle: test-backend-ops style sweep of single ops, each compared with the float64 REF backend.

    kazeia oracle -b HTP0 -o MUL_MAT --htp-profile 2026-05 -p 'k=9728' -j 2 --csv out.csv
    kazeia oracle --htp-profile 2026-05 --seed 1 \\
        --case 'MUL_MAT(type_a=q4_0,type_b=f32,m=2560,n=38,k=9728,bs=[1,1],nr=[1,1],view=contig)'
    kazeia oracle --replay kz_act.bin -o MUL_MAT --htp-profile 2026-05    # a GGML_HEXAGON_DUMP capture as src1

Every case runs in a worker process (a device death, a crash or a hang fails that case, never the sweep).
Exit status 0 if every supported case passed, 1 otherwise (as test-backend-ops).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time

from kazeia.cli import validate as V
from kazeia.cli.common import add_common
from kazeia.debug import oracle as O
from kazeia.errors import KazeiaError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("oracle", help="single-op differential tests against the float64 oracle (test-backend-ops)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--backend", type=V.device, default="HTP0",
                   help="backend under test: HTP0 (default), CPU or REF")
    p.add_argument("-o", "--ops", default=None, metavar="OPS",
                   help=f"comma list of ops (default: all): {','.join(O.OPS)}")
    p.add_argument("-p", "--pattern", type=V.regex, default=None, metavar="REGEX",
                   help="only cases whose name matches (re.search), e.g. 'type_a=q4_0.*k=9728'")
    p.add_argument("--types", default=None, metavar="TYPES",
                   help=f"MUL_MAT weight / GET_ROWS table types to keep (default {','.join(O.MM_TYPES)})")
    p.add_argument("--quick", action="store_true", help="the small grids (for tests and smoke checks)")
    p.add_argument("--case", action="append", default=[], metavar="NAME",
                   help="run this case (a full name as printed, e.g. 'MUL_MAT(type_a=q4_0,...)'; repeatable) "
                        "instead of the grids")
    p.add_argument("-j", "--jobs", type=V.integer(0, 256), default=O.default_jobs(), metavar="N",
                   help="worker processes (default: the CPU count; 0 runs in this process, unprotected)")
    p.add_argument("--timeout", type=V.seconds, default=O.DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds before a case counts as hung (default {O.DEFAULT_TIMEOUT:g})")
    p.add_argument("--seed", type=V.seed, default=None, metavar="S",
                   help="data seed (default or -1: random, printed)")
    p.add_argument("--csv", type=V.output_file, default=None, metavar="FILE",
                   help="write one record per case (test-backend-ops fields)")
    p.add_argument("--json", type=V.output_file, default=None, metavar="FILE", help="write the whole sweep as JSON")
    p.add_argument("--list", action="store_true", help="print the case names and exit")
    p.add_argument("--show-all", action="store_true", help="print every case, not only the failing ones")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--replay", type=V.regular_file, default=None, metavar="FILE",
                   help="run the MUL_MAT whose src1 is this raw float32 capture (GGML_HEXAGON_DUMP's kz_act.bin; "
                        "shape from the .txt beside it) with a random weight, and the same case with random data")
    p.add_argument("--replay-shape", type=V.dims(2, 3), default=None, metavar="K,N",
                   help="--replay: the capture's shape when no description is beside it (and M=rows of the weight "
                        "with ',M')")
    g = p.add_argument_group("HTP0")
    g.add_argument("--htp-profile", type=V.htp_profile, default=None,
                   help="2026-10 (default), robust or 2026-05; env KAZEIA_HTP_PROFILE")
    g.add_argument("--vtcm", type=V.vtcm_bytes, default=None, metavar="BYTES", help="VTCM size (default 8388608)")
    g.add_argument("--fault", type=V.fault(), action="append", default=[], metavar="NAME",
                   help="fault injection (repeatable)")
    add_common(p)
    p.set_defaults(func=main)
    return p


class ProgressBar:
    """One self-rewriting line on a terminal; a line per 10% otherwise."""

    def __init__(self, enabled: bool, stream=None) -> None:
        self.enabled = enabled
        self.stream = stream = stream or sys.stderr
        self.tty = stream.isatty()
        self.t0 = time.monotonic()
        self.counts: dict[str, int] = {}
        self.last_decile = -1

    def __call__(self, done: int, total: int, r: O.CaseResult) -> None:
        self.counts[r.status] = self.counts.get(r.status, 0) + 1
        if not self.enabled:
            return
        decile = done * 10 // max(total, 1)
        if not self.tty and decile == self.last_decile and done != total:
            return
        self.last_decile = decile
        elapsed = time.monotonic() - self.t0
        eta = elapsed / done * (total - done) if done else 0.0
        width = 30
        fill = done * width // max(total, 1)
        tally = " ".join(f"{_short(s)} {n}" for s, n in sorted(self.counts.items()))
        line = f"[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {tally} eta {eta:.0f}s"
        if self.tty:
            w = self.width()
            self.stream.write("\r" + line[:w].ljust(w) + ("\n" if done == total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def clear(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r" + " " * self.width() + "\r")
            self.stream.flush()

    @staticmethod
    def width() -> int:
        return max(40, shutil.get_terminal_size((100, 24)).columns - 1)


def _short(status: str) -> str:
    return {"OK": "ok", "FAIL": "fail", "DEVICE DEATH": "death", "CRASH": "crash", "TIMEOUT": "timeout",
            "not supported": "n/s", "reference invalid": "ref-invalid"}.get(status, status)


def _replay(args: argparse.Namespace) -> int:
    from kazeia.debug.oracle.replay_bin import load_capture, replay_capture, replay_case

    dims = list(args.replay_shape or [])
    op = (args.ops or "MUL_MAT").split(",")[0].strip().upper()
    cap = load_capture(args.replay)
    case = replay_case(cap, op, *(dims + [None] * (3 - len(dims))))
    spec = O.BackendSpec(args.backend, profile=args.htp_profile, vtcm=args.vtcm, faults=tuple(args.fault))
    spec.validate()
    seed = args.seed if args.seed not in (None, V.RANDOM_SEED) else O.now_seed()
    r = replay_capture(cap, case, spec, seed)
    for line in r.lines():
        print(line)
    return 0 if r.captured.passed and r.random.passed else 1


def main(args: argparse.Namespace) -> int:
    if args.replay:
        return _replay(args)
    ops = [o for o in args.ops.split(",") if o.strip()] if args.ops else None
    types = args.types.split(",") if args.types else None
    if args.case:
        cases = [O.parse_case(name) for name in args.case]
    else:
        cases = O.make_cases(ops, types, quick=args.quick, pattern=args.pattern, vtcm=args.vtcm)
    if args.list:
        for c in cases:
            print(c.name)
        print(f"{len(cases)} cases", file=sys.stderr)
        return 0
    if not cases:
        raise KazeiaError("no case matches (check -o, --types and -p)")
    if args.jobs < 0:
        raise KazeiaError("-j must be >= 0")
    spec = O.BackendSpec(args.backend, profile=args.htp_profile, vtcm=args.vtcm, faults=tuple(args.fault))
    spec.validate()
    seed = args.seed if args.seed not in (None, V.RANDOM_SEED) else O.now_seed()
    jobs = min(args.jobs, len(cases))
    where = f"{jobs} worker process{'es' if jobs != 1 else ''}" if jobs else "in process"
    print(f"Testing {len(cases)} case{'s' if len(cases) != 1 else ''} on {spec.name} ({spec.describe()}) against "
          f"REF (float64), seed {seed}, {where}", flush=True)
    bar = ProgressBar(not args.no_progress)
    sweep = O.run_sweep(cases, spec, seed, jobs=args.jobs, timeout=args.timeout, progress=bar)
    bar.clear()
    for r in sweep.results:
        if args.show_all or r.failed:
            print(r.line())
            for line in r.log[-2:] if r.failed else []:  # what the DSP said (FARF), e.g. the VTCM overflow
                print(f"      {line}")
    for line in sweep.summary_lines():
        print(line)
    print(f"  {sweep.seconds:.1f} s; rerun with --seed {seed}")
    if args.csv:
        sweep.write_csv(args.csv)
    if args.json:
        sweep.write_json(args.json)
    if sweep.interrupted:
        return 130
    return 0 if sweep.ok else 1
