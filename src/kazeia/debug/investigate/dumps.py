"""Dump an op and replay it: alone on a fresh device, with its batch context, and on the robust profile."""

from __future__ import annotations

from kazeia.debug.investigate.common import dump_op, op_regex
from kazeia.debug.investigate.table import Context, StepDef


def dump_faulting(cx: Context) -> tuple[str, str]:
    """The faulting op at completion (what it consumed) and, for contrast, at enqueue time."""
    from kazeia.debug.dump import compare_captures, find_pair

    f = cx.findings
    d, dumps = dump_op(cx, f.faulting, "both")
    f.dump_dir = d
    f.dump = next((x for x in dumps if x.capture == "complete"), None)
    enqueue = find_pair(dumps, f.dump) if f.dump is not None else None
    summary = f"dumped {f.faulting} to {d}"
    if f.dump is not None and enqueue is not None:
        f.capture_diff = compare_captures(enqueue, f.dump)
        summary += "; enqueue-time capture vs the consumed inputs: " + " ".join(f.capture_diff.describe()[1:])
    return summary, cx.spec.command() + f" --dump '{op_regex(f.faulting)}' {d} --dump-at both"


def replay_dump(cx: Context) -> tuple[str, str]:
    from kazeia.debug.replay import replay

    f = cx.findings
    f.replay = replay(f.dump, with_context=True)
    f.replay_robust = replay(f.dump, htp_profile="robust")
    return (f"same profile: {f.replay.verdict()} -> {f.replay.diagnosis()}; robust profile: "
            f"{f.replay_robust.verdict()}"), f"kazeia replay {f.dump_dir} --with-context"


def dump_first_bad(cx: Context) -> tuple[str, str]:
    """The first op out of tolerance, dumped at completion and replayed with its batch context."""
    from kazeia.debug.replay import replay

    f = cx.findings
    d, dumps = dump_op(cx, f.first_bad, "complete")
    if not dumps:
        return f"{f.first_bad} was not captured", ""
    f.dump_dir, f.dump = d, dumps[0]
    f.replay = replay(f.dump, with_context=cx.settings is not None)
    return f"{f.replay.verdict()} -> {f.replay.diagnosis()}", f"kazeia replay {d}" + \
        (" --with-context" if cx.settings is not None else "")


DUMP_FAULTING = StepDef("dump the faulting op (completion vs enqueue time)", dump_faulting, needs=("faulting",),
                        gives=("dump_dir", "dump", "capture_diff"))
REPLAY = StepDef("replay alone and with batch context", replay_dump, needs=("dump",),
                 gives=("replay", "replay_robust"))
DUMP_FIRST_BAD = StepDef("dump and replay the first bad op", dump_first_bad, needs=("first_bad",),
                         gives=("dump_dir", "dump", "replay"))
