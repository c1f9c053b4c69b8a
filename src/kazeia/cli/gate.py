"""kazeia gate: validate a model's op classes on the HTP model and write the policy that routes only the failing
ones (--auto), or explain a policy (--explain)."""

from __future__ import annotations

import argparse
import os
import sys

from kazeia.backends.devices import device_name
from kazeia.cli import validate as V
from kazeia.cli.common import add_common, device_options, model_path
from kazeia.cli.routing import gate_summary, progress_bar
from kazeia.engine.policy import Policy
from kazeia.errors import KazeiaError

EPILOG = """\
--auto: per MUL_MAT class, the device's default path at the class's smallest and largest M against REF; a
  failing class gets the fastest valid alternative (hvx, cpu, split, split-op) by modeled time. The policy is
  cached by model hash and device settings.
exit status: 0 a policy written, cached or explained; 2 a bad input or flag.
run time: the 36-layer seed model cold ~20-30 s; cached, under a second.
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("gate", help="validated gate policies: --auto builds one for a model, --explain prints one",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", type=V.regular_file, help="GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("-dev", "--device", type=V.device, default="HTP0", help="the device to validate (HTP0)")
    p.add_argument("--htp-profile", type=V.htp_profile, default=None,
                   help="HTP version profile (2026-10, the default; robust; 2026-05)")
    p.add_argument("--vtcm", type=V.vtcm_bytes, default=None, metavar="BYTES", help="HTP VTCM size in bytes")
    p.add_argument("--fault", type=V.fault(), action="append", default=[], metavar="NAME",
                   help="HTP fault injection (repeatable)")
    p.add_argument("-ub", "--ubatch-size", type=V.positive(), default=512, help="validate M = 1..N (default 512)")
    p.add_argument("--auto", action="store_true", help="validate (or take from the cache) and write the policy")
    p.add_argument("--explain", type=V.optional_file, nargs="?", const="", default=None, metavar="FILE",
                   help="print why each rule exists and its modeled cost (FILE, or the cached policy of -m and "
                        "the device settings)")
    p.add_argument("-o", "--output", type=V.output_file, default=None, metavar="FILE",
                   help="--auto: also write the policy here")
    p.add_argument("--no-cache", action="store_true", help="--auto: validate again even if cached")
    p.add_argument("-j", "--jobs", type=V.integer(1, 256), default=2, help="child processes at once (default 2)")
    add_common(p)
    p.set_defaults(func=main)
    return p


def _settings(args: argparse.Namespace):
    from kazeia.backends.htp import HtpSettings

    if device_name(args.device) != "HTP0":
        raise KazeiaError(f"kazeia gate validates the HTP model (-dev HTP0), not {args.device}")
    return HtpSettings.from_options(device_options(args))


def main(args: argparse.Namespace) -> int:
    from kazeia.debug.gate.auto import auto_policy, cache_path_for, explain, source_of

    if not args.auto and args.explain is None:
        raise KazeiaError("kazeia gate: give --auto (validate and write a policy) or --explain [FILE]")
    if args.explain:
        print(explain(Policy.load(args.explain)))
        return 0
    path = model_path(args)
    if not os.path.isfile(path):
        raise KazeiaError(f"-m {path}: no such file")
    settings = _settings(args)
    if args.auto:
        res = auto_policy(path, settings, args.ubatch_size, args.jobs, progress_bar, use_cache=not args.no_cache)
        print(gate_summary(res), file=sys.stderr)
        if args.output:
            res.policy.save(args.output)
        print(res.policy.to_toml() if args.explain is None else explain(res.policy))
        return 0
    cached = cache_path_for(source_of(path, settings, args.ubatch_size))
    if not os.path.exists(cached):
        raise KazeiaError(f"no cached policy for {path} with these settings: run `kazeia gate --auto` first")
    print(explain(Policy.load(cached)))
    return 0
