"""kazeia's graph is llama.cpp's graph, node for node.

Against llama-eval-callback's node list (tests/data/eval_callback_*.txt, recorded with llama.cpp 0c1e57098bba on
the same tiny F32 llama and qwen3 and a 10-token prompt): the same names, ops, types, source names and shapes,
in the same order, views included. That llama.cpp (October 2026) feeds flash attention an F16 mask; kazeia's
default graph (`kq_mask_cast=False`, what the 2026-10 profile and the CPU run) matches it exactly, node_<index>
names included. The May 2026 graph the original team ran (the 2026-05 profile: an F32 mask and its F16 cast)
differs by that one CPY alone, with ggml's `node_<index>` names after it one higher.
"""

from __future__ import annotations

import os
import re

import pytest

from kazeia.engine.context import Model
from kazeia.engine.kv import KVCache
from kazeia.gguf.writer import preset, write_model
from kazeia.graph.builder import ggml_name
from kazeia.graph.tensor import Tensor, type_name
from kazeia.models.transformer import GraphOptions, make_inputs

DATA = os.path.join(os.path.dirname(__file__), "data")
LINE = re.compile(r"^\s*(?P<name>.+?) = \((?P<type>\w+)\)\s+(?P<op>\w+)\((?P<s0>.*?)\{(?P<s0ne>[\d, ]+)\}, "
                  r"(?:(?P<s1>.*?)\{(?P<s1ne>[\d, ]+)\})?\}\) = \{(?P<ne>[\d, ]+)\}$")


def parse(path: str) -> list[tuple]:
    rows = []
    for ln in open(path, encoding="utf-8"):
        m = LINE.match(ln.rstrip("\n"))
        assert m, ln
        g = m.groupdict()
        rows.append((g["name"], g["type"], g["op"], g["s0"], g["s0ne"], g["s1"] or "", g["s1ne"] or "", g["ne"]))
    return rows


def _ne(t: Tensor) -> str:
    return ", ".join(str(x) for x in t.ne)


def row(n: Tensor) -> tuple:
    s1 = n.src[1] if len(n.src) > 1 and n.src[1] is not None else None
    return (ggml_name(n), type_name(n.type), n.desc(), ggml_name(n.src[0]), _ne(n.src[0]),
            ggml_name(s1) if s1 is not None else "", _ne(s1) if s1 is not None else "", _ne(n))


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("evcb") / f"tiny_{request.param}.gguf")
    write_model(preset("tiny", arch=request.param, wtype="f32"), path)
    return request.param, Model.load(path)


def graph_rows(model: Model, kq_mask_cast: bool, n_tokens: int = 10) -> list[tuple]:
    """llama-eval-callback's run: the prompt's tokens, a cache of 4096 cells or the model's training context if
    smaller (n_kv 256 with flash attention), one output."""
    a = model.args
    kv = KVCache(a, min(4096, a.n_ctx_train))
    inp = make_inputs(n_tokens, 256, 1, True, kq_mask_cast, a.n_embd)
    g, _ = model.arch.build(a, model.weights, inp, kv.layers, 256, GraphOptions(True, kq_mask_cast))
    return [row(n) for n in g.nodes]


# more logs of the same llama-eval-callback (tests/data/README.md): a 4-layer llama, whose last layer's output-row
# GET_ROWS are node_117 and node_118 in llama.cpp's numbering, and llama.cpp's own conversions of a tiny Qwen2 and
# a tiny Llama
MORE = [("eval_callback_llama4_tiny_f32.txt", "llama4"), ("eval_callback_qwen2_tiny_f32.txt", "qwen2_converted"),
        ("eval_callback_llama_converted_f32.txt", "llama_converted")]


@pytest.mark.parametrize("log,which", MORE)
def test_more_graphs_match_llama_eval_callback_exactly(log, which, tmp_path):
    if which == "llama4":
        path = str(tmp_path / "tiny_llama4.gguf")
        write_model(preset("tiny", arch="llama", wtype="f32", n_layer=4), path)
    else:
        path = os.path.join(DATA, f"{which.split('_')[0]}_tiny_converted.gguf")
    want = parse(os.path.join(DATA, log))
    n_tokens = int(want[0][7].split(", ")[1])  # embd's shape: [n_embd, tokens]
    got = graph_rows(Model.load(path), kq_mask_cast=False, n_tokens=n_tokens)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, (i, g, w)


