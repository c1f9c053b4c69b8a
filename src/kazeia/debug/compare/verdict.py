"""Row statuses of a comparison. Each output is judged by kazeia.debug.judge (the one judge of every tool);
a comparison adds DRIFT (cumulative mode: out of tolerance after its inputs had already drifted) and DEATH."""

from __future__ import annotations

from kazeia.debug.judge import FAIL, OK, REF_INVALID, Verdict, judge

MODES = ("cumulative", "isolated")
DRIFT, DEATH = "DRIFT", "DEATH"

__all__ = ["DEATH", "DRIFT", "FAIL", "MODES", "OK", "REF_INVALID", "Verdict", "judge"]
