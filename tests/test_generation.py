"""Generation: the default model's answer, determinism, context overflow, and the sampler.

- SmolLM2-135M-Instruct (the embedded default model), greedy, "The capital of France is": the
  continuation contains "Paris".
- Determinism: two runs with the same seed give identical tokens and bitwise-identical logits at every
  step, on `cpu` and on `ref`, in fresh contexts and in a reset, reused one.
- A prompt longer than the context raises ContextOverflowError (CLI: exit 2, one line); generation stops
  cleanly when the context is full.
- Sampler: greedy is argmax; every sample lies in the top-k set and in the top-p nucleus computed here;
  the empirical distribution matches softmax(logits / temp) (seeded, so the check is deterministic).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kazeia.backends.cpu import CpuBackend
from kazeia.backends.ref import RefBackend
from kazeia.engine.context import Context
from kazeia.engine.generate import Sampler, SamplingParams, generate
from kazeia.engine.scheduler import Scheduler
from kazeia.engine.tokenizer import GGUFTokenizer
from kazeia.errors import ContextOverflowError
from oracle_utils import shared_model


def make_ctx(path: str, backend: str = "cpu", n_ctx: int = 256, **kw) -> Context:
    be = CpuBackend() if backend == "cpu" else RefBackend()
    return Context(shared_model(path), Scheduler([be]), n_ctx=n_ctx, **kw)


def recording(ctx: Context) -> list[np.ndarray]:
    """Wrap ctx.decode so every logits array it returns is kept."""
    rec: list[np.ndarray] = []
    orig = ctx.decode

    def decode(tokens, all_logits=False):
        out = orig(tokens, all_logits)
        rec.append(np.array(out, copy=True))
        return out

    ctx.decode = decode  # type: ignore[method-assign]
    return rec


@pytest.mark.slow
def test_default_model_knows_the_capital_of_france(default_model):
    ctx = make_ctx(default_model)
    tok = GGUFTokenizer.from_gguf(ctx.model.file)
    prompt = tok.encode("The capital of France is")
    res = generate(ctx, prompt, 8, Sampler(SamplingParams(temp=0.0)), tok.is_eog)
    text = tok.decode(res.tokens)
    assert "Paris" in text, text


# ---------------------------------------------------------------------------------------------------
# determinism


def _run(path: str, backend: str, seed: int, n: int = 10, ctx: Context | None = None):
    ctx = ctx or make_ctx(path, backend, n_ctx=64)
    rec = recording(ctx)
    prompt = [11, 200, 37, 512, 90, 3]
    res = generate(ctx, prompt, n, Sampler(SamplingParams(temp=0.9, top_k=40, top_p=0.95, seed=seed)),
                   lambda t: False)
    ctx.decode = type(ctx).decode.__get__(ctx)  # type: ignore[method-assign]
    return res.tokens, rec


def _bitwise_equal(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x.view(np.uint32), y.view(np.uint32))
                                    for x, y in zip(a, b))


@pytest.mark.parametrize("backend", ["cpu", "ref"])
def test_same_seed_same_tokens_and_bitwise_logits(tiny_qwen3, backend):
    t1, l1 = _run(tiny_qwen3, backend, seed=1234)
    t2, l2 = _run(tiny_qwen3, backend, seed=1234)
    assert t1 == t2
    assert len(l1) == 10 and _bitwise_equal(l1, l2)


@pytest.mark.parametrize("backend", ["cpu", "ref"])
def test_reset_context_reproduces_bitwise(tiny_llama, backend):
    """A reused context (graph cache, compute buffer and KV cache all warm) gives the same bits after reset."""
    ctx = make_ctx(tiny_llama, backend, n_ctx=64)
    t1, l1 = _run(tiny_llama, backend, seed=7, ctx=ctx)
    ctx.reset()
    t2, l2 = _run(tiny_llama, backend, seed=7, ctx=ctx)
    assert t1 == t2 and _bitwise_equal(l1, l2)


@pytest.mark.slow
def test_default_model_sampling_is_deterministic(default_model):
    t1, l1 = _run(default_model, "cpu", seed=99, n=6)
    t2, l2 = _run(default_model, "cpu", seed=99, n=6)
    assert t1 == t2 and _bitwise_equal(l1, l2)


@pytest.mark.slow
def test_different_seeds_give_different_samples(default_model):
    ctx = make_ctx(default_model, n_ctx=64)
    prompt = [1, 504, 3458, 282, 4649, 314]
    outs = []
    for seed in (1, 2):
        ctx.reset()
        res = generate(ctx, prompt, 12, Sampler(SamplingParams(temp=1.5, top_k=0, top_p=1.0, seed=seed)),
                       lambda t: False)
        outs.append(res.tokens)
    assert outs[0] != outs[1]


# ---------------------------------------------------------------------------------------------------
# context overflow


def test_prompt_longer_than_context(tiny_qwen3):
    ctx = make_ctx(tiny_qwen3, n_ctx=8)
    with pytest.raises(ContextOverflowError):
        ctx.decode(list(range(1, 10)))
    assert ctx.n_past == 0
    ctx.decode(list(range(1, 6)))
    with pytest.raises(ContextOverflowError):
        ctx.decode([1, 2, 3, 4])
    ctx.decode([1, 2, 3])  # exactly full is fine
    assert ctx.n_past == 8


def test_generation_stops_when_the_context_is_full(tiny_qwen3):
    ctx = make_ctx(tiny_qwen3, n_ctx=16)
    res = generate(ctx, list(range(100, 110)), -1, Sampler(SamplingParams(temp=0.0)), lambda t: False)
    assert res.stop == "context"
    assert ctx.n_past == 16 and len(res.tokens) == 16 - 10 + 1


def test_cli_prompt_longer_than_context(tiny_qwen3):
    # -c 8 is 256 cells, as llama_context pads n_ctx: a prompt of more than 256 tokens overflows it
    r = subprocess.run([sys.executable, "-m", "kazeia", "run", "-m", tiny_qwen3, "-c", "8", "-n", "2", "--temp", "0",
                        "-p", "this prompt is certainly longer than the context " * 60],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "context" in lines[0] and "Traceback" not in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------------
# sampler

LOGITS = np.array([2.0, 1.5, 1.0, 0.0, -1.0, 0.5, 1.9, -3.0])


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _draw(params: SamplingParams, n: int, logits=LOGITS) -> np.ndarray:
    s = Sampler(params)
    return np.array([s.sample(logits) for _ in range(n)])


def test_greedy_is_argmax():
    rng = np.random.default_rng(0)
    for _ in range(20):
        lg = rng.standard_normal(50).astype(np.float32)
        assert Sampler(SamplingParams(temp=0.0)).sample(lg) == int(np.argmax(lg))
        assert Sampler(SamplingParams(temp=5.0, top_k=1, seed=3)).sample(lg) == int(np.argmax(lg))


@pytest.mark.parametrize("top_k", [0, 3, 5])
@pytest.mark.parametrize("temp", [0.5, 1.0, 2.0])
def test_distribution_matches_softmax(top_k, temp):
    """top-p off: frequencies follow softmax(logits / temp) over the top-k set (within 5 sigma)."""
    n = 4000
    draws = _draw(SamplingParams(temp=temp, top_k=top_k, top_p=1.0, seed=42), n)
    keep = np.argsort(-LOGITS, kind="stable")[:top_k] if top_k else np.arange(LOGITS.size)
    p = np.zeros(LOGITS.size)
    p[keep] = _softmax(LOGITS[keep] / temp)
    counts = np.bincount(draws, minlength=LOGITS.size)
    assert set(np.flatnonzero(counts)) <= set(keep.tolist())
    sigma = np.sqrt(n * p * (1 - p)) + 1
    assert np.all(np.abs(counts - n * p) <= 5 * sigma), (counts, n * p)


def _nucleus(probs: np.ndarray, top_p: float) -> set[int]:
    """llama.cpp's top-p: the smallest prefix (by descending probability) whose mass reaches top_p."""
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order])
    k = int(np.searchsorted(cum, top_p)) + 1
    return set(order[:k].tolist())


def test_top_p_only_samples_the_nucleus():
    draws = _draw(SamplingParams(temp=1.0, top_k=0, top_p=0.8, seed=5), 3000)
    nucleus = _nucleus(_softmax(LOGITS), 0.8)
    assert set(draws.tolist()) == nucleus


def test_top_p_nucleus_does_not_depend_on_temperature():
    """llama.cpp's chain is top_k -> top_p -> temperature -> dist: the nucleus is chosen at temperature 1."""
    logits = np.array([2.0, 1.5, 1.0, 0.0])
    nucleus = _nucleus(_softmax(logits), 0.8)  # {0, 1, 2}
    draws = _draw(SamplingParams(temp=0.5, top_k=0, top_p=0.8, seed=11), 3000, logits)
    assert set(draws.tolist()) == nucleus
