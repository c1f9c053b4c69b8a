"""kazeia htp: the emulated Hexagon NPU backend. `htp plan` shows how one MUL_MAT uses VTCM.

Every number printed here is what `kazeia.backends.htp.plan.plan_for_node` returns for a contiguous MUL_MAT of
that shape, i.e. what the HTP backend executes for the same shape, VTCM size, profile and HTP switches.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable

from kazeia.backends.htp import (
    DEFAULT_HVX_THREADS,
    DEFAULT_VTCM,
    MAX_HVX_THREADS,
    PROFILES,
    MatmulPlan,
    matmul_node,
    plan_for_node,
)
from kazeia.backends.htp.forensics import bank_crossings
from kazeia.cli import validate
from kazeia.cli.common import add_common
from kazeia.debug.plan_view import plan_svg, plan_text
from kazeia.errors import KazeiaError
from kazeia.outputs import write_text

K_PLAN_TYPES = ("q4_k", "q5_k", "q6_k")  # October's only
PLAN_TYPES = ("q4_0", "q4_1", "q8_0", "iq4_nl", "mxfp4", *K_PLAN_TYPES, "f16")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("htp", help="the emulated Hexagon NPU backend (VTCM plans, ...)")
    hsub = p.add_subparsers(dest="htp_command", metavar="SUBCOMMAND")
    for add in SUBCOMMANDS.values():
        add(hsub)
    add_common(p)
    p.set_defaults(func=main, htp_parser=p)
    return p


def main(args: argparse.Namespace) -> int:
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "htp_func", None)
    if func is None:
        args.htp_parser.print_help()
        return 2
    return func(args)


# --------------------------------------------------------------------------------------------------------------
# htp plan


def add_plan_parser(hsub) -> argparse.ArgumentParser:
    p = hsub.add_parser("plan", help="VTCM plan of one MUL_MAT (path, chunking, areas, overflow)",
                        description="Path (HMX/HVX), chunking and VTCM areas of one MUL_MAT as the emulated "
                                    "ggml-hexagon backend runs it. M = activation rows (tokens), K = inner "
                                    "dimension, N = weight rows (output features).")
    p.add_argument("--m", type=validate.positive(), required=True, help="activation rows (tokens in the ubatch)")
    p.add_argument("--k", type=validate.positive(), required=True, help="inner dimension (weight row length)")
    p.add_argument("--n", type=validate.positive(), required=True, help="weight rows (output features)")
    p.add_argument("--type", dest="qtype", choices=PLAN_TYPES, default="q4_0", help="weight type (default q4_0)")
    p.add_argument("--vtcm", type=validate.vtcm_bytes, default=None, metavar="BYTES",
                   help=f"VTCM size (default {DEFAULT_VTCM}; env KAZEIA_HTP_VTCM)")
    p.add_argument("--htp-profile", choices=list(PROFILES), default=None,
                   help="2026-10 (default), robust or 2026-05 (env KAZEIA_HTP_PROFILE)")
    p.add_argument("--threads", type=validate.integer(1, MAX_HVX_THREADS), default=None, metavar="N",
                   help=f"HVX threads (default GGML_HEXAGON_NHVX or {DEFAULT_HVX_THREADS}, at most "
                        f"{MAX_HVX_THREADS})")
    p.add_argument("--no-hmx", action="store_true",
                   help="HMX disabled (as GGML_HEXAGON_USE_HMX=0, or GGML_HEXAGON_NHMX=0 under 2026-10)")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--svg", type=validate.output_file, metavar="FILE", help="also write an SVG drawing of the VTCM map")
    add_common(p)
    p.set_defaults(htp_func=plan_main)
    return p


def plan_from_args(args: argparse.Namespace) -> MatmulPlan:
    """The plan for the flags, with the defaults the HTP backend itself resolves from the environment
    (KAZEIA_HTP_VTCM, KAZEIA_HTP_PROFILE, GGML_HEXAGON_NHVX, GGML_HEXAGON_USE_HMX, GGML_HEXAGON_ARCH)."""
    from kazeia.backends.htp import HtpSettings

    for name in ("m", "k", "n"):
        if getattr(args, name) <= 0:
            raise KazeiaError(f"--{name} must be positive")
    if args.vtcm is not None and args.vtcm <= 0:
        raise KazeiaError("--vtcm must be positive")
    s = HtpSettings.from_env(profile=args.htp_profile, vtcm_bytes=args.vtcm)
    threads = args.threads if args.threads is not None else s.nhvx
    if not 1 <= threads <= MAX_HVX_THREADS:
        raise KazeiaError(f"--threads must be 1..{MAX_HVX_THREADS}")
    if args.qtype in K_PLAN_TYPES and not s.caps.host_solves_plans:
        raise KazeiaError(f"--type {args.qtype}: {s.profile}'s ggml-hexagon takes no K-quant weights (its supports_op "
                          "leaves such a MUL_MAT to the CPU); October's plans them: --htp-profile 2026-10")
    if args.no_hmx:  # (2026-05: GGML_HEXAGON_USE_HMX=0; 2026-10: GGML_HEXAGON_NHMX=0)
        s = dataclasses.replace(s, use_hmx=False, nhmx=0)
    s = dataclasses.replace(s, nhvx=threads)
    return plan_for_node(matmul_node(args.m, args.k, args.n, args.qtype), s)


def plan_main(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    crossings = bank_crossings(plan) if plan.fits else []  # a failing HMX plan never issues its loads
    if args.svg:
        write_text(args.svg, plan_svg(plan))
    if args.json:
        d = plan.to_dict()
        d["bank_crossings"] = [c.to_dict() for c in crossings]
        print(json.dumps(d))
    else:
        print(plan_text(plan, crossings))
    return 0


SUBCOMMANDS: dict[str, Callable] = {"plan": add_plan_parser}  # the lead adds "faults" here


# --------------------------------------------------------------------------------------------------------------
# htp faults


def add_faults_parser(hsub) -> argparse.ArgumentParser:
    p = hsub.add_parser("faults", help="list the version profiles, the arch profiles and the optional fault injections")
    p.set_defaults(htp_func=run_faults)
    return p


def run_faults(args: argparse.Namespace) -> int:
    from kazeia.backends.htp import FAULTS, PROFILES

    print("profiles (--htp-profile, env KAZEIA_HTP_PROFILE):")
    for p in PROFILES.values():
        print(f"  {p.name:10s} {p.description}")
    from kazeia.backends.htp import describe_archs

    print("\narchs (--htp-arch vNN, env GGML_HEXAGON_ARCH; default v79), per code generation (robust is 2026-05's):")
    for line in describe_archs():
        print(line)
    print("\nfault injections (--fault NAME, repeatable; env KAZEIA_HTP_FAULTS=a,b), all off by default:")
    for f in FAULTS.values():
        where = [f"in {f.only_in} code" if f.only_in else "both code generations",
                 "archs " + ", ".join(f"v{a}" for a in f.archs) if f.archs else "every arch"]
        if f.path:
            where.append(f"{'quantized ' if f.quantized_only else ''}{f.path.upper()} MUL_MATs")
        if f.scope:
            where = [f.scope]
        if f.report:
            where.append(f"stands for {f.report}")
        print(f"  {f.name:20s} {f.description}\n  {'':20s} [{'; '.join(where)}]")
    return 0


SUBCOMMANDS["faults"] = add_faults_parser
