"""Does the fault depend on the activation values or only on how many rows there are? Delta debugging over the
dumped matmul's src1 rows, replayed alone."""

from __future__ import annotations

import re

from kazeia.debug.investigate.table import Context, StepDef


def rows_step(cx: Context) -> tuple[str, str]:
    from kazeia.debug.bisect import ddmin_rows, dump_rows_replay

    f = cx.findings
    if f.dump.op != "MUL_MAT":
        return f"{f.dump.name} is a {f.dump.op}, not a MUL_MAT: no rows to reduce", ""
    death = f.death or f.first.death
    regex = re.escape(death["message"]) if death else None  # the failure this run showed, not any failure
    values, replay, config = dump_rows_replay(f.dump, fail_regex=regex)
    f.rows = ddmin_rows(values, replay, config=config)
    return f.rows.message, f"kazeia bisect rows {f.dump_dir}" + (f" --fail-regex '{regex}'" if regex else "")


ROWS = StepDef("rows: values or row count?", rows_step, needs=("dump",), gives=("rows",))
