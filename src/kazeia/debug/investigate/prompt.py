"""Does the device's output follow the prompt? GenieX #1429's reporter saw an NPU output that "does not depend on the
input prompt at all", with no crash and no error: a symptom apart from non-finite numbers (#26123's inf). The run
again with another prompt of the same length (its token ids reversed, or shifted where reversing changes nothing),
on the device and on the CPU: when the CPU's logits change and the device's do not, the device's output is
prompt-independent. Judged from this run's logits only."""

from __future__ import annotations

import numpy as np

from kazeia.debug.investigate.table import Context, StepDef
from kazeia.debug.runner import run
from kazeia.engine.session import load_model, prompt_ids, reference_spec

# the device's logits change this many times less than the CPU's between the two prompts: prompt-independent
IGNORES_PROMPT = 1e-3


def other_prompt(ids: list[int], n_vocab: int) -> list[int]:
    """Token ids of another prompt of the same length: reversed, or each shifted by one where reversing gives the
    same ids (a palindrome, one token)."""
    rev = ids[::-1]
    return rev if rev != ids else [(t + 1) % n_vocab for t in ids]


def relative_change(a: np.ndarray, b: np.ndarray) -> float:
    """|a - b|^2 / max(|a|^2, |b|^2) of the last rows (0 when both are zero)."""
    a, b = np.asarray(a, np.float64)[-1], np.asarray(b, np.float64)[-1]
    scale = max(float(np.sum(a * a)), float(np.sum(b * b)))
    return float(np.sum((a - b) ** 2)) / scale if scale > 0 else 0.0


def prompt_step(cx: Context) -> tuple[str, str]:
    f = cx.findings
    first, ref = f.first.logits if f.first is not None else None, f.reference_logits
    if first is None or ref is None or not np.isfinite(first[-1:]).all():
        return "skipped: the run has no finite logits to compare across prompts", ""
    model = load_model(cx.spec.model_path)
    other = other_prompt(prompt_ids(cx.spec, model), model.args.n_vocab)
    spec = cx.spec.with_(tokens=other, prompt=None, n_prompt=None)
    r = run(spec)
    cpu = run(reference_spec(spec, device="CPU", htp_profile=None, faults=[], env={}, gates=[]))
    if r.logits is None or cpu.logits is None:
        return "skipped: a run with the other prompt gave no logits", spec.command()
    dev, host = relative_change(r.logits, first), relative_change(cpu.logits, ref)
    ignores = host > 0 and dev <= host * IGNORES_PROMPT
    f.prompt_dependence = (ignores, dev, host)
    return (f"another prompt of {len(other)} tokens changes the CPU's logits by {host:.3g} (relative) and "
            f"{cx.spec.device}'s by {dev:.3g}: the device's output "
            f"{'does NOT depend on the prompt' if ignores else 'follows the prompt'}", spec.command())


PROMPT = StepDef("does the output follow the prompt", prompt_step, needs=("first", "reference_logits"),
                 gives=("prompt_dependence",))
