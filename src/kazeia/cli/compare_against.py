"""kazeia compare --against LOG: a device's llama-eval-callback log judged against kazeia's float64 reference
of the same model and prompt (the token ids the log lists, else -p / --n-prompt)."""

from __future__ import annotations

import argparse

from kazeia.cli.common import spec_from_args
from kazeia.errors import KazeiaError
from kazeia.limits import read_text


def main(args: argparse.Namespace) -> int:
    from kazeia.debug.evalcb import EVALCB, AgainstReport, compare_log, parse_log, reference_nodes

    log, tokens = parse_log(read_text(args.against, EVALCB), args.against)
    if not log:
        raise KazeiaError(f"{args.against}: no llama-eval-callback tensor lines ('name = (type) OP(...) = {{ne}}')")
    if tokens is None and args.prompt is None and args.n_prompt is None:
        raise KazeiaError(f"{args.against} lists no token ids: give -p PROMPT or --n-prompt N")
    spec = spec_from_args(args, device="REF").with_(tokens=tokens)
    rep = AgainstReport(compare_log(log, reference_nodes(spec), rel=args.tolerance), len(tokens or []))
    print("\n".join(rep.lines()))
    return 1 if rep.first_departure is not None else 0
