"""Is the run deterministic? The same configuration run again, op outputs and logits compared bit for bit."""

from __future__ import annotations

from kazeia.debug.investigate.table import Context, StepDef


def determinism_step(n_runs: int) -> StepDef:
    def step(cx: Context) -> tuple[str, str]:
        from kazeia.debug.determinism import check_determinism, timing_seeded

        specs = timing_seeded(cx.spec, n_runs)
        rep = cx.findings.determinism = check_determinism(cx.spec, n_runs=n_runs, specs=specs)
        if not rep.deterministic and rep.first_diff is not None:
            cx.fact("first op whose output differs between runs", rep.first_diff.name)
        if len(rep.first_tokens) > 1:
            cx.fact("first token between runs", "; ".join(f"{t}: {len(ix)}" for t, ix in rep.first_tokens.items()))
        if rep.mechanism:
            cx.fact("the runs' differences follow", "their builds' HMX queue layout (hmx-queue-narrowing)")
        seeds = [s.env.get("KAZEIA_HTP_RACE_SEED") for s in specs]
        how = f" (HTP timing seeds {', '.join(seeds)})" if all(seeds) and len(set(seeds)) > 1 else ""
        return rep.message + how, cx.spec.command()

    return StepDef(f"determinism ({n_runs} runs)", step, gives=("determinism",))
