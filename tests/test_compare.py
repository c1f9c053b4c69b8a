"""`kazeia compare` and kazeia.debug.compare: per-op error against the float64 REF, cumulative and isolated.

- CPU vs REF: nothing out of tolerance; isolated errors stay at float32 rounding while cumulative ones grow;
- HTP robust on SmolLM2 and on the Qwen3-4B-shaped model (40 tokens: HMX, 16 tokens: HVX): nothing out of
  tolerance; under --strict, every HVX excess is explained by ggml's own activation conversion;
- fault injections: the first op out of tolerance is the first HMX MUL_MAT, found from a clean run's paths;
- the 2026-05 death: the op that dies is the one whose HMX VTCM plan overflows (plan.plan_matmul);
- NaN produced by an op (hook injection) is named with a NaN reason; a NaN weight makes REF invalid, not
  the backend guilty;
- the CLI: table, exit status, --json, --plot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kazeia.backends.base import Hook
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_matmul
from kazeia.debug.allowance import reference_activations
from kazeia.debug.compare import (
    DRIFT,
    FAIL,
    OK,
    REF_INVALID,
    capture_reference,
    compare,
)
from kazeia.engine.session import RunSpec, load_model
from kazeia.errors import KazeiaError
from kazeia.graph.tensor import GGMLType, array

N_HMX = 40  # tokens: M >= 32 puts eligible matmuls on HMX
N_HVX = 16


# ---------------------------------------------------------------------------------------------------------
# the MUL_MAT allowance (the verdict itself: tests/test_judge.py)


def test_reference_activation_conversion():
    # values that are exact int8 multiples of an fp16-exact scale survive the q8 conversion unchanged
    d = 0.5
    k = np.random.default_rng(0).integers(-127, 128, (8, 32)).astype(np.float64)
    k[:, 0] = 127  # every block's amax is 127 * d, so its scale is d
    x = k * d
    np.testing.assert_array_equal(reference_activations(x, GGMLType.Q4_0), x)
    # a generic row: error within half a step of each block's scale
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 64))
    q = reference_activations(x, GGMLType.Q8_0)
    step = np.abs(x.reshape(3, 2, 32)).max(-1, keepdims=True) / 127
    assert np.all(np.abs(q - x).reshape(3, 2, 32) <= step * 0.5 + 1e-3 * step)
    assert reference_activations(x, GGMLType.F32) is None
    np.testing.assert_array_equal(reference_activations(np.array([1.0 + 2 ** -12]), GGMLType.F16), [1.0])
    np.testing.assert_array_equal(reference_activations(np.array([1.0 + 2 ** -9]), GGMLType.BF16), [1.0])


# ---------------------------------------------------------------------------------------------------------
# CPU against REF


def _computed_nodes(spec: RunSpec) -> int:
    from kazeia.debug.runner import run
    from kazeia.engine.session import build_context, prompt_ids

    ctx = build_context(spec.with_(device="REF"))
    run(spec.with_(device="REF"), ctx=ctx)
    assert ctx.last_graph is not None and len(prompt_ids(spec, ctx.model)) <= spec.ubatch
    return sum(1 for n in ctx.last_graph.nodes if n.is_computed)


def test_cpu_vs_ref_tiny_both_modes(tiny_qwen3_q4):
    spec = RunSpec(model=tiny_qwen3_q4, n_prompt=N_HMX, device="CPU")
    r = compare(spec, "both")
    assert r.ok and r.exit_status == 0 and r.first_failure is None
    n = _computed_nodes(spec)
    assert len(r.rows["isolated"]) == len(r.rows["cumulative"]) == n
    iso = {x.index: x for x in r.rows["isolated"]}
    # isolated: each op sees REF's inputs rounded to float32, so its error stays at float32 rounding, except a
    # weight MUL_MAT with M <= 2 (here the last row's lm_head): the cpu GEMV quantizes its activations to int16
    # per 32-block (qmatmul.py), ~1e-9, far below test-backend-ops' 5e-4 but above float32 rounding
    assert max(x.nmse for x in iso.values() if x.op != "MUL_MAT") < 1e-11
    assert max(x.nmse for x in iso.values() if x.op == "MUL_MAT") < 1e-8
    # cumulative: errors propagate; late ops drift more than in isolation, logits within the model threshold
    # (rows of M > 2 only: the last layer's FFN sees only the output row, a GEMV, like llama.cpp's graph)
    late = [x for x in r.rows["cumulative"] if x.layer == 1 and x.op == "MUL_MAT" and int(x.shape.split(",")[1]) > 2]
    assert late and all(x.nmse > 10 * iso[x.index].nmse for x in late)
    assert r.logits_nmse["cumulative"] < 2e-3
    # the first op (inputs identical to REF's) is judged in cumulative mode too
    assert r.rows["cumulative"][0].judged and r.rows["cumulative"][0].input_nmse == 0.0


@pytest.fixture(scope="module")
def smol_ref(default_model):
    return capture_reference(RunSpec(model=default_model, n_prompt=N_HMX, device="HTP0"))


@pytest.mark.slow
def test_cpu_vs_ref_default_model(default_model, smol_ref):
    r = compare(RunSpec(model=default_model, n_prompt=N_HMX, device="CPU"), "both", reference=smol_ref)
    assert r.ok, r.first_failure
    assert r.logits_nmse["cumulative"] < 2e-3


# ---------------------------------------------------------------------------------------------------------
# HTP, robust profile (named: the default is 2026-10, whose HMX starts at M = 5 and whose lm_head runs on the HTP)


def _first_hmx_matmul(report) -> object:
    """From a clean run: the first MUL_MAT that ran on HMX, in graph order."""
    return next(x for x in report.rows["isolated"] if x.op == "MUL_MAT" and x.path == "hmx")


@pytest.fixture(scope="module")
def smol_clean(default_model, smol_ref):
    return compare(RunSpec(model=default_model, n_prompt=N_HMX, device="HTP0", htp_profile="robust"), "isolated",
                   reference=smol_ref)


@pytest.mark.slow
def test_htp_robust_default_model_isolated(smol_clean):
    r = smol_clean
    assert r.ok, f"{r.first_failure.label()}: {r.first_failure.reason}" if r.first_failure else ""
    paths = {(x.op, x.path) for x in r.rows["isolated"]}
    assert ("MUL_MAT", "hmx") in paths and ("MUL_MAT", "hvx") in paths
    assert r.deaths["isolated"] is None


@pytest.mark.slow
def test_htp_strict_excess_is_ggml_conversion_error(default_model, smol_ref, smol_clean):
    """Without the allowance, any HVX MUL_MAT over 5e-4 must be explained by the NMSE that ggml's own
    activation conversion has on the same inputs (computed independently in float64 from REF)."""
    strict = compare(RunSpec(model=default_model, n_prompt=N_HMX, device="HTP0"), "isolated", reference=smol_ref,
                     strict=True)
    for x in strict.failures("isolated"):
        assert x.op == "MUL_MAT" and x.path == "hvx", x.label()
        assert x.quant_floor is None  # strict: no allowance recorded
        floor = smol_ref.floors[(x.ubatch, x.index)]
        assert x.nmse == pytest.approx(floor, rel=0.1), x.label()
    allowed = {(x.ubatch, x.index): x for x in smol_clean.rows["isolated"]}
    for x in strict.failures("isolated"):
        assert allowed[(x.ubatch, x.index)].status == OK


@pytest.fixture(scope="module")
def q4b_model(q4b2) -> str:
    # the session's Qwen3-4B-shaped 2-layer model (conftest): layer 0's FFN sees every token (the last layer's
    # sees only the output row, as in llama.cpp's graph)
    return q4b2


@pytest.fixture(scope="module")
def q4b_ref(q4b_model):
    return capture_reference(RunSpec(model=q4b_model, n_prompt=N_HMX, device="HTP0"))


@pytest.fixture(scope="module")
def q4b_clean(q4b_model, q4b_ref):
    return compare(RunSpec(model=q4b_model, n_prompt=N_HMX, device="HTP0", htp_profile="robust"), "isolated",
                   reference=q4b_ref)


@pytest.mark.slow
def test_htp_robust_qwen3_4b_hmx(q4b_clean):
    r = q4b_clean
    assert r.ok, f"{r.first_failure.label()}: {r.first_failure.reason}" if r.first_failure else ""
    mm = [x for x in r.rows["isolated"] if x.op == "MUL_MAT" and x.backend == "HTP0"]
    tokens = [int(x.shape.split(",")[1]) for x in mm]
    assert mm and all(x.path == ("hmx" if m == N_HMX else "hvx") for x, m in zip(mm, tokens))
    assert tokens.count(1) == 3  # the last layer's gate, up and down see only the output row


@pytest.mark.slow
def test_htp_robust_qwen3_4b_hvx(q4b_model):
    r = compare(RunSpec(model=q4b_model, n_prompt=N_HVX, device="HTP0", htp_profile="robust"), "both")
    assert r.ok, f"{r.first_failure.label()}: {r.first_failure.reason}" if r.first_failure else ""
    mm = [x for x in r.rows["isolated"] if x.op == "MUL_MAT" and x.backend == "HTP0"]
    assert mm and all(x.path == "hvx" for x in mm)
    assert r.logits_nmse["cumulative"] < 2e-3


# ---------------------------------------------------------------------------------------------------------
# fault injections: the culprit is the first HMX MUL_MAT
#
# hmx-bias-stale: the HMX read-out uses the scale the unit last loaded. Every HMX matmul restores 1.0 for the
# next one, so the first HMX matmul of a session always reads a stale scale (0 after reset, or 1/sqrt(head_dim)
# after an HMX flash attention): it is the first op affected. scatter-unretired: every HMX matmul reads some of
# its first column tile's weights before they landed, so again the first HMX matmul is the first affected (its
# stale VTCM bytes are leftovers of non-matmul ops, never its own weights). The race is pinned by a seed.


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["hmx-bias-stale", "scatter-unretired"])
def test_fault_names_first_hmx_matmul_qwen3_4b(q4b_model, q4b_ref, q4b_clean, fault):
    expected = _first_hmx_matmul(q4b_clean)
    for seed in ("0", "1"):
        spec = RunSpec(model=q4b_model, n_prompt=N_HMX, device="HTP0", faults=[fault],
                       env={"KAZEIA_HTP_RACE_SEED": seed})
        r = compare(spec, "isolated", reference=q4b_ref)
        f = r.first_failure
        assert f is not None and (f.name, f.index, f.path) == (expected.name, expected.index, "hmx"), fault
        assert f.min_tolerance is not None and f.min_tolerance > f.threshold
        assert r.exit_status == 1
        before = [x for x in r.rows["isolated"] if x.index < f.index]
        assert before and all(x.status == OK for x in before)


@pytest.mark.slow
def test_fault_names_first_hmx_matmul_default_model(default_model, smol_ref, smol_clean):
    expected = _first_hmx_matmul(smol_clean)
    r = compare(RunSpec(model=default_model, n_prompt=N_HMX, device="HTP0", faults=["hmx-bias-stale"],
                        htp_profile="robust"), "isolated", reference=smol_ref)
    f = r.first_failure
    assert (f.name, f.index) == (expected.name, expected.index)
    # after an HMX flash attention the stale scale is 1/sqrt(head_dim): output = reference / 8 for SmolLM2,
    # so NMSE = (1 - 1/8)^2 / (1/8)^2 = 49, which the table reports as the minimum required tolerance
    fa_before = [x for x in smol_clean.rows["isolated"] if x.op == "FLASH_ATTN_EXT" and x.index < f.index]
    assert fa_before and fa_before[-1].path == "hmx"
    hd = load_model(default_model).args.head_dim
    assert f.min_tolerance == pytest.approx((1 - hd ** -0.5) ** 2 / hd ** -1, rel=1e-2)


@pytest.mark.slow
def test_death_is_the_op_whose_hmx_plan_overflows(q4b_model):
    spec = RunSpec(model=q4b_model, n_prompt=N_HMX, device="HTP0", htp_profile="2026-05")
    r = compare(spec, "isolated")  # its own reference: 2026-05 runs May's llama.cpp graph (the mask cast)
    f = r.first_failure
    assert f is not None and f.status == "DEATH" and r.exit_status == 1
    assert r.rows["isolated"][-1] is f and r.deaths["isolated"]["code"] == 0x2E
    assert r.not_run["isolated"] > 0
    # independent: the only MUL_MAT shape whose HMX plan overflows 8 MiB under 2026-05 at M=40
    model = load_model(q4b_model)
    over = [name for name, w in model.weights.items() if w.type != GGMLType.F32 and w.ne[1] % 32 == 0
            and plan_matmul(N_HMX, w.ne[0], w.ne[1], w.type.name.lower(), profile="2026-05").status == "overflow"]
    assert over == ["blk.0.ffn_down.weight", "blk.1.ffn_down.weight"]
    assert f.name == "ffn_out-0" and f.op == "MUL_MAT"  # the first of them to run (layer 1's sees one row only)


# ---------------------------------------------------------------------------------------------------------
# NaN


class _NaNInjector(Hook):
    """A faulty device: writes NaN into one op's output when it completes."""

    def __init__(self, name: str) -> None:
        self.name = name

    def on_complete(self, node, info) -> None:
        if node.name == self.name:
            array(node)[..., 0] = np.nan


