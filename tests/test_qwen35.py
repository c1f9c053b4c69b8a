"""The hybrid Qwen3.5 against an independent implementation: Hugging Face transformers' Qwen3_5ForCausalLM.

transformers cannot load a qwen35 GGUF, so each case builds a tiny random model in transformers and writes it with
kazeia's GGUF writer, names and layouts mapped as llama.cpp's converter maps them (tests/hf_qwen35.py). With F32
weights, on `cpu` and `ref`:
- 16 greedy tokens identical to transformers' generate, logits of every step within NMSE 1e-5;
- last-position logits within NMSE 1e-5 (flash attention on and off);
- a prompt prefilled in micro-batches and then decoded gives the logits of token-by-token decoding (the
  recurrent state is carried across micro-batches exactly), and every position matches transformers;
- shapes no other test names: layer counts, full-attention intervals (including none), K/V head ratios, head
  sizes, partial rotary fractions, tied embeddings.
A GGUF written by llama.cpp's convert_hf_to_gguf.py (tests/data, see its README) loads and matches too, and
kazeia's writer gives that file's keys and tensors bit for bit.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_5")

from gguf import GGUFReader  # noqa: E402

from hf_qwen35 import export, random_qwen35  # noqa: E402
from kazeia.backends.cpu import CpuBackend  # noqa: E402
from kazeia.backends.ref import RefBackend  # noqa: E402
from kazeia.engine.context import Context, Model  # noqa: E402
from kazeia.engine.scheduler import Scheduler  # noqa: E402
from oracle_utils import assert_nmse  # noqa: E402

pytestmark = pytest.mark.oracle

NMSE_MODEL = 1e-5
N_STEPS = 16
PROMPT = [17, 250, 3, 200, 42, 99, 128, 77, 50, 5, 6, 7, 260]
DATA = os.path.join(os.path.dirname(__file__), "data")
CONVERTED = os.path.join(DATA, "qwen35_tiny_converted.gguf")
CONVERTED_HF = os.path.join(DATA, "qwen35_tiny_hf")

# name -> random_qwen35 arguments; "base" has fewer K than V heads (the converter's V-head reorder) and GQA
CASES = {
    "base": dict(seed=1),
    "5layers_interval2_vk4": dict(seed=2, n_layer=5, interval=2, k_heads=2, v_heads=8, ssm_dim=8),
    "3layers_mha_equal_heads": dict(seed=3, n_layer=3, interval=3, n_head=2, n_head_kv=2, head_dim=16, k_heads=2,
                                    v_heads=2, sections=(1, 1, 0)),
    "all_gdn_tied": dict(seed=4, n_layer=2, layer_types=["linear_attention"] * 2, tied=True, ssm_dim=32, k_heads=1,
                         v_heads=3),
    "attention_first_half_rotary": dict(seed=5, n_layer=3, layer_types=["full_attention", "linear_attention",
                                                                         "linear_attention"],
                                        head_dim=16, partial_rotary=0.5, sections=(2, 1, 1), n_head=6, n_head_kv=3),
}


@pytest.fixture(scope="module", autouse=True)
def _quiet():
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ.get("KAZEIA_TEST_THREADS", "1")))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """case -> (transformers model, GGUF path), built on first use."""
    cache: dict = {}

    def get(case: str):
        if case not in cache:
            m = random_qwen35(**CASES[case])
            cache[case] = (m, export(m, str(tmp_path_factory.mktemp(case) / f"{case}.gguf")))
        return cache[case]

    return get


def hf_logits(m, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return m(torch.tensor([tokens]), use_cache=False).logits[0].double().numpy()


def ours(path: str, backend: str = "cpu", **kw) -> Context:
    be = CpuBackend() if backend == "cpu" else RefBackend()
    return Context(Model.load(path), Scheduler([be]), n_ctx=kw.pop("n_ctx", 64), **kw)


def greedy_steps(ctx: Context, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    logits = ctx.decode(prompt)[-1]
    toks, steps = [], []
    for _ in range(n):
        steps.append(logits.astype(np.float64))
        toks.append(int(np.argmax(logits)))
        logits = ctx.decode([toks[-1]])[-1]
    return toks, steps


def check_generation(m, path: str, backend: str = "cpu") -> None:
    toks, steps = greedy_steps(ours(path, backend), PROMPT, N_STEPS)
    with torch.no_grad():
        gen = m.generate(torch.tensor([PROMPT]), max_new_tokens=N_STEPS, min_new_tokens=N_STEPS, do_sample=False)
    assert toks == gen[0, len(PROMPT):].tolist()
    want = hf_logits(m, PROMPT + toks[:-1])[len(PROMPT) - 1:]
    for i, (a, b) in enumerate(zip(steps, want)):
        assert_nmse(a, b, NMSE_MODEL, f"step {i}")


@pytest.mark.parametrize("case", ["base", "5layers_interval2_vk4"])
def test_greedy_tokens_and_logits_match(made, case):
    m, path = made(case)
    check_generation(m, path)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("flash_attn", [True, False], ids=["fa", "nofa"])
def test_last_logits(made, case, backend, flash_attn):
    m, path = made(case)
    a = ours(path, backend, flash_attn=flash_attn).decode(PROMPT)[-1]
    assert_nmse(a, hf_logits(m, PROMPT)[-1], NMSE_MODEL, "last-position logits")


@pytest.mark.parametrize("case", ["base", "3layers_mha_equal_heads", "all_gdn_tied"])
@pytest.mark.parametrize("n_ubatch", [1, 2, 5, 512])
def test_prefill_in_micro_batches_then_decode_equals_token_by_token(made, case, n_ubatch):
    """The prompt in micro-batches of n_ubatch, then 4 decode steps, against feeding one token at a time: the
    same logits at every step (so the conv and SSM states are carried exactly); and every position of the last
    micro-batch against transformers."""
    m, path = made(case)
    extra = [11, 12, 13, 14]
    one_by_one = ours(path, "ref")
    seq = [one_by_one.decode([t])[-1].astype(np.float64) for t in PROMPT + extra]
    batched = ours(path, "ref", n_ubatch=n_ubatch)
    got = [batched.decode(PROMPT)[-1]] + [batched.decode([t])[-1] for t in extra]
    for i, g in enumerate(got):
        assert_nmse(g, seq[len(PROMPT) - 1 + i], 1e-12, f"step {i} after a prefill in micro-batches of {n_ubatch}")
    cpu = ours(path, "cpu", n_ubatch=n_ubatch)
    head, tail = PROMPT[:8], PROMPT[8:] + extra
    cpu.decode(head)
    rows = cpu.decode(tail, all_logits=True)
    want = hf_logits(m, PROMPT + extra)
    n_last = rows.shape[0]
    assert n_last == (len(tail) if n_ubatch >= len(tail) else (len(tail) - 1) % n_ubatch + 1)
    for i in range(n_last):
        pos = len(want) - n_last + i
        assert_nmse(rows[i], want[pos], NMSE_MODEL, f"position {pos}")


def test_reset_starts_the_recurrent_state_over(made):
    m, path = made("base")
    ctx = ours(path)
    first = ctx.decode(PROMPT)[-1]
    ctx.decode([1, 2, 3])
    ctx.reset()
    assert np.array_equal(ctx.decode(PROMPT)[-1], first)


# ---------------------------------------------------------------------------------------------------
# the file llama.cpp's converter wrote


@pytest.fixture(scope="module")
def converted_hf():
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM

    return Qwen3_5ForCausalLM.from_pretrained(CONVERTED_HF, dtype=torch.float32).eval()


def test_converter_file_matches_transformers(converted_hf):
    check_generation(converted_hf, CONVERTED)
    for backend in ("cpu", "ref"):
        for n_ubatch in (3, 512):
            a = ours(CONVERTED, backend, n_ubatch=n_ubatch).decode(PROMPT[:-1])[-1]
            assert_nmse(a, hf_logits(converted_hf, PROMPT[:-1])[-1], NMSE_MODEL, f"{backend} ubatch {n_ubatch}")


def test_our_writer_gives_the_converter_file(converted_hf, tmp_path):
    """Same qwen35 keys and the same tensors (names, types, shapes, bytes) as convert_hf_to_gguf.py."""
    mine, theirs = GGUFReader(export(converted_hf, str(tmp_path / "ours.gguf"))), GGUFReader(CONVERTED)
    keys = {k: f.contents() for k, f in theirs.fields.items() if k.startswith("qwen35.")}
    ours_keys = {k: f.contents() for k, f in mine.fields.items() if k.startswith("qwen35.")}
    assert ours_keys.pop("qwen35.vocab_size") == 272  # the one key kazeia's writer adds
    assert ours_keys == keys
    t_ours = {t.name: t for t in mine.tensors}
    assert set(t_ours) == {t.name for t in theirs.tensors}
    for t in theirs.tensors:
        o = t_ours[t.name]
        assert (o.tensor_type, list(o.shape)) == (t.tensor_type, list(t.shape)), t.name
        assert np.array_equal(np.asarray(o.data), np.asarray(t.data)), t.name