def test_graph_matches_llama_eval_callback_exactly(tiny):
    arch, model = tiny
    want = parse(os.path.join(DATA, f"eval_callback_{arch}_tiny_f32.txt"))
    got = graph_rows(model, kq_mask_cast=False)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, (i, g, w)


def _unnamed(r: tuple) -> tuple:
    """A row with ggml's node_<index> names replaced by a placeholder (they count nodes, so they shift)."""
    return tuple("node_?" if re.fullmatch(r"node_\d+", x) else x for x in r)


def test_the_may_graph_is_that_graph_plus_the_mask_cast(tiny):
    arch, model = tiny
    want = parse(os.path.join(DATA, f"eval_callback_{arch}_tiny_f32.txt"))
    got = graph_rows(model, kq_mask_cast=True)
    casts = [i for i, r in enumerate(got) if r[2] == "CPY"]
    assert len(casts) == 1
    cast = got[casts[0]]
    assert cast[:5] == ("attn_inp_kq_mask (copy)", "f16", "CPY", "attn_inp_kq_mask", "256, 10, 1, 1")
    assert got[casts[0] + 1][2] == "FLASH_ATTN_EXT"  # right before the first attention, as ggml's DFS puts it
    rest = got[:casts[0]] + got[casts[0] + 1:]
    assert [_unnamed(r) for r in rest] == [_unnamed(r) for r in want]


def test_names_pick_one_node(tiny):
    """Repeated llama.cpp names get #k here, in graph order, so a name always selects one node."""
    _, model = tiny
    a = model.args
    inp = make_inputs(10, 256, 1, True, True, a.n_embd)
    g, _ = model.arch.build(a, model.weights, inp, KVCache(a, 4096).layers, 256, GraphOptions())
    names = [n.name for n in g.nodes]
    assert len(names) == len(set(names))
    assert g.node("norm-0").op == "RMS_NORM" and g.node("norm-0").src[0].name == "embd"
    assert g.node("Qcur-0").op == "MUL_MAT" and g.node("Qcur-0#1").op == "RESHAPE"
    assert g.node("Qcur-0#2").op == "ROPE"
    assert g.node("ffn_out-0").op == "MUL_MAT" and g.node("ffn_out-0").src[0].weight_name == "blk.0.ffn_down.weight"
    assert [n.op for n in g.nodes if n.name.startswith("norm")][-1] == "RMS_NORM"
    assert g.node("norm").src[0].name == f"l_out-{a.n_layer - 1}" and g.node("result_norm").src[0].name == "norm"
    # the last layer's FFN sees only the output row
    assert g.node(f"ffn_out-{a.n_layer - 1}").ne[1] == 1 and g.node("ffn_out-0").ne[1] == 10


VIEW_OPS = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}  # no computation: the trace has no line for them


def test_trace_of_a_run_is_that_list(tiny):
    """What `kazeia trace` records for the same prompt, op by op, is llama-eval-callback's list without the views:
    the same names (kazeia's `#k` suffix taken off, ggml's node_<index> included), ops and shapes, in the same
    order. A run of the 2026-05 code generation builds the May graph: the same list plus the mask cast, with the
    node_<index> names after it one higher (matched by op and shape)."""
    arch, model = tiny
    want = [(r[0], r[2], r[7]) for r in parse(os.path.join(DATA, f"eval_callback_{arch}_tiny_f32.txt"))
            if r[2] not in VIEW_OPS]
    prompt = "Once upon a time there was a small model that"
    assert _trace_rows(model.path, prompt) == want
    may = _trace_rows(model.path, prompt, htp_profile="2026-05")
    cast = [i for i, g in enumerate(may) if g[1] == "CPY"]
    assert len(cast) == 1 and may[cast[0]][0] == "attn_inp_kq_mask (copy)" and may[cast[0]][2] == "256, 10, 1, 1"
    del may[cast[0]]
    assert may != want and [_unnamed(g) for g in may] == [_unnamed(w) for w in want]


