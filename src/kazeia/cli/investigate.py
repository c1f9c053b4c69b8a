"""kazeia investigate: reproduce a device problem and write the report the original team could not."""

from __future__ import annotations

import argparse
import sys

from kazeia.cli import validate as V
from kazeia.cli.common import add_common, add_device_args, add_model_args, set_threads, tool_spec
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError

EPILOG = """\
what it says: the outcome (the run died, an op failed on the device, completed with wrong logits, or completed
  with logits that match the CPU), the faulting op, the mechanism with each hypothesis marked as evidence shows
  it, and a gate validated by a rerun; report.md, report.html and investigation.json in -o.
exit status: 0 no fault found; 1 a fault found; 2 a bad input or flag; 74 the report cannot be written.
run time: the seed scenario (36-layer Qwen3-4B Q4_0, 38 tokens, 2026-05) ~25 s; a 2-layer model a few seconds.

example:
  kazeia investigate -m qwen3-4b-q4_0.gguf --n-prompt 38 -dev HTP0 --htp-profile 2026-05
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("investigate", help="find and explain a device fault automatically; writes a report",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_device_args(p)
    p.add_argument("-o", "--output", type=V.output_dir, default="kazeia-investigation", help="report directory")
    p.add_argument("-n", "--n-predict", type=V.integer(0), default=0,
                   help="tokens to generate after the prompt (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_common(p)
    p.set_defaults(func=main)
    return p


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    if args.prompt is None and args.n_prompt is None:
        raise KazeiaError("investigate needs -p PROMPT or --n-prompt N")
    return tool_spec(args, "investigate")


def main(args: argparse.Namespace) -> int:
    from kazeia.debug.investigate import Progress, investigate

    set_threads(args.threads)
    spec = spec_from_args(args)
    inv = investigate(spec, args.output, progress=(lambda msg: None) if args.quiet else Progress())
    print(f"\n{inv.title}\n\noutcome: {inv.outcome}\n\nverdict: {inv.verdict}")
    if inv.gate:
        print(f"\nrecommended gate: {inv.gate['description']}\n  try: {inv.gate['flags']}\n  validated: "
              f"{'yes' if inv.gate.get('validated') else 'no'} ({inv.gate.get('evidence', '')})")
    print(f"\nreport: {args.output}/report.md and {args.output}/report.html", file=sys.stdout)
    return 1 if inv.fault_found else 0
