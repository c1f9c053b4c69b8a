"""kazeia bisect: find the first failing op (ops), the failing prompt lengths (m), the minimal failing rows (rows).

Each step is a run in a child process judged by `--check CMD` (exit status 0 = pass) or by the built-in
oracle (no death, logits within NMSE 2e-3 of the CPU); `--fail-regex` pins the failure signature; `--state
FILE` makes the search resumable (rewritten after every step; rerun the same command to continue).
"""

from __future__ import annotations

import argparse
import json
import sys

from kazeia.cli import validate as V
from kazeia.cli.common import add_common, add_device_args, add_model_args, set_threads, tool_spec
from kazeia.debug import bisect as B
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bisect", help="bisect a failure: first failing op, failing prompt lengths, minimal rows",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bsub = p.add_subparsers(dest="bisect_command", metavar="SUBCOMMAND")

    ops = bsub.add_parser("ops", help="first op whose running on the device makes the run fail (O(log n) runs)",
                          description=B.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_args(ops)
    ops.set_defaults(bisect_func=_main_ops)

    m = bsub.add_parser("m", help="smallest and largest failing prompt length M (--n-prompt is a failing M)")
    _add_run_args(m)
    g = m.add_argument_group("prompt length search")
    g.add_argument("--fail", type=V.positive(), default=None, metavar="M", help="a failing M (default: --n-prompt)")
    g.add_argument("--pass", dest="pass_m", type=V.positive(), default=1, metavar="M",
                   help="a passing M below it to start from (default 1; halved while it fails)")
    g.add_argument("--limit", type=V.positive(), default=1024, metavar="M",
                   help="largest M to try when searching upward (default 1024, capped by -c)")
    g.add_argument("--predict", type=V.m_range, default=None, metavar="LO:HI",
                   help="only confirm a predicted failing range: run M-1, M, M+1 at both ends (the full search "
                        "follows if they disagree)")
    m.set_defaults(bisect_func=_main_m)

    rows = bsub.add_parser("rows", help="minimal failing subset of a dumped op's src1 rows (ddmin)")
    rows.add_argument("dump", type=V.existing_path, metavar="DUMP_DIR",
                      help="op dump directory (kazeia run --dump REGEX DIR)")
    rows.add_argument("--op", default=None, help="entry id or node name when the directory holds several dumps")
    rows.add_argument("-dev", "--device", type=V.device, default=None,
                      help="device to replay on (default: the recorded one)")
    rows.add_argument("--htp-profile", type=V.htp_profile, default=None, help="HTP profile (default: the recorded one)")
    rows.add_argument("--vtcm", type=V.vtcm_bytes, default=None, metavar="BYTES", help="HTP VTCM size")
    rows.add_argument("--fault", type=V.fault(), action="append", default=None, metavar="NAME",
                      help="HTP fault injections")
    rows.add_argument("--no-shortcut", action="store_true",
                      help="always run ddmin (default: test zero/random rows first and bisect the row count "
                           "when the values do not matter)")
    rows.add_argument("--seed", type=V.seed, default=0,
                      help="seed of the random rows of the value check (-1: random, printed)")
    _add_search_args(rows, check=False)
    rows.set_defaults(bisect_func=_main_rows)
    for sp in (ops, m, rows):
        add_common(sp)
    p.set_defaults(func=main, bisect_parser=p)
    return p


def _add_run_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_device_args(p)
    p.add_argument("-n", "--n-predict", type=V.integer(0), default=0, help="greedy tokens to generate after the prompt")
    p.add_argument("--stop-after", default=None, metavar="NODE",
                   help="each step runs the graph only through NODE (e.g. l_out-0: a death in the layers up to it "
                        "is decided there); the oracle then judges NODE's output against the reference's")
    _add_search_args(p, check=True)


def _add_search_args(p: argparse.ArgumentParser, check: bool) -> None:
    g = p.add_argument_group("judging and resuming")
    if check:
        g.add_argument("--check", default=None, metavar="CMD",
                       help="shell command judging each step (exit status 0 = pass); it gets the step as "
                            "{cpu_node_range}, {m}, {run} placeholders and env KAZEIA_CPU_NODE_RANGE (which "
                            "`kazeia run` follows), KAZEIA_BISECT_M, KAZEIA_RUN_CMD. Default: the built-in "
                            "oracle (no death, logits within NMSE 2e-3 of --reference)")
        g.add_argument("--reference", type=V.device, default="CPU",
                       help="oracle reference device (CPU or REF; default CPU)")
        g.add_argument("--timeout", type=V.seconds, default=600.0, metavar="S",
                       help="a step running longer is killed and counts as failing (hang); default 600")
        g.add_argument("--no-isolate", action="store_true",
                       help="oracle runs in this process instead of child processes (faster; a real crash or "
                            "hang then ends the search)")
    g.add_argument("--fail-regex", type=V.regex, default=None, metavar="REGEX",
                   help="only failures whose output matches count; other failures are 'other' (treated as "
                        "passing, reported)")
    g.add_argument("--state", type=V.output_file, default=None, metavar="FILE",
                   help="JSON state rewritten after every step; rerun with the same file to resume")
    g.add_argument("--max-steps", type=V.integer(0), default=None, metavar="N",
                   help="stop after N new steps (resume later with --state)")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    g.add_argument("-q", "--quiet", action="store_true", help="no per-step progress lines on stderr")


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    """The RunSpec of the model/device flags, as `kazeia run` maps them."""
    return tool_spec(args, args.command if isinstance(getattr(args, "command", None), str) else "bisect")


def make_judge(args: argparse.Namespace) -> B.Judge:
    if args.fail_regex:
        from kazeia.limits import safe_regex

        safe_regex(args.fail_regex, "--fail-regex")
    if args.check:
        return B.CommandJudge(args.check, args.fail_regex, args.timeout)
    cache = f"{args.state}.refs" if args.state else None
    return B.OracleJudge(args.reference.upper(), fail_regex=args.fail_regex, timeout=args.timeout,
                         isolate=not args.no_isolate, cache_dir=cache)


def _log(args: argparse.Namespace):
    if args.quiet:
        return None
    return lambda line: print(line, file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    func = getattr(args, "bisect_func", None)
    if func is None:
        args.bisect_parser.print_help()
        return 2
    try:
        return func(args)
    except B.BisectInterrupted as e:
        print(str(e), file=sys.stderr)
        return e.exit_code


def _main_ops(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    spec = spec_from_args(args)
    if spec.n_prompt is None and not spec.prompt:
        raise KazeiaError("bisect ops needs the failing run's prompt: -p PROMPT or --n-prompt N")
    res = B.bisect_ops(spec, make_judge(args), args.state, args.max_steps, log=_log(args))
    print(json.dumps(res.to_dict(), indent=1) if args.json else B.format_ops(res))
    return 0 if res.verdict == "found" else 1


def _main_m(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    spec = spec_from_args(args)
    predicted = args.predict
    res = B.bisect_m(spec, make_judge(args), fail_m=args.fail, pass_m=args.pass_m, limit=args.limit,
                     predicted=predicted, state_path=args.state, max_steps=args.max_steps, log=_log(args))
    print(json.dumps(res.to_dict(), indent=1) if args.json else B.format_m(res))
    return 0 if res.verdict in ("found", "confirmed") else 1


def _main_rows(args: argparse.Namespace) -> int:
    from kazeia.debug.dump import load_dump

    dump = load_dump(args.dump, op=args.op)
    seed, drawn = V.resolve_seed(args.seed)
    if drawn:
        print(f"seed: {seed} (--seed -1: drawn at random)", file=sys.stderr)
    res = B.bisect_rows(dump, args.device, args.htp_profile, args.vtcm, args.fault, args.fail_regex, args.state,
                        args.max_steps, shortcut=not args.no_shortcut, seed=seed, log=_log(args))
    if args.json:
        print(json.dumps(res.to_dict(), indent=1))
    else:
        print(f"{dump.summary()}\n{B.format_rows(res)}")
    return 0 if res.verdict == "found" else 1
