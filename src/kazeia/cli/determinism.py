"""kazeia determinism: run the same configuration N times and name the first op whose output differs.

Each run gets a fresh context; every op's output is hashed when the op completes on its device, and the
runs are compared op by op in execution order, then the final logits bitwise. Exit status 0 when
deterministic, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import sys

from kazeia.cli import validate as V
from kazeia.cli.bisect import spec_from_args
from kazeia.cli.common import add_common, add_device_args, add_model_args, set_threads
from kazeia.debug.determinism import build_seeded, check_determinism
from kazeia.errors import KazeiaError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("determinism", help="run N times, name the first op whose output differs between runs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_device_args(p)
    g = p.add_argument_group("determinism")
    g.add_argument("-N", "--runs", type=V.integer(2, 1000), default=3, help="number of runs (default 3, at most 1000)")
    g.add_argument("-n", "--n-predict", type=V.integer(0), default=0, help="greedy tokens to generate after the prompt")
    g.add_argument("--isolate", action="store_true", help="each run in its own child process")
    g.add_argument("--timeout", type=V.seconds, default=600.0, metavar="S", help="per-run timeout with --isolate")
    g.add_argument("-cnv", "--conversation", action="store_true",
                   help="the prompt is a chat turn, rendered with the model's chat template (as kazeia run -cnv)")
    g.add_argument("-st", "--single-turn", action="store_true", help="accepted with -cnv (one turn is what runs)")
    g.add_argument("--reasoning", choices=["on", "off"], default=None, help="Qwen3 thinking on/off (with -cnv)")
    g.add_argument("--json", action="store_true", help="print the report as JSON")
    g.add_argument("-q", "--quiet", action="store_true", help="no per-run progress lines on stderr")
    add_common(p)
    p.set_defaults(func=main)
    return p


def _chat_spec(spec, reasoning: str | None):
    """The spec with the prompt rendered as `kazeia run -cnv -st` renders its first turn (token ids)."""
    from kazeia.engine.chat import chat_prompt_ids
    from kazeia.engine.session import load_model, tokenizer

    if not spec.prompt:
        raise KazeiaError("-cnv needs -p PROMPT (a chat turn)")
    tok = tokenizer(load_model(spec.model_path))
    thinking = None if reasoning is None else reasoning == "on"
    return spec.with_(tokens=chat_prompt_ids(tok, spec.prompt, thinking, n_ctx=spec.ctx or None))


def main(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    spec = spec_from_args(args)
    if spec.n_prompt is None and not spec.prompt:
        raise KazeiaError("nothing to run: give -p PROMPT or --n-prompt N")
    if args.conversation:
        spec = _chat_spec(spec, args.reasoning)
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    # (a bad build the spec leaves unpinned: each run another clean build, numbered; the timing stays free)
    specs = build_seeded(spec, args.runs)
    rep = check_determinism(spec, args.runs, isolate=args.isolate, timeout=args.timeout, log=log, specs=specs)
    if specs[0] is not spec:
        rep.message += ("\n  (each run models another clean build of this code: KAZEIA_HTP_BUILD_SEED "
                        f"{specs[0].env['KAZEIA_HTP_BUILD_SEED']} .. {specs[-1].env['KAZEIA_HTP_BUILD_SEED']})")
    print(json.dumps(rep.to_dict(), indent=1) if args.json else rep.message)
    return 0 if rep.deterministic else 1
