"""kazeia investigate: reproduce a device problem and write the report the original team could not."""

from __future__ import annotations

import argparse
import sys

from kazeia.cli import validate as V
from kazeia.cli.common import add_common, add_device_args, add_model_args, set_threads, tool_spec
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("investigate", help="find and explain a device fault automatically; writes a report")
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