def test_nan_output_is_named_in_both_modes(tiny_qwen3_q4):
    spec = RunSpec(model=tiny_qwen3_q4, n_prompt=N_HVX, device="CPU")
    r = compare(spec, "both", hooks=[_NaNInjector("ffn_up-0")])
    for mode in ("isolated", "cumulative"):
        f = r.first_failure_in(mode)
        assert f is not None and f.name == "ffn_up-0" and f.reason.startswith("NaN"), mode
    # isolated: the next ops get REF's inputs and pass; cumulative: they inherit the NaN and are not blamed
    iso = r.failures("isolated")
    assert [x.name for x in iso] == ["ffn_up-0"]
    after = [x for x in r.rows["cumulative"] if x.index > r.first_failure_in("cumulative").index]
    assert any(x.status == DRIFT for x in after)
    # only the whole-model output is judged again (it holds NaN: the model's answer is wrong)
    assert [x.name for x in after if x.status == FAIL] == ["result_output"]


def test_nan_in_reference_is_reference_invalid(tmp_path):
    from gguf import GGUFReader

    from kazeia.gguf.writer import preset, write_model

    path = str(tmp_path / "nan.gguf")
    write_model(preset("tiny", arch="qwen3", wtype="f32"), path)
    rd = GGUFReader(path, "r+")
    t = next(t for t in rd.tensors if t.name == "blk.1.ffn_norm.weight")
    t.data[0] = np.nan
    rd.data.flush()
    del rd
    r = compare(RunSpec(model=path, n_prompt=N_HVX, device="CPU"), "isolated")
    rows = r.rows["isolated"]
    bad = [x for x in rows if x.status == REF_INVALID]
    assert bad and bad[0].name == "ffn_norm-1" and "reference invalid" in bad[0].reason
    assert all(x.status == OK for x in rows if x.index < bad[0].index)
    assert not r.failures("isolated") and r.exit_status == 0  # never blamed on the backend


