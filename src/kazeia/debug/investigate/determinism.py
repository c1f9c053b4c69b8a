"""Is the run deterministic? The same configuration run again, op outputs and logits compared bit for bit."""

from __future__ import annotations

from kazeia.debug.investigate.table import Context, StepDef


def determinism_step(n_runs: int) -> StepDef:
    def step(cx: Context) -> tuple[str, str]:
        from kazeia.debug.determinism import check_determinism

        rep = cx.findings.determinism = check_determinism(cx.spec, n_runs=n_runs)
        if not rep.deterministic and rep.first_diff is not None:
            cx.fact("first op whose output differs between runs", rep.first_diff.name)
        return rep.message, cx.spec.command()

    return StepDef(f"determinism ({n_runs} runs)", step, gives=("determinism",))
