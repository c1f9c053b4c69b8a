"""kazeia compare: per-op error of a device against the float64 REF oracle, cumulative and isolated.

Exit status 0 when no op is out of tolerance, 1 when one is (its name is printed), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys

from kazeia.cli import validate as V
from kazeia.cli.common import add_common, add_device_args, add_model_args, set_threads, tool_spec
from kazeia.debug.compare import MODES, compare, format_table, summary_lines
from kazeia.debug.compare.report import drift_source
from kazeia.debug.judge import WHOLE_MODEL_NMSE
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError
from kazeia.outputs import write_text

# logits NMSE from which compare says where the error comes from (a near-tie of greedy decoding flips at ~1e-4)
VISIBLE_NMSE = 1e-4

EPILOG = """\
cumulative: the device runs the whole prefill feeding itself; every op is compared with REF at completion
  (errors accumulate: only ops whose inputs were still bit-identical to REF's are judged, and the logits
  against the whole-model threshold 2e-3).
isolated: every op is fed REF's inputs, run alone (one op per HTP batch) and judged by its test-backend-ops
  NMSE threshold: MUL_MAT/FLASH_ATTN_EXT 5e-4, SOFT_MAX 1e-6, same-type copies 0, others 1e-7. A weight
  MUL_MAT may also carry the NMSE ggml's own CPU path commits converting its activations (int8 blocks),
  which test-backend-ops never counted; --strict removes that allowance.

examples:
  kazeia compare -m q4b1.gguf --n-prompt 40 -dev HTP0
  kazeia compare --n-prompt 40 -dev HTP0 --fault hmx-bias-stale --mode isolated --plot err.png
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("compare", help="per-op NMSE of a device against the float64 REF (first op out of tolerance)",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_device_args(p)
    g = p.add_argument_group("compare")
    g.add_argument("--mode", choices=[*MODES, "both"], default="both", help="comparison mode (default both)")
    g.add_argument("--json", type=V.output_file, metavar="FILE", help="write the full report as JSON")
    g.add_argument("--plot", type=V.output_file, metavar="FILE.png",
                   help="plot log NMSE along the graph (needs matplotlib)")
    g.add_argument("--strict", action="store_true",
                   help="no allowance for ggml's own activation conversion in MUL_MAT thresholds")
    g.add_argument("--problems-only", action="store_true", help="print only the rows that are not OK")
    g.add_argument("--against", type=V.regular_file, metavar="LOG", default=None,
                   help="judge a device's llama-eval-callback log instead of running a device: the first tensor "
                        "departing from the float64 reference beyond the device's numerics, with its signature")
    g.add_argument("--tolerance", type=V.real(0.0, 1e6, lo_open=True), default=2e-2, metavar="REL",
                   help="with --against: the device numerics allowed, relative to each tensor's rms (default 0.02)")
    add_common(p)
    p.set_defaults(func=main)
    return p


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    """The RunSpec of the model/device flags, as `kazeia run` maps them."""
    if args.n_prompt is None and not args.prompt:
        raise KazeiaError("nothing to compare: give -p PROMPT or --n-prompt N")
    return tool_spec(args, "compare")


def main(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    if args.against:
        from kazeia.cli.compare_against import main as against

        return against(args)
    spec = spec_from_args(args)
    if args.prompt is not None and args.n_prompt is None:
        from kazeia.engine.session import load_model, prompt_ids

        if not prompt_ids(spec, load_model(spec.model_path)):
            raise KazeiaError("the prompt encodes to no tokens")
    from kazeia.engine.progress import ticking

    with ticking("compare", lambda: f"comparing {spec.device} with the float64 reference"):
        report = compare(spec, args.mode, strict=args.strict)
    out = sys.stdout
    for mode in report.modes:
        out.write(format_table(report, mode, only_problems=args.problems_only) + "\n\n")
    out.write("\n".join(summary_lines(report)) + "\n")
    first = report.first_failure
    if first is not None:
        out.write(f"first op out of tolerance: {first.label()}: {first.reason}\n")
    elif report.drift:
        m = report.drift[0]
        out.write(f"no op out of tolerance on its own inputs, but the logits are wrong numbers ({m}: NMSE "
                  f"{report.logits_nmse[m]:.3g} > {WHOLE_MODEL_NMSE:g}): an accumulated drift, not a fault at one op\n")
        src = drift_source(report)
        out.write((src or "--mode both shows which ops' own numerics it comes from") + "\n")
    else:
        out.write("no op out of tolerance\n")
        lg = report.logits_nmse.get("cumulative")
        src = drift_source(report) if lg is not None and lg >= VISIBLE_NMSE else None
        if src:  # within the bound, yet large enough that a greedy near-tie can pick another token than the CPU's
            out.write(f"the logits' NMSE {lg:.3g} is within the bound; it comes from {src}\n")
    if args.json:
        write_text(args.json, json.dumps(report.to_dict(), indent=1, allow_nan=False))
    if args.plot:
        from kazeia.debug.plots import plot_errors

        plot_errors(report, args.plot)
    return report.exit_status
