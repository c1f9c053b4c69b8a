"""Models against independent oracles, on files written by llama.cpp's own converter (tests/data, see README.md):
tiny random Qwen2ForCausalLM (4 layers, q/k/v biases, GQA, untied), LlamaForCausalLM (the same without biases,
NORM rope), Gemma3ForCausalLM (6 layers, five sliding-window layers of window 8 then a global one, GEGLU, four
norms, q/k norms), Phi3ForCausalLM (fused QKV and gate/up, rope on 12 of 16 dims with LongRoPE factors) and
Lfm2ForCausalLM (short-conv layers beside attention layers), each with its `convert_hf_to_gguf.py` output.
- transformers on the same weights: last-position logits and every position of a prefill split into
  micro-batches within NMSE 1e-6 (F32 weights, F32 KV cache), 16 greedy tokens identical, on `cpu` and `ref`;
- the graph, node for node, against `llama-eval-callback` on those files (tests/test_llama_graph.py), and Qwen2's
  per-op values against that log's;
- every device: the file runs on HTP0 under each profile.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from kazeia.backends.cpu import CpuBackend
from kazeia.backends.ref import RefBackend
from kazeia.engine.context import Context, Model
from kazeia.engine.scheduler import Scheduler
from kazeia.engine.session import RunSpec, build_context
from kazeia.graph.tensor import GGMLType

DATA = os.path.join(os.path.dirname(__file__), "data")
CONVERTED = os.path.join(DATA, "qwen2_tiny_converted.gguf")
FILES = {arch: (os.path.join(DATA, f"{arch}_tiny_converted.gguf"), os.path.join(DATA, f"{arch}_tiny_hf"))
         for arch in ("qwen2", "llama", "gemma3", "phi3", "lfm2")}
PROMPT = [17, 250, 3, 100, 42, 99, 128, 77, 200, 5, 6]
NMSE_F32 = 1e-6
N_STEPS = 16


def _ours(arch: str, backend: str, **kw) -> Context:
    be = CpuBackend() if backend == "cpu" else RefBackend()
    return Context(Model.load(FILES[arch][0]), Scheduler([be]), n_ctx=64, type_k=GGMLType.F32, type_v=GGMLType.F32,
                   **kw)


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a.astype(np.float64) - b) ** 2).sum() / (b.astype(np.float64) ** 2).sum())


@pytest.fixture(scope="module", params=list(FILES))
def hf(request):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    m = transformers.AutoModelForCausalLM.from_pretrained(FILES[request.param][1], dtype=torch.float32).eval()

    def logits(tokens: list[int]) -> np.ndarray:
        with torch.no_grad():
            return m(torch.tensor([tokens])).logits[0].double().numpy()

    def greedy(tokens: list[int], n: int) -> list[int]:
        with torch.no_grad():
            out = m.generate(torch.tensor([tokens]), max_new_tokens=n, do_sample=False)
        return out[0, len(tokens):].tolist()

    return request.param, logits, greedy


@pytest.mark.oracle
@pytest.mark.parametrize("backend", ["cpu", "ref"])
def test_converter_written_file_matches_transformers(hf, backend):
    arch, logits, _ = hf
    want = logits(PROMPT)
    ctx = _ours(arch, backend, n_ubatch=4)  # 11 tokens in micro-batches of 4, 4, 3
    got = ctx.decode(PROMPT, all_logits=True)
    assert _nmse(got[-1], want[-1]) < NMSE_F32
    whole = _ours(arch, backend).decode(PROMPT, all_logits=True)
    assert _nmse(whole, want) < NMSE_F32


@pytest.mark.oracle
def test_greedy_text_agrees_with_transformers(hf):
    arch, _, greedy = hf
    ctx = _ours(arch, "cpu")
    out, logits = [], ctx.decode(PROMPT)
    for _ in range(N_STEPS):
        out.append(int(logits[-1].argmax()))
        logits = ctx.decode([out[-1]])
    assert out == greedy(PROMPT, N_STEPS)


@pytest.mark.parametrize("arch", list(FILES))
@pytest.mark.parametrize("profile", ["2026-05", "robust", "2026-10"])
def test_runs_on_htp0_under_every_profile(arch, profile):
    path = FILES[arch][0]
    ref = build_context(RunSpec(model=path, device="REF", ctx=64)).decode(PROMPT)[-1]
    got = build_context(RunSpec(model=path, device="HTP0", htp_profile=profile, ctx=64)).decode(PROMPT)[-1]
    assert np.isfinite(got).all() and _nmse(got, ref) < 1e-3


# per architecture: nodes the values log must have judged (a named node of the first and last layers, an unnamed one)
JUDGED = {"qwen2": {"Qcur-0", "ffn_out-3", "result_output", "node_24"},
          "llama": {"Qcur-0", "attn_out-0", "ffn_out-3", "result_output"},
          "gemma3": {"Qcur_normed-0", "ffn_geglu-4", "sa_out-5", "inp_scaled", "result_output"},
          "phi3": {"wqkv-0", "ffn_swiglu-3", "l_out-2", "result_output"},
          "lfm2": {"model.layers.{}.conv.conv-0", "model.layers.{}.self_attn.out_proj-1", "node_17", "result_output"},
          "qwen35": {"conv_input-0", "linear_attn_out-2", "gate_sigmoid-1", "node_42", "result_output"}}


@pytest.mark.parametrize("arch", list(JUDGED))
def test_per_op_values_agree_with_llama_eval_callback(arch):
    """llama-eval-callback's whole log on the converted file (tests/data/eval_callback_<arch>_tiny_f32_values.txt,
    values included): every op it prints agrees with kazeia's float64 reference of the same graph within the log's
    print precision (`kazeia compare --against`), none departs. The run has llama-eval-callback's context (the
    training context, 512 or 1024 cells): Phi-3 takes its long rope factors, as llama.cpp did."""
    from kazeia.debug.evalcb import compare_log, parse_log, reference_nodes

    name = ("eval_callback_llama_converted_f32_values.txt" if arch == "llama"
            else f"eval_callback_{arch}_tiny_f32_values.txt")
    log, tokens = parse_log(open(os.path.join(DATA, name)).read())
    nodes = reference_nodes(RunSpec(model=os.path.join(DATA, f"{arch}_tiny_converted.gguf"), tokens=tokens,
                                    device="REF"))
    checks = compare_log(log, nodes)
    assert not [c for c in checks if c.status == "DEPARTS"]
    judged = [c.name for c in checks if c.status == "OK"]
    assert len(judged) >= 60 and JUDGED[arch] <= set(judged)


LONG = 300  # past Phi-3's original context (256), past Gemma 3's SWA cache (256 cells: it wraps)


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("arch", ["gemma3", "phi3", "lfm2"])
def test_a_long_prompt_then_decode_matches_transformers(arch):
    """300 tokens in micro-batches of 64, then one at a time from position 280, in a 512-cell context, on the
    float64 reference against transformers at every position: Gemma 3's sliding-window cache wraps (its cells
    are reused past 256), Phi-3 takes its long rope factors (the context per sequence, 512, exceeds the original
    256; transformers takes them for a sequence that long), LFM2 carries its conv state across every split."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    m = transformers.AutoModelForCausalLM.from_pretrained(FILES[arch][1], dtype=torch.float32).eval()
    tokens = np.random.default_rng(0).integers(3, 270, LONG).tolist()
    with torch.no_grad():
        want = m(torch.tensor([tokens])).logits[0].double().numpy()
    ctx = Context(Model.load(FILES[arch][0]), Scheduler([RefBackend()]), n_ctx=512, n_ubatch=64,
                  type_k=GGMLType.F32, type_v=GGMLType.F32)
    got = [ctx.decode(tokens[s:min(s + 64, 280)], all_logits=True) for s in range(0, 280, 64)]
    got += [ctx.decode([t], all_logits=True) for t in tokens[280:]]
    got = np.concatenate(got)
    worst = max(_nmse(g, w) for g, w in zip(got, want))
    assert worst < 1e-9, worst
