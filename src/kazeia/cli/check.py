"""kazeia check: will this GGUF crash on my phone, with this llama.cpp? From the header alone (a file cut after
its header is enough), every MUL_MAT weight under each ggml-hexagon version x Hexagon arch (x VTCM, -ub): the path
per range of M (HMX, HVX, CPU), the VTCM bytes, the outcome (runs, refused, unsupported, overflow then re-entry
then death, garbage, a field report's risk, no session), the VMEM budget, the modeled speed and the safest fast
settings. Exit status 0 whatever the verdicts (the verdicts are the output)."""

from __future__ import annotations

import argparse
import json

from kazeia.cli import validate as V
from kazeia.cli.common import add_common
from kazeia.engine.context import MAX_SEQ
from kazeia.errors import KazeiaError

MAX_CONFIGS = 512  # profiles x archs x VTCM sizes x ubatches: each is a plan table of every class over M


def _list(parse, what: str):
    def run(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items or len(items) > 64:
            raise argparse.ArgumentTypeError(f"{what}: 1 to 64 comma-separated values")
        return [parse(t) for t in items]
    return run


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("check", help="a GGUF header against every ggml-hexagon version and Hexagon arch",
                       description=__doc__)
    p.add_argument("-m", "--model", required=True, metavar="FILE.gguf", help="the GGUF file (only its header is read)")
    p.add_argument("--htp-profile", type=_list(V.htp_profile, "--htp-profile"), default=None,
                   help="versions, comma-separated (default: 2026-05,robust,2026-10)")
    p.add_argument("--htp-arch", type=_list(V.htp_arch, "--htp-arch"), default=None,
                   help="archs, comma-separated (default: v68,v69,v73,v75,v79,v81)")
    p.add_argument("--vtcm", type=_list(V.vtcm_bytes, "--vtcm"), default=None, metavar="BYTES[,BYTES]",
                   help="VTCM sizes (default: each arch's own, 8 MiB assumed)")
    p.add_argument("-ub", "--ubatch-size", type=_list(V.integer(1, 8192), "-ub"), default=[512], metavar="N[,N]",
                   help="ubatch sizes: M runs from 1 to each (default 512)")
    p.add_argument("-np", "--parallel", type=_list(V.integer(1, MAX_SEQ), "-np"), default=[1], metavar="N[,N]",
                   help="sequences per micro-batch (llama.cpp's -np with a hybrid's split_equal; default 1): a "
                        "recurrent layer's ssm_out then has a [K, T, N] src1")
    p.add_argument("-c", "--ctx-size", type=V.integer(1, 1 << 24), default=4096, help="context, for the KV size")
    p.add_argument("--n-prompt", type=V.integer(1, 1 << 20), default=None, metavar="N",
                   help="the modeled rates' prompt length (default: one whole -ub micro-batch); the same figures "
                        "upgrade and bench print for that scenario")
    p.add_argument("--json", action="store_true", help="print the whole report as one JSON object")
    p.add_argument("--html", type=V.output_file, default=None, metavar="FILE", help="also write the heat map here")
    add_common(p)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from kazeia.debug.check import PROFILES, check_model
    from kazeia.debug.check.report import heatmap_html, text, to_dict
    from kazeia.outputs import write_text

    archs = tuple(int(a[1:]) for a in args.htp_arch) if args.htp_arch else None
    profiles = tuple(dict.fromkeys(args.htp_profile)) if args.htp_profile else PROFILES
    vtcms = tuple(dict.fromkeys(args.vtcm)) if args.vtcm else (None,)
    ubs = tuple(dict.fromkeys(args.ubatch_size))
    seqs = tuple(dict.fromkeys(args.parallel))
    n = len(profiles) * (len(archs) if archs else 6) * len(vtcms) * len(ubs) * len(seqs)
    if n > MAX_CONFIGS:
        raise KazeiaError(f"check: {n} configurations asked for (at most {MAX_CONFIGS})")
    kw = {"archs": tuple(dict.fromkeys(archs))} if archs else {}
    report = check_model(args.model, profiles=profiles, vtcms=vtcms, ubatches=ubs, ctx=args.ctx_size, n_seqs=seqs,
                         n_prompt=args.n_prompt,
                         **kw)
    if args.html:
        write_text(args.html, heatmap_html(report))
    print(json.dumps(to_dict(report)) if args.json else text(report))
    return 0