def _trace_rows(path: str, prompt: str, htp_profile: str | None = None) -> list[tuple[str, str, str]]:
    """(name without #k, op, dst shape) of every op `kazeia trace` records for one prompt."""
    import io

    from kazeia.debug.runner import run
    from kazeia.debug.trace import TraceHook
    from kazeia.engine.session import RunSpec

    hook = TraceHook(None, io.StringIO())
    assert run(RunSpec(model=path, prompt=prompt, htp_profile=htp_profile), hooks=(hook,)).ok
    return [(re.sub(r"#\d+$", "", r["name"]), r["op"], re.sub(r"^\w+\[|\]$", "", r["dst"]).replace(",", ", "))
            for r in hook.records]


def test_qwen35_may_trace_is_that_list_with_the_may_graphs_differences():
    """The hybrid, on llama.cpp's own conversion of a tiny Qwen3.5 (tests/data), run under 2026-05 (the May 2026
    llama.cpp's graph; today's graph equals llama-eval-callback's list exactly, test_new_architectures_...): the
    same ops, shapes, names and order, but for what llama.cpp changed since: the mask's F16 cast (#23764 removed
    it), ggml_l2_norm where today's graph has RMS_NORM + SCALE (#28068), and the delta-net state in bb4dc86a's
    [S*S*H, K, n_seqs] form. Unnamed nodes match by op and shape (the differences shift ggml's node_<index>)."""
    want = []
    for name, _, op, _, _, _, _, ne in parse(os.path.join(DATA, "eval_callback_qwen35_tiny_f32.txt")):
        if op in VIEW_OPS or ne.split(", ")[1] == "0":
            continue  # views, and build_rs's empty copies: no computation, no trace line
        if op == "SCALE" and name.split("-")[0] in ("q_conv_predelta", "k_conv_predelta"):
            assert want[-1][1] == "RMS_NORM"
            want[-1] = (name, "L2_NORM", ne)  # build_gdn_l2_norm (#28068) = the May graph's ggml_l2_norm
            continue
        want.append((name, op, ne))
    got = _trace_rows(os.path.join(DATA, "qwen35_tiny_converted.gguf"), "Once upon a time there was a small model that",
                      htp_profile="2026-05")
    cast = [i for i, g in enumerate(got) if g[0] == "attn_inp_kq_mask (copy)"]
    assert len(cast) == 1
    del got[cast[0]]
    assert [_unnamed(g) for g in got] == [_unnamed(w) for w in want]


# llama.cpp's own conversions of tiny random Gemma 3, Phi-3, LFM2 and Qwen3.5 (tests/data/README.md) and the node
# lists llama-eval-callback printed for them: sliding-window layers (their own cache, mask and rope base), fused QKV
# and gate/up with LongRoPE factors, short-conv and gated-delta-net layers and build_rs's state nodes (zero-sized
# ones included), in today's llama.cpp graph
CONVERTED_ARCHS = ["gemma3", "phi3", "lfm2", "qwen35"]


def context_rows(path: str, n_tokens: int) -> list[tuple]:
    """The graph a context builds for llama-eval-callback's run: n_tokens prompt tokens in the context kazeia's run
    takes by default (the training context here, padded to 256 as llama_context pads it), fresh recurrent cells,
    one output. Names as the log prints
    them (without leading spaces: ggml names `(transposed)` after an unnamed source ` (transposed)`)."""
    from kazeia.backends.cpu import CpuBackend
    from kazeia.engine.context import Context
    from kazeia.engine.scheduler import Scheduler
    from kazeia.engine.session import RunSpec, n_ctx_for

    model = Model.load(path)
    ctx = Context(model, Scheduler([CpuBackend()]), n_ctx=n_ctx_for(RunSpec(model=path), model))
    bg = ctx._build(n_tokens, ctx._n_kv(n_tokens), 1, n_kv_swa=ctx._n_kv_swa(n_tokens))
    return [(row(n)[0].strip(),) + row(n)[1:] for n in bg.graph.nodes]


@pytest.mark.parametrize("arch", CONVERTED_ARCHS)
def test_new_architectures_match_llama_eval_callback_exactly(arch):
    want = parse(os.path.join(DATA, f"eval_callback_{arch}_tiny_f32.txt"))
    n_tokens = int(want[0][7].split(", ")[1])
    got = context_rows(os.path.join(DATA, f"{arch}_tiny_converted.gguf"), n_tokens)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, (i, g, w)
