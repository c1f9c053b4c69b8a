"""kazeia crashlog: read a cDSP crash record pasted from a device's logcat and place its Bad VA on the VTCM plans
the HTP makes for a model and a prompt length.

    adb logcat -d -s adsprpc > crash.txt
    kazeia crashlog crash.txt -m model.gguf --n-prompt 38

The record gives the fault PC (as a symbol when the call trace names it), the Bad VA and the error code. With a
model and a prompt length, every MUL_MAT the HTP takes in the prefill graphs is planned (the arithmetic the DSP
runs, for the profile and VTCM size given) and the ones whose VTCM map holds the Bad VA are listed: area, HMX
deep-load run, boundary. VTCM's virtual address on the device is not in the record: --vtcm-base gives it
(default: the emulator's).
"""

from __future__ import annotations

import argparse

from kazeia.cli import validate as V
from kazeia.cli.common import add_common
from kazeia.errors import KazeiaError
from kazeia.limits import TextLimits, numbered_lines, read_text

MAX_LOG_BYTES = 16 << 20
ERROR_MEANINGS = {0x2601: "precise bus error (or stack overflow)", 0x2001: "precise exception", 0x0: "abort"}


def _hex(s: str) -> int:
    try:
        v = int(s, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a hexadecimal address: {s!r}") from None
    if not 0 <= v < 1 << 32:
        raise argparse.ArgumentTypeError(f"{s!r} is not a 32-bit DSP address")
    return v


EPILOG = """\
exit status: 0 a record read (and placed, with -m); 2 no crash record in the file, or a bad input or flag.
run time: about a second (the plans are arithmetic, no model run).
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("crashlog", help="read a pasted cDSP crash record; place its Bad VA on the VTCM plans",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", type=V.regular_file, metavar="FILE",
                   help="logcat text holding a 'Process on cDSP CRASHED' record")
    p.add_argument("-m", "--model", type=V.regular_file, default=None, help="GGUF file of the model that was running")
    p.add_argument("--n-prompt", type=V.positive(), default=None, metavar="N", help="prompt length in tokens")
    p.add_argument("-ub", "--ubatch-size", type=V.positive(), default=512, help="micro-batch size (default 512)")
    p.add_argument("--htp-profile", type=V.htp_profile, default=None,
                   help="HTP profile whose plans to use (default 2026-10)")
    p.add_argument("--vtcm", type=V.vtcm_bytes, default=None, metavar="BYTES", help="VTCM size (default 8388608)")
    p.add_argument("--vtcm-base", type=_hex, default=None, metavar="HEX",
                   help="virtual address VTCM is mapped at on the device (default: the emulator's)")
    add_common(p)
    p.set_defaults(func=main)
    return p


def read_log(path: str, limit: int = MAX_LOG_BYTES, what: str = "device log") -> str:
    """A pasted log as text (undecodable bytes replaced): a regular file of at most `limit` bytes."""
    limits = TextLimits(what, max_bytes=limit)
    text = read_text(path, limits)
    for _ in numbered_lines(text, path, limits):  # line count and length, before any pattern sees a line
        pass
    return text


def plans_for(model: str, n_prompt: int, ubatch: int, settings) -> list:
    """(node name, plan) of every MUL_MAT the HTP takes in the prefill graphs of `n_prompt` tokens."""
    from kazeia.backends.htp import plan_for_node, supports_op
    from kazeia.gguf.reader import load_gguf
    from kazeia.models.base import model_args
    from kazeia.models.shapes import prefill_graphs

    f = load_gguf(model)
    args = model_args(f)
    if n_prompt > args.n_ctx_train:  # the graphs of a prompt the model cannot hold: refused before building them
        raise KazeiaError(f"--n-prompt {n_prompt} is more than {model}'s training context ({args.n_ctx_train} tokens)")
    wtype = next((t.type for n, t in f.tensors.items() if n.endswith("attn_q.weight")), None)
    out = []
    for g in prefill_graphs(args, n_prompt, wtype, ubatch) if wtype is not None else prefill_graphs(args, n_prompt,
                                                                                                     n_ubatch=ubatch):
        out += [(n.name, plan_for_node(n, settings)) for n in g.nodes
                if n.op == "MUL_MAT" and supports_op(n, settings)]
    return out


def main(args: argparse.Namespace) -> int:
    from kazeia.backends.htp import HtpSettings
    from kazeia.backends.htp.forensics import VTCM_VA, parse_crash
    from kazeia.debug.crashmap import crash_map

    crash = parse_crash(read_log(args.file))
    if crash is None:
        raise KazeiaError(f"{args.file}: no cDSP crash record (no 'Fault PC' / 'Bad VA' lines)")
    print(f"process: {crash.process or '?'} (thread {crash.thread or '?'}) {crash.reason or ''}".rstrip())
    print(f"fault PC: {crash.fault_location()}" + (f" = 0x{crash.fault_pc:08X}" if crash.fault_pc is not None else ""))
    if crash.bad_va is not None:
        print(f"Bad VA: 0x{crash.bad_va:08X}")
    if crash.error_code is not None:
        print(f"error code: 0x{crash.error_code:X} ({ERROR_MEANINGS.get(crash.error_code, 'see the SSR cause field')})")
    if not args.model or not args.n_prompt:
        print("(give -m MODEL --n-prompt N to place the Bad VA on the VTCM plans)")
        return 0
    if crash.bad_va is None:
        raise KazeiaError(f"{args.file}: the crash record has no Bad VA line, so there is no address to place on "
                          f"the VTCM plans")
    settings = HtpSettings.from_env(profile=args.htp_profile, vtcm_bytes=args.vtcm)
    base = args.vtcm_base if args.vtcm_base is not None else VTCM_VA
    hits = crash_map(crash, plans_for(args.model, args.n_prompt, args.ubatch_size, settings), base)
    if not hits:
        print(f"no MUL_MAT plan of this model at {args.n_prompt} tokens (profile {settings.profile}, VTCM "
              f"{settings.vtcm_bytes} B) holds VTCM offset 0x{crash.bad_va - base:06x}")
        return 1
    if hits[0][0] == "":
        print(hits[0][1].lines()[0])
        return 1
    with_load = [h for h in hits if h[1].loads]
    shown = with_load or hits
    print(f"{len(shown)} MUL_MAT(s) at {args.n_prompt} tokens (profile {settings.profile}) hold it"
          + (" in an HMX deep-load run" if with_load else ""))
    groups: dict[str, list[str]] = {}
    for name, pl in shown:
        groups.setdefault("; ".join(pl.lines()), []).append(name)
    for text, names in groups.items():
        print(f"  {', '.join(names)}: {text}")
    return 1