# ---------------------------------------------------------------------------------------------------------
# CLI


def kazeia(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kazeia", *args], capture_output=True, text=True)


@pytest.mark.slow
def test_cli_fault_json_plot(tiny_qwen3_q4, tmp_path):
    jpath, ppath = str(tmp_path / "r.json"), str(tmp_path / "r.png")
    clean = kazeia("compare", "-m", tiny_qwen3_q4, "--n-prompt", str(N_HMX), "-dev", "HTP0", "--mode", "isolated",
                   "--json", jpath)
    assert clean.returncode == 0, clean.stderr
    assert "no op out of tolerance" in clean.stdout
    with open(jpath) as f:
        d = json.load(f)
    first_hmx = next(x for x in d["rows"]["isolated"] if x["op"] == "MUL_MAT" and x["path"] == "hmx")
    r = kazeia("compare", "-m", tiny_qwen3_q4, "--n-prompt", str(N_HMX), "-dev", "HTP0", "--fault",
               "hmx-bias-stale", "--json", jpath, "--plot", ppath)
    assert r.returncode == 1, r.stderr
    with open(jpath) as f:
        d = json.load(f)
    assert d["ok"] is False and d["first_failure"]["name"] == first_hmx["name"]
    assert d["first_failure"]["mode"] == "isolated" and set(d["rows"]) == {"cumulative", "isolated"}
    assert f"first op out of tolerance: #{first_hmx['index']} {first_hmx['name']}" in r.stdout
    assert "== cumulative" in r.stdout and "== isolated" in r.stdout and "kazeia compare" in d["command"]
    with open(ppath, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(ppath) > 10_000


@pytest.mark.slow
def test_cli_usage_errors(tiny_qwen3_q4):
    r = kazeia("compare", "-m", tiny_qwen3_q4, "-dev", "HTP0")
    assert r.returncode == 2 and "give -p PROMPT or --n-prompt" in r.stderr and "Traceback" not in r.stderr
    r = kazeia("compare", "-m", tiny_qwen3_q4, "--n-prompt", "8", "--mode", "sideways")
    assert r.returncode == 2


def test_plot_without_matplotlib(monkeypatch, tmp_path, tiny_qwen3_q4):
    from kazeia.debug.plots import plot_errors

    r = compare(RunSpec(model=tiny_qwen3_q4, n_prompt=8, device="CPU"), "isolated")
    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(KazeiaError, match="matplotlib"):
        plot_errors(r, str(tmp_path / "x.png"))
