"""Whole models against an independent implementation: Hugging Face transformers.

The same GGUF file is loaded by our engine and by transformers' GGUF loader (which converts the tensors
itself, un-permuting Llama's q/k rows for its rotate_half rope). With F32 weights:
- greedy decoding gives the same 16 tokens;
- the logits at the last position, at every position of a prefill split into micro-batches, and at each
  step of a generation agree to NMSE <= 1e-5, on `cpu` and on `ref`, with flash attention on and off, and
  with F16 or F32 KV caches.
Transformers ignores qwen3's attention.key_length, so the head size is passed to it explicitly.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gguf import GGUFReader  # noqa: E402

from kazeia.backends.cpu import CpuBackend  # noqa: E402
from kazeia.backends.ref import RefBackend  # noqa: E402
from kazeia.engine.context import Context, Model  # noqa: E402
from kazeia.engine.scheduler import Scheduler  # noqa: E402
from kazeia.graph.tensor import GGMLType  # noqa: E402
from oracle_utils import assert_nmse  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.oracle]  # whole-model runs

NMSE_MODEL = 1e-5
N_STEPS = 16
PROMPT = [17, 250, 3, 600, 42, 999, 128, 77, 500]


@pytest.fixture(scope="module", autouse=True)
def _quiet():
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ.get("KAZEIA_TEST_THREADS", "1")))


_hf_cache: dict[str, object] = {}


def hf_model(path: str):
    if path not in _hf_cache:
        r = GGUFReader(path)
        arch = r.get_field("general.architecture").contents()
        head_dim = int(r.get_field(f"{arch}.attention.key_length").contents())
        d, name = os.path.split(path)
        # (Qwen2's, Phi-3's and LFM2's configs derive it: hidden / heads)
        kw = {} if arch in ("qwen2", "phi3", "lfm2") else {"head_dim": head_dim}
        # what llama.cpp reads differently from transformers' GGUF defaults: Gemma 3 scales q by 1/sqrt(head_dim)
        # (hparams.f_attention_scale), not by Gemma3Config's default query_pre_attn_scalar of 256; Phi-3's default
        # pad_token_id (32000) is past a tiny vocabulary
        kw.update({"gemma3": {"query_pre_attn_scalar": head_dim}, "phi3": {"pad_token_id": 0}}.get(arch, {}))
        m = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32, **kw)
        m.eval()
        _hf_cache[path] = m
    return _hf_cache[path]


def hf_logits(path: str, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        out = hf_model(path)(torch.tensor([tokens]))
    return out.logits[0].double().numpy()


def ours(path: str, backend: str = "cpu", n_ctx: int = 64, **kw) -> Context:
    be = CpuBackend() if backend == "cpu" else RefBackend()
    return Context(Model.load(path), Scheduler([be]), n_ctx=n_ctx, **kw)


MODELS = ["tiny_qwen3", "tiny_llama", "tiny_qwen2", "tiny_gemma3", "tiny_phi3", "tiny_lfm2", "tiny_qwen3_narrow_heads",
          "tiny_qwen3_q4"]


@pytest.fixture(params=MODELS)
def model_path(request) -> str:
    return request.getfixturevalue(request.param)


def test_greedy_tokens_and_logits_match(model_path):
    """16 greedy tokens identical to transformers' generate; logits of every step within NMSE 1e-5."""
    ctx = ours(model_path)
    logits = ctx.decode(PROMPT)[-1]
    toks, steps = [], []
    for _ in range(N_STEPS):
        steps.append(logits.astype(np.float64))
        t = int(np.argmax(logits))
        toks.append(t)
        logits = ctx.decode([t])[-1]
    with torch.no_grad():
        gen = hf_model(model_path).generate(torch.tensor([PROMPT]), max_new_tokens=N_STEPS, do_sample=False,
                                            min_new_tokens=N_STEPS)
    assert toks == gen[0, len(PROMPT):].tolist()
    ref = hf_logits(model_path, PROMPT + toks[:-1])[len(PROMPT) - 1:]
    for i, (a, b) in enumerate(zip(steps, ref)):
        assert_nmse(a, b, NMSE_MODEL, f"step {i}")


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("flash_attn", [True, False], ids=["fa", "nofa"])
@pytest.mark.parametrize("cache", ["f16", "f32"])
def test_last_logits(model_path, backend, flash_attn, cache):
    ct = GGMLType.F16 if cache == "f16" else GGMLType.F32
    ctx = ours(model_path, backend, flash_attn=flash_attn, type_k=ct, type_v=ct)
    a = ctx.decode(PROMPT)[-1]
    assert_nmse(a, hf_logits(model_path, PROMPT)[-1], NMSE_MODEL, "last-position logits")


@pytest.mark.parametrize("n_ubatch", [1, 4, 512])
def test_all_positions_with_micro_batches(model_path, n_ubatch):
    """A 13-token prompt fed in micro-batches; the last micro-batch's rows, then a second call for the rest."""
    prompt = PROMPT + [3, 4, 5, 6]
    want = hf_logits(model_path, prompt)
    ctx = ours(model_path, n_ubatch=n_ubatch)
    head, tail = prompt[:8], prompt[8:]
    ctx.decode(head)
    got = ctx.decode(tail, all_logits=True)
    n_last = len(tail) if n_ubatch >= len(tail) else (len(tail) - 1) % n_ubatch + 1
    assert got.shape == (n_last, want.shape[1])
    for i in range(n_last):
        assert_nmse(got[i], want[len(prompt) - n_last + i], NMSE_MODEL, f"position {len(prompt) - n_last + i}")


@pytest.mark.parametrize("flash_attn", [True, False], ids=["fa", "nofa"])
def test_padded_and_stale_cache_cells_are_masked(tiny_qwen3, flash_attn):
    """A large context: the attended KV length is padded far past the tokens (to 256 cells with flash
    attention), and those cells hold stale data (here: large finite F16 garbage). They must be masked out."""
    ctx = ours(tiny_qwen3, n_ctx=1024, flash_attn=flash_attn)
    ctx.kv.buffer.data[:] = 0x7B  # every cache byte 0x7B: F16 0x7B7B = 61280
    a = ctx.decode(PROMPT)[-1]
    assert_nmse(a, hf_logits(tiny_qwen3, PROMPT)[-1], NMSE_MODEL, "stale padded cache")
