"""Run the fuzz cases of every input class and print classes x outcomes.

    python tests/fuzz/run.py                      # every class, the default counts, seed 0
    python tests/fuzz/run.py --seed 7 --scale 2   # other values, twice as many
    python tests/fuzz/run.py --classes evalcb,env --show-failures

Exit status 1 when any case ends in a traceback, the last-resort line, a hang (60 s), more than 2 GB of RSS, a
refusal of more than one line, or exit 0 on an input marked bad. --report FILE keeps every failure's stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # forked children must not inherit a BLAS thread pool
sys.path.insert(0, os.path.dirname(__file__))

import generators as G  # noqa: E402
import generators_files as GF  # noqa: E402
from harness import FAILURES, Result, run_case  # noqa: E402

CLASSES = {"evalcb": (G.gen_evalcb, 200), "op-stream": (G.gen_op_stream, 600), "crashlog": (G.gen_crashlog, 400),
           "policy": (G.gen_policy, 500), "outputs": (G.gen_outputs, 200), "streams": (G.gen_streams, 30),
           "env": (G.gen_env, 250), "prompts": (G.gen_prompts, 100), "templates": (GF.gen_templates, 200),
           "sizes": (GF.gen_sizes, 150), "dumps": (GF.gen_dumps, 400), "gguf": (GF.gen_gguf, 30),
           "template-results": (GF.gen_template_results, 120), "special-files": (GF.gen_special_files, 60),
           "expansion": (GF.gen_expansion, 24)}  # 3,264 cases


def build_cases(classes: list[str], seed: int, scale: float) -> list:
    cases = []
    for name in classes:
        gen, count = CLASSES[name]
        cases += gen(random.Random(f"{seed}:{name}"), max(1, int(count * scale)))
    return cases


def run_all(cases: list, jobs: int, workdir: str, shared: dict, progress: bool = True) -> list[Result]:
    results: list[Result] = []
    lock = threading.Lock()
    todo = list(enumerate(cases))

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i, case = todo.pop(0)
            r = run_case(case, workdir, shared)
            with lock:
                results.append(r)
                if progress and len(results) % 50 == 0:
                    print(f"[fuzz] {len(results)}/{len(cases)}", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def table(results: list[Result]) -> str:
    by: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        by[r.case.cls][r.outcome] += 1
    cols = ["ok", "finding", "refused", *FAILURES]
    lines = ["| class | cases | " + " | ".join(cols) + " | max s | total s | max RSS MiB |",
             "|---|---|" + "---|" * len(cols) + "---|---|---|"]
    for cls in sorted(by):
        rs = [r for r in results if r.case.cls == cls]
        lines.append(f"| {cls} | {len(rs)} | " + " | ".join(str(by[cls][c]) for c in cols)
                     + f" | {max(r.seconds for r in rs):.1f} | {sum(r.seconds for r in rs):.0f} | "
                       f"{max(r.rss for r in rs) / 2**20:.0f} |")
    total = Counter(r.outcome for r in results)
    lines.append(f"| all | {len(results)} | " + " | ".join(str(total[c]) for c in cols) + " | | | |")
    return "\n".join(lines)


def preload() -> None:
    """Import what every case imports anyway (engine, backends, tokenizers, jinja2), once, before forking: a
    case then costs its own work, not the interpreter's imports. The parent stays far below the RSS limit."""
    import kazeia.backends.htp.backend  # noqa: F401
    import kazeia.debug.runner  # noqa: F401
    import kazeia.engine.chat  # noqa: F401
    import kazeia.engine.session  # noqa: F401


def make_shared(workdir: str) -> dict:
    from kazeia.gguf.writer import SynthConfig, write_model

    tiny = os.path.join(workdir, "tiny.gguf")
    write_model(SynthConfig(n_layer=2, wtype="q4_0"), tiny)
    return {"tiny": tiny}


def main() -> int:
    import kazeia

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every class's case count")
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--report", default=None, help="write every failure (JSON) here")
    ap.add_argument("--show-failures", action="store_true")
    args = ap.parse_args()
    import kazeia.cli.main  # noqa: F401 - imported once here, so each forked case starts warm

    root = os.path.dirname(os.path.dirname(os.path.abspath(kazeia.__file__)))  # cases that start an interpreter
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])

    kazeia.cli.main.build_parser()
    preload()
    workdir = tempfile.mkdtemp(prefix="kazeia-fuzz-")
    try:
        shared = make_shared(workdir)
        cases = build_cases(args.classes.split(","), args.seed, args.scale)
        t0 = time.perf_counter()
        results = run_all(cases, args.jobs, workdir, shared)
        print(table(results))
        print(f"{len(results)} cases in {time.perf_counter() - t0:.0f} s (seed {args.seed})")
        failed = [r for r in results if r.failed]
        for r in failed if args.show_failures else []:
            tail = r.stderr.strip().splitlines()[-3:]
            print(f"FAIL {r.case.cls}/{r.case.name} {r.outcome} exit={r.code} argv={r.case.argv!r:.200}")
            for ln in tail:
                print("    " + ln[:300])
        if args.report:
            with open(args.report, "w") as f:
                json.dump([{"class": r.case.cls, "name": r.case.name, "argv": r.case.argv, "outcome": r.outcome,
                            "code": r.code, "seconds": r.seconds, "rss": r.rss, "stderr": r.stderr[-4000:]}
                           for r in failed], f, indent=1)
        return 1 if failed else 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
