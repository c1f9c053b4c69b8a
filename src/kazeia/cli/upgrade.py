"""kazeia upgrade: does upgrading ggml-hexagon fix my fault, and what else changes? The scenario (the flags of
`run` / `investigate`) under `--from` and `--to` profiles, side by side; writes upgrade.md, upgrade.html and
upgrade.json. Exit status: 0 fixed (or no fault either side), 1 the fault is left, 4 the upgrade brings a new one."""

from __future__ import annotations

import argparse
import sys

from kazeia.cli import validate as V
from kazeia.cli.common import add_common, add_device_args, add_model_args, hide_option, tool_spec
from kazeia.errors import KazeiaError

EPILOG = """\
verdicts: fixed (the --from run fails, the --to run completes with correct logits), unchanged (both complete),
  left (both fail), new fault (only the --to run fails). A run fails when it dies, stops on an op status, or
  completes with logits past the whole-model bound against REF (NaN included: "wrong numbers").
exit status: 0 fixed or unchanged; 1 left; 4 new fault; 2 a bad input or flag (checked before any work).
run time: a 2-layer model a few seconds; the 36-layer seed scenario about half a minute.

example:
  kazeia upgrade -m qwen3-4b-q4_0.gguf --n-prompt 38 --from 2026-05 --to 2026-10
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("upgrade", help="the scenario under two ggml-hexagon versions: fixed, left or a new fault",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_device_args(p)
    p.add_argument("--from", dest="from_profile", type=V.htp_profile, default="2026-05",
                   help="the version the user runs now (default 2026-05)")
    p.add_argument("--to", dest="to_profile", type=V.htp_profile, default="2026-10",
                   help="the version to upgrade to (default 2026-10)")
    p.add_argument("-n", "--n-predict", type=V.integer(0), default=0,
                   help="tokens to generate after the prompt (default 0)")
    p.add_argument("-o", "--output", type=V.output_dir, default="kazeia-upgrade", help="report directory")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_common(p)
    hide_option(p, "htp_profile")  # --from and --to name the versions
    p.set_defaults(func=main, device=None)
    return p


def main(args: argparse.Namespace) -> int:
    from kazeia.debug.upgrade import render_markdown, upgrade, write

    if args.prompt is None and args.n_prompt is None:
        raise KazeiaError("upgrade needs -p PROMPT or --n-prompt N")
    if getattr(args, "htp_profile", None):
        raise KazeiaError("upgrade compares --from and --to; --htp-profile does not apply")
    if args.device not in (None, "HTP0"):
        raise KazeiaError(f"upgrade runs the scenario on HTP0 under two ggml-hexagon versions; -dev {args.device} does "
                          f"not apply (kazeia run -dev {args.device} runs it there)")
    spec = tool_spec(args, "upgrade")
    say = (lambda s: None) if args.quiet else (lambda s: print(f"kazeia upgrade: {s}", file=sys.stderr, flush=True))
    u = upgrade(spec, args.from_profile, args.to_profile, progress=say)
    write(u, args.output)
    print(render_markdown(u))
    print(f"report: {args.output}/upgrade.md and {args.output}/upgrade.html")
    return u.exit_status
