"""kazeia trace: run a prompt with the op trace on (KZOP lines on stderr, JSONL file), and print where every
op ran; with `-np N -kvu`, the prompt in N sequences side by side. The same trace is `kazeia run --oplog`
(GGML_HEXAGON_OPLOG is the HTP host's enqueue-time log, another tool)."""

from __future__ import annotations

import argparse
import sys

from kazeia.cli import validate as V
from kazeia.cli.common import (
    add_common,
    add_device_args,
    add_model_args,
    add_parallel_args,
    open_session,
    prompt_tokens,
)
from kazeia.engine.progress import ticking
from kazeia.engine.session import check_generation
from kazeia.errors import DeviceDeathError

EPILOG = """\
exit status: 0 done; 2 a bad input or flag; 3 the device died (the trace up to it is kept); 74 the JSONL cannot
  be written.
run time: as `kazeia run` of the same prompt, plus the statistics of every op's inputs and output.
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("trace", help="run with the per-op trace (KZOP lines + JSONL) and a placement table",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_parallel_args(p)
    add_device_args(p)
    p.add_argument("-n", "--n-predict", type=V.integer(0), default=0, help="tokens to generate after the prompt")
    p.add_argument("-o", "--jsonl", type=V.output_file, default="kazeia-trace.jsonl", help="JSONL trace file")
    p.add_argument("--quiet", action="store_true", help="no KZOP lines on stderr (JSONL only)")
    p.add_argument("--placements", action="store_true", help="print the node -> backend/path table at the end")
    add_common(p)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    args.oplog = not args.quiet
    args.oplog_file = args.jsonl
    s = open_session(args)
    ids = prompt_tokens(args, s)
    check_generation(len(ids), args.n_predict, s.ctx.n_ctx)
    trace = next(h for h in s.scheduler.hooks if h.__class__.__name__ == "TraceHook")
    status = 0

    def progress() -> str:
        return f"{len(trace.records)} ops traced, token {trace.ubatch} of {args.n_predict} generated"

    try:
        with ticking("trace", progress):
            # the prompt in every sequence (-np N), then each sequence's own greedy tokens, side by side
            logits = s.ctx.decode_seqs([ids] * s.ctx.n_seq)
            for _ in range(args.n_predict):
                trace.ubatch += 1
                logits = s.ctx.decode_seqs([[int(row.argmax())] for row in logits])
    except DeviceDeathError as e:
        print(str(e), file=sys.stderr)
        status = e.exit_code
    finally:
        if trace.jsonl is not None:
            trace.jsonl.close()
    if args.placements:
        print_placements(trace.records)
    print(f"{len(trace.records)} ops traced -> {args.jsonl}", file=sys.stderr)
    return status


def print_placements(records: list[dict]) -> None:
    print(f"{'#':>5}  {'node':28s} {'op':16s} {'where':12s} {'batch':>5s}  rule")
    for r in records:
        if r.get("ubatch", 0) == 0:
            print(f"{r['index']:5d}  {r['name']:28s} {r['op']:16s} {r['backend'] + '/' + r['path']:12s} "
                  f"{r['batch'] if r['batch'] is not None else '':>5}  {r.get('rule') or ''}")
