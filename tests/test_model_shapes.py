"""Whole models of shapes no other test uses, cpu against the float64 ref: the quantized matmuls, the tiling
and the KV handling must not depend on the sizes they were tuned on.

- a 36-layer Llama-shaped model (the depth of the seed's model, tiny widths, an odd FFN width);
- a Qwen3 whose matmuls have K = 5120 (not a power of two, 160 blocks) and an FFN with N = 5120 + 32;
each with Q4_0, Q4_1 and Q8_0 weights: the prefill logits (the AVX2 int16 GEMM; tiled dequantize + BLAS on the
portable path) and a decode step (the GEMV) agree with ref to NMSE 1e-6, and the greedy next token is the same.
"""

from __future__ import annotations

import numpy as np
import pytest

from kazeia.backends.cpu import CpuBackend
from kazeia.backends.ref import RefBackend
from kazeia.engine.context import Context, Model
from kazeia.engine.scheduler import Scheduler
from kazeia.gguf.synth_tokenizer import MIN_VOCAB
from kazeia.gguf.writer import preset, write_model
from oracle_utils import assert_nmse

SHAPES = {
    "llama36": dict(arch="llama", n_layer=36, n_embd=64, n_ff=96, n_head=4, n_head_kv=2, head_dim=16),
    "qwen3_k5120": dict(arch="qwen3", n_layer=1, n_embd=5120, n_ff=5152, n_head=4, n_head_kv=2, head_dim=64),
}


@pytest.fixture(scope="module", params=[(s, t) for s in SHAPES for t in ("q4_0", "q4_1", "q8_0")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def shaped_model(request, tmp_path_factory) -> str:
    shape, wtype = request.param
    path = tmp_path_factory.mktemp("shapes") / f"{shape}_{wtype}.gguf"
    write_model(preset("tiny", **SHAPES[shape], wtype=wtype, n_vocab=max(MIN_VOCAB, 512), seed=11), path)
    return str(path)


def _run(path: str, backend) -> tuple[np.ndarray, np.ndarray]:
    ctx = Context(Model.load(path), Scheduler([backend]), n_ctx=64)
    prompt = ctx.decode(list(range(3, 40)), all_logits=True)
    step = ctx.decode([int(np.argmax(prompt[-1]))])
    return prompt, step


@pytest.mark.slow
def test_cpu_matches_ref(shaped_model):
    cpu_prompt, cpu_step = _run(shaped_model, CpuBackend())
    ref_prompt, ref_step = _run(shaped_model, RefBackend())
    assert_nmse(cpu_prompt, ref_prompt, 1e-6, "prefill logits")
    assert_nmse(cpu_step, ref_step, 1e-6, "decode-step logits")
    assert np.argmax(cpu_step[-1]) == np.argmax(ref_step[-1])
