"""kazeia replay: rerun dumped ops (from `--dump REGEX DIR`) alone or with their HTP batch context.

Each dumped op is rerun on the chosen device (default: the device and HTP settings of the recorded run) and
judged against float64 on the same inputs with the op's test-backend-ops threshold, and against the output
the run recorded. `--with-context` also reruns, on the same device state, the ops that preceded it in its
HTP batch: "alone: OK; with context: FAIL" means a context-triggered fault (stale VTCM, src1 shortcut),
"alone: died; with context: died" a value- or shape-triggered one. Exit status: 0 if every replay passes,
1 if one fails or dies, 2 for a bad dump or bad flags.
"""

from __future__ import annotations

import argparse
import json
import sys

from kazeia.cli import validate as V
from kazeia.cli.common import add_common
from kazeia.debug.dump import Dump, compare_captures, find_pair, load_dumps
from kazeia.debug.replay import format_result, replay
from kazeia.errors import KazeiaError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("replay", help="rerun dumped ops alone or with their HTP batch context",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=V.existing_path, nargs="?", default=None, metavar="DIR",
                   help="a dump directory written by --dump (or one entry of it)")
    p.add_argument("--op", default=None, metavar="ID|NAME", help="replay only this entry id or node name")
    p.add_argument("--capture", choices=["complete", "enqueue", "all"], default="complete",
                   help="which captures to replay (default complete: what the op consumed)")
    p.add_argument("-dev", "--device", type=V.device, default=None,
                   help="CPU, HTP0 or REF (default: the recorded device)")
    p.add_argument("--htp-profile", type=V.htp_profile, default=None, help="HTP profile (default: the recorded one)")
    p.add_argument("--vtcm", type=V.vtcm_bytes, default=None, metavar="BYTES", help="HTP VTCM size (default: recorded)")
    p.add_argument("--fault", type=V.fault(allow_none=True), action="append", default=None, metavar="NAME",
                   help="HTP fault injection (repeatable; replaces the recorded ones; 'none' clears them)")
    p.add_argument("--with-context", action="store_true",
                   help="also rerun the ops before it in its HTP batch on the restored VTCM and memory")
    p.add_argument("--captures", action="store_true",
                   help="also compare each enqueue-time capture with the completion-time capture of the same op")
    p.add_argument("--strict", action="store_true",
                   help="judge a weight MUL_MAT by its bare threshold, without the allowance for ggml's own "
                        "activation conversion")
    p.add_argument("--op-stream", type=V.regular_file, metavar="LOG", default=None,
                   help="rebuild a device's op log (KZOP or GGML_HEXAGON_VERBOSE lines: shapes only) on the HTP model "
                        "under --htp-profile/--vtcm/--fault, in order on one device: does the profile predict what "
                        "the device did?")
    p.add_argument("--experiment", action="store_true",
                   help="state vs value: replay each op on the HTP from reset, after ops that leave other unit state, "
                        "with VTCM patterns and another timing; says which state (if any) its output follows")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_common(p)
    p.set_defaults(func=main)
    return p


def _select(dumps: list[Dump], op: str | None, capture: str) -> list[Dump]:
    out = [d for d in dumps if op is None or d.id == op or d.name == op]
    if op is not None and not out:
        raise KazeiaError(f"no dump of {op!r} (have: {', '.join(sorted({d.name for d in dumps}))})")
    if capture != "all":
        chosen = [d for d in out if d.capture == capture]
        if op is not None and not chosen and out:
            chosen = out  # an explicit id of the other capture kind
        out = chosen
    if not out:
        raise KazeiaError("nothing to replay (no matching captures in the dump)")
    return out


def main(args: argparse.Namespace) -> int:
    if args.op_stream:
        return _op_stream(args)
    if args.dir is None:
        raise KazeiaError("give a dump DIR (or --op-stream LOG)")
    dumps = load_dumps(args.dir)
    chosen = _select(dumps, args.op, args.capture)
    if args.experiment:
        return _experiment(chosen, args)
    faults = None
    if args.fault is not None:
        faults = [f for f in args.fault if f.lower() != "none"]
    results = []
    failed = False
    for d in chosen:
        with_ctx = args.with_context and d.capture == "complete"
        if with_ctx and d.context is None:
            raise KazeiaError(f"{d.id}: cannot replay with context: {d.context_note}")
        r = replay(d, device=args.device, htp_profile=args.htp_profile, vtcm=args.vtcm, faults=faults,
                   with_context=with_ctx, strict=args.strict)
        failed |= not r.ok
        entry = {"result": r, "dump": d, "captures": None}
        if args.captures:
            pair = find_pair(dumps, d)
            if pair is not None:
                a, b = (pair, d) if pair.capture == "enqueue" else (d, pair)
                entry["captures"] = compare_captures(a, b)
        results.append(entry)
    if args.json:
        out = {"dir": args.dir, "ok": not failed, "results": []}
        for e in results:
            js = e["result"].to_dict()
            js["summary"] = e["dump"].summary()
            if e["captures"] is not None:
                js["captures"] = {"identical": e["captures"].identical, "lines": e["captures"].describe()}
            out["results"].append(js)
        json.dump(out, sys.stdout, indent=1, allow_nan=False, default=str)
        sys.stdout.write("\n")
    else:
        for e in results:
            for line in format_result(e["result"], e["dump"]):
                print(line)
            if e["captures"] is not None:
                for line in e["captures"].describe():
                    print("  " + line)
    return 1 if failed else 0


def _experiment(chosen: list[Dump], args: argparse.Namespace) -> int:
    """--experiment: the state-versus-value experiment on each HTP dump (kazeia.debug.state_experiment)."""
    from kazeia.debug.replay import htp_settings_for
    from kazeia.debug.state_experiment import state_experiment

    faulty = False
    out = []
    for d in chosen:
        if d.htp_settings is None:
            raise KazeiaError(f"{d.id}: --experiment replays on the HTP model; this dump is from {d.backend}")
        faults = None if args.fault is None else [f for f in args.fault if f.lower() != "none"]
        ex = state_experiment(d, htp_settings_for(d, args.htp_profile, args.vtcm, faults))
        faulty |= ex.mechanism_class != "none"
        out.append(ex)
    if args.json:
        json.dump({"dir": args.dir, "experiments": [e.to_dict() for e in out]}, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        for e in out:
            print("\n".join(e.lines()))
    return 1 if faulty else 0


def _op_stream(args: argparse.Namespace) -> int:
    """--op-stream LOG: the logged ops rebuilt from their shapes and run in order (kazeia.debug.op_stream)."""
    from kazeia.backends.htp import HtpSettings
    from kazeia.debug.op_stream import OP_STREAM, parse_stream, replay_stream
    from kazeia.limits import read_text

    path = args.op_stream
    ops = parse_stream(read_text(path, OP_STREAM), path)
    if not ops:
        raise KazeiaError(f"{path}: no KZOP or GGML_HEXAGON_VERBOSE execute-op lines")
    faults = [f for f in (args.fault or []) if f.lower() != "none"]
    settings = HtpSettings.from_env(profile=args.htp_profile, vtcm_bytes=args.vtcm, faults=faults)
    res = replay_stream(ops, settings)
    print("\n".join(res.lines()))
    return 1 if res.death is not None or res.first_wrong is not None else 0
