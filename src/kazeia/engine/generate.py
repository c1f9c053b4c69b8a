"""Sampling and the generation loop (prefill, then one token at a time until EOS or -n)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kazeia.engine.context import Context
from kazeia.engine.nonfinite import NonFiniteTracker, check_logits
from kazeia.errors import KazeiaError


@dataclass(frozen=True)
class SamplingParams:
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    seed: int = 0
    min_p: float = 0.0  # llama-cli's default is 0.05; 0 = disabled


class Sampler:
    """Greedy when temp <= 0; else top-k, then top-p and min-p (at temperature 1), then temperature, seeded
    (llama.cpp's default sampler chain order)."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def sample(self, logits: np.ndarray) -> int:
        p = self.params
        logits = np.asarray(logits, dtype=np.float64).reshape(-1)
        if p.temp <= 0:
            return int(np.argmax(logits))
        idx = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            idx = idx[: p.top_k]
        z = logits[idx]
        if p.top_p < 1:  # the nucleus is chosen at temperature 1, as llama.cpp's sampler chain does (0: one token)
            probs = np.exp(z - z.max())
            probs /= probs.sum()
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            idx, z = idx[:keep], z[:keep]
        if p.min_p > 0:  # tokens at least min_p times as likely as the best one (z is sorted, so a prefix)
            keep = int(np.count_nonzero(z - z[0] >= np.log(p.min_p)))
            idx, z = idx[:keep], z[:keep]
        with np.errstate(over="ignore"):
            zt = z / p.temp
        if not np.isfinite(zt).all():  # a temperature so small (--temp 1e-320) that logits / temp overflow
            zt = np.where(z == z.max(), 0.0, -np.inf)
        z = zt
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        return int(idx[self.rng.choice(len(idx), p=probs)])


@dataclass
class GenerationResult:
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    prompt_seconds: float = 0.0
    gen_seconds: float = 0.0
    stop: str = "length"  # length | eos | interrupted
    last_logits: np.ndarray | None = None

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def gen_tps(self) -> float:
        # the first generated token comes from the prefill logits; decode steps produce the rest
        n = max(len(self.tokens) - 1, 0)
        return n / self.gen_seconds if self.gen_seconds > 0 and n else 0.0


def generate(ctx: Context, prompt: list[int], n_predict: int, sampler: Sampler,
             is_eog: Callable[[int], bool], on_token: Callable[[int], None] | None = None) -> GenerationResult:
    """Prefill `prompt` then sample up to n_predict tokens (llama.cpp's -n: -1 = infinity, -2 = until the context is
    filled; both end at EOS or the context's end here, there is no context shift; other negatives are refused).
    Logits that are not finite stop it with a NonFiniteLogitsError naming the first op whose output went
    non-finite (found by a NonFiniteTracker), under greedy and sampling alike."""
    if n_predict < -2:
        raise KazeiaError(f"-n {n_predict}: use N >= 0, -1 (infinity) or -2 (until the context is filled)")
    steps = _Steps(ctx)
    try:
        return _generate(ctx, prompt, n_predict, sampler, is_eog, on_token, steps)
    finally:
        steps.close()


class _Steps:
    """ctx.decode with non-finite logits turned into a NonFiniteLogitsError that names the first op whose
    output went non-finite.

    When every backend is synchronous (its results a pure function of the inputs: CPU, REF) and the model keeps
    no recurrent state, the tracker watches only a decode call whose logits came out non-finite: that call is
    run again from the same position with the tracker attached (the same inputs give the same values, and the
    KV rows it writes are the ones it wrote before). A watched decode costs a check of every op's output and,
    on the CPU, the node-by-node path: half the default model's decode speed. A device (asynchronous, its
    faults and races not a pure function of the inputs) or a recurrent state (which a call changes and a
    re-run would advance twice) is watched at every call."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.tracker = NonFiniteTracker()
        self.rerun = ctx.rs is None and ctx.recovery is None and not any(b.is_async for b in ctx.scheduler.backends)
        if not self.rerun:
            ctx.scheduler.add_hook(self.tracker)

    def decode(self, tokens: list[int], where: str) -> np.ndarray:
        p0 = self.ctx.n_past
        self.tracker.reset()
        logits = self.ctx.decode(tokens)
        if self.rerun and not np.isfinite(logits[-1]).all():
            self.ctx.rewind(p0)
            self.ctx.scheduler.add_hook(self.tracker)
            try:
                logits = self.ctx.decode(tokens)
            finally:
                self.ctx.scheduler.remove_hook(self.tracker)
        check_logits(logits[-1], where, self.tracker)
        return logits

    def close(self) -> None:
        if not self.rerun:
            self.ctx.scheduler.remove_hook(self.tracker)


def _generate(ctx: Context, prompt: list[int], n_predict: int, sampler: Sampler, is_eog: Callable[[int], bool],
              on_token: Callable[[int], None] | None, steps: _Steps) -> GenerationResult:
    res = GenerationResult(prompt_tokens=len(prompt))
    t0 = time.perf_counter()
    logits = steps.decode(prompt, f"after the prompt of {len(prompt)} tokens")
    res.prompt_seconds = time.perf_counter() - t0
    res.last_logits = logits[-1]
    t1 = time.perf_counter()
    try:
        while n_predict < 0 or len(res.tokens) < n_predict:
            tid = sampler.sample(logits[-1])
            res.tokens.append(tid)
            if is_eog(tid):
                res.stop = "eos"
                break
            if on_token:
                on_token(tid)
            if n_predict >= 0 and len(res.tokens) >= n_predict:
                break
            if ctx.n_past >= ctx.n_ctx:
                res.stop = "context"
                break
            logits = steps.decode([tid], f"at generated token {len(res.tokens) + 1}")
            res.last_logits = logits[-1]
    except KeyboardInterrupt:
        res.stop = "interrupted"
    res.gen_seconds = time.perf_counter() - t1
    return res


def synthetic_prompt(n: int, n_vocab: int, is_control: Callable[[int], bool], seed: int = 0) -> list[int]:
    """A deterministic prompt of exactly n tokens (llama-bench style random ids, no control tokens)."""
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while len(out) < n:
        for t in rng.integers(0, n_vocab, size=n - len(out)):
            if not is_control(int(t)):
                out.append(int(t))
    return out
